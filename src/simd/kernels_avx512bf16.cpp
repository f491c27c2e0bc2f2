// The avx512bf16 target (normlab/simd.h): the bf16 rounding entries of the storage-conversion table, compiled
// with the avx512 flags plus AVX512_BF16 (CMakeLists.txt), so that simd/vec.h's bf16 store uses
// vcvtneps2bf16. Every other kernel of that target is avx512's (src/simd/isa_select.h).
#define NL_TARGET avx512bf16
#define NL_BF16_ONLY 1
// convert_kernels-inl.h uses the row kernels, so it comes second.
// clang-format off
#include "norm/row_kernels-inl.h"
#include "norm/convert_kernels-inl.h"
// clang-format on
