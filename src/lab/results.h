// The lab's results model: one ClaimResult per claim of the LayerNorm logic chain (docs/LAB.md), written
// as DIR/results.json (schema: docs/lab-results.schema.json).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lab/verdicts.h"

namespace normlab::lab {

inline constexpr int kResultsSchemaVersion = 1;

struct SeedValues {
  int seed = 0;
  nlohmann::json values = nlohmann::json::object();  // name → number (null when not finite)
};

struct ClaimResult {
  int id = 0;                 // 1..9, lab.md's numbering; 10..12 the further experiments (kLastClaim)
  std::string section;        // the report section it belongs to ("warmup", ...)
  std::string title;          // short
  std::string claim;          // the claim's text
  bool measured = false;      // false: not yet measured (verdict inconclusive, reason says why)
  nlohmann::json config = nlohmann::json::object();  // sizes, schedules, seeds, ...
  nlohmann::json data = nlohmann::json::object();    // raw numbers (curves, per-layer values) for the report
  std::vector<SeedValues> per_seed;                  // the values the rule reads, per seed
  RuleResult verdict;
  std::string command;                    // reruns this claim alone: `normlab lab --only N ...`
  std::vector<std::string> run_commands;  // the other issues' CLI commands for each run
  std::string note;                       // caveats (measured proxy, quick sizes, ...)
  double wall_s = 0;                      // sum of the wall times of its runs
};

struct LabResults {
  std::string version;   // normlab's
  bool quick = false;
  std::vector<int> seeds;
  int jobs = 1;          // parallel runs
  std::string command;   // the command line of this run
  std::string started;   // ISO 8601, UTC
  double wall_s = 0;
  std::vector<ClaimResult> claims;  // ascending id
};

nlohmann::json to_json(const ClaimResult& c);
nlohmann::json to_json(const LabResults& r);

// Writes DIR/results.json atomically (DIR/results.json.tmp, then rename).
void write_results(const std::string& dir, const LabResults& r);

// A number for JSON: finite → itself, otherwise null.
nlohmann::json finite_or_null(double v);

// What changed between two results.json documents: verdicts and the per-seed key numbers, one line each.
std::string compare_results(const nlohmann::json& a, const nlohmann::json& b);

}  // namespace normlab::lab
