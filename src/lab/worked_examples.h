// (Moved from tools/cli for the lab library.) The seed article's worked LayerNorm examples, run through normlab's real kernel and compared with
// the hand-computed answers. Returned as data so that `normlab lab` (today and in its later, fuller
// form) can print, check and record them.
//
//   layer-output:  a layer outputs [1, 2, 3]; LayerNorm over it: mean 2, rstd √(3/2),
//                  y = [−1.2247, 0, 1.2247]
//   speech-over-F: [[1,2,3],[3,4,5]] of shape [F=2, T=3] normalized over F (axis 0): every column is
//                  {a, a+2}, mean a+1, variance 1 → [[−1,−1,−1],[1,1,1]]
//   speech-over-T: the same tensor over T (axis 1): each row {a, a+1, a+2}, variance 2/3 →
//                  rows [−1.2247, 0, 1.2247]
// All use eps = 0, so the hand answers are exact.
#pragma once

#include <normlab/norm.h>
#include <normlab/tensor.h>

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace normlab::lab {

// One quantity of one example compared against its hand-computed value.
struct ExampleCheck {
  std::string quantity;          // "y", "mean", "rstd"
  Dims shape;                    // of the quantity
  std::vector<double> expected;  // hand-computed, C order
  std::vector<double> actual;    // from normlab's kernel, C order
  double max_abs_err = 0;
  double tolerance = 0;
  bool passed = false;
};

struct WorkedExample {
  std::string name;         // short id, e.g. "layer-output"
  std::string description;  // one line for humans
  Dims input_shape;
  std::vector<float> input;  // C order
  Axes axes;
  double eps = 0;
  std::vector<ExampleCheck> checks;

  bool passed() const;
};

struct WorkedExamples {
  std::vector<WorkedExample> examples;

  bool all_passed() const;
  int num_checks() const;
  int num_failed() const;
};

// Runs every worked example through normlab::layer_norm_forward. Never throws for a wrong answer (the
// checks record it); throws normlab::Error only if the kernel rejects its input.
WorkedExamples run_worked_examples();

nlohmann::json worked_examples_json(const WorkedExamples& w);

}  // namespace normlab::lab
