// End-to-end tests of `normlab lab` (NORMLAB_CLI):
//   * --quick writes a results.json that validates against docs/lab-results.schema.json (a validator for
//     the subset of JSON Schema the schema uses: type, required, properties, enum, items, minimum) and an
//     index.html that headless Chromium renders with every section present and every image decoded (the
//     report's inline script writes each image's naturalWidth into the DOM; --dump-dom shows it); the
//     screenshot is kept as an artifact: BUILD/tests/lab_quick_report.png (and BUILD/tests/lab_quick/).
//     Chromium missing is a failure, not a skip (scripts/install-deps installs it).
//   * --only 1 and --compare; argument errors.
//   * the lab's gradient-norm runs compute what `normlab gradnorms --json` prints.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "lab/experiments.h"

namespace normlab {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct RunResult {
  int rc = -1;
  std::string out, err;
};

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

RunResult run_shell(const std::string& cmd, const fs::path& dir) {
  const fs::path out = dir / "stdout.txt", err = dir / "stderr.txt";
  const std::string full = "cd '" + dir.string() + "' && " + cmd + " >'" + out.string() + "' 2>'" + err.string() + "'";
  const int status = std::system(full.c_str());
  RunResult r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

RunResult run_cli(const std::string& args, const fs::path& dir) {
  return run_shell(std::string("'") + NORMLAB_CLI + "' " + args, dir);
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("normlab_lab_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// ---- a JSON Schema validator for the subset the schema uses ----------------------------------------
bool type_ok(const json& v, const std::string& t) {
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "boolean") return v.is_boolean();
  if (t == "integer") return v.is_number_integer() || v.is_number_unsigned();
  if (t == "number") return v.is_number();
  if (t == "null") return v.is_null();
  ADD_FAILURE() << "schema uses an unsupported type " << t;
  return false;
}

void validate(const json& v, const json& schema, const std::string& path, std::vector<std::string>& errors) {
  static const std::set<std::string> kKnown = {"$schema", "$id", "title", "description", "type", "required",
                                               "properties", "enum", "items", "minimum"};
  for (const auto& [k, unused] : schema.items())
    if (!kKnown.count(k)) errors.push_back(path + ": schema keyword '" + k + "' is not supported by this validator");
  if (schema.contains("type")) {
    const json& t = schema.at("type");
    bool ok = false;
    if (t.is_array()) {
      for (const auto& x : t) ok = ok || type_ok(v, x.get<std::string>());
    } else {
      ok = type_ok(v, t.get<std::string>());
    }
    if (!ok) {
      errors.push_back(path + ": expected type " + t.dump() + ", got " + v.dump().substr(0, 80));
      return;
    }
  }
  if (schema.contains("enum")) {
    bool found = false;
    for (const auto& e : schema.at("enum")) found = found || e == v;
    if (!found) errors.push_back(path + ": " + v.dump() + " not in " + schema.at("enum").dump());
  }
  if (schema.contains("minimum") && v.is_number() && v.get<double>() < schema.at("minimum").get<double>())
    errors.push_back(path + ": " + v.dump() + " < minimum " + schema.at("minimum").dump());
  if (schema.contains("required") && v.is_object())
    for (const auto& r : schema.at("required"))
      if (!v.contains(r.get<std::string>())) errors.push_back(path + ": missing required '" + r.get<std::string>() + "'");
  if (schema.contains("properties") && v.is_object())
    for (const auto& [k, sub] : schema.at("properties").items())
      if (v.contains(k)) validate(v.at(k), sub, path + "." + k, errors);
  if (schema.contains("items") && v.is_array())
    for (std::size_t i = 0; i < v.size(); ++i)
      validate(v.at(i), schema.at("items"), path + "[" + std::to_string(i) + "]", errors);
}

std::vector<std::string> validate_results(const json& results) {
  const json schema = json::parse(read_file(fs::path(NORMLAB_SOURCE_DIR) / "docs" / "lab-results.schema.json"));
  std::vector<std::string> errors;
  validate(results, schema, "$", errors);
  return errors;
}

TEST(LabSchema, ValidatorRejectsBadDocuments) {
  json good = {{"schema_version", 1}, {"normlab_version", "0.1.0"}, {"quick", true}, {"seeds", {0}}, {"jobs", 2},
               {"command", "normlab lab"}, {"started", "now"}, {"wall_s", 1.0}, {"claims", json::array()}};
  EXPECT_TRUE(validate_results(good).empty());
  json bad = good;
  bad.erase("claims");
  EXPECT_FALSE(validate_results(bad).empty());
  bad = good;
  bad["jobs"] = 0;  // minimum 1
  EXPECT_FALSE(validate_results(bad).empty());
  bad = good;
  bad["claims"] = {{{"id", 1}, {"verdict", "probably"}}};  // enum + missing fields
  EXPECT_GE(validate_results(bad).size(), 2u);
  bad = good;
  bad["quick"] = "yes";
  EXPECT_FALSE(validate_results(bad).empty());
}

// ---- --quick, end to end ------------------------------------------------------------------------------
const char* kSections[] = {"neuron", "layer", "layernorm-math", "ln-vs-bn", "f-vs-t", "placement",
                           "gradient-flow", "residual-growth", "warmup", "layer-utilization", "variants"};

std::string chromium_flags(const fs::path& profile) {
  return "--headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking "
         "--disable-component-update --disable-sync --user-data-dir='" + profile.string() + "' --window-size=1100,800";
}

TEST(LabCli, QuickRunValidatesAgainstTheSchemaAndRendersInChromium) {
  const fs::path work = fresh_dir("quick");
  const fs::path out = fs::path(NORMLAB_BINARY_DIR) / "lab_quick";  // kept as a test artifact
  fs::remove_all(out);
  const RunResult r = run_cli("lab --quick --out '" + out.string() + "'", work);
  ASSERT_EQ(r.rc, 0) << r.out << "\n" << r.err;
  EXPECT_NE(r.out.find("[  1/"), std::string::npos) << "progress lines expected\n" << r.out;

  // results.json against the schema, and its content.
  ASSERT_TRUE(fs::exists(out / "results.json"));
  const json res = json::parse(read_file(out / "results.json"));
  const std::vector<std::string> errors = validate_results(res);
  EXPECT_TRUE(errors.empty()) << [&] {
    std::string s;
    for (const auto& e : errors) s += e + "\n";
    return s;
  }();
  EXPECT_TRUE(res.at("quick").get<bool>());
  std::map<int, json> claims;
  for (const auto& c : res.at("claims")) claims[c.at("id").get<int>()] = c;
  ASSERT_EQ(claims.size(), 12u);
  EXPECT_EQ(claims[1].at("verdict"), "reproduced") << claims[1].dump(1);
  // F vs T on speech: residuals on a --limit 2 data set (20 test utterances); the pattern is clear even there.
  EXPECT_EQ(claims[3].at("verdict"), "reproduced") << claims[3].dump(1);
  EXPECT_EQ(claims[3].at("data").at("dataset").at("limit"), 2);
  EXPECT_EQ(claims[3].at("data").at("residuals").at("mean").at("clean").at("f-ln"), 0.0);  // the control
  EXPECT_EQ(claims[2].at("verdict"), "reproduced") << claims[2].dump(1);  // deterministic kernel-level measurement
  for (int id : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}) {
    EXPECT_TRUE(claims[id].at("measured").get<bool>()) << id;
    EXPECT_FALSE(claims[id].at("per_seed").empty()) << id;
    EXPECT_EQ(claims[id].at("reason").get<std::string>().find("runs failed"), std::string::npos)
        << claims[id].at("reason");
    EXPECT_EQ(claims[id].at("command").get<std::string>(), "normlab lab --only " + std::to_string(id) + " --quick");
  }
  EXPECT_EQ(claims[6].at("data").at("runs").size(), 4u);  // 4 arms × 1 seed
  EXPECT_EQ(claims[11].at("data").at("runs").size(), 18u);  // 9 placements (controls included) × 2 depths
  EXPECT_NE(claims[11].at("data").at("refused").at(0).at("error").get<std::string>().find("SpanNorm"), std::string::npos);
  EXPECT_EQ(claims[12].at("data").at("runs").size(), 4u);  // 2 depths × 2 warmups
  EXPECT_EQ(claims[4].at("data").at("profiles").at(0).at("dx").size(),
            claims[4].at("data").at("profiles").at(0).at("layers").get<std::size_t>());

  // The report in headless Chromium.
  ASSERT_TRUE(fs::exists(out / "index.html"));
  const char* chromium = "/usr/bin/chromium";
  ASSERT_EQ(::access(chromium, X_OK), 0) << chromium << " is missing: run scripts/install-deps";
  const fs::path url_path = fs::canonical(out / "index.html");
  const RunResult dom = run_shell(std::string(chromium) + " " + chromium_flags(work / "profile1") +
                                      " --dump-dom 'file://" + url_path.string() + "'",
                                  work);
  ASSERT_EQ(dom.rc, 0) << dom.err;
  for (const char* s : kSections)
    EXPECT_NE(dom.out.find(std::string("data-section=\"") + s + "\""), std::string::npos) << "section " << s;
  for (int id = 1; id <= 12; ++id)
    EXPECT_NE(dom.out.find("id=\"claim-" + std::to_string(id) + "\""), std::string::npos) << "claim " << id;
  // Every image decoded: naturalWidth > 0 written into the DOM by the report's script. (Plain string search:
  // std::regex recurses per character and overflows the stack on base64 data URIs.)
  auto attr = [](const std::string& tag, const std::string& name) -> std::string {
    const std::string key = " " + name + "=\"";
    const std::size_t at = tag.find(key);
    if (at == std::string::npos) return "";
    const std::size_t from = at + key.size();
    return tag.substr(from, tag.find('"', from) - from);
  };
  int images = 0;
  for (std::size_t at = dom.out.find("<img "); at != std::string::npos; at = dom.out.find("<img ", at + 5)) {
    const std::string tag = dom.out.substr(at, dom.out.find('>', at) - at + 1);
    ++images;
    const std::string w = attr(tag, "data-natural-width");
    ASSERT_FALSE(w.empty()) << "image without data-natural-width: " << tag.substr(0, 120);
    EXPECT_GT(std::stoi(w), 0) << tag.substr(0, 120);
  }
  EXPECT_GE(images, 12) << "one plot per measured claim (1..12)";
  const std::size_t body = dom.out.find("<body");
  ASSERT_NE(body, std::string::npos);
  const std::string body_tag = dom.out.substr(body, dom.out.find('>', body) - body + 1);
  ASSERT_FALSE(attr(body_tag, "data-images-decoded").empty()) << body_tag;
  EXPECT_EQ(std::stoi(attr(body_tag, "data-images-decoded")), images) << body_tag;

  // Screenshot, kept next to the test binary.
  const fs::path shot = fs::path(NORMLAB_BINARY_DIR) / "lab_quick_report.png";
  fs::remove(shot);
  const RunResult sc = run_shell(std::string(chromium) + " " + chromium_flags(work / "profile2") +
                                     " --screenshot='" + shot.string() + "' 'file://" + url_path.string() + "'",
                                 work);
  ASSERT_EQ(sc.rc, 0) << sc.err;
  ASSERT_TRUE(fs::exists(shot));
  const std::string png = read_file(shot);
  ASSERT_GT(png.size(), 1000u);
  EXPECT_EQ(png.substr(1, 3), "PNG");
  fs::remove_all(work);
}

// ---- --only, --compare, errors ------------------------------------------------------------------------------
TEST(LabCli, OnlyClaim1ThenCompare) {
  const fs::path work = fresh_dir("only1");
  const RunResult a = run_cli("lab --only 1 --out a", work);
  ASSERT_EQ(a.rc, 0) << a.out << a.err;
  EXPECT_TRUE(fs::exists(work / "a" / "index.html"));
  const RunResult b = run_cli("lab --only 1 --out b --no-report", work);
  ASSERT_EQ(b.rc, 0) << b.out << b.err;
  EXPECT_FALSE(fs::exists(work / "b" / "index.html"));
  const json j = json::parse(read_file(work / "a" / "results.json"));
  EXPECT_TRUE(validate_results(j).empty());
  ASSERT_EQ(j.at("claims").size(), 1u);
  EXPECT_EQ(j.at("claims").at(0).at("verdict"), "reproduced");
  EXPECT_EQ(j.at("claims").at(0).at("command"), "normlab lab --only 1");

  const RunResult c = run_cli("lab --compare a/results.json b/results.json", work);
  ASSERT_EQ(c.rc, 0) << c.err;
  EXPECT_NE(c.out.find("claim 1"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("no differences"), std::string::npos) << c.out;

  // A changed verdict and number show up.
  json changed = j;
  changed["claims"][0]["verdict"] = "not-reproduced";
  changed["claims"][0]["per_seed"][0]["values"]["layer-output.y.max_abs_err"] = 0.5;
  std::ofstream(work / "c.json") << changed.dump();
  const RunResult d = run_cli("lab --compare a/results.json c.json", work);
  ASSERT_EQ(d.rc, 0) << d.err;
  EXPECT_NE(d.out.find("verdict reproduced -> not-reproduced"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("layer-output.y.max_abs_err"), std::string::npos) << d.out;
  fs::remove_all(work);
}

TEST(LabCli, ResumeReusesFinishedRuns) {
  const fs::path work = fresh_dir("resume");
  const RunResult a = run_cli("lab --quick --only 5 --out r --no-report", work);
  ASSERT_EQ(a.rc, 0) << a.out << a.err;
  fs::copy_file(work / "r" / "results.json", work / "first.json");
  const RunResult b = run_cli("lab --quick --only 5 --out r --no-report --resume", work);
  ASSERT_EQ(b.rc, 0) << b.out << b.err;
  EXPECT_NE(b.out.find("reused (--resume)"), std::string::npos) << b.out;
  EXPECT_EQ(b.out.find("start "), std::string::npos) << "no run should start again\n" << b.out;
  const RunResult c = run_cli("lab --compare first.json r/results.json", work);
  EXPECT_NE(c.out.find("no differences"), std::string::npos) << c.out;
  fs::remove_all(work);
}

TEST(LabCli, ArgumentErrors) {
  const fs::path work = fresh_dir("errors");
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"lab --only 13 --out x", "claims are numbered 1..12"},
           {"lab --compare only-one.json", "--compare"},
           {"lab --compare nope.json nope2.json", "cannot read"}}) {
    const RunResult r = run_cli(args, work);
    EXPECT_EQ(r.rc, 1) << args;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\n" << r.err;
  }
  fs::remove_all(work);
}

// The lab's claim-5 runs compute what `normlab gradnorms --json` prints (same model, batches, averaging).
TEST(LabJobs, GradnormsJobMatchesTheGradnormsCommand) {
  const fs::path work = fresh_dir("gradnorms");
  const RunResult r = run_cli(
      "gradnorms --placement post --layers 3 --d-model 32 --heads 4 --ffn 64 --seq 16 --batch 4 --batches 2 "
      "--seed 1 --json",
      work);
  ASSERT_EQ(r.rc, 0) << r.err;
  const json cli = json::parse(r.out);
  const json spec = {{"kind", "gradnorms"}, {"placement", "post"}, {"layers", 3}, {"d_model", 32}, {"heads", 4},
                     {"ffn", 64},           {"seq", 16},          {"batch", 4},  {"batches", 2},  {"seed", 1},
                     {"data", "fortunes"}};
  const json lab = lab::run_job(spec, work.string());
  ASSERT_EQ(lab.at("ffn2").size(), 3u);
  for (int l = 0; l < 3; ++l) {
    const double a = cli.at("layers").at(l).at("ffn.w2").get<double>(), b = lab.at("ffn2").at(l).get<double>();
    EXPECT_NEAR(a, b, 1e-5 * std::fabs(a)) << "layer " << l;
  }
  EXPECT_NEAR(cli.at("loss").get<double>(), lab.at("loss").get<double>(), 1e-6);
  fs::remove_all(work);
}

}  // namespace
}  // namespace normlab
