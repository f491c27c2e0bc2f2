// Runtime choice of the instruction set for the row kernels.
#include <normlab/simd.h>

#include <atomic>
#include <cstdlib>

#include "norm/row_kernels.h"
#include "simd/isa_select.h"

namespace normlab {
namespace kernels {
namespace scalar {
extern const RowKernels kTable;
}
namespace avx2 {
extern const RowKernels kTable;
}
namespace avx512 {
extern const RowKernels kTable;
}
}  // namespace kernels

namespace {

// Every target, from the most portable to the fastest: supported_isas() keeps this order, so its last
// entry is the default.
constexpr Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16};

Isa best_isa() {
  if (const char* env = std::getenv("NORMLAB_ISA"); env && *env) {
    const Isa isa = parse_isa(env);
    NL_CHECK(isa_supported(isa), "NORMLAB_ISA={} but this CPU does not support it", env);
    return isa;
  }
  return supported_isas().back();  // scalar is always supported
}

std::atomic<Isa>& active() {
  static std::atomic<Isa> isa{best_isa()};
  return isa;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx512Bf16:
      return "avx512bf16";
  }
  return "?";
}

Isa parse_isa(const std::string& name) {
  for (Isa isa : kAllIsas)
    if (name == isa_name(isa)) return isa;
  throw Error(fmt::format("unknown instruction set '{}' (valid: scalar, avx2, avx512, avx512bf16)", name));
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
    case Isa::kAvx512Bf16:
      return isa_supported(Isa::kAvx512) && __builtin_cpu_supports("avx512bf16");
  }
  return false;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : kAllIsas)
    if (isa_supported(isa)) out.push_back(isa);
  return out;
}

Isa active_isa() {
  return active().load();
}

void set_isa(Isa isa) {
  NL_CHECK(isa_supported(isa), "instruction set {} is not supported by this CPU", isa_name(isa));
  active().store(isa);
}

const kernels::RowKernels& kernels::row_kernels() {
  return *for_isa(active_isa(), &scalar::kTable, &avx2::kTable, &avx512::kTable);
}

}  // namespace normlab
