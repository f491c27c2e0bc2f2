// The lab's verdict rules (src/lab/verdicts.h) on synthetic numbers: every rule is fed results that must
// give each of its outcomes (reproduced, reproduced-with-correction, not-reproduced, inconclusive), and the
// results model's JSON and --compare are checked.
#include "lab/verdicts.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "lab/results.h"

namespace normlab::lab {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double U = 3.376;  // the unigram level of the fortunes validation split
const Thresholds& T = kThresholds;

TEST(VerdictNames, RoundTrip) {
  for (Verdict v : {Verdict::kReproduced, Verdict::kReproducedWithCorrection, Verdict::kNotReproduced,
                    Verdict::kInconclusive})
    EXPECT_EQ(parse_verdict(verdict_name(v)), v);
  EXPECT_STREQ(verdict_name(Verdict::kReproducedWithCorrection), "reproduced-with-correction");
  EXPECT_THROW(parse_verdict("maybe"), std::exception);
}

TEST(AggregateSeeds, EveryOutcome) {
  using S = SeedOutcome;
  EXPECT_EQ(aggregate_seeds({S::kFull, S::kFull, S::kFull}), Verdict::kReproduced);
  EXPECT_EQ(aggregate_seeds({S::kFull, S::kCorrected, S::kFull}), Verdict::kReproducedWithCorrection);
  EXPECT_EQ(aggregate_seeds({S::kCorrected}), Verdict::kReproducedWithCorrection);
  EXPECT_EQ(aggregate_seeds({S::kFail, S::kFail}), Verdict::kNotReproduced);
  EXPECT_EQ(aggregate_seeds({S::kFull, S::kFail}), Verdict::kInconclusive);
  EXPECT_EQ(aggregate_seeds({}), Verdict::kInconclusive);
}

TEST(Claim1, Outcomes) {
  EXPECT_EQ(rule_claim1({13, 0}).verdict, Verdict::kReproduced);
  EXPECT_EQ(rule_claim1({13, 1}).verdict, Verdict::kNotReproduced);
  EXPECT_EQ(rule_claim1({0, 0}).verdict, Verdict::kInconclusive);
  EXPECT_NE(rule_claim1({13, 0}).rule.find("1e-6"), std::string::npos);
}

TEST(Claim2, Outcomes) {
  const Claim2Seed full{0, 0.0, 0.3, 1e-7, 0.5, 0.2, 2e-7};
  EXPECT_EQ(rule_claim2({full, full}).verdict, Verdict::kReproduced);
  Claim2Seed special_fails = full;
  special_fails.special = 0.1;
  EXPECT_EQ(rule_claim2({full, special_fails}).verdict, Verdict::kReproducedWithCorrection);
  Claim2Seed ln_moves = full;
  ln_moves.ln_pad = 0.01;
  Claim2Seed bn_still = full;
  bn_still.bn_batch = 1e-5;
  EXPECT_EQ(rule_claim2({ln_moves, bn_still}).verdict, Verdict::kNotReproduced);
  EXPECT_EQ(rule_claim2({full, ln_moves}).verdict, Verdict::kInconclusive);
  EXPECT_EQ(rule_claim2({}).verdict, Verdict::kInconclusive);
}

// Gradient profiles: Post-LN ffn2 ratio last/first grows with depth; Pre-LN's last layer ∝ L^slope.
GradSeed grad_seed(int seed, double post_growth, double pre_slope, double r_pre, double r_post) {
  GradSeed s;
  s.seed = seed;
  for (int L : {6, 12, 24}) {
    GradProfile po, pr;
    po.layers = pr.layers = L;
    for (int l = 0; l < L; ++l) {
      po.ffn2.push_back(1.0 + post_growth * L * l / (L - 1));  // last/first = 1 + growth·L
      pr.ffn2.push_back(std::pow(L, pre_slope));
      po.block.push_back(1.0);  // parameter gradients: informational, not read by the rules
      pr.block.push_back(1.0);
      po.dx.push_back(l == 0 ? r_post : 1.0);  // ‖∂L/∂x_l‖: claim 4 reads block 1 over block L
      pr.dx.push_back(l == 0 ? r_pre : 1.0);
    }
    s.post.push_back(po);
    s.pre.push_back(pr);
  }
  return s;
}

TEST(Claim5, Outcomes) {
  EXPECT_EQ(rule_claim5({grad_seed(0, 0.1, -0.5, 1, 0.1), grad_seed(1, 0.2, -0.45, 1, 0.1)}).verdict,
            Verdict::kReproduced);
  // Pre-LN shrinks, with another exponent: corrected.
  EXPECT_EQ(rule_claim5({grad_seed(0, 0.1, -1.2, 1, 0.1), grad_seed(1, 0.1, -0.5, 1, 0.1)}).verdict,
            Verdict::kReproducedWithCorrection);
  // Post-LN's ratio does not grow (growth 0 → ratio 1 everywhere): failed in every seed.
  EXPECT_EQ(rule_claim5({grad_seed(0, 0.0, -0.5, 1, 0.1), grad_seed(1, 0.0, -0.5, 1, 0.1)}).verdict,
            Verdict::kNotReproduced);
  EXPECT_EQ(rule_claim5({grad_seed(0, 0.1, -0.5, 1, 0.1), grad_seed(1, 0.0, 0.0, 1, 0.1)}).verdict,
            Verdict::kInconclusive);
  GradSeed one_depth = grad_seed(0, 0.1, -0.5, 1, 0.1);
  one_depth.post.resize(1), one_depth.pre.resize(1);
  EXPECT_EQ(rule_claim5({one_depth}).verdict, Verdict::kInconclusive);
}

TEST(Claim5, LogLogSlope) {
  EXPECT_NEAR(loglog_slope({6, 12, 24}, {1 / std::sqrt(6.0), 1 / std::sqrt(12.0), 1 / std::sqrt(24.0)}), -0.5, 1e-12);
  EXPECT_TRUE(std::isnan(loglog_slope({6}, {1})));
  EXPECT_TRUE(std::isnan(loglog_slope({6, 12}, {1, 0})));
}

TEST(Claim4, Outcomes) {
  EXPECT_EQ(rule_claim4({grad_seed(0, 0.1, -0.5, 1.5, 0.1)}).verdict, Verdict::kReproduced);
  // Post below Pre but Pre's input side < 0.5: corrected.
  EXPECT_EQ(rule_claim4({grad_seed(0, 0.1, -0.5, 0.3, 0.1)}).verdict, Verdict::kReproducedWithCorrection);
  EXPECT_EQ(rule_claim4({grad_seed(0, 0.1, -0.5, 0.3, 0.9)}).verdict, Verdict::kNotReproduced);
  EXPECT_EQ(rule_claim4({grad_seed(0, 0.1, -0.5, 1.5, 0.1), grad_seed(1, 0.1, -0.5, 0.3, 0.9)}).verdict,
            Verdict::kInconclusive);
  EXPECT_EQ(rule_claim4({}).verdict, Verdict::kInconclusive);
}

TEST(Claim6, Outcomes) {
  const double stuck = U - 0.01, trained = U - 1.2;
  EXPECT_EQ(rule_claim6({{0, U, stuck, trained, trained}, {1, U, kNaN, trained, trained}}).verdict,
            Verdict::kReproduced);  // a divergence counts as failed
  EXPECT_EQ(rule_claim6({{0, U, stuck, trained, trained}, {1, U, trained, trained, trained}}).verdict,
            Verdict::kReproducedWithCorrection);
  EXPECT_EQ(rule_claim6({{0, U, trained, trained, trained}}).verdict, Verdict::kNotReproduced);
  // A control arm stuck: inconclusive.
  EXPECT_EQ(rule_claim6({{0, U, stuck, stuck, trained}}).verdict, Verdict::kInconclusive);
  EXPECT_EQ(rule_claim6({}).verdict, Verdict::kInconclusive);
  // Boundaries: exactly U − stuck_margin is stuck; exactly U − trained_margin is trained.
  EXPECT_EQ(rule_claim6({{0, U, U - T.stuck_margin, U - T.trained_margin, U - T.trained_margin}}).verdict,
            Verdict::kReproduced);
  EXPECT_NE(rule_claim6({{0, U, stuck, trained, trained}}).rule.find("U − 0.05"), std::string::npos);
}

TEST(Claim7, Outcomes) {
  EXPECT_EQ(rule_claim7({{0, U, 1.80, 1.82}, {1, U, 1.79, 1.80}}).verdict, Verdict::kReproduced);
  EXPECT_EQ(rule_claim7({{0, U, 1.85, 1.82}, {1, U, 1.83, 1.80}}).verdict, Verdict::kNotReproduced);
  EXPECT_EQ(rule_claim7({{0, U, 1.80, 1.82}, {1, U, 1.83, 1.80}}).verdict, Verdict::kInconclusive);
  EXPECT_EQ(rule_claim7({{0, U, 1.800, 1.801}}).verdict, Verdict::kInconclusive);  // a tie
  EXPECT_EQ(rule_claim7({{0, U, U, 1.82}}).verdict, Verdict::kInconclusive);      // an arm did not train
  // This rule has no corrected form: a small effect either shows in every seed or it does not.
}

TEST(Claim3, Outcomes) {
  // The full data set's numbers (docs/SPEECH_STUDY.md): gain 0, segment-gain F-LN 0.246 vs T-CMVN 1.017,
  // channel T-CMVN 0.109 vs F-LN 0.555.
  const Claim3Input measured{0, 0, 0.246, 1.017, 0.555, 0.109};
  EXPECT_EQ(rule_claim3(measured).verdict, Verdict::kReproduced);
  EXPECT_NE(rule_claim3(measured).rule.find("≤ 0.001"), std::string::npos);
  EXPECT_NE(rule_claim3(measured).reason.find("0.246"), std::string::npos);
  // Boundaries: exactly the thresholds still reproduce.
  EXPECT_EQ(rule_claim3({T.c3_gain_max, T.c3_gain_max, 0.5, 1.0, 1.0, 0.5}).verdict, Verdict::kReproduced);
  // Either direction reversed → not-reproduced.
  EXPECT_EQ(rule_claim3({0, 0, 1.017, 0.246, 0.555, 0.109}).verdict, Verdict::kNotReproduced);
  EXPECT_EQ(rule_claim3({0, 0, 0.246, 1.017, 0.109, 0.555}).verdict, Verdict::kNotReproduced);
  // The right direction but not by the margin → inconclusive.
  EXPECT_EQ(rule_claim3({0, 0, 0.8, 1.0, 0.555, 0.109}).verdict, Verdict::kInconclusive);
  EXPECT_EQ(rule_claim3({0, 0, 0.246, 1.017, 0.555, 0.4}).verdict, Verdict::kInconclusive);
  // A constant gain not removed → inconclusive (unless a direction is reversed).
  EXPECT_EQ(rule_claim3({0.01, 0, 0.246, 1.017, 0.555, 0.109}).verdict, Verdict::kInconclusive);
  EXPECT_EQ(rule_claim3({0, 0.01, 0.246, 1.017, 0.555, 0.109}).verdict, Verdict::kInconclusive);
  // Missing values → inconclusive.
  EXPECT_EQ(rule_claim3({0, 0, kNaN, 1.017, 0.555, 0.109}).verdict, Verdict::kInconclusive);
}

TEST(Claim8, Outcomes) {
  const std::vector<double> small{0.5, 0.2, 0.01, 0.01, 0.02, 0.03}, large{0.9, 0.8, 0.5, 0.4, 0.6, 0.5},
      medium{0.5, 0.4, 0.3, 0.35, 0.4, 0.45};
  EXPECT_NEAR(deep_skip_mean(small), 0.02, 1e-12);
  EXPECT_EQ(rule_claim8({{0, U, 1.9, 1.9, small, large}}).verdict, Verdict::kReproduced);
  EXPECT_EQ(rule_claim8({{0, U, 1.9, 1.9, medium, large}}).verdict, Verdict::kReproducedWithCorrection);
  EXPECT_EQ(rule_claim8({{0, U, 1.9, 1.9, large, small}}).verdict, Verdict::kNotReproduced);
  EXPECT_EQ(rule_claim8({{0, U, 1.9, 1.9, small, large}, {1, U, 1.9, 1.9, large, small}}).verdict,
            Verdict::kInconclusive);
  EXPECT_EQ(rule_claim8({{0, U, 1.9, U, small, large}}).verdict, Verdict::kInconclusive);  // Post stuck
  EXPECT_EQ(rule_claim8({}).verdict, Verdict::kInconclusive);
}

TEST(Claim9, Outcomes) {
  auto seed = [](int s, double final_cos, bool trained = true) {
    return Claim9Seed{s, {{"pre", trained, {0.1, 0.1}, {0.15, final_cos}}}};
  };
  EXPECT_EQ(rule_claim9({seed(0, 0.95), seed(1, 0.92)}).verdict, Verdict::kReproduced);
  EXPECT_EQ(rule_claim9({seed(0, 0.5), seed(1, 0.95)}).verdict, Verdict::kReproducedWithCorrection);
  EXPECT_EQ(rule_claim9({seed(0, 0.12)}).verdict, Verdict::kNotReproduced);
  EXPECT_EQ(rule_claim9({seed(0, 0.95), seed(1, 0.12)}).verdict, Verdict::kInconclusive);
  EXPECT_EQ(rule_claim9({seed(0, 0.95, false)}).verdict, Verdict::kInconclusive);  // no trained arm
}

// Residual-stream norms at the deepest depth: Post-LN ‖x_l‖ = post_level·(1 + post_wobble·(l odd)); Pre-LN
// ‖x_l‖² = 1 + slope·l (+ curvature·l² to break linearity).
GradSeed resid_seed(int seed, double post_wobble, double slope, double curvature = 0) {
  GradSeed s;
  s.seed = seed;
  GradProfile po, pr;
  po.layers = pr.layers = 24;
  for (int l = 1; l <= 24; ++l) {
    po.resid.push_back(8.0 * (1 + (l % 2 ? post_wobble : 0.0)));
    pr.resid.push_back(std::sqrt(1 + slope * l + curvature * std::pow(l, 4)));
  }
  s.post.push_back(po);
  s.pre.push_back(pr);
  return s;
}

TEST(ResidualGrowth, Outcomes) {
  EXPECT_EQ(rule_residual_growth({resid_seed(0, 0.0, 0.5), resid_seed(1, 0.05, 1.0)}).verdict, Verdict::kReproduced);
  // Pre-LN grows, but not linearly (∝ l⁴): corrected.
  EXPECT_EQ(rule_residual_growth({resid_seed(0, 0.0, 0.0, 1e-3), resid_seed(1, 0.0, 0.5)}).verdict,
            Verdict::kReproducedWithCorrection);
  // Post-LN not flat (20 % wobble), or Pre-LN flat: failed in every seed.
  EXPECT_EQ(rule_residual_growth({resid_seed(0, 0.2, 0.5), resid_seed(1, 0.0, 0.0)}).verdict, Verdict::kNotReproduced);
  EXPECT_EQ(rule_residual_growth({resid_seed(0, 0.0, 0.5), resid_seed(1, 0.2, 0.5)}).verdict, Verdict::kInconclusive);
  EXPECT_EQ(rule_residual_growth({}).verdict, Verdict::kInconclusive);
  EXPECT_NEAR(linear_r2({1, 2, 3, 4}, {3, 5, 7, 9}), 1.0, 1e-15);
  EXPECT_TRUE(std::isnan(linear_r2({1, 2}, {1, 2})));
  EXPECT_TRUE(std::isnan(linear_r2({1, 2, 3}, {2, 2, 2})));
}

// Variants: `trained` (≤ U − 0.5), `stuck` (≥ U − 0.05), `mid` (neither).
constexpr double kTrained = U - 1.0, kStuck = U - 0.01, kMid = U - 0.2;
std::vector<VariantRun> variant_runs(double post, double pre, std::vector<std::pair<const char*, double>> variants) {
  std::vector<VariantRun> r;
  for (int L : {6, 12}) {
    r.push_back({"post", L, U, post});
    r.push_back({"pre", L, U, pre});
    for (auto [name, v] : variants) r.push_back({name, L, U, v});
  }
  return r;
}

TEST(Variants, Outcomes) {
  EXPECT_EQ(rule_variants(variant_runs(kStuck, kTrained, {{"b2t", kTrained}, {"dyt", kTrained}})).verdict,
            Verdict::kReproduced);
  const RuleResult some = rule_variants(variant_runs(kStuck, kTrained, {{"b2t", kTrained}, {"dyt", kMid}}));
  EXPECT_EQ(some.verdict, Verdict::kReproducedWithCorrection);
  EXPECT_NE(some.reason.find("not: dyt"), std::string::npos) << some.reason;
  EXPECT_EQ(rule_variants(variant_runs(kNaN, kTrained, {{"b2t", kStuck}, {"dyt", kNaN}})).verdict,
            Verdict::kNotReproduced);  // a diverged Post-LN counts as stuck, a diverged variant as not trained
  // Controls: Post-LN trains without warmup, or Pre-LN does not train → inconclusive.
  EXPECT_EQ(rule_variants(variant_runs(kTrained, kTrained, {{"b2t", kTrained}})).verdict, Verdict::kInconclusive);
  EXPECT_EQ(rule_variants(variant_runs(kStuck, kMid, {{"b2t", kTrained}})).verdict, Verdict::kInconclusive);
  EXPECT_EQ(rule_variants(variant_runs(kStuck, kTrained, {})).verdict, Verdict::kInconclusive);
  // A variant trained at 6 layers only is not trained at every depth.
  std::vector<VariantRun> r = variant_runs(kStuck, kTrained, {{"b2t", kTrained}});
  r.back().final_val = kStuck;  // b2t at 12 layers
  EXPECT_EQ(rule_variants(r).verdict, Verdict::kNotReproduced);
}

// Warmup grid: final loss per (depth, warmup); `trained` from the given thresholds w*(L) (−1: none).
std::vector<WarmupRun> warmup_runs(std::vector<std::pair<int, long>> thresholds) {
  std::vector<WarmupRun> r;
  for (auto [L, th] : thresholds)
    for (long w : {0L, 50L, 100L}) r.push_back({L, w, U, th >= 0 && w >= th ? kTrained : kStuck});
  return r;
}

TEST(WarmupDepth, Outcomes) {
  EXPECT_EQ(warmup_threshold(warmup_runs({{2, 0}, {6, 100}}), 6), 100);
  EXPECT_EQ(warmup_threshold(warmup_runs({{2, 0}, {6, -1}}), 6), -1);
  EXPECT_EQ(rule_warmup_depth(warmup_runs({{2, 0}, {4, 0}, {6, 100}, {8, -1}})).verdict, Verdict::kReproduced);
  EXPECT_EQ(rule_warmup_depth(warmup_runs({{2, 0}, {4, 100}, {6, 50}, {8, 100}})).verdict,
            Verdict::kReproducedWithCorrection);  // larger at the deepest, not monotone
  EXPECT_EQ(rule_warmup_depth(warmup_runs({{2, 50}, {4, 50}, {8, 50}})).verdict, Verdict::kNotReproduced);
  EXPECT_EQ(rule_warmup_depth(warmup_runs({{2, 100}, {8, 0}})).verdict, Verdict::kNotReproduced);
  EXPECT_EQ(rule_warmup_depth(warmup_runs({{2, -1}, {8, -1}})).verdict, Verdict::kInconclusive);
  EXPECT_EQ(rule_warmup_depth(warmup_runs({{2, 0}})).verdict, Verdict::kInconclusive);
  // An untrained run that is not stuck (between U − 0.5 and U − 0.05) does not count as trained.
  std::vector<WarmupRun> r = warmup_runs({{2, 0}, {8, 50}});
  for (WarmupRun& w : r)
    if (w.layers == 8 && w.warmup == 50) w.final_val = kMid;
  EXPECT_EQ(warmup_threshold(r, 8), 100);
}

TEST(NotMeasured, IsInconclusiveWithTheReason) {
  const RuleResult r = rule_not_measured("speech experiment not implemented");
  EXPECT_EQ(r.verdict, Verdict::kInconclusive);
  EXPECT_EQ(r.reason, "speech experiment not implemented");
}

TEST(Results, JsonAndCompare) {
  LabResults a;
  a.version = "0.1.0";
  a.seeds = {0};
  ClaimResult c;
  c.id = 6;
  c.title = "warmup";
  c.verdict = rule_claim6({{0, U, U, U - 1, U - 1}});
  c.per_seed.push_back({0, {{"post-nowarmup", U}, {"nan", finite_or_null(kNaN)}}});
  a.claims.push_back(c);
  const nlohmann::json ja = to_json(a);
  EXPECT_EQ(ja.at("claims").at(0).at("verdict"), "reproduced");
  EXPECT_TRUE(ja.at("claims").at(0).at("per_seed").at(0).at("values").at("nan").is_null());

  LabResults b = a;
  b.claims[0].verdict = rule_claim6({{0, U, U - 1, U - 1, U - 1}});
  b.claims[0].per_seed[0].values["post-nowarmup"] = U - 1;
  const std::string diff = compare_results(ja, to_json(b));
  EXPECT_NE(diff.find("verdict reproduced -> not-reproduced"), std::string::npos) << diff;
  EXPECT_NE(diff.find("post-nowarmup"), std::string::npos) << diff;
  EXPECT_NE(compare_results(ja, ja).find("no differences"), std::string::npos);
}

}  // namespace
}  // namespace normlab::lab
