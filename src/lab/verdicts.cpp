// The lab's verdict rules (see verdicts.h).
#include "lab/verdicts.h"

#include <fmt/format.h>
#include <normlab/error.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

namespace normlab::lab {

namespace {

constexpr const Thresholds& T = kThresholds;

std::string num(double v) { return std::isfinite(v) ? fmt::format("{:.4g}", v) : (std::isnan(v) ? "nan" : "inf"); }

std::string outcomes_str(const std::vector<SeedOutcome>& o) {
  int full = 0, corr = 0, fail = 0;
  for (SeedOutcome s : o) (s == SeedOutcome::kFull ? full : s == SeedOutcome::kCorrected ? corr : fail) += 1;
  return fmt::format("seeds: {} full, {} corrected, {} failed", full, corr, fail);
}

// A final loss that is NaN/inf (diverged) counts as not trained and as stuck.
bool stuck(double v, double u) { return !std::isfinite(v) || v >= u - T.stuck_margin; }
bool trained(double v, double u) { return std::isfinite(v) && v <= u - T.trained_margin; }

}  // namespace

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kReproduced: return "reproduced";
    case Verdict::kReproducedWithCorrection: return "reproduced-with-correction";
    case Verdict::kNotReproduced: return "not-reproduced";
    case Verdict::kInconclusive: return "inconclusive";
  }
  return "inconclusive";
}

Verdict parse_verdict(const std::string& s) {
  for (Verdict v : {Verdict::kReproduced, Verdict::kReproducedWithCorrection, Verdict::kNotReproduced,
                    Verdict::kInconclusive})
    if (s == verdict_name(v)) return v;
  throw Error(fmt::format("unknown verdict '{}'", s));
}

Verdict aggregate_seeds(const std::vector<SeedOutcome>& o) {
  if (o.empty()) return Verdict::kInconclusive;
  const auto all = [&](auto pred) { return std::all_of(o.begin(), o.end(), pred); };
  if (all([](SeedOutcome s) { return s == SeedOutcome::kFull; })) return Verdict::kReproduced;
  if (all([](SeedOutcome s) { return s != SeedOutcome::kFail; })) return Verdict::kReproducedWithCorrection;
  if (all([](SeedOutcome s) { return s == SeedOutcome::kFail; })) return Verdict::kNotReproduced;
  return Verdict::kInconclusive;
}

RuleResult rule_claim1(const Claim1Input& in) {
  RuleResult r;
  r.rule = "every worked-example value (y, mean, rstd) within 1e-6 of the hand-computed answer and every exercise "
           "check passes → reproduced; any check fails → not-reproduced; no checks → inconclusive";
  if (in.checks <= 0) {
    r.reason = "no checks ran";
    return r;
  }
  r.verdict = in.failed == 0 ? Verdict::kReproduced : Verdict::kNotReproduced;
  r.reason = fmt::format("{} of {} checks passed", in.checks - in.failed, in.checks);
  return r;
}

RuleResult rule_claim2(const std::vector<Claim2Seed>& seeds) {
  RuleResult r;
  r.rule = fmt::format(
      "per seed: LayerNorm invariant (max |Δ| ≤ {:g} when the batch shrinks from 64 to 2 and when zero padding is "
      "added) and BatchNorm dependent (max |Δ| ≥ {:g} for the batch change and for the padding) → full, and the "
      "special case (batch 1, one channel over the features) coinciding within {:g} keeps it full; the special case "
      "failing → corrected; LayerNorm not invariant or BatchNorm not dependent → failed",
      T.c2_invariant, T.c2_depends, T.c2_coincide);
  std::vector<SeedOutcome> out;
  std::string detail;
  for (const Claim2Seed& s : seeds) {
    const bool ln_ok = s.ln_batch <= T.c2_invariant && s.ln_pad <= T.c2_invariant;
    const bool bn_dep = s.bn_batch >= T.c2_depends && s.bn_pad >= T.c2_depends;
    SeedOutcome o = SeedOutcome::kFail;
    if (ln_ok && bn_dep) o = s.special <= T.c2_coincide ? SeedOutcome::kFull : SeedOutcome::kCorrected;
    out.push_back(o);
    detail += fmt::format("{}seed {}: LN Δbatch {} Δpad {}; BN Δbatch {} Δpad {} train/eval {}; batch-1 BN vs LN {}",
                          detail.empty() ? "" : "; ", s.seed, num(s.ln_batch), num(s.ln_pad), num(s.bn_batch),
                          num(s.bn_pad), num(s.bn_train_eval), num(s.special));
  }
  r.verdict = aggregate_seeds(out);
  r.reason = out.empty() ? "no measurements" : detail + " — " + outcomes_str(out);
  return r;
}

