// Argument checks and instantiation helpers shared by the layer sources (internal).
#pragma once

#include <normlab/error.h>
#include <normlab/tensor.h>

#include <span>

namespace normlab::nn::detail {

// Every size of a layer must be ≥ 1: "linear: C must be ≥ 1, got 0".
inline void check_size(const char* layer, const char* name, Index value) {
  NL_CHECK(value >= 1, "{}: {} must be ≥ 1, got {}", layer, name, value);
}

inline void check_not_null(const char* layer, const char* name, const void* p) {
  NL_CHECK(p != nullptr, "{}: {} must not be null", layer, name);
}

// lengths: empty, or B entries in [0, T].
inline void check_lengths(const char* layer, std::span<const Index> lengths, Index B, Index T) {
  if (lengths.empty()) return;
  NL_CHECK(static_cast<Index>(lengths.size()) == B, "{}: lengths has {} entries, expected B = {} (or none)", layer,
           lengths.size(), B);
  for (Index b = 0; b < B; ++b) {
    const Index len = lengths[static_cast<std::size_t>(b)];
    NL_CHECK(len >= 0 && len <= T, "{}: lengths[{}] = {} is out of range [0, T = {}]", layer, b, len, T);
  }
}

// The real length of sequence b.
inline Index length_of(std::span<const Index> lengths, Index b, Index T) {
  return lengths.empty() ? T : lengths[static_cast<std::size_t>(b)];
}

}  // namespace normlab::nn::detail
