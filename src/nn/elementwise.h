// Parallel elementwise loops over fixed chunks (internal).
//
// for_chunks(n, body) calls body(begin, end) for the consecutive ranges [k·kElementChunk, …) of [0, n),
// in parallel (normlab's parallel_for). The ranges depend on n only and every element is computed by
// one call, so results are the same bits for any thread count.
#pragma once

#include <normlab/tensor.h>

#include <algorithm>

#include "parallel/parallel.h"

namespace normlab::nn::detail {

inline constexpr Index kElementChunk = 32768;

template <typename Body>
void for_chunks(Index n, Body&& body) {
  parallel::parallel_for((n + kElementChunk - 1) / kElementChunk, [&](Index k) {
    const Index begin = k * kElementChunk;
    body(begin, std::min(n, begin + kElementChunk));
  });
}

}  // namespace normlab::nn::detail