double loglog_slope(const std::vector<double>& x, const std::vector<double>& y) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (x.size() != y.size() || x.size() < 2) return nan;
  std::vector<double> lx, ly;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!(x[i] > 0) || !(y[i] > 0) || !std::isfinite(x[i]) || !std::isfinite(y[i])) return nan;
    lx.push_back(std::log(x[i]));
    ly.push_back(std::log(y[i]));
  }
  const double n = static_cast<double>(lx.size());
  const double mx = std::accumulate(lx.begin(), lx.end(), 0.0) / n, my = std::accumulate(ly.begin(), ly.end(), 0.0) / n;
  double sxy = 0, sxx = 0;
  for (std::size_t i = 0; i < lx.size(); ++i) {
    sxy += (lx[i] - mx) * (ly[i] - my);
    sxx += (lx[i] - mx) * (lx[i] - mx);
  }
  return sxx > 0 ? sxy / sxx : nan;
}

RuleResult rule_claim4(const std::vector<GradSeed>& seeds) {
  RuleResult r;
  r.rule = fmt::format(
      "r = ‖∂L/∂x_1‖ / ‖∂L/∂x_L‖ at initialization at the deepest depth, per seed (x_l: block l's residual-stream "
      "input; ‖·‖ the mean over tokens; Model::input_grad_norms). Identity path: Pre-LN r ≥ {} and Post-LN r < {} → "
      "full; Post-LN r < Pre-LN r otherwise → corrected; else failed. All seeds full → reproduced; all "
      "full-or-corrected → reproduced-with-correction; all failed → not-reproduced; mixed → inconclusive",
      T.c4_pre_min_ratio, T.c4_post_max_ratio);
  std::vector<SeedOutcome> out;
  std::string detail;
  for (const GradSeed& s : seeds) {
    if (s.post.empty() || s.pre.empty()) continue;
    const GradProfile &po = s.post.back(), &pr = s.pre.back();
    if (po.dx.empty() || pr.dx.empty()) continue;
    const double rpo = po.dx.front() / po.dx.back(), rpr = pr.dx.front() / pr.dx.back();
    SeedOutcome o = SeedOutcome::kFail;
    if (rpr >= T.c4_pre_min_ratio && rpo < T.c4_post_max_ratio)
      o = SeedOutcome::kFull;
    else if (rpo < rpr)
      o = SeedOutcome::kCorrected;
    out.push_back(o);
    detail += fmt::format("{}seed {} (L={}): r_pre {}, r_post {}", detail.empty() ? "" : "; ", s.seed, po.layers,
                          num(rpr), num(rpo));
  }
  r.verdict = aggregate_seeds(out);
  r.reason = out.empty() ? "no measurements" : detail + " — " + outcomes_str(out);
  return r;
}

