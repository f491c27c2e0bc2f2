// Runtime choice of the storage-conversion kernels: the same target as the row kernels (normlab/simd.h).
#include "norm/convert_kernels.h"

#include <normlab/simd.h>

#include "simd/isa_select.h"

namespace normlab::kernels {
namespace scalar::cvt {
extern const ConvertKernels kConvertTable;
}
namespace avx2::cvt {
extern const ConvertKernels kConvertTable;
}
namespace avx512::cvt {
extern const ConvertKernels kConvertTable;
}
namespace avx512bf16::cvt {
extern const Bf16Kernels kBf16Table;
}

namespace {

// avx512's table with the bf16 rounding entries of the avx512bf16 target.
const ConvertKernels& avx512bf16_table() {
  static const ConvertKernels table = [] {
    ConvertKernels t = avx512::cvt::kConvertTable;
    const Bf16Kernels& b = avx512bf16::cvt::kBf16Table;
    t.narrow[kBf16] = b.narrow;
    t.rows_forward_bf16 = b.rows_forward;
    t.rows_backward_bf16 = b.rows_backward;
    return t;
  }();
  return table;
}

}  // namespace

const ConvertKernels& convert_kernels() {
  const Isa isa = active_isa();
  if (isa == Isa::kAvx512Bf16) return avx512bf16_table();
  return *for_isa(isa, &scalar::cvt::kConvertTable, &avx2::cvt::kConvertTable, &avx512::cvt::kConvertTable);
}

}  // namespace normlab::kernels
