// The row kernels' machine choices (row_kernels.h, RowTuning): which machine this processor is taken for.
#include <cpuid.h>
#include <normlab/error.h>

#include <cstdlib>
#include <string_view>

#include "norm/row_kernels.h"

namespace normlab::kernels {

CpuKind parse_cpu_kind(const char* name) {
  const std::string_view s = name ? name : "";
  if (s == "intel") return CpuKind::kIntel;
  if (s == "zen4") return CpuKind::kZen4;
  if (s == "zen5") return CpuKind::kZen5;
  NL_CHECK(false, "NORMLAB_ROW_TUNING must be intel, zen4 or zen5, got '{}'", s);
  return CpuKind::kIntel;
}

const char* cpu_kind_name(CpuKind kind) {
  switch (kind) {
    case CpuKind::kIntel:
      return "intel";
    case CpuKind::kZen4:
      return "zen4";
    case CpuKind::kZen5:
      return "zen5";
  }
  return "?";
}

CpuKind machine_cpu_kind() {
  if (const char* env = std::getenv("NORMLAB_ROW_TUNING"); env && *env) return parse_cpu_kind(env);
  __builtin_cpu_init();
  if (!__builtin_cpu_is("amd")) return CpuKind::kIntel;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return CpuKind::kZen4;
  const unsigned base = (eax >> 8) & 0xF, family = base == 0xF ? base + ((eax >> 20) & 0xFF) : base;
  return family >= 0x1A ? CpuKind::kZen5 : CpuKind::kZen4;
}

const RowTuning& machine_row_tuning() {
  static const RowTuning t = row_tuning_for(machine_cpu_kind());
  return t;
}

}  // namespace normlab::kernels