RuleResult rule_claim5(const std::vector<GradSeed>& seeds) {
  RuleResult r;
  r.rule = fmt::format(
      "per seed, over depths L: (a) Post-LN's ‖∇W_ffn2‖(layer L) / ‖∇W_ffn2‖(layer 1) > 1 at every depth and "
      "increasing with depth; (b) Pre-LN's last-layer ‖∇W_ffn2‖ ∝ L^s with s (log-log least squares) in [{}, {}]. "
      "(a) and (b) → full; (a) and s < {} → corrected (shrinks with another exponent); else failed. All seeds "
      "full → reproduced; all full-or-corrected → reproduced-with-correction; all failed → not-reproduced; "
      "mixed or fewer than 2 depths → inconclusive",
      T.c5_slope_lo, T.c5_slope_hi, T.c5_slope_shrinks);
  std::vector<SeedOutcome> out;
  std::string detail;
  for (const GradSeed& s : seeds) {
    if (s.post.size() < 2 || s.pre.size() != s.post.size()) continue;
    bool a = true;
    double prev = 0;
    std::string ratios;
    for (const GradProfile& p : s.post) {
      const double q = p.ffn2.empty() ? std::numeric_limits<double>::quiet_NaN() : p.ffn2.back() / p.ffn2.front();
      ratios += fmt::format("{}L={}:{}", ratios.empty() ? "" : ",", p.layers, num(q));
      if (!(q > 1) || !(q > prev)) a = false;
      prev = q;
    }
    std::vector<double> depth, last;
    for (const GradProfile& p : s.pre) {
      depth.push_back(p.layers);
      last.push_back(p.ffn2.empty() ? std::numeric_limits<double>::quiet_NaN() : p.ffn2.back());
    }
    const double slope = loglog_slope(depth, last);
    SeedOutcome o = SeedOutcome::kFail;
    if (a && slope >= T.c5_slope_lo && slope <= T.c5_slope_hi)
      o = SeedOutcome::kFull;
    else if (a && slope < T.c5_slope_shrinks)
      o = SeedOutcome::kCorrected;
    out.push_back(o);
    detail += fmt::format("{}seed {}: Post last/first {}; Pre last-layer slope {}", detail.empty() ? "" : "; ", s.seed,
                          ratios, num(slope));
  }
  r.verdict = aggregate_seeds(out);
  r.reason = out.empty() ? "fewer than 2 depths measured" : detail + " — " + outcomes_str(out);
  return r;
}

RuleResult rule_claim6(const std::vector<Claim6Seed>& seeds) {
  RuleResult r;
  r.rule = fmt::format(
      "final validation loss vs the unigram level U, per seed: controls (Post-LN with warmup, Pre-LN without) "
      "must train (≤ U − {}) in every seed, else inconclusive. Then Post-LN without warmup stuck (≥ U − {}, or "
      "diverged) in every seed → reproduced; in some seeds → reproduced-with-correction; in none → "
      "not-reproduced",
      T.trained_margin, T.stuck_margin);
  if (seeds.empty()) {
    r.reason = "no runs";
    return r;
  }
  int stuck_n = 0;
  bool controls = true;
  std::string detail;
  for (const Claim6Seed& s : seeds) {
    const bool st = stuck(s.post_nowarmup, s.unigram);
    stuck_n += st ? 1 : 0;
    controls = controls && trained(s.post_warmup, s.unigram) && trained(s.pre_nowarmup, s.unigram);
    detail += fmt::format("{}seed {}: U {} Post-no-warmup {} Post-warmup {} Pre-no-warmup {}",
                          detail.empty() ? "" : "; ", s.seed, num(s.unigram), num(s.post_nowarmup),
                          num(s.post_warmup), num(s.pre_nowarmup));
  }
  const int n = static_cast<int>(seeds.size());
  if (!controls)
    r.verdict = Verdict::kInconclusive, r.reason = "a control arm did not train: ";
  else if (stuck_n == n)
    r.verdict = Verdict::kReproduced, r.reason = fmt::format("Post-LN without warmup stuck in {}/{} seeds: ", stuck_n, n);
  else if (stuck_n > 0)
    r.verdict = Verdict::kReproducedWithCorrection,
    r.reason = fmt::format("Post-LN without warmup stuck in only {}/{} seeds: ", stuck_n, n);
  else
    r.verdict = Verdict::kNotReproduced, r.reason = fmt::format("Post-LN without warmup trained in every seed: ");
  r.reason += detail;
  return r;
}

