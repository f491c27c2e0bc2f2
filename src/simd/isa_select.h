// One value per instruction set, picked by an Isa (internal): the kernel tables compiled once per target
// (row, column, channel, convert kernels) and the speech front end's per-target functions.
#pragma once

#include <normlab/simd.h>

namespace normlab {

// The value for `isa`: scalar, avx2 or avx512. The avx512bf16 target runs the avx512 code everywhere but in
// the bf16 rounding stores (src/norm/convert_kernels.cpp picks its own table for those).
template <typename T>
T for_isa(Isa isa, T scalar, T avx2, T avx512) {
  switch (isa) {
    case Isa::kAvx512:
    case Isa::kAvx512Bf16:
      return avx512;
    case Isa::kAvx2:
      return avx2;
    case Isa::kScalar:
      break;
  }
  return scalar;
}

}  // namespace normlab
