// The seed article's worked LayerNorm examples (see worked_examples.h): inputs, hand-computed answers,
// and the comparison with normlab's kernel.
#include "lab/worked_examples.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

namespace normlab::lab {

namespace {

// Output values are fp32: a hand answer such as √(3/2) is representable to ≈ 6e-8.
constexpr double kTolerance = 1e-6;

ExampleCheck compare(std::string quantity, const Tensor& actual, std::vector<double> expected) {
  ExampleCheck c;
  c.quantity = std::move(quantity);
  c.shape = actual.shape();
  c.expected = std::move(expected);
  c.tolerance = kTolerance;
  for (Index i = 0; i < actual.numel(); ++i) c.actual.push_back(actual[i]);
  if (c.actual.size() != c.expected.size()) {
    c.max_abs_err = std::numeric_limits<double>::infinity();
  } else {
    for (std::size_t i = 0; i < c.actual.size(); ++i) {
      const double d = std::fabs(c.actual[i] - c.expected[i]);
      c.max_abs_err = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(c.max_abs_err, d);
    }
  }
  c.passed = c.max_abs_err <= c.tolerance;
  return c;
}

struct Expected {
  std::vector<double> y, mean, rstd;
};

WorkedExample run_one(std::string name, std::string description, Dims shape, std::vector<float> input,
                      Axes axes, const Expected& want) {
  WorkedExample ex;
  ex.name = std::move(name);
  ex.description = std::move(description);
  ex.input_shape = shape;
  ex.input = std::move(input);
  ex.axes = std::move(axes);
  ex.eps = 0.0;
  const ConstView x(ex.input.data(), shape);
  const Dims kshape = kept_shape(shape, ex.axes);
  Tensor y(shape), mean(kshape), rstd(kshape);
  layer_norm_forward(y.view(), mean.view(), rstd.view(), x, ConstView{}, ConstView{}, ex.axes, ex.eps);
  ex.checks.push_back(compare("y", y, want.y));
  if (!want.mean.empty()) ex.checks.push_back(compare("mean", mean, want.mean));
  if (!want.rstd.empty()) ex.checks.push_back(compare("rstd", rstd, want.rstd));
  return ex;
}

}  // namespace

bool WorkedExample::passed() const {
  for (const ExampleCheck& c : checks)
    if (!c.passed) return false;
  return !checks.empty();
}

bool WorkedExamples::all_passed() const {
  return num_failed() == 0 && !examples.empty();
}

int WorkedExamples::num_checks() const {
  int n = 0;
  for (const WorkedExample& e : examples) n += static_cast<int>(e.checks.size());
  return n;
}

int WorkedExamples::num_failed() const {
  int n = 0;
  for (const WorkedExample& e : examples)
    for (const ExampleCheck& c : e.checks) n += c.passed ? 0 : 1;
  return n;
}

WorkedExamples run_worked_examples() {
  const double s = std::sqrt(1.5);  // 1/√(2/3): the rstd of {a, a+1, a+2}
  WorkedExamples w;
  w.examples.push_back(run_one("layer-output",
                               "a layer outputs [1, 2, 3]: mean 2, variance 2/3, LayerNorm -> "
                               "[-1.2247, 0, 1.2247]",
                               Dims{3}, {1, 2, 3}, Axes{0}, {.y = {-s, 0, s}, .mean = {2}, .rstd = {s}}));
  w.examples.push_back(run_one("speech-over-F",
                               "[[1,2,3],[3,4,5]] as [F=2, T=3], normalized over F (axis 0): "
                               "[[-1,-1,-1],[1,1,1]]",
                               Dims{2, 3}, {1, 2, 3, 3, 4, 5}, Axes{0},
                               {.y = {-1, -1, -1, 1, 1, 1}, .mean = {2, 3, 4}, .rstd = {1, 1, 1}}));
  w.examples.push_back(run_one("speech-over-T",
                               "[[1,2,3],[3,4,5]] as [F=2, T=3], normalized over T (axis 1): "
                               "rows [-1.2247, 0, 1.2247]",
                               Dims{2, 3}, {1, 2, 3, 3, 4, 5}, Axes{1},
                               {.y = {-s, 0, s, -s, 0, s}, .mean = {2, 4}, .rstd = {s, s}}));
  return w;
}

nlohmann::json worked_examples_json(const WorkedExamples& w) {
  nlohmann::json list = nlohmann::json::array();
  for (const WorkedExample& e : w.examples) {
    nlohmann::json checks = nlohmann::json::array();
    for (const ExampleCheck& c : e.checks)
      checks.push_back({{"quantity", c.quantity},
                        {"shape", c.shape.vec()},
                        {"expected", c.expected},
                        {"actual", c.actual},
                        {"max_abs_err", c.max_abs_err},
                        {"tolerance", c.tolerance},
                        {"passed", c.passed}});
    list.push_back({{"name", e.name},
                    {"description", e.description},
                    {"input_shape", e.input_shape.vec()},
                    {"input", e.input},
                    {"axes", e.axes},
                    {"eps", e.eps},
                    {"checks", checks},
                    {"passed", e.passed()}});
  }
  return list;
}

}  // namespace normlab::lab