RuleResult rule_claim7(const std::vector<Claim7Seed>& seeds) {
  RuleResult r;
  r.rule = fmt::format(
      "paired per seed, d = val(Post-LN) − val(Pre-LN) at the end of the same schedule; both arms must train "
      "(≤ U − {}) in every seed, else inconclusive. d < −{} in every seed → reproduced; d > +{} in every seed → "
      "not-reproduced; otherwise (mixed signs or ties) → inconclusive",
      T.trained_margin, T.c7_tie, T.c7_tie);
  if (seeds.empty()) {
    r.reason = "no runs";
    return r;
  }
  int better = 0, worse = 0;
  bool ok = true;
  double sum = 0;
  std::string detail;
  for (const Claim7Seed& s : seeds) {
    const double d = s.post - s.pre;
    ok = ok && trained(s.post, s.unigram) && trained(s.pre, s.unigram);
    better += d < -T.c7_tie ? 1 : 0;
    worse += d > T.c7_tie ? 1 : 0;
    sum += d;
    detail += fmt::format("{}seed {}: d {}", detail.empty() ? "" : "; ", s.seed, num(d));
  }
  const int n = static_cast<int>(seeds.size());
  r.reason = fmt::format("mean d {} ({}); Post better in {}/{}, worse in {}/{}", num(sum / n), detail, better, n, worse, n);
  if (!ok)
    r.verdict = Verdict::kInconclusive, r.reason = "an arm did not train; " + r.reason;
  else if (better == n)
    r.verdict = Verdict::kReproduced;
  else if (worse == n)
    r.verdict = Verdict::kNotReproduced;
  else
    r.verdict = Verdict::kInconclusive;
  return r;
}

double deep_skip_mean(const std::vector<double>& skip) {
  if (skip.empty()) return std::numeric_limits<double>::quiet_NaN();
  const std::size_t L = skip.size(), first = L - (L + 1) / 2;
  double s = 0;
  for (std::size_t l = first; l < L; ++l) s += skip[l];
  return s / static_cast<double>(L - first);
}

RuleResult rule_claim8(const std::vector<Claim8Seed>& seeds) {
  RuleResult r;
  r.rule = fmt::format(
      "per seed (Pre-LN and Post-LN trained with the same schedule), D = mean validation-loss increase when "
      "skipping each one of the last ⌈L/2⌉ blocks alone; both arms must train (≤ U − {}), else inconclusive. "
      "D_pre ≤ {} × D_post → full; D_pre < D_post → corrected; else failed. All seeds full → reproduced; all "
      "full-or-corrected → reproduced-with-correction; all failed → not-reproduced; mixed → inconclusive",
      T.trained_margin, T.c8_max_ratio);
  std::vector<SeedOutcome> out;
  bool ok = !seeds.empty();
  std::string detail;
  for (const Claim8Seed& s : seeds) {
    ok = ok && trained(s.pre_full, s.unigram) && trained(s.post_full, s.unigram);
    const double dpre = deep_skip_mean(s.pre_skip), dpost = deep_skip_mean(s.post_skip);
    SeedOutcome o = SeedOutcome::kFail;
    if (dpre <= T.c8_max_ratio * dpost)
      o = SeedOutcome::kFull;
    else if (dpre < dpost)
      o = SeedOutcome::kCorrected;
    out.push_back(o);
    detail += fmt::format("{}seed {}: D_pre {} D_post {}", detail.empty() ? "" : "; ", s.seed, num(dpre), num(dpost));
  }
  if (!ok) {
    r.reason = seeds.empty() ? "no runs" : "an arm did not train; " + detail;
    return r;
  }
  r.verdict = aggregate_seeds(out);
  r.reason = detail + " — " + outcomes_str(out);
  return r;
}

