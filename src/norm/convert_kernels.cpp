// Runtime choice of the storage-conversion kernels: the same target as the row kernels (normlab/simd.h).
#include <normlab/simd.h>

#include "norm/convert_kernels.h"

namespace normlab::kernels {
namespace scalar::cvt { extern const ConvertKernels kConvertTable; }
namespace avx2::cvt { extern const ConvertKernels kConvertTable; }
namespace avx512::cvt { extern const ConvertKernels kConvertTable; }

const ConvertKernels& convert_kernels() {
  switch (active_isa()) {
    case Isa::kAvx512: return avx512::cvt::kConvertTable;
    case Isa::kAvx2: return avx2::cvt::kConvertTable;
    case Isa::kScalar: break;
  }
  return scalar::cvt::kConvertTable;
}

}  // namespace normlab::kernels
