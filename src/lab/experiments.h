// The lab's experiments (docs/LAB.md): which runs each claim needs (plan), how one run is executed
// (run_job, in a child process of `normlab lab` or in-process), and how the runs' outputs become
// ClaimResults with verdicts (assemble).
//
// A run ("job") is a JSON spec:
//   {"kind": "gradnorms", "placement", "layers", "d_model", "heads", "ffn", "seq", "batch", "batches", "seed",
//    "data"}  — per-layer gradient norms at initialization, the computation of `normlab gradnorms`
//   {"kind": "train", "config": {TrainConfig as train_config_json}, "removal": bool} — nn::train, then (removal)
//    the validation loss with the last k blocks dropped (k = 1..L−1) and with each block skipped alone, the
//    computation of `normlab eval --drop-last K / --skip-block I` on the final checkpoint.
//   {"kind": "speech", "seed", "limit", "renditions"} — claim 3: speech::MakeSpeechData into WORK/speech-data
//    (`normlab speech-data`), then part (a) of speech::run_speech_study (`normlab speech-study --no-classifier`):
//    feature residuals per corruption and front end.
// Every arm of a claim uses the same seeds, and the training loop's batches and validation windows depend
// on the seed only, so comparisons between arms are paired.
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "lab/results.h"
#include "lab/worked_examples.h"

namespace normlab::lab {

// Claims 1..9 are lab.md's; 10..12 are the further experiments (residual-stream norm growth,
// placement variants without warmup, Post-LN's warmup threshold vs depth).
inline constexpr int kLastClaim = 12;

struct LabOptions {
  bool quick = false;
  std::vector<int> seeds{0, 1, 2};
  std::set<int> only;          // empty: every claim
  std::string data = "fortunes";
  bool wants(int claim) const { return only.empty() || only.count(claim) > 0; }
};

struct Job {
  std::string key;           // unique, file-name safe: "c6-post-nowarmup-s0"
  nlohmann::json spec;       // see above
  std::vector<std::string> commands;  // the CLI commands that redo this run alone
  double cost = 1;           // relative cost estimate (longest first)
};

// The runs needed by the selected claims (claims 8 and 9 reuse claim 6's trained models).
std::vector<Job> plan_jobs(const LabOptions& opt);

// Executes one run; `work_dir` holds its logs and checkpoint. Sets the process's thread count to 1
// (normlab and OpenMP settings are process-global: run jobs in separate processes to run them in parallel).
nlohmann::json run_job(const nlohmann::json& spec, const std::string& work_dir);

// An extra check for claim 1 computed by the caller (the CLI's exercise).
struct ExtraCheck {
  std::string name;
  bool passed = false;
  std::string detail;
};

// The claims' results from the runs' outputs (key → output; a missing or failed run has no entry or an
// {"error": ...} entry and its claims become inconclusive with the error in the reason).
std::vector<ClaimResult> assemble(const LabOptions& opt, const nlohmann::json& outputs,
                                  const std::vector<ExtraCheck>& claim1_extra);

// `normlab lab --only N [--quick] [--seeds K]` for claim N under these options.
std::string lab_command(const LabOptions& opt, int claim);

// The report's sections, in the article's order: {id, heading, claim ids}.
struct Section {
  std::string id, heading;
  std::vector<int> claims;
};
const std::vector<Section>& sections();

}  // namespace normlab::lab
