// A double mean's fp32 pair (internal): the one definition of m_hi and m_lo for every kernel family.
#pragma once

namespace normlab::kernels {
// Internal linkage: the per-target kernel units (compiled with different instruction sets) include this
// too, and an out-of-line copy of an inline function could otherwise be taken from any of them.
namespace {

struct MeanSplit {
  float hi, lo;
};

// docs/numerics.md ("Precision"): m_hi = float(mean), m_lo = float(mean − m_hi), the pair carrying the mean
// to about u² relative.
inline MeanSplit split_mean(double mean) {
  const float hi = static_cast<float>(mean);
  return {hi, static_cast<float>(mean - static_cast<double>(hi))};
}

}  // namespace
}  // namespace normlab::kernels
