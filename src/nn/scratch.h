// Reusable scratch memory for the layers' internal temporaries (internal).
//
// A training loop calls the same layers with the same sizes every step; allocating their (N,C) and
// (N,F) temporaries each time costs a page fault per 4 KiB (glibc serves large blocks with mmap), more
// than the arithmetic of the elementwise passes. scratch<Real>(slot, n) returns a buffer of at least n
// elements that lives until the thread ends and is reused by the next call with the same slot. Its
// contents are unspecified: the caller writes before it reads.
//
// Each slot belongs to one function (the list below), so buffers that are alive at the same time never
// share a slot. A function that uses a slot must not call another that uses the same slot.
#pragma once

#include <normlab/tensor.h>

#include <cstddef>
#include <vector>

namespace normlab::nn::detail {

enum ScratchSlot : int {
  kAttnDout,    // attention_backward: dout with the padded rows zeroed
  kAttnDctx,    // attention_backward: ∂/∂ctx
  kAttnDq,      // attention_backward: ∂/∂q, ∂/∂k, ∂/∂v
  kAttnDk,
  kAttnDv,
  kFfnDhidden,  // ffn_backward: ∂/∂a, then (in place) ∂/∂h
  kNormDx,      // layernorm_backward / rmsnorm_backward: the library's dx (written =) before dinp += dx
  kNormScaled,  // Norm::backward: scale·dout
  kBnInp,       // batchnorm_forward/backward with padding: the real rows of inp, out (or dout), dx
  kBnOut,
  kBnDx,
  kBlockGrad0,  // Block::backward: its 7 (N,C) gradient temporaries, kBlockGrad0 + 0..6
  kBlockGradLast = kBlockGrad0 + 6,
  kNumScratchSlots
};

template <typename Real>
Real* scratch(ScratchSlot slot, Index n) {
  thread_local std::vector<Real> buffers[kNumScratchSlots];
  std::vector<Real>& b = buffers[slot];
  if (b.size() < static_cast<std::size_t>(n)) b.resize(static_cast<std::size_t>(n));
  return b.data();
}

}  // namespace normlab::nn::detail