RuleResult rule_claim9(const std::vector<Claim9Seed>& seeds) {
  RuleResult r;
  r.rule = fmt::format(
      "per seed, over the arms that trained and their layers: max final mean pairwise token cosine ≥ {} → full "
      "(collapse); else max rise (final − init, same layer) ≥ {} → corrected (similarity grows, no collapse); else "
      "failed. All seeds full → reproduced; all full-or-corrected → reproduced-with-correction; all failed → "
      "not-reproduced; mixed or no trained arm → inconclusive",
      T.c9_collapse, T.c9_rise);
  std::vector<SeedOutcome> out;
  std::string detail;
  for (const Claim9Seed& s : seeds) {
    double best = -2, rise = -2;
    std::string where;
    bool any = false;
    for (const Claim9Arm& a : s.arms) {
      if (!a.trained) continue;
      any = true;
      for (std::size_t l = 0; l < a.cos_final.size(); ++l) {
        if (a.cos_final[l] > best) best = a.cos_final[l], where = fmt::format("{} layer {}", a.arm, l + 1);
        if (l < a.cos_init.size()) rise = std::max(rise, a.cos_final[l] - a.cos_init[l]);
      }
    }
    if (!any) continue;
    out.push_back(best >= T.c9_collapse ? SeedOutcome::kFull
                  : rise >= T.c9_rise  ? SeedOutcome::kCorrected
                                       : SeedOutcome::kFail);
    detail += fmt::format("{}seed {}: max final cosine {} ({}), max rise {}", detail.empty() ? "" : "; ", s.seed,
                          num(best), where, num(rise));
  }
  r.verdict = aggregate_seeds(out);
  r.reason = out.empty() ? "no trained arm" : detail + " — " + outcomes_str(out);
  return r;
}

RuleResult rule_claim3(const Claim3Input& in) {
  RuleResult r;
  r.rule = fmt::format(
      "feature residuals (mean over test utterances of the per-cell RMS distance between N(clean) and "
      "N(corrupted)) for N = F-LN and T-CMVN: constant gain (largest over ±20/±40 dB) ≤ {:g} for both, "
      "segment-gain residual of F-LN ≤ {:g} × that of T-CMVN, and channel residual of T-CMVN ≤ {:g} × that of "
      "F-LN → reproduced; segment-gain F-LN > T-CMVN or channel T-CMVN > F-LN (a direction reversed) → "
      "not-reproduced; otherwise (or a value missing) → inconclusive",
      T.c3_gain_max, T.c3_ratio, T.c3_ratio);
  const double v[] = {in.gain_fln, in.gain_tcmvn, in.seg_fln, in.seg_tcmvn, in.ch_fln, in.ch_tcmvn};
  r.reason = fmt::format(
      "constant gain: F-LN {}, T-CMVN {}; segment-gain: F-LN {}, T-CMVN {} (ratio {}); channel: T-CMVN {}, F-LN {} "
      "(ratio {})",
      num(in.gain_fln), num(in.gain_tcmvn), num(in.seg_fln), num(in.seg_tcmvn), num(in.seg_fln / in.seg_tcmvn),
      num(in.ch_tcmvn), num(in.ch_fln), num(in.ch_tcmvn / in.ch_fln));
  if (!std::all_of(std::begin(v), std::end(v), [](double x) { return std::isfinite(x) && x >= 0; })) {
    r.verdict = Verdict::kInconclusive;
    r.reason = "a residual is missing or not finite; " + r.reason;
    return r;
  }
  const bool gain = in.gain_fln <= T.c3_gain_max && in.gain_tcmvn <= T.c3_gain_max;
  const bool seg = in.seg_fln <= T.c3_ratio * in.seg_tcmvn;
  const bool ch = in.ch_tcmvn <= T.c3_ratio * in.ch_fln;
  if (in.seg_fln > in.seg_tcmvn || in.ch_tcmvn > in.ch_fln)
    r.verdict = Verdict::kNotReproduced;
  else if (gain && seg && ch)
    r.verdict = Verdict::kReproduced;
  else
    r.verdict = Verdict::kInconclusive;
  return r;
}

