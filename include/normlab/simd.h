// normlab/simd.h — which instruction set the kernels run on.
//
// Each vectorized kernel is compiled once per target from a single source (src/norm/row_kernels-inl.h)
// and chosen at run time: the best target the CPU supports, or the one named by the environment
// variable NORMLAB_ISA (scalar, avx2, avx512, avx512bf16) or by set_isa(). All targets perform the same
// operations in the same order, so they produce identical bits; tests check that.
#pragma once

#include <string>
#include <vector>

namespace normlab {

// kAvx512Bf16: the avx512 kernels, except that bf16 rounding stores (the fused norms on bf16 rows, the
// fp32 → bf16 conversion) use AVX512_BF16's conversion instruction (AMD Zen 4 and later, Intel Cooper
// Lake and Sapphire Rapids and later). That instruction flushes subnormal inputs to zero, so a vector with a
// subnormal lane takes the avx512 integer rounding instead: the bits are those of every other target.
enum class Isa { kScalar, kAvx2, kAvx512, kAvx512Bf16 };

const char* isa_name(Isa isa);
Isa parse_isa(const std::string& name);  // throws normlab::Error for an unknown name
bool isa_supported(Isa isa);              // does this CPU run it?
std::vector<Isa> supported_isas();        // scalar first
Isa active_isa();
void set_isa(Isa isa);  // throws normlab::Error when the CPU lacks it

}  // namespace normlab
