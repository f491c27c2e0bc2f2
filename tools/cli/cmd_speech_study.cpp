// `normlab speech-study --data DIR [--out study.json] [--seeds 3] [--quick]`: which normalization axis
// removes which corruption of the spoken-digit data set (src/speech/study.h): (a) feature-level residuals
// per front end and corruption, (b) a Transformer keyword classifier trained behind each front end.
// Results as JSON (--out, or stdout); progress on stderr.
#include <normlab/error.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cli.h"
#include "speech/study.h"

namespace normlab::cli {
namespace {

struct SpeechStudyCli {
  speech::StudyOptions study;
  std::string out;
  std::vector<std::string> classifier_front_ends;
  bool no_classifier = false, quiet = false;
};

void run_speech_study_cmd(SpeechStudyCli& c) {
  c.study.classifier = !c.no_classifier;
  if (!c.classifier_front_ends.empty()) {
    c.study.classifier_front_ends.clear();
    for (const std::string& n : c.classifier_front_ends) c.study.classifier_front_ends.push_back(speech::parse_front_end(n));
  }
  if (!c.quiet)
    c.study.log = [](const std::string& s) {
      std::fprintf(stderr, "%s\n", s.c_str());
      std::fflush(stderr);
    };
  const std::string json = speech::run_speech_study(c.study);
  if (c.out.empty()) {
    std::printf("%s\n", json.c_str());
    return;
  }
  const std::string tmp = c.out + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f << json << '\n';
    NL_CHECK(f.good(), "speech-study: cannot write {}", tmp);
  }
  NL_CHECK(std::rename(tmp.c_str(), c.out.c_str()) == 0, "speech-study: cannot rename {} to {}", tmp, c.out);
  if (!c.quiet) std::fprintf(stderr, "speech-study: wrote %s\n", c.out.c_str());
}

}  // namespace

void add_speech_study_command(CLI::App& app) {
  auto c = std::make_shared<SpeechStudyCli>();
  CLI::App* cmd = app.add_subcommand(
      "speech-study",
      "F-normalization vs T-normalization on the spoken-digit data: feature residuals per corruption and a "
      "Transformer keyword classifier per front end");
  cmd->add_option("--data", c->study.data_dir, "Data set directory (from `normlab speech-data`)")->required();
  cmd->add_option("--out", c->out, "Write the results (JSON) here; default: stdout");
  cmd->add_option("--seeds", c->study.seeds, "Classifier seeds per front end")->capture_default_str();
  cmd->add_flag("--quick", c->study.quick, "Small subsets and few training steps (a smoke run)");
  cmd->add_flag("--no-classifier", c->no_classifier, "Only the feature residuals (part a)");
  cmd->add_option("--front-ends", c->classifier_front_ends,
                  "Classifier front ends (default: none f-ln t-cmvn t-then-f)");
  cmd->add_option("--steps", c->study.steps, "Training steps (default 150; --quick 20)");
  cmd->add_option("--batch", c->study.batch, "Batch size (default 32; --quick 8)");
  cmd->add_option("--eval-every", c->study.eval_every, "Validation period in steps (default 50; --quick 10)");
  cmd->add_option("--lr", c->study.lr, "Peak learning rate (cosine schedule)")->capture_default_str();
  cmd->add_option("--layers", c->study.layers, "Encoder layers")->capture_default_str();
  cmd->add_option("--d-model", c->study.d_model, "Model width")->capture_default_str();
  cmd->add_option("--heads", c->study.heads, "Attention heads")->capture_default_str();
  cmd->add_option("--ffn", c->study.ffn, "FFN width")->capture_default_str();
  cmd->add_option("--max-train", c->study.max_train, "At most this many training clips (0 = all)")
      ->capture_default_str();
  cmd->add_option("--threads", c->study.threads, "Threads (0 = keep the default)")->capture_default_str();
  cmd->add_flag("--quiet", c->quiet, "No progress output");
  cmd->callback([c] { run_speech_study_cmd(*c); });
}

}  // namespace normlab::cli
