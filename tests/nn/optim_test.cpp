// Optimizers, gradient clipping and learning-rate schedules (normlab/nn/optim.h, src/nn/schedule.h)
// against values computed by hand (the formulas of PyTorch's documentation, evaluated in double here).
// The comparison with torch::optim itself is tests/torch/optim_torch_test.cpp.
#include <normlab/nn/optim.h>

#include <cmath>
#include <vector>

#include "nn/schedule.h"
#include "support/tolerance.h"

namespace normlab::nn {
namespace {

TEST(NnOptim, AdamWFirstStepsMatchHandValues) {
  // p = [1, −2], lr 0.1, β = (0.9, 0.999), eps 1e-8, weight decay 0.1.
  std::vector<float> p = {1.0f, -2.0f}, g(2);
  std::vector<ParamRef> refs = {{"w", Dims{1, 2}, p.data(), g.data()}};
  AdamW opt(refs, AdamWOptions{0.9, 0.999, 1e-8, 0.1, true});
  const double lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
  double pd[2] = {1.0, -2.0}, m[2] = {0, 0}, v[2] = {0, 0};
  const double grads[3][2] = {{0.5, 0.1}, {-0.5, 0.3}, {0.25, -0.2}};
  for (int t = 1; t <= 3; ++t) {
    for (int j = 0; j < 2; ++j) {
      g[static_cast<std::size_t>(j)] = static_cast<float>(grads[t - 1][j]);
      pd[j] *= 1 - lr * wd;
      m[j] = b1 * m[j] + (1 - b1) * grads[t - 1][j];
      v[j] = b2 * v[j] + (1 - b2) * grads[t - 1][j] * grads[t - 1][j];
      const double mh = m[j] / (1 - std::pow(b1, t)), vh = v[j] / (1 - std::pow(b2, t));
      pd[j] -= lr * mh / (std::sqrt(vh) + eps);
    }
    opt.step(lr);
    for (int j = 0; j < 2; ++j) EXPECT_NEAR(p[static_cast<std::size_t>(j)], pd[j], 4e-7) << "step " << t << " j " << j;
  }
  // Step 1 by hand: p·(1 − 0.01) − 0.1·sign(g) = [0.89, −2.08].
  EXPECT_EQ(opt.steps(), 3);
  std::vector<float> p1 = {1.0f, -2.0f}, g1 = {0.5f, 0.1f};
  AdamW one({{"w", Dims{1, 2}, p1.data(), g1.data()}}, AdamWOptions{0.9, 0.999, 1e-8, 0.1, true});
  one.step(0.1);
  EXPECT_NEAR(p1[0], 0.89, 1e-6);
  EXPECT_NEAR(p1[1], -2.08, 1e-6);
}

TEST(NnOptim, AdamWSkipsWeightDecayOnBiasesAndNorms) {
  std::vector<float> w = {1, 1}, b = {1}, n = {1}, gw = {0, 0}, gb = {0}, gn = {0};
  std::vector<ParamRef> refs = {{"blocks.0.attn.q.weight", Dims{1, 2}, w.data(), gw.data()},
                                {"blocks.0.attn.q.bias", Dims{1}, b.data(), gb.data()},
                                {"blocks.0.norm1.weight", Dims{1}, n.data(), gn.data()}};
  AdamW opt(refs, AdamWOptions{0.9, 0.98, 1e-9, 0.5, true});
  opt.step(0.1);  // zero gradients: only decay moves the weights
  EXPECT_FLOAT_EQ(w[0], 0.95f);
  EXPECT_FLOAT_EQ(b[0], 1.0f);
  EXPECT_FLOAT_EQ(n[0], 1.0f);
  AdamW all(refs, AdamWOptions{0.9, 0.98, 1e-9, 0.5, false});
  all.step(0.1);
  EXPECT_FLOAT_EQ(b[0], 0.95f);
}

TEST(NnOptim, NoDecayRuleByName) {
  float x = 0;
  auto ref = [&](const char* name, Dims s) { return ParamRef{name, s, &x, &x}; };
  EXPECT_TRUE(is_no_decay(ref("blocks.0.attn.q.bias", Dims{4})));
  EXPECT_TRUE(is_no_decay(ref("ln_f.weight", Dims{4})));
  EXPECT_TRUE(is_no_decay(ref("blocks.1.norm2.weight", Dims{4})));
  EXPECT_TRUE(is_no_decay(ref("blocks.1.norm1.alpha", Dims{1})));
  EXPECT_TRUE(is_no_decay(ref("blocks.1.ln1.weight", Dims{4, 4})));  // by name even if 2-D
  EXPECT_FALSE(is_no_decay(ref("blocks.0.ffn.w1.weight", Dims{8, 4})));
  EXPECT_FALSE(is_no_decay(ref("wte", Dims{256, 4})));
  EXPECT_FALSE(is_no_decay(ref("head.weight", Dims{256, 4})));
}

TEST(NnOptim, SgdMomentumMatchesHandValues) {
  std::vector<float> p = {1.0f}, g = {0.5f};
  Sgd opt({{"w", Dims{1, 1}, p.data(), g.data()}}, SgdOptions{0.9, 0.0, false, 0.0, true});
  opt.step(0.1);  // buf = 0.5, p = 0.95
  EXPECT_FLOAT_EQ(p[0], 0.95f);
  opt.step(0.1);  // buf = 0.9·0.5 + 0.5 = 0.95, p = 0.95 − 0.095
  EXPECT_NEAR(p[0], 0.855, 1e-7);
  ASSERT_EQ(opt.state().size(), 1u);
  EXPECT_NEAR(opt.state()[0].data[0], 0.95, 1e-7);

  // Weight decay (L2, added to the gradient) and Nesterov.
  std::vector<float> q = {1.0f}, h = {0.5f};
  Sgd nes({{"w", Dims{1, 1}, q.data(), h.data()}}, SgdOptions{0.9, 0.0, true, 0.1, true});
  nes.step(0.1);  // d = 0.5 + 0.1 = 0.6; buf = 0.6; d = 0.6 + 0.9·0.6 = 1.14; q = 1 − 0.114
  EXPECT_NEAR(q[0], 0.886, 1e-7);
  nes.step(0.1);  // d = 0.5 + 0.0886 = 0.5886; buf = 0.54 + 0.5886 = 1.1286; d = 0.5886 + 1.01574; q −= 0.160434
  EXPECT_NEAR(q[0], 0.886 - 0.1 * (0.5886 + 0.9 * 1.1286), 1e-6);

  // No momentum: plain SGD, no state.
  std::vector<float> r = {2.0f}, k = {1.0f};
  Sgd plain({{"w", Dims{1, 1}, r.data(), k.data()}}, SgdOptions{});
  plain.step(0.5);
  EXPECT_FLOAT_EQ(r[0], 1.5f);
  EXPECT_TRUE(plain.state().empty());
}

TEST(NnOptim, ClipGradNormReturnsPreClipNorm) {
  std::vector<float> a = {3.0f}, ga = {3.0f}, b = {0.0f}, gb = {4.0f};
  std::vector<ParamRef> refs = {{"a", Dims{1}, a.data(), ga.data()}, {"b", Dims{1}, b.data(), gb.data()}};
  EXPECT_DOUBLE_EQ(global_grad_norm(refs), 5.0);
  EXPECT_DOUBLE_EQ(clip_grad_norm(refs, 10.0), 5.0);  // below the threshold: untouched
  EXPECT_EQ(ga[0], 3.0f);
  EXPECT_DOUBLE_EQ(clip_grad_norm(refs, 0.0), 5.0);  // 0 = off
  EXPECT_EQ(gb[0], 4.0f);
  EXPECT_DOUBLE_EQ(clip_grad_norm(refs, 1.0), 5.0);
  EXPECT_NEAR(ga[0], 3.0 / (5.0 + 1e-6), 1e-7);
  EXPECT_NEAR(gb[0], 4.0 / (5.0 + 1e-6), 1e-7);
  EXPECT_NEAR(global_grad_norm(refs), 1.0, 1e-6);
  // Non-finite: reported, gradients untouched.
  ga[0] = INFINITY;
  EXPECT_TRUE(std::isinf(clip_grad_norm(refs, 1.0)));
  EXPECT_NEAR(gb[0], 4.0 / (5.0 + 1e-6), 1e-7);
  ga[0] = NAN;
  EXPECT_TRUE(std::isnan(global_grad_norm(refs)));
}

TEST(NnOptim, InvalidOptionsThrow) {
  std::vector<float> p = {1}, g = {1};
  std::vector<ParamRef> refs = {{"w", Dims{1}, p.data(), g.data()}};
  EXPECT_NL_ERROR(AdamW(refs, AdamWOptions{1.0, 0.98, 1e-9, 0, true}), "beta1");
  EXPECT_NL_ERROR(Sgd(refs, SgdOptions{0.0, 0.0, true, 0.0, true}), "Nesterov");
}

// ---- schedules ----------------------------------------------------------------------------------------

TEST(NnSchedule, HandValues) {
  const Schedule constant{ScheduleKind::kConstant, 3e-3, 0, 600};
  EXPECT_DOUBLE_EQ(lr_at(constant, 0), 3e-3);
  EXPECT_DOUBLE_EQ(lr_at(constant, 599), 3e-3);

  const Schedule linear{ScheduleKind::kLinear, 2e-3, 200, 600};
  EXPECT_DOUBLE_EQ(lr_at(linear, 0), 2e-3 / 200);
  EXPECT_DOUBLE_EQ(lr_at(linear, 99), 1e-3);
  EXPECT_DOUBLE_EQ(lr_at(linear, 199), 2e-3);
  EXPECT_DOUBLE_EQ(lr_at(linear, 200), 2e-3);
  EXPECT_DOUBLE_EQ(lr_at(linear, 5000), 2e-3);
  EXPECT_DOUBLE_EQ(lr_at(Schedule{ScheduleKind::kLinear, 1.0, 0, 10}, 0), 1.0);

  const Schedule cosine{ScheduleKind::kCosine, 1.0, 10, 110, 0.1};
  EXPECT_DOUBLE_EQ(lr_at(cosine, 0), 0.1);
  EXPECT_DOUBLE_EQ(lr_at(cosine, 4), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(cosine, 9), 1.0);
  EXPECT_NEAR(lr_at(cosine, 59), 0.55, 1e-15);  // halfway: 0.1 + 0.9·½
  EXPECT_NEAR(lr_at(cosine, 34), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-15);
  EXPECT_NEAR(lr_at(cosine, 109), 0.1, 1e-15);  // the last step reaches the floor
  EXPECT_NEAR(lr_at(cosine, 500), 0.1, 1e-15);
  const Schedule cos0{ScheduleKind::kCosine, 1.0, 0, 100, 0.0};
  EXPECT_NEAR(lr_at(cos0, 49), 0.5, 1e-15);
  EXPECT_NEAR(lr_at(cos0, 99), 0.0, 1e-15);

  const Schedule noam{ScheduleKind::kNoam, 1.0, 4, 100};
  EXPECT_DOUBLE_EQ(lr_at(noam, 0), 0.25);  // 2·min(1, 1/8)
  EXPECT_DOUBLE_EQ(lr_at(noam, 1), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(noam, 3), 1.0);   // peak at n = w
  EXPECT_DOUBLE_EQ(lr_at(noam, 15), 0.5);  // 2/√16
  EXPECT_DOUBLE_EQ(lr_at(Schedule{ScheduleKind::kNoam, 1.0, 0, 10}, 3), 0.5);  // w = 0: lr/√n
}

TEST(NnSchedule, ParseAndValidate) {
  EXPECT_EQ(parse_schedule("cosine"), ScheduleKind::kCosine);
  EXPECT_EQ(parse_schedule("noam"), ScheduleKind::kNoam);
  EXPECT_STREQ(schedule_name(ScheduleKind::kLinear), "linear");
  EXPECT_NL_ERROR(parse_schedule("step"), "valid: constant, linear, cosine, noam");
  EXPECT_NL_ERROR(validate(Schedule{ScheduleKind::kConstant, 1e-3, 200, 600}), "use schedule linear");
  EXPECT_NL_ERROR(validate(Schedule{ScheduleKind::kCosine, 1e-3, 600, 600}), "more steps");
  EXPECT_NL_ERROR(validate(Schedule{ScheduleKind::kCosine, 1e-3, 10, 600, 1.5}), "floor");
  EXPECT_NL_ERROR(validate(Schedule{ScheduleKind::kLinear, -1, 0, 600}), "learning rate");
  validate(Schedule{ScheduleKind::kLinear, 1e-3, 200, 600});
}

}  // namespace
}  // namespace normlab::nn
