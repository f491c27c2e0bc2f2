// The lab's results model (see results.h).
#include "lab/results.h"

#include <fmt/format.h>
#include <normlab/error.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <system_error>

namespace normlab::lab {

nlohmann::json finite_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

nlohmann::json to_json(const ClaimResult& c) {
  nlohmann::json seeds = nlohmann::json::array();
  for (const SeedValues& s : c.per_seed) seeds.push_back({{"seed", s.seed}, {"values", s.values}});
  return {{"id", c.id},
          {"section", c.section},
          {"title", c.title},
          {"claim", c.claim},
          {"measured", c.measured},
          {"config", c.config},
          {"data", c.data},
          {"per_seed", seeds},
          {"verdict", verdict_name(c.verdict.verdict)},
          {"rule", c.verdict.rule},
          {"reason", c.verdict.reason},
          {"command", c.command},
          {"run_commands", c.run_commands},
          {"note", c.note},
          {"wall_s", c.wall_s}};
}

nlohmann::json to_json(const LabResults& r) {
  nlohmann::json claims = nlohmann::json::array();
  for (const ClaimResult& c : r.claims) claims.push_back(to_json(c));
  return {{"schema_version", kResultsSchemaVersion},
          {"normlab_version", r.version},
          {"quick", r.quick},
          {"seeds", r.seeds},
          {"jobs", r.jobs},
          {"command", r.command},
          {"started", r.started},
          {"wall_s", r.wall_s},
          {"claims", claims}};
}

void write_results(const std::string& dir, const LabResults& r) {
  namespace fs = std::filesystem;
  const fs::path path = fs::path(dir) / "results.json", tmp = fs::path(dir) / "results.json.tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    NL_CHECK(f.good(), "lab: cannot open '{}' for writing", tmp.string());
    f << to_json(r).dump(2) << '\n';
    f.close();
    NL_CHECK(!f.fail(), "lab: write error on '{}'", tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  NL_CHECK(!ec, "lab: cannot rename '{}' to '{}': {}", tmp.string(), path.string(), ec.message());
}

namespace {

std::string value_str(const nlohmann::json& v) {
  if (v.is_number_float()) return fmt::format("{:.4g}", v.get<double>());
  return v.dump();
}

}  // namespace

std::string compare_results(const nlohmann::json& a, const nlohmann::json& b) {
  std::string out;
  auto claims_of = [](const nlohmann::json& j) {
    std::map<int, nlohmann::json> m;
    for (const auto& c : j.at("claims")) m[c.at("id").get<int>()] = c;
    return m;
  };
  const auto ca = claims_of(a), cb = claims_of(b);
  out += fmt::format("A: {} ({}{}), B: {} ({}{})\n", a.value("started", "?"), a.value("quick", false) ? "quick, " : "",
                     fmt::format("{:.0f} s", a.value("wall_s", 0.0)), b.value("started", "?"),
                     b.value("quick", false) ? "quick, " : "", fmt::format("{:.0f} s", b.value("wall_s", 0.0)));
  int changed = 0;
  std::map<int, bool> ids;
  for (const auto& [id, c] : ca) ids[id] = true;
  for (const auto& [id, c] : cb) ids[id] = true;
  for (const auto& [id, unused] : ids) {
    const auto ia = ca.find(id), ib = cb.find(id);
    if (ia == ca.end() || ib == cb.end()) {
      out += fmt::format("claim {}: only in {}\n", id, ia == ca.end() ? "B" : "A");
      ++changed;
      continue;
    }
    const nlohmann::json &x = ia->second, &y = ib->second;
    const std::string va = x.at("verdict"), vb = y.at("verdict");
    if (va != vb) {
      out += fmt::format("claim {} ({}): verdict {} -> {}\n", id, x.value("title", ""), va, vb);
      ++changed;
    } else {
      out += fmt::format("claim {} ({}): verdict {} (unchanged)\n", id, x.value("title", ""), va);
    }
    // Per-seed values present in both.
    std::map<int, nlohmann::json> sa, sb;
    for (const auto& s : x.at("per_seed")) sa[s.at("seed").get<int>()] = s.at("values");
    for (const auto& s : y.at("per_seed")) sb[s.at("seed").get<int>()] = s.at("values");
    for (const auto& [seed, vals] : sa) {
      const auto it = sb.find(seed);
      if (it == sb.end()) continue;
      for (const auto& [k, v] : vals.items()) {
        if (!it->second.contains(k)) continue;
        const auto& w = it->second.at(k);
        if (v == w) continue;
        std::string delta;
        if (v.is_number() && w.is_number()) delta = fmt::format(" (Δ {:+.4g})", w.get<double>() - v.get<double>());
        out += fmt::format("    seed {} {}: {} -> {}{}\n", seed, k, value_str(v), value_str(w), delta);
        ++changed;
      }
    }
  }
  out += changed == 0 ? "no differences\n" : fmt::format("{} difference(s)\n", changed);
  return out;
}

}  // namespace normlab::lab
