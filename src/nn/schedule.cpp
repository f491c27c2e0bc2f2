// Learning-rate schedules (src/nn/schedule.h).
#include "nn/schedule.h"

#include <normlab/error.h>

#include <algorithm>
#include <cmath>
#include <numbers>

namespace normlab::nn {

const char* schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::kConstant: return "constant";
    case ScheduleKind::kLinear: return "linear";
    case ScheduleKind::kCosine: return "cosine";
    case ScheduleKind::kNoam: return "noam";
  }
  return "?";
}

ScheduleKind parse_schedule(const std::string& name) {
  for (ScheduleKind k : {ScheduleKind::kConstant, ScheduleKind::kLinear, ScheduleKind::kCosine, ScheduleKind::kNoam})
    if (name == schedule_name(k)) return k;
  throw Error("unknown schedule \"" + name + "\"; valid: constant, linear, cosine, noam");
}

void validate(const Schedule& s) {
  NL_CHECK(std::isfinite(s.lr) && s.lr >= 0, "learning rate must be finite and ≥ 0, got {}", s.lr);
  NL_CHECK(s.warmup >= 0, "warmup must be ≥ 0 steps, got {}", s.warmup);
  NL_CHECK(s.kind != ScheduleKind::kConstant || s.warmup == 0,
           "schedule constant takes no warmup (got warmup {}); use schedule linear for a linear warmup "
           "followed by a constant rate",
           s.warmup);
  if (s.kind == ScheduleKind::kCosine) {
    NL_CHECK(s.total > s.warmup, "schedule cosine needs more steps ({}) than warmup steps ({})", s.total,
             s.warmup);
    NL_CHECK(s.floor >= 0 && s.floor <= 1, "cosine floor fraction must be in [0, 1], got {}", s.floor);
  }
}

double lr_at(const Schedule& s, std::int64_t step) {
  const double n = static_cast<double>(step + 1);
  const double w = static_cast<double>(s.warmup);
  switch (s.kind) {
    case ScheduleKind::kConstant: return s.lr;
    case ScheduleKind::kLinear: return s.warmup > 0 ? s.lr * std::min(1.0, n / w) : s.lr;
    case ScheduleKind::kCosine: {
      if (s.warmup > 0 && n <= w) return s.lr * n / w;
      const double span = static_cast<double>(std::max<std::int64_t>(1, s.total - s.warmup));
      const double p = std::clamp((n - w) / span, 0.0, 1.0);
      return s.lr * (s.floor + (1 - s.floor) * 0.5 * (1 + std::cos(std::numbers::pi * p)));
    }
    case ScheduleKind::kNoam: {
      const double ww = std::max(1.0, w);
      return s.lr * std::sqrt(ww) * std::min(1.0 / std::sqrt(n), n / std::pow(ww, 1.5));
    }
  }
  return s.lr;
}

}  // namespace normlab::nn