double linear_r2(const std::vector<double>& x, const std::vector<double>& y) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (x.size() != y.size() || x.size() < 3) return nan;
  const double n = static_cast<double>(x.size());
  const double mx = std::accumulate(x.begin(), x.end(), 0.0) / n, my = std::accumulate(y.begin(), y.end(), 0.0) / n;
  double sxy = 0, sxx = 0, syy = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i]) || !std::isfinite(y[i])) return nan;
    sxy += (x[i] - mx) * (y[i] - my), sxx += (x[i] - mx) * (x[i] - mx), syy += (y[i] - my) * (y[i] - my);
  }
  return sxx > 0 && syy > 0 ? sxy * sxy / (sxx * syy) : nan;
}

RuleResult rule_residual_growth(const std::vector<GradSeed>& seeds) {
  RuleResult r;
  r.rule = fmt::format(
      "residual-stream norms ‖x_l‖ after each block at initialization, deepest depth, per seed: Post-LN flat "
      "(max_l ‖x_l‖ / min_l ‖x_l‖ ≤ {}) and Pre-LN growing linearly (‖x_L‖² / ‖x_1‖² ≥ {} and a least-squares "
      "line of ‖x_l‖² on l with R² ≥ {}) → full; Post-LN flat and Pre-LN growing but not linearly → corrected; "
      "else failed. All seeds full → reproduced; all full-or-corrected → reproduced-with-correction; all failed → "
      "not-reproduced; mixed → inconclusive",
      T.c10_flat, T.c10_growth, T.c10_linear_r2);
  std::vector<SeedOutcome> out;
  std::string detail;
  for (const GradSeed& s : seeds) {
    if (s.post.empty() || s.pre.empty()) continue;
    const std::vector<double>&po = s.post.back().resid, &pr = s.pre.back().resid;
    if (po.size() < 3 || pr.size() < 3) continue;
    const auto [lo, hi] = std::minmax_element(po.begin(), po.end());
    const double spread = *hi / *lo;
    std::vector<double> l, sq;
    for (std::size_t i = 0; i < pr.size(); ++i) l.push_back(static_cast<double>(i + 1)), sq.push_back(pr[i] * pr[i]);
    const double growth = sq.back() / sq.front(), r2 = linear_r2(l, sq);
    const bool flat = spread <= T.c10_flat, grows = growth >= T.c10_growth;
    SeedOutcome o = SeedOutcome::kFail;
    if (flat && grows) o = r2 >= T.c10_linear_r2 ? SeedOutcome::kFull : SeedOutcome::kCorrected;
    out.push_back(o);
    detail += fmt::format("{}seed {} (L={}): Post max/min {}; Pre ‖x_L‖²/‖x_1‖² {}, R² {}", detail.empty() ? "" : "; ",
                          s.seed, s.post.back().layers, num(spread), num(growth), num(r2));
  }
  r.verdict = aggregate_seeds(out);
  r.reason = out.empty() ? "no measurements" : detail + " — " + outcomes_str(out);
  return r;
}

