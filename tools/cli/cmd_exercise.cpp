// `normlab exercise [--seed 0] [--json]`: the source article's LayerNorm exercise.
//
//   1. x of shape [2, 4, 6] (batch, token, feature) = N(0,1)·5 + 10. The draws come from
//      std::mt19937_64(seed) through std::normal_distribution<double>(0, 1), one per element in C order,
//      then rounded to float. (std::normal_distribution's algorithm is implementation-defined —
//      libstdc++ uses the Marsaglia polar method — so the exact numbers are reproducible for a given
//      standard library; none of the printed conclusions depend on them.)
//   2. LayerNorm over the last axis (eps 1e-5) with normlab's kernel, and the textbook per-row version
//      written out below in plain float loops; prints the max absolute difference of the two.
//   3. The per-token mean and variance of LayerNorm(x): ≈ 0 and ≈ 1 (a 2×4 table).
//   4. The shapes through a minimal Pre-Norm block y = x + Linear(LN(x)), where Linear(6, 6) has
//      weights and bias drawn, after x, from the same generator: U(−1/√6, 1/√6) (PyTorch's default
//      bound for nn.Linear), weight [out][in] first in row-major order, then bias.
#include <normlab/norm.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "cli.h"

namespace normlab::cli {

namespace {

constexpr Index kBatch = 2, kTokens = 4, kFeatures = 6;

// The textbook LayerNorm of one row, exactly as written on a whiteboard: mean, biased variance,
// (x − mean) / sqrt(var + eps), all in float.
void textbook_layer_norm_row(const float* x, float* y, Index n, float eps) {
  float sum = 0.0f;
  for (Index i = 0; i < n; ++i) sum += x[i];
  const float mean = sum / static_cast<float>(n);
  float sq = 0.0f;
  for (Index i = 0; i < n; ++i) sq += (x[i] - mean) * (x[i] - mean);
  const float var = sq / static_cast<float>(n);
  const float denom = std::sqrt(var + eps);
  for (Index i = 0; i < n; ++i) y[i] = (x[i] - mean) / denom;
}

// y[r][o] = b[o] + Σ_i w[o][i]·x[r][i] over the rows of a [..., in] tensor.
Tensor linear(const Tensor& x, const std::vector<float>& w, const std::vector<float>& b, Index in,
              Index out) {
  Dims shape = x.shape();
  shape[shape.size() - 1] = out;
  Tensor y(shape);
  const Index rows = x.numel() / in;
  for (Index r = 0; r < rows; ++r)
    for (Index o = 0; o < out; ++o) {
      float acc = b[static_cast<std::size_t>(o)];
      for (Index i = 0; i < in; ++i) acc += w[static_cast<std::size_t>(o * in + i)] * x[r * in + i];
      y[r * out + o] = acc;
    }
  return y;
}

std::string fmt_shape(const Dims& d) {
  return d.str();
}

}  // namespace

ExerciseResult run_exercise(std::uint64_t seed) {
  ExerciseResult r;
  r.seed = seed;
  r.eps = 1e-5;
  std::mt19937_64 gen(seed);

  // 1. The input.
  Tensor x(Dims{kBatch, kTokens, kFeatures});
  std::normal_distribution<double> n01(0.0, 1.0);
  for (Index i = 0; i < x.numel(); ++i) x[i] = static_cast<float>(n01(gen) * 5.0 + 10.0);
  r.input_shape = x.shape();

  // 2. normlab's kernel vs the textbook rows.
  Tensor y(x.shape());
  layer_norm_forward(y.view(), View{}, View{}, x.cview(), ConstView{}, ConstView{}, Axes{-1}, r.eps);
  r.output_shape = y.shape();
  Tensor t(x.shape());
  for (Index row = 0; row < kBatch * kTokens; ++row)
    textbook_layer_norm_row(x.data() + row * kFeatures, t.data() + row * kFeatures, kFeatures,
                            static_cast<float>(r.eps));
  for (Index i = 0; i < y.numel(); ++i)
    r.max_abs_diff =
        std::max(r.max_abs_diff, std::fabs(static_cast<double>(y[i]) - static_cast<double>(t[i])));

  // 3. Per-token statistics of the normalized output.
  r.token_mean.assign(kBatch, std::vector<double>(kTokens));
  r.token_var.assign(kBatch, std::vector<double>(kTokens));
  for (Index b = 0; b < kBatch; ++b)
    for (Index k = 0; k < kTokens; ++k) {
      const float* row = y.data() + (b * kTokens + k) * kFeatures;
      double mean = 0, var = 0;
      for (Index i = 0; i < kFeatures; ++i) mean += row[i];
      mean /= kFeatures;
      for (Index i = 0; i < kFeatures; ++i) var += (row[i] - mean) * (row[i] - mean);
      var /= kFeatures;
      r.token_mean[static_cast<std::size_t>(b)][static_cast<std::size_t>(k)] = mean;
      r.token_var[static_cast<std::size_t>(b)][static_cast<std::size_t>(k)] = var;
    }

  // 4. A minimal Pre-Norm block: y = x + Linear(LN(x)).
  const double bound = 1.0 / std::sqrt(static_cast<double>(kFeatures));
  std::uniform_real_distribution<double> u(-bound, bound);
  std::vector<float> w(static_cast<std::size_t>(kFeatures * kFeatures)),
      bias(static_cast<std::size_t>(kFeatures));
  for (float& v : w) v = static_cast<float>(u(gen));
  for (float& v : bias) v = static_cast<float>(u(gen));
  const Tensor& ln = y;  // LN(x), computed above
  Tensor z = linear(ln, w, bias, kFeatures, kFeatures);
  NL_CHECK(z.shape() == x.shape(), "exercise: Linear(LN(x)) has shape {} but x has shape {}", z.shape().str(),
           x.shape().str());
  Tensor out(x.shape());
  for (Index i = 0; i < x.numel(); ++i) out[i] = x[i] + z[i];
  r.block_x_shape = x.shape();
  r.block_ln_shape = ln.shape();
  r.block_linear_shape = z.shape();
  r.block_y_shape = out.shape();
  return r;
}

void print_exercise(const ExerciseResult& r, std::FILE* out) {
  fmt::print(out, "x = N(0,1)·5 + 10 (seed {}), LayerNorm over the last axis, eps {:g}\n", r.seed, r.eps);
  fmt::print(out, "input shape: {}\n", fmt_shape(r.input_shape));
  fmt::print(out, "LayerNorm output shape: {}\n", fmt_shape(r.output_shape));
  fmt::print(out, "max abs diff (normlab vs textbook per-row float loops): {:.3e}\n", r.max_abs_diff);
  fmt::print(out, "per-token mean after LayerNorm (rows: batch, columns: token; expect ≈ 0):\n");
  for (const auto& row : r.token_mean) {
    fmt::print(out, " ");
    for (double v : row) fmt::print(out, " {:+.3e}", v);
    fmt::print(out, "\n");
  }
  fmt::print(out, "per-token variance after LayerNorm (biased; expect ≈ 1):\n");
  for (const auto& row : r.token_var) {
    fmt::print(out, " ");
    for (double v : row) fmt::print(out, " {:10.7f}", v);
    fmt::print(out, "\n");
  }
  fmt::print(out, "Pre-Norm block y = x + Linear(LN(x)), Linear(6, 6) seeded:\n");
  fmt::print(out, "  x:             {}\n", fmt_shape(r.block_x_shape));
  fmt::print(out, "  LN(x):         {}\n", fmt_shape(r.block_ln_shape));
  fmt::print(out, "  Linear(LN(x)): {}\n", fmt_shape(r.block_linear_shape));
  fmt::print(out, "  y:             {}\n", fmt_shape(r.block_y_shape));
}

nlohmann::json exercise_json(const ExerciseResult& r) {
  return {
      {"seed", r.seed},
      {"eps", r.eps},
      {"input_shape", r.input_shape.vec()},
      {"output_shape", r.output_shape.vec()},
      {"max_abs_diff", r.max_abs_diff},
      {"token_mean", r.token_mean},
      {"token_var", r.token_var},
      {"prenorm_block",
       {{"x", r.block_x_shape.vec()},
        {"ln_x", r.block_ln_shape.vec()},
        {"linear_ln_x", r.block_linear_shape.vec()},
        {"y", r.block_y_shape.vec()}}},
  };
}

void add_exercise_command(CLI::App& app) {
  struct Options {
    std::uint64_t seed = 0;
    bool json = false;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "exercise",
      "The article's LayerNorm exercise on x[2,4,6] = N(0,1)·5+10 (kernel vs textbook, statistics, shapes)");
  cmd->footer(
      "Prints the input shape, the LayerNorm output shape (last axis, eps 1e-5), the max abs difference "
      "between normlab's kernel and a textbook per-row implementation, the per-token mean and variance "
      "after LayerNorm, and the shapes through a Pre-Norm block y = x + Linear(LN(x)) with a seeded "
      "Linear(6, 6).");
  cmd->add_option("--seed", opts->seed, "Seed of the std::mt19937_64 that draws x and the Linear layer")
      ->capture_default_str();
  cmd->add_flag("--json", opts->json, "Print the same numbers as one JSON object");
  cmd->callback([opts] {
    const ExerciseResult r = run_exercise(opts->seed);
    if (opts->json) {
      fmt::print("{}\n", exercise_json(r).dump(2));
    } else {
      fmt::print("normlab exercise\n");
      print_exercise(r, stdout);
    }
  });
}

}  // namespace normlab::cli
