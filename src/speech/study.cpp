// `normlab speech-study`; the contract is in src/speech/study.h.
#include "speech/study.h"

#include <normlab/cmvn.h>
#include <normlab/error.h>
#include <normlab/nn/model.h>
#include <normlab/nn/optim.h>
#include <normlab/norm.h>
#include <normlab/parallel.h>
#include <normlab/speech/fbank.h>
#include <normlab/speech/wav.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <set>
#include <sstream>

#include "nn/schedule.h"
#include "speech/dataset.h"

namespace normlab::speech {

namespace {

struct FrontEndName {
  FrontEnd fe;
  const char* name;
};
constexpr FrontEndName kFrontEndNames[] = {
    {FrontEnd::kNone, "none"},           {FrontEnd::kFLn, "f-ln"},
    {FrontEnd::kTCmvn, "t-cmvn"},        {FrontEnd::kTThenF, "t-then-f"},
    {FrontEnd::kFThenT, "f-then-t"},     {FrontEnd::kTCmn, "t-cmn"},
    {FrontEnd::kFMean, "f-mean"},        {FrontEnd::kTThenFMean, "t-then-f-mean"},
    {FrontEnd::kFThenTMean, "f-then-t-mean"},
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

FeatureMatrix f_layer_norm(const FeatureMatrix& x, double eps) {
  FeatureMatrix y{x.frames, x.dims, std::vector<float>(x.data.size())};
  layer_norm_forward(y.view(), View{}, View{}, x.view(), ConstView{}, ConstView{}, Axes{1}, eps);
  return y;
}

FeatureMatrix t_cmvn(const FeatureMatrix& x, bool norm_vars) {
  FeatureMatrix y{x.frames, x.dims, std::vector<float>(x.data.size())};
  CmvnOptions o;
  o.norm_vars = norm_vars;
  apply_cmvn_per_utterance(y.view(), x.view(), o);
  return y;
}

FeatureMatrix f_mean(const FeatureMatrix& x) {
  FeatureMatrix y{x.frames, x.dims, std::vector<float>(x.data.size())};
  for (Index t = 0; t < x.frames; ++t) {
    const float* row = x.data.data() + t * x.dims;
    double m = 0;
    for (Index f = 0; f < x.dims; ++f) m += row[f];
    m /= static_cast<double>(x.dims);
    float* out = y.data.data() + t * x.dims;
    for (Index f = 0; f < x.dims; ++f) out[f] = static_cast<float>(row[f] - m);
  }
  return y;
}

double mean_of(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}
// Sample standard deviation (n − 1); 0 for fewer than two values.
double sd_of(const std::vector<double>& v) {
  if (v.size() < 2) return 0.0;
  const double m = mean_of(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}

// Per-frame RMS distances of two equally shaped matrices, sorted.
std::vector<double> sorted_frame_distances(const FeatureMatrix& a, const FeatureMatrix& b) {
  std::vector<double> d(static_cast<std::size_t>(a.frames));
  for (Index t = 0; t < a.frames; ++t) {
    double s = 0;
    for (Index f = 0; f < a.dims; ++f) {
      const std::size_t i = static_cast<std::size_t>(t * a.dims + f);
      const double e = static_cast<double>(a.data[i]) - static_cast<double>(b.data[i]);
      s += e * e;
    }
    d[static_cast<std::size_t>(t)] = std::sqrt(s / static_cast<double>(a.dims));
  }
  std::sort(d.begin(), d.end());
  return d;
}

double quantile_sorted(const std::vector<double>& v, double q) {
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
}

// Per-utterance spread of N(clean): the RMS of every cell about the utterance's mean cell value. The
// scale against which a residual under N can be judged.
double cell_spread(const FeatureMatrix& x) {
  double m = 0;
  for (float v : x.data) m += v;
  m /= static_cast<double>(x.data.size());
  double s = 0;
  for (float v : x.data) s += (v - m) * (v - m);
  return std::sqrt(s / static_cast<double>(x.data.size()));
}

std::vector<std::string> split_csv_line(const std::string& line, std::size_t fields) {
  // The last field (params) takes the rest of the line, commas included.
  std::vector<std::string> out;
  std::size_t start = 0;
  for (std::size_t i = 0; i + 1 < fields; ++i) {
    const std::size_t comma = line.find(',', start);
    if (comma == std::string::npos) return out;
    out.push_back(line.substr(start, comma - start));
    start = comma + 1;
  }
  out.push_back(line.substr(start));
  return out;
}

// ---- the classifier ---------------------------------------------------------------------------------

struct Example {
  const FeatureMatrix* x;
  int label;
};

// A padded batch [B, T, F] with lengths.
struct Batch {
  std::vector<float> frames;
  std::vector<std::int32_t> labels;
  std::vector<Index> lengths;
  Index B = 0, T = 0;
};

Batch make_batch(const std::vector<Example>& set, std::span<const std::size_t> idx, Index F) {
  Batch b;
  b.B = static_cast<Index>(idx.size());
  for (std::size_t i : idx) b.T = std::max(b.T, set[i].x->frames);
  b.frames.assign(static_cast<std::size_t>(b.B * b.T * F), 0.0f);
  for (std::size_t k = 0; k < idx.size(); ++k) {
    const Example& e = set[idx[k]];
    std::copy(e.x->data.begin(), e.x->data.end(), b.frames.begin() + static_cast<std::ptrdiff_t>(k * b.T * F));
    b.labels.push_back(e.label);
    b.lengths.push_back(e.x->frames);
  }
  return b;
}

struct EvalResult {
  double accuracy = 0, loss = 0;
};

EvalResult evaluate(nn::Model& model, const std::vector<Example>& set, Index F, Index batch) {
  std::vector<std::size_t> order(set.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return set[a].x->frames < set[b].x->frames; });
  const Index K = model.config().classes;
  std::size_t correct = 0;
  double loss = 0;
  for (std::size_t s = 0; s < order.size(); s += static_cast<std::size_t>(batch)) {
    const std::size_t n = std::min(order.size() - s, static_cast<std::size_t>(batch));
    const Batch b = make_batch(set, std::span<const std::size_t>(order).subspan(s, n), F);
    loss += model.forward_frames(b.frames.data(), b.labels.data(), b.B, b.T, b.lengths) * static_cast<double>(n);
    const float* logits = model.logits();
    for (Index i = 0; i < b.B; ++i) {
      const float* row = logits + i * K;
      const Index pred = std::max_element(row, row + K) - row;
      if (pred == b.labels[static_cast<std::size_t>(i)]) ++correct;
    }
  }
  const double n = static_cast<double>(std::max<std::size_t>(set.size(), 1));
  return {static_cast<double>(correct) / n, loss / n};
}

// Padding-aware batching: each epoch shuffles the set, sorts pools of 8 batches by length (little padding),
// cuts them into batches and shuffles the batch order.
std::vector<std::vector<std::size_t>> epoch_batches(const std::vector<Example>& set, Index batch,
                                                    std::mt19937_64& rng) {
  std::vector<std::size_t> order(set.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  const std::size_t B = static_cast<std::size_t>(batch), pool = 8 * B;
  std::vector<std::vector<std::size_t>> batches;
  for (std::size_t s = 0; s < order.size(); s += pool) {
    const auto first = order.begin() + static_cast<std::ptrdiff_t>(s);
    const auto last = order.begin() + static_cast<std::ptrdiff_t>(std::min(order.size(), s + pool));
    std::stable_sort(first, last, [&](std::size_t a, std::size_t b) { return set[a].x->frames < set[b].x->frames; });
    for (auto it = first; it < last; it += static_cast<std::ptrdiff_t>(std::min<std::size_t>(B, static_cast<std::size_t>(last - it))))
      batches.emplace_back(it, it + static_cast<std::ptrdiff_t>(std::min<std::size_t>(B, static_cast<std::size_t>(last - it))));
  }
  std::shuffle(batches.begin(), batches.end(), rng);
  return batches;
}

struct RunResult {
  std::int64_t steps = 0, best_step = 0;
  double best_val_acc = 0, best_val_loss = 0, final_train_loss = 0, seconds = 0;
  std::vector<std::pair<std::int64_t, double>> val_curve;  // (step, val accuracy)
  std::map<std::string, double> test_acc;
  bool diverged = false;
};

}  // namespace

const char* front_end_name(FrontEnd fe) {
  for (const auto& e : kFrontEndNames)
    if (e.fe == fe) return e.name;
  return "?";
}

FrontEnd parse_front_end(const std::string& name) {
  std::string valid;
  for (const auto& e : kFrontEndNames) {
    if (name == e.name) return e.fe;
    valid += valid.empty() ? e.name : std::string("|") + e.name;
  }
  throw Error(fmt::format("unknown front end '{}'; valid front ends: {}", name, valid));
}

FeatureMatrix apply_front_end(FrontEnd fe, const FeatureMatrix& x, double ln_eps) {
  NL_CHECK(x.frames >= 1 && x.dims >= 1 && x.data.size() == static_cast<std::size_t>(x.frames * x.dims),
           "front end: a feature matrix needs ≥ 1 frame and ≥ 1 dim with frames·dims values, got {}×{} with {}",
           x.frames, x.dims, x.data.size());
  switch (fe) {
    case FrontEnd::kNone: return x;
    case FrontEnd::kFLn: return f_layer_norm(x, ln_eps);
    case FrontEnd::kTCmvn: return t_cmvn(x, true);
    case FrontEnd::kTThenF: return f_layer_norm(t_cmvn(x, true), ln_eps);
    case FrontEnd::kFThenT: return t_cmvn(f_layer_norm(x, ln_eps), true);
    case FrontEnd::kTCmn: return t_cmvn(x, false);
    case FrontEnd::kFMean: return f_mean(x);
    case FrontEnd::kTThenFMean: return f_mean(t_cmvn(x, false));
    case FrontEnd::kFThenTMean: return t_cmvn(f_mean(x), false);
  }
  throw Error("front end: unknown kind");
}

double rms_distance(const FeatureMatrix& a, const FeatureMatrix& b) {
  NL_CHECK(a.frames == b.frames && a.dims == b.dims, "rms_distance: shapes differ: {}×{} vs {}×{}", a.frames,
           a.dims, b.frames, b.dims);
  NL_CHECK(!a.data.empty(), "rms_distance: empty matrices");
  double s = 0;
  for (std::size_t i = 0; i < a.data.size(); ++i) {
    const double d = static_cast<double>(a.data[i]) - static_cast<double>(b.data[i]);
    s += d * d;
  }
  return std::sqrt(s / static_cast<double>(a.data.size()));
}

double front_end_residual(FrontEnd fe, const FeatureMatrix& clean, const FeatureMatrix& corrupted, double ln_eps) {
  return rms_distance(apply_front_end(fe, clean, ln_eps), apply_front_end(fe, corrupted, ln_eps));
}

std::vector<ManifestRow> read_manifest(const std::string& data_dir) {
  const std::filesystem::path p = std::filesystem::path(data_dir) / "manifest.csv";
  std::ifstream f(p);
  NL_CHECK(f.good(), "speech-study: cannot read {} (make the data set with `normlab speech-data --out {}`)",
           p.string(), data_dir);
  std::string line;
  std::getline(f, line);
  NL_CHECK(line.rfind("file,split,digit,voice,speed,pitch,corruption,params", 0) == 0,
           "speech-study: {} has an unexpected header '{}'", p.string(), line);
  std::vector<ManifestRow> rows;
  for (std::size_t n = 2; std::getline(f, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const std::vector<std::string> c = split_csv_line(line, 8);
    NL_CHECK(c.size() == 8, "speech-study: {} line {}: expected 8 fields: '{}'", p.string(), n, line);
    ManifestRow r;
    r.file = c[0], r.split = c[1], r.voice = c[3], r.corruption = c[6], r.params = c[7];
    try {
      r.digit = std::stoi(c[2]), r.speed = std::stoi(c[4]), r.pitch = std::stoi(c[5]);
    } catch (const std::exception&) {
      throw Error(fmt::format("speech-study: {} line {}: digit, speed and pitch must be integers: '{}'",
                              p.string(), n, line));
    }
    NL_CHECK(r.digit >= 0 && r.digit <= 9, "speech-study: {} line {}: digit {} is not in 0..9", p.string(), n,
             r.digit);
    rows.push_back(std::move(r));
  }
  NL_CHECK(!rows.empty(), "speech-study: {} lists no clips", p.string());
  return rows;
}

FeatureMatrix study_features(const std::string& wav_path, int num_bins) {
  const Waveform w = read_wav(wav_path);  // int16 scale; float copies are scaled back by 32768
  FbankOptions o;
  o.frame_opts.dither = 0.0f;
  o.mel_opts.num_bins = num_bins;
  const Tensor t = ComputeFbank(o, w.samples, w.samp_freq);
  FeatureMatrix m{t.size(0), t.size(1), std::vector<float>(t.data(), t.data() + t.numel())};
  return m;
}

std::string run_speech_study(const StudyOptions& o) {
  using nlohmann::json;
  const auto t_start = Clock::now();
  auto log = [&](const std::string& s) {
    if (o.log) o.log(s);
  };
  NL_CHECK(!o.data_dir.empty(), "speech-study: --data DIR is required");
  NL_CHECK(o.seeds >= 1, "speech-study: --seeds must be ≥ 1, got {}", o.seeds);
  NL_CHECK(o.num_bins >= 1, "speech-study: num_bins must be ≥ 1, got {}", o.num_bins);
  NL_CHECK(std::isfinite(o.ln_eps) && o.ln_eps >= 0, "speech-study: ln_eps must be finite and ≥ 0");
  if (o.threads > 0) set_num_threads(o.threads);
  const std::filesystem::path root(o.data_dir);
  const std::vector<ManifestRow> rows = read_manifest(o.data_dir);

  // Sizes: quick runs use small deterministic subsets.
  const std::size_t max_test = o.quick ? 40 : 0, max_val = o.quick ? 60 : 0;
  const std::size_t max_train = o.max_train > 0 ? static_cast<std::size_t>(o.max_train) : (o.quick ? 200 : 0);
  const std::int64_t steps = o.steps > 0 ? o.steps : (o.quick ? 20 : 150);
  const std::int64_t batch = o.batch > 0 ? o.batch : (o.quick ? 8 : 32);
  const std::int64_t eval_every = o.eval_every > 0 ? o.eval_every : (o.quick ? 10 : 50);

  // Clean clips per split, and the corrupted copies of each clean test clip (matched by file name).
  std::map<std::string, std::vector<const ManifestRow*>> clean;
  std::map<std::string, std::map<std::string, const ManifestRow*>> corrupted_of;  // test file name → kind → row
  std::vector<std::string> kinds;  // corruption kinds in manifest order
  for (const ManifestRow& r : rows) {
    if (r.corruption == "clean") {
      clean[r.split].push_back(&r);
    } else {
      corrupted_of[std::filesystem::path(r.file).filename().string()][r.corruption] = &r;
      if (std::find(kinds.begin(), kinds.end(), r.corruption) == kinds.end()) kinds.push_back(r.corruption);
    }
  }
  // Order the kinds as the data set defines them; unknown kinds after.
  std::vector<std::string> ordered;
  for (const char* k : kCorruptions)
    if (std::find(kinds.begin(), kinds.end(), k) != kinds.end()) ordered.push_back(k);
  for (const std::string& k : kinds)
    if (std::find(ordered.begin(), ordered.end(), k) == ordered.end()) ordered.push_back(k);
  kinds = ordered;
  NL_CHECK(!clean["test"].empty(), "speech-study: {} has no clean test clips", o.data_dir);
  NL_CHECK(!kinds.empty(), "speech-study: {} has no corrupted test copies (was it made with --no-corrupt?)",
           o.data_dir);

  auto subset = [](std::vector<const ManifestRow*> v, std::size_t max) {
    if (max == 0 || v.size() <= max) return v;
    // Evenly spaced, so that a subset still covers every voice and digit.
    std::vector<const ManifestRow*> out;
    for (std::size_t i = 0; i < max; ++i) out.push_back(v[i * v.size() / max]);
    return out;
  };
  const std::vector<const ManifestRow*> test = subset(clean["test"], max_test);

  // ---- features -----------------------------------------------------------------------------------
  auto t0 = Clock::now();
  auto features_of = [&](const std::vector<const ManifestRow*>& v) {
    std::vector<FeatureMatrix> out;
    out.reserve(v.size());
    for (const ManifestRow* r : v) out.push_back(study_features((root / r->file).string(), o.num_bins));
    return out;
  };
  std::vector<FeatureMatrix> test_clean = features_of(test);
  std::map<std::string, std::vector<FeatureMatrix>> test_corrupt;
  for (const std::string& k : kinds) {
    std::vector<const ManifestRow*> v;
    for (const ManifestRow* r : test) {
      const auto it = corrupted_of.find(std::filesystem::path(r->file).filename().string());
      NL_CHECK(it != corrupted_of.end() && it->second.count(k), "speech-study: test clip {} has no '{}' copy",
               r->file, k);
      v.push_back(it->second.at(k));
    }
    test_corrupt[k] = features_of(v);
    for (std::size_t i = 0; i < v.size(); ++i)
      NL_CHECK(test_corrupt[k][i].frames == test_clean[i].frames,
               "speech-study: {} has {} frames but its clean clip {} has {}", v[i]->file, test_corrupt[k][i].frames,
               test[i]->file, test_clean[i].frames);
  }
  log(fmt::format("speech-study: features of {} test clips × ({} corruptions + clean) in {:.1f} s", test.size(),
                  kinds.size(), seconds_since(t0)));

  json out;
  out["config"] = {
      {"data", o.data_dir},
      {"quick", o.quick},
      {"num_bins", o.num_bins},
      {"dither", 0.0},
      {"ln_eps", o.ln_eps},
      {"cmvn", "per utterance; t-cmvn: means and variances (var floor 1e-20); t-cmn: means only"},
      {"residual", "mean over test utterances of sqrt(mean over cells of (N(clean) - N(corrupted))^2)"},
      {"test_utterances", test.size()},
  };

  // ---- (a) residuals ------------------------------------------------------------------------------
  t0 = Clock::now();
  {
    json res;
    std::vector<std::string> fe_names, rows_names = {"clean"};
    for (FrontEnd fe : o.residual_front_ends) fe_names.push_back(front_end_name(fe));
    for (const std::string& k : kinds) rows_names.push_back(k);
    res["front_ends"] = fe_names;
    res["corruptions"] = rows_names;
    res["utterances"] = test.size();
    json mean = json::object(), sd = json::object(), mx = json::object(), scale = json::object(),
         frame_median = json::object(), frame_p90 = json::object();
    for (FrontEnd fe : o.residual_front_ends) {
      const std::string name = front_end_name(fe);
      std::vector<FeatureMatrix> nclean;
      std::vector<double> spread;
      for (const FeatureMatrix& x : test_clean) {
        nclean.push_back(apply_front_end(fe, x, o.ln_eps));
        spread.push_back(cell_spread(nclean.back()));
      }
      scale[name] = mean_of(spread);
      for (const std::string& k : rows_names) {
        std::vector<double> d, med, p90;
        for (std::size_t i = 0; i < test_clean.size(); ++i) {
          const FeatureMatrix y = apply_front_end(fe, k == "clean" ? test_clean[i] : test_corrupt[k][i], o.ln_eps);
          d.push_back(rms_distance(nclean[i], y));
          const std::vector<double> fd = sorted_frame_distances(nclean[i], y);
          med.push_back(quantile_sorted(fd, 0.5));
          p90.push_back(quantile_sorted(fd, 0.9));
        }
        mean[k][name] = mean_of(d);
        sd[k][name] = sd_of(d);
        mx[k][name] = *std::max_element(d.begin(), d.end());
        frame_median[k][name] = mean_of(med);
        frame_p90[k][name] = mean_of(p90);
      }
    }
    res["mean"] = mean;
    res["sd"] = sd;
    res["max"] = mx;
    res["frame_median"] = frame_median;
    res["frame_p90"] = frame_p90;
    res["frame_note"] =
        "frame_median / frame_p90: mean over utterances of the median / 90th percentile over frames of the "
        "per-frame RMS distance (a residual confined to a few frames shows as a small median)";
    res["scale"] = scale;
    res["scale_note"] = "mean over clean test utterances of the RMS of N(clean) about its mean cell value";
    res["seconds"] = seconds_since(t0);
    out["residuals"] = res;
    log(fmt::format("speech-study: residuals for {} front ends in {:.1f} s", fe_names.size(), seconds_since(t0)));
  }

  // ---- (b) classifier -----------------------------------------------------------------------------
  json cls;
  cls["front_ends"] = json::array();
  for (FrontEnd fe : o.classifier_front_ends) cls["front_ends"].push_back(front_end_name(fe));
  std::vector<std::string> test_sets = {"clean"};
  for (const std::string& k : kinds) test_sets.push_back(k);
  cls["test_sets"] = test_sets;
  if (!o.classifier) {
    cls["status"] = "not run (--no-classifier)";
    out["classifier"] = cls;
  } else {
    t0 = Clock::now();
    const std::vector<const ManifestRow*> train = subset(clean["train"], max_train);
    const std::vector<const ManifestRow*> val = subset(clean["validation"], max_val);
    NL_CHECK(!train.empty() && !val.empty(), "speech-study: the classifier needs clean train and validation clips");
    const std::vector<FeatureMatrix> train_x = features_of(train), val_x = features_of(val);
    log(fmt::format("speech-study: features of {} train and {} validation clips in {:.1f} s", train.size(),
                    val.size(), seconds_since(t0)));
    Index max_frames = 1;
    for (const std::vector<FeatureMatrix>* v :
         std::initializer_list<const std::vector<FeatureMatrix>*>{&train_x, &val_x, &test_clean})
      for (const FeatureMatrix& x : *v) max_frames = std::max(max_frames, x.frames);

    nn::ModelConfig mc;
    mc.placement = nn::Placement::kPre;
    mc.head = nn::Head::kClassifier;
    mc.layers = o.layers, mc.d_model = o.d_model, mc.heads = o.heads, mc.ffn = o.ffn;
    mc.vocab = 0, mc.classes = 10, mc.input_dim = o.num_bins;
    mc.max_seq = static_cast<int>(max_frames);
    mc.causal = false;
    const nn::Schedule sched{nn::ScheduleKind::kCosine, o.lr, std::max<std::int64_t>(1, steps / 20), steps, 0.1};
    nn::validate(sched);
    cls["config"] = {
        {"model", "Pre-LN Transformer encoder, mean-pooled, bidirectional, sinusoidal positions, ReLU FFN"},
        {"layers", o.layers},
        {"d_model", o.d_model},
        {"heads", o.heads},
        {"ffn", o.ffn},
        {"input_dim", o.num_bins},
        {"classes", 10},
        {"max_seq", max_frames},
        {"optimizer", "AdamW beta=(0.9,0.98) eps=1e-9 wd=0"},
        {"lr", o.lr},
        {"schedule", fmt::format("linear warmup {} steps, cosine to 0.1x", sched.warmup)},
        {"clip", o.clip},
        {"steps", steps},
        {"batch", batch},
        {"eval_every", eval_every},
        {"selection", "best validation accuracy (ties: lower validation loss) among evaluations"},
        {"train_utterances", train.size()},
        {"validation_utterances", val.size()},
        {"test_utterances", test.size()},
        {"seeds", o.seeds},
    };

    json per_seed = json::array();
    std::map<std::string, std::map<std::string, std::vector<double>>> acc;  // fe → test set → per seed
    std::map<std::string, std::vector<double>> val_acc;
    for (FrontEnd fe : o.classifier_front_ends) {
      const std::string fe_name = front_end_name(fe);
      auto normalized = [&](const std::vector<FeatureMatrix>& v) {
        std::vector<FeatureMatrix> r;
        r.reserve(v.size());
        for (const FeatureMatrix& x : v) r.push_back(apply_front_end(fe, x, o.ln_eps));
        return r;
      };
      const std::vector<FeatureMatrix> ntrain = normalized(train_x), nval = normalized(val_x);
      std::map<std::string, std::vector<FeatureMatrix>> ntest;
      ntest["clean"] = normalized(test_clean);
      for (const std::string& k : kinds) ntest[k] = normalized(test_corrupt[k]);
      auto examples = [](const std::vector<FeatureMatrix>& x, const std::vector<const ManifestRow*>& r) {
        std::vector<Example> e;
        for (std::size_t i = 0; i < x.size(); ++i) e.push_back({&x[i], r[i]->digit});
        return e;
      };
      const std::vector<Example> train_set = examples(ntrain, train), val_set = examples(nval, val);

      for (int seed = 0; seed < o.seeds; ++seed) {
        const auto ts = Clock::now();
        mc.seed = static_cast<std::uint64_t>(seed);
        nn::Model model(mc);
        std::vector<nn::ParamRef> params = model.params();
        nn::AdamW opt(params, nn::AdamWOptions{});
        std::mt19937_64 rng(0x5eed0000ull + static_cast<std::uint64_t>(seed));  // same batches for every front end
        RunResult rr;
        std::vector<std::vector<float>> best(params.size());
        auto snapshot = [&] {
          for (std::size_t i = 0; i < params.size(); ++i)
            best[i].assign(params[i].data, params[i].data + params[i].numel());
        };
        snapshot();
        bool have_best = false;
        std::vector<std::vector<std::size_t>> batches;
        std::size_t next = 0;
        double loss_sum = 0;
        std::int64_t loss_n = 0;
        for (std::int64_t step = 0; step < steps; ++step) {
          if (next >= batches.size()) batches = epoch_batches(train_set, batch, rng), next = 0;
          const Batch b = make_batch(train_set, batches[next++], o.num_bins);
          const double loss = model.forward_frames(b.frames.data(), b.labels.data(), b.B, b.T, b.lengths);
          if (!std::isfinite(loss)) {
            rr.diverged = true;
            log(fmt::format("speech-study: [{} seed {}] diverged at step {}: loss = {}", fe_name, seed, step + 1, loss));
            break;
          }
          model.backward();
          nn::clip_grad_norm(params, o.clip);
          opt.step(nn::lr_at(sched, step));
          loss_sum += loss, ++loss_n;
          rr.steps = step + 1;
          if ((step + 1) % eval_every == 0 || step + 1 == steps) {
            const EvalResult v = evaluate(model, val_set, o.num_bins, 64);
            rr.val_curve.emplace_back(step + 1, v.accuracy);
            rr.final_train_loss = loss_sum / static_cast<double>(loss_n);
            if (!have_best || v.accuracy > rr.best_val_acc ||
                (v.accuracy == rr.best_val_acc && v.loss < rr.best_val_loss)) {
              have_best = true;
              rr.best_val_acc = v.accuracy, rr.best_val_loss = v.loss, rr.best_step = step + 1;
              snapshot();
            }
            log(fmt::format("speech-study: [{} seed {}] step {}/{} train loss {:.3f} val acc {:.3f} loss {:.3f} "
                            "({:.1f} s)",
                            fe_name, seed, step + 1, steps, rr.final_train_loss, v.accuracy, v.loss,
                            seconds_since(ts)));
            loss_sum = 0, loss_n = 0;
          }
        }
        for (std::size_t i = 0; i < params.size(); ++i) std::copy(best[i].begin(), best[i].end(), params[i].data);
        json tj = json::object();
        for (const std::string& s : test_sets) {
          const EvalResult r = evaluate(model, examples(ntest[s], test), o.num_bins, 64);
          rr.test_acc[s] = r.accuracy;
          tj[s] = r.accuracy;
          acc[fe_name][s].push_back(r.accuracy);
        }
        val_acc[fe_name].push_back(rr.best_val_acc);
        rr.seconds = seconds_since(ts);
        json curve = json::array();
        for (const auto& [st, a] : rr.val_curve) curve.push_back({st, a});
        per_seed.push_back({{"front_end", fe_name},
                            {"seed", seed},
                            {"steps", rr.steps},
                            {"diverged", rr.diverged},
                            {"best_step", rr.best_step},
                            {"val_acc", rr.best_val_acc},
                            {"val_loss", rr.best_val_loss},
                            {"val_curve", curve},
                            {"test_acc", tj},
                            {"seconds", rr.seconds}});
        std::string line = fmt::format("speech-study: [{} seed {}] best step {} val {:.3f}; test", fe_name, seed,
                                       rr.best_step, rr.best_val_acc);
        for (const std::string& s : test_sets) line += fmt::format(" {} {:.3f}", s, rr.test_acc[s]);
        log(line + fmt::format(" ({:.1f} s)", rr.seconds));
      }
    }
    json summary = json::object();
    for (FrontEnd fe : o.classifier_front_ends) {
      const std::string n = front_end_name(fe);
      summary[n]["val"] = {{"mean", mean_of(val_acc[n])}, {"sd", sd_of(val_acc[n])}};
      for (const std::string& s : test_sets)
        summary[n][s] = {{"mean", mean_of(acc[n][s])}, {"sd", sd_of(acc[n][s])}, {"values", acc[n][s]}};
    }
    cls["status"] = "run";
    cls["per_seed"] = per_seed;
    cls["summary"] = summary;
    cls["summary_note"] = "accuracy: mean and sample sd (n-1) over seeds";
    cls["seconds"] = seconds_since(t0);
    out["classifier"] = cls;
  }
  out["seconds"] = seconds_since(t_start);
  return out.dump(2);
}

}  // namespace normlab::speech
