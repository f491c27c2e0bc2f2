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

const ConvertKernels& convert_kernels() {
  return *for_isa(active_isa(), &scalar::cvt::kConvertTable, &avx2::cvt::kConvertTable,
                  &avx512::cvt::kConvertTable);
}

}  // namespace normlab::kernels