RuleResult rule_variants(const std::vector<VariantRun>& runs) {
  RuleResult r;
  r.rule = fmt::format(
      "final validation loss vs the unigram level U, constant learning rate, no warmup, at every depth: the "
      "controls must show the warmup problem (Post-LN stuck, ≥ U − {}, or diverged; Pre-LN trained, ≤ U − {}) at "
      "every depth, else inconclusive. Every variant trained at every depth → reproduced; some → "
      "reproduced-with-correction (the reason names those that did not); none → not-reproduced",
      T.stuck_margin, T.trained_margin);
  std::map<std::string, std::vector<const VariantRun*>> by;
  for (const VariantRun& v : runs) by[v.variant].push_back(&v);
  if (!by.count("post") || !by.count("pre") || by.size() < 3) {
    r.reason = "controls or variants missing";
    return r;
  }
  bool controls = true;
  std::string ctl;
  for (const VariantRun* v : by["post"]) {
    controls = controls && stuck(v->final_val, v->unigram);
    ctl += fmt::format("{}post L={} {}", ctl.empty() ? "" : ", ", v->layers, num(v->final_val));
  }
  for (const VariantRun* v : by["pre"]) {
    controls = controls && trained(v->final_val, v->unigram);
    ctl += fmt::format(", pre L={} {}", v->layers, num(v->final_val));
  }
  std::string ok, failed;
  int n_ok = 0, n = 0;
  for (const auto& [name, vs] : by) {
    if (name == "post" || name == "pre") continue;
    ++n;
    bool all = true;
    std::string d;
    for (const VariantRun* v : vs) {
      all = all && trained(v->final_val, v->unigram);
      d += fmt::format("{}L={} {}", d.empty() ? "" : " ", v->layers, num(v->final_val));
    }
    (all ? ok : failed) += fmt::format("{}{} ({})", (all ? ok : failed).empty() ? "" : ", ", name, d);
    n_ok += all ? 1 : 0;
  }
  const std::string detail = fmt::format("controls: {}; trained at every depth: {}; not: {}", ctl,
                                         ok.empty() ? "none" : ok, failed.empty() ? "none" : failed);
  if (!controls) {
    r.reason = "the controls do not show the warmup problem; " + detail;
    return r;
  }
  r.verdict = n_ok == n ? Verdict::kReproduced : n_ok > 0 ? Verdict::kReproducedWithCorrection : Verdict::kNotReproduced;
  r.reason = fmt::format("{}/{} variants trained without warmup at every depth; ", n_ok, n) + detail;
  return r;
}

long warmup_threshold(const std::vector<WarmupRun>& runs, int layers) {
  long best = -1;
  for (const WarmupRun& w : runs)
    if (w.layers == layers && trained(w.final_val, w.unigram) && (best < 0 || w.warmup < best)) best = w.warmup;
  return best;
}

RuleResult rule_warmup_depth(const std::vector<WarmupRun>& runs) {
  RuleResult r;
  r.rule = fmt::format(
      "Post-LN, the same learning rate and steps at every depth: the threshold w*(L) is the smallest warmup of the "
      "grid whose run trains (≤ U − {}), ∞ when none does. Every w* = ∞ → inconclusive (the grid is too short). "
      "w* non-decreasing in L and w*(deepest) > w*(shallowest) → reproduced; w*(deepest) > w*(shallowest) but not "
      "monotone → reproduced-with-correction; otherwise (equal or smaller at the deepest depth) → not-reproduced",
      T.trained_margin);
  std::vector<int> depths;
  for (const WarmupRun& w : runs)
    if (std::find(depths.begin(), depths.end(), w.layers) == depths.end()) depths.push_back(w.layers);
  std::sort(depths.begin(), depths.end());
  if (depths.size() < 2) {
    r.reason = "fewer than 2 depths";
    return r;
  }
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> th;
  std::string detail;
  for (int L : depths) {
    const long w = warmup_threshold(runs, L);
    th.push_back(w < 0 ? kInf : static_cast<double>(w));
    std::string vals;
    for (const WarmupRun& x : runs)
      if (x.layers == L) vals += fmt::format("{}w{}:{}", vals.empty() ? "" : " ", x.warmup, num(x.final_val));
    detail += fmt::format("{}L={}: w* {} ({})", detail.empty() ? "" : "; ", L, w < 0 ? "∞" : std::to_string(w), vals);
  }
  r.reason = detail;
  if (std::all_of(th.begin(), th.end(), [](double v) { return std::isinf(v); })) {
    r.reason = "no warmup of the grid trains at any depth; " + detail;
    return r;
  }
  const bool grows = th.back() > th.front();
  const bool monotone = std::is_sorted(th.begin(), th.end());
  r.verdict = grows && monotone ? Verdict::kReproduced : grows ? Verdict::kReproducedWithCorrection : Verdict::kNotReproduced;
  return r;
}

RuleResult rule_not_measured(const std::string& why) {
  return {Verdict::kInconclusive, "not yet measured: no verdict until the experiment runs", why};
}

}  // namespace normlab::lab
