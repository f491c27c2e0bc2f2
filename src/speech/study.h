// speech/study.h — `normlab speech-study`: which normalization axis removes which corruption
// (docs/SPEECH_STUDY.md; recipe and expected pattern: /work/shared speech.md, "What separates
// F-normalization from T-normalization"; lab.md claim 3).
//
// Features: 40-bin Kaldi log-mel filterbanks (fbank.h) with dither 0, [T, F] per utterance.
//
// Front ends (per utterance, no learned parameters):
//   none       x
//   f-ln       LayerNorm over F per frame, no affine, eps `ln_eps`
//   t-cmvn     per-utterance CMVN over T, means and variances (apply_cmvn_per_utterance, norm_vars)
//   t-then-f   t-cmvn, then f-ln
//   f-then-t   f-ln, then t-cmvn
//   t-cmn      per-utterance mean removal over T (CMN, means only)
//   f-mean     per-frame mean removal over F (means only)
//   t-then-f-mean, f-then-t-mean   the two means-only steps in either order
// Mathematically: a constant shift of every cell is removed exactly by every front end except none;
// a per-frame shift x[t,f] + s_t by f-ln, f-mean, f-then-t, and both means-only combinations; a per-band
// shift x[t,f] + b_f by t-cmvn, t-cmn, t-then-f, and both means-only combinations (which commute:
// both are x − row mean − column mean + grand mean). tests/speech/study_test.cpp pins this.
//
// Part (a), residuals: for every test utterance and corruption, the per-cell RMS distance
// sqrt(mean_{t,f} (N(clean) − N(corrupted))²) under each front end N, averaged over the test set.
// Part (b), a keyword classifier: a Pre-LN Transformer encoder (nn/model.h, Head::kClassifier over
// real-valued frames, mean-pooled, bidirectional) trained on clean train data behind each front end,
// model selection on the validation split, accuracy on the clean and every corrupted test set.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <normlab/tensor.h>

namespace normlab::speech {

enum class FrontEnd { kNone, kFLn, kTCmvn, kTThenF, kFThenT, kTCmn, kFMean, kTThenFMean, kFThenTMean };
inline constexpr FrontEnd kAllFrontEnds[] = {FrontEnd::kNone,  FrontEnd::kFLn,   FrontEnd::kTCmvn,
                                             FrontEnd::kTThenF, FrontEnd::kFThenT, FrontEnd::kTCmn,
                                             FrontEnd::kFMean, FrontEnd::kTThenFMean, FrontEnd::kFThenTMean};
const char* front_end_name(FrontEnd fe);
FrontEnd parse_front_end(const std::string& name);  // throws normlab::Error listing the valid names

// A [T, F] feature matrix (row-major, frame-major).
struct FeatureMatrix {
  Index frames = 0, dims = 0;
  std::vector<float> data;
  ConstView view() const { return ConstView(data.data(), Dims{frames, dims}); }
  View view() { return View(data.data(), Dims{frames, dims}); }
};

// N(x) for one utterance. ln_eps: the eps of the LayerNorm over F.
FeatureMatrix apply_front_end(FrontEnd fe, const FeatureMatrix& x, double ln_eps = 1e-5);

// sqrt(mean over cells of (a − b)²), in double; shapes must agree.
double rms_distance(const FeatureMatrix& a, const FeatureMatrix& b);

// rms_distance(N(clean), N(corrupted)).
double front_end_residual(FrontEnd fe, const FeatureMatrix& clean, const FeatureMatrix& corrupted,
                          double ln_eps = 1e-5);

// One row of DIR/manifest.csv (speech/dataset.h).
struct ManifestRow {
  std::string file, split, voice, corruption, params;
  int digit = 0, speed = 0, pitch = 0;
};
// Reads DIR/manifest.csv; throws normlab::Error when it is missing or malformed.
std::vector<ManifestRow> read_manifest(const std::string& data_dir);

// Log-mel features of a WAV file as the study uses them (num_bins mel bins, dither 0, int16 scale).
FeatureMatrix study_features(const std::string& wav_path, int num_bins = 40);

struct StudyOptions {
  std::string data_dir;
  int seeds = 3;            // classifier seeds 0..seeds−1
  bool quick = false;       // small subsets and few steps (smoke runs, tests)
  bool classifier = true;   // part (b)
  int num_bins = 40;
  double ln_eps = 1e-5;
  // Classifier (0 / negative = the default for quick or full runs, see study.cpp).
  int layers = 2, d_model = 64, heads = 4, ffn = 128;
  std::int64_t steps = 0, batch = 0, eval_every = 0;
  double lr = 2e-3, clip = 1.0;
  int max_train = 0;  // > 0: at most this many training utterances (a deterministic subset)
  int threads = 0;    // 0: keep the current setting
  std::vector<FrontEnd> residual_front_ends = {std::begin(kAllFrontEnds), std::end(kAllFrontEnds)};
  std::vector<FrontEnd> classifier_front_ends = {FrontEnd::kNone, FrontEnd::kFLn, FrontEnd::kTCmvn,
                                                 FrontEnd::kTThenF};
  // Progress lines (stderr in the CLI).
  std::function<void(const std::string&)> log;
};

// Runs the study and returns its results as JSON text (config, residuals, classifier per seed, summary,
// timings). Throws normlab::Error for a missing or inconsistent data set.
std::string run_speech_study(const StudyOptions& opts);

}  // namespace normlab::speech
