// normlab/simd.h — which instruction set the kernels run on.
//
// Each vectorized kernel is compiled once per target from a single source (src/norm/row_kernels-inl.h)
// and chosen at run time: the best target the CPU supports, or the one named by the environment
// variable NORMLAB_ISA (scalar, avx2, avx512) or by set_isa(). All targets perform the same
// operations in the same order, so they produce identical bits; tests check that.
#pragma once

#include <string>
#include <vector>

namespace normlab {

enum class Isa { kScalar, kAvx2, kAvx512 };

const char* isa_name(Isa isa);
Isa parse_isa(const std::string& name);  // throws normlab::Error for an unknown name
bool isa_supported(Isa isa);              // does this CPU run it?
std::vector<Isa> supported_isas();        // scalar first
Isa active_isa();
void set_isa(Isa isa);  // throws normlab::Error when the CPU lacks it

}  // namespace normlab
