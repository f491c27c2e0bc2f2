// Learning-rate schedules: lr(step) as pure functions.
//
// `step` is the 0-based index of the optimizer update about to be taken (the first update is step 0);
// n = step + 1 is the number of updates including this one; w = warmup steps; lr = peak rate.
//   constant  lr                                                  (warmup must be 0)
//   linear    lr · min(1, n / w)                                  linear warmup, then constant
//   cosine    n ≤ w: lr · n / w;  then lr · (f + (1 − f) · ½(1 + cos(π · p))), p = min(1, (n − w) / (S − w))
//             with S the total number of steps and f the floor fraction (0.1: decays to 0.1 · lr at the
//             last step)
//   noam      lr · √w · min(1/√n, n / w^1.5)                       (Vaswani et al.; peak lr at n = w;
//             w = 0 is taken as 1, i.e. lr / √n)
#pragma once

#include <cstdint>
#include <string>

namespace normlab::nn {

enum class ScheduleKind { kConstant, kLinear, kCosine, kNoam };

const char* schedule_name(ScheduleKind k);
ScheduleKind parse_schedule(const std::string& name);  // throws normlab::Error listing the valid names

struct Schedule {
  ScheduleKind kind = ScheduleKind::kConstant;
  double lr = 3e-3;            // peak learning rate
  std::int64_t warmup = 0;     // warmup steps
  std::int64_t total = 0;      // total steps (cosine only)
  double floor = 0.1;          // cosine: final fraction of lr
};

// Throws normlab::Error for a negative lr/warmup, constant with warmup > 0, cosine with total ≤ warmup,
// or a floor outside [0, 1].
void validate(const Schedule& s);

// The learning rate of update `step` (0-based).
double lr_at(const Schedule& s, std::int64_t step);

}  // namespace normlab::nn
