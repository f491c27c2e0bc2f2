// The lab's verdict rules (docs/LAB.md): pure functions from measured numbers to a verdict, with every
// threshold in one place (struct Thresholds / kThresholds). Each rule also returns its exact text with the
// thresholds filled in, and a one-line reason naming the numbers that decided it.
//
// Verdicts: reproduced · reproduced-with-correction (the claim holds in a weaker or corrected form, said
// in the reason) · not-reproduced · inconclusive (the measurement cannot decide: seeds disagree, a control
// arm did not train, too few depths, or the experiment is not measured yet).
//
// Most rules classify each seed as kFull / kCorrected / kFail and aggregate with aggregate_seeds():
// every seed full → reproduced; every seed full-or-corrected → reproduced-with-correction; every seed
// fail → not-reproduced; anything else (seeds disagree, or no seed) → inconclusive.
#pragma once

#include <string>
#include <vector>

namespace normlab::lab {

enum class Verdict { kReproduced, kReproducedWithCorrection, kNotReproduced, kInconclusive };
const char* verdict_name(Verdict v);      // "reproduced", "reproduced-with-correction", ...
Verdict parse_verdict(const std::string& s);  // throws normlab::Error for an unknown name

struct RuleResult {
  Verdict verdict = Verdict::kInconclusive;
  std::string rule;    // the exact rule, thresholds included
  std::string reason;  // the numbers that decided it
};

// Every threshold of every rule.
struct Thresholds {
  // claim 1: worked examples — every value within the check's own tolerance (1e-6, fp32 output).
  // claim 2 (kernel level): max |Δ output| of the same real values when the batch or the padding changes.
  double c2_invariant = 1e-6;  // LayerNorm: unchanged (fp32 rounding)
  double c2_depends = 1e-3;    // BatchNorm: changes by at least this
  double c2_coincide = 1e-5;   // batch 1, one channel over the features: BN = LN
  // claim 3: feature residuals sqrt(mean_{t,f} (N(clean) − N(corrupted))²), mean over test utterances.
  double c3_gain_max = 1e-3;  // a constant gain: removed by both F-LN and T-CMVN (residual ≤ this)
  double c3_ratio = 0.5;      // segment gain: F-LN ≤ 0.5 × T-CMVN; channel: T-CMVN ≤ 0.5 × F-LN
  // claim 4: r = ‖∂L/∂x_1‖ / ‖∂L/∂x_L‖ at the deepest depth (x_l: block l's residual-stream input).
  double c4_pre_min_ratio = 0.5;   // Pre-LN: the input-side block keeps at least half the output side's
  double c4_post_max_ratio = 0.5;  // Post-LN: the input-side block gets less than half
  // claim 5: Pre-LN's last-layer ‖∇W_ffn2‖ ∝ L^slope.
  double c5_slope_lo = -0.75, c5_slope_hi = -0.25;  // "like 1/√L"
  double c5_slope_shrinks = -0.1;                   // shrinks at all (correction: another exponent)
  // claims 6–9: "stuck" and "trained" relative to the unigram (byte-frequency) validation loss U.
  double stuck_margin = 0.05;   // stuck: val ≥ U − 0.05
  double trained_margin = 0.5;  // trained: val ≤ U − 0.5
  // claim 7: paired difference d = val(Post) − val(Pre); |d| ≤ tie is a tie.
  double c7_tie = 0.002;
  // claim 8: mean loss increase when skipping each deep block (last ⌈L/2⌉), Pre vs Post.
  double c8_max_ratio = 0.5;  // Pre's increase ≤ 0.5 × Post's
  // claim 9: mean pairwise token cosine.
  double c9_collapse = 0.9;  // collapse
  double c9_rise = 0.1;      // rises over training (correction: similarity grows, no collapse)
  // experiment 10: residual-stream norms ‖x_l‖ after each block at initialization, deepest depth.
  double c10_flat = 1.1;        // Post-LN flat: max_l ‖x_l‖ / min_l ‖x_l‖ ≤ 1.1
  double c10_growth = 1.5;      // Pre-LN grows: ‖x_L‖² / ‖x_1‖² ≥ 1.5
  double c10_linear_r2 = 0.95;  // Pre-LN linear: least-squares fit of ‖x_l‖² on l with R² ≥ 0.95
};
inline constexpr Thresholds kThresholds{};

enum class SeedOutcome { kFull, kCorrected, kFail };
Verdict aggregate_seeds(const std::vector<SeedOutcome>& outcomes);

// ---- claim 1 ---------------------------------------------------------------------------------------
struct Claim1Input {
  int checks = 0;  // worked-example and exercise checks
  int failed = 0;
};
RuleResult rule_claim1(const Claim1Input& in);

// ---- claim 2: LayerNorm vs BatchNorm (kernel level) ---------------------------------------------------
struct Claim2Seed {
  int seed = 0;
  double ln_batch = 0, bn_batch = 0;  // output of the same sample in a batch of 64 vs its first 2
  double ln_pad = 0, bn_pad = 0;      // output at the real frames, padded (max over fractions) vs unpadded
  double bn_train_eval = 0;           // BatchNorm train-mode vs eval-mode output, batch-2 running statistics
  double special = 0;                 // batch 1, layout [1, 1, C]: BatchNorm vs LayerNorm
};
RuleResult rule_claim2(const std::vector<Claim2Seed>& seeds);

// ---- claim 3: F- vs T-normalization of speech features (speech-study part (a)) ----------------------------
// Mean residuals over the test utterances; gain_* is the largest over the constant-gain corruptions.
struct Claim3Input {
  double gain_fln = 0, gain_tcmvn = 0;  // gain±20dB, gain±40dB
  double seg_fln = 0, seg_tcmvn = 0;    // segment-gain
  double ch_fln = 0, ch_tcmvn = 0;      // channel
};
RuleResult rule_claim3(const Claim3Input& in);

// ---- claims 4 and 5: gradients at initialization -----------------------------------------------------
// One seed of one placement at one depth: per-layer values from the input side.
struct GradProfile {
  int layers = 0;
  std::vector<double> ffn2;   // ‖∇W_ffn2‖ per layer
  std::vector<double> block;  // ‖∇θ‖ of all of the block's parameters, per layer
  std::vector<double> dx;     // ‖∂L/∂x_l‖ (block l's residual-stream input; mean over tokens), per layer
  std::vector<double> resid;  // ‖x_l‖ after block l (mean over tokens), per layer
};
// For each seed: the profiles at each depth (ascending depth), for Post-LN and Pre-LN.
struct GradSeed {
  int seed = 0;
  std::vector<GradProfile> post, pre;
};
RuleResult rule_claim4(const std::vector<GradSeed>& seeds);
RuleResult rule_claim5(const std::vector<GradSeed>& seeds);
// Least-squares slope of log(y) against log(x) (NaN when fewer than 2 points or a value ≤ 0).
double loglog_slope(const std::vector<double>& x, const std::vector<double>& y);

// ---- claim 6: warmup ---------------------------------------------------------------------------------
struct Claim6Seed {
  int seed = 0;
  double unigram = 0;         // U: the validation loss of a byte-frequency model
  double post_nowarmup = 0;   // final validation loss (NaN or +inf when diverged: counts as failed)
  double post_warmup = 0;
  double pre_nowarmup = 0;
};
RuleResult rule_claim6(const std::vector<Claim6Seed>& seeds);

// ---- claim 7: shallow Post-LN vs Pre-LN ----------------------------------------------------------------
struct Claim7Seed {
  int seed = 0;
  double unigram = 0;
  double post = 0;  // final validation loss, same schedule, same seed and batches
  double pre = 0;
};
RuleResult rule_claim7(const std::vector<Claim7Seed>& seeds);

// ---- claim 8: layer utilization ------------------------------------------------------------------------
struct Claim8Seed {
  int seed = 0;
  double unigram = 0;
  double pre_full = 0, post_full = 0;         // validation loss with every block
  std::vector<double> pre_skip, post_skip;    // validation-loss increase when skipping block l alone
};
RuleResult rule_claim8(const std::vector<Claim8Seed>& seeds);
double deep_skip_mean(const std::vector<double>& skip);  // mean increase over the last ⌈L/2⌉ blocks

// ---- claim 9: token similarity ---------------------------------------------------------------------------
struct Claim9Arm {
  std::string arm;
  bool trained = false;                 // ≤ U − trained_margin at the end
  std::vector<double> cos_init, cos_final;  // per layer, mean pairwise token cosine
};
struct Claim9Seed {
  int seed = 0;
  std::vector<Claim9Arm> arms;
};
RuleResult rule_claim9(const std::vector<Claim9Seed>& seeds);

// ---- experiment 10: residual-stream norm growth at initialization (Xiong et al. 2020, Lemma 1) ---------
// Reads the deepest profile of each seed's Post-LN and Pre-LN (GradProfile::resid).
RuleResult rule_residual_growth(const std::vector<GradSeed>& seeds);
// R² of the least-squares line through (x_i, y_i) (NaN when fewer than 3 points or y constant).
double linear_r2(const std::vector<double>& x, const std::vector<double>& y);

// ---- experiment 11: placement variants without warmup -----------------------------------------------------
// One run: a variant (or a control: "post", "pre") at one depth, constant learning rate, no warmup.
struct VariantRun {
  std::string variant;
  int layers = 0;
  double unigram = 0;
  double final_val = 0;  // NaN when diverged
};
RuleResult rule_variants(const std::vector<VariantRun>& runs);

// ---- experiment 12: Post-LN's warmup threshold vs depth -----------------------------------------------------
struct WarmupRun {
  int layers = 0;
  long warmup = 0;  // linear warmup steps (0: constant)
  double unigram = 0;
  double final_val = 0;
};
// The smallest warmup of the grid whose run trained at this depth (−1 when none did).
long warmup_threshold(const std::vector<WarmupRun>& runs, int layers);
RuleResult rule_warmup_depth(const std::vector<WarmupRun>& runs);

// ---- not measured --------------------------------------------------------------------------------------
RuleResult rule_not_measured(const std::string& why);

}  // namespace normlab::lab
