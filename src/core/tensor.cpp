// Out-of-line pieces of tensor.h (kept small: views are header-only templates).
#include <normlab/tensor.h>

namespace normlab {

// Explicit instantiations catch template errors at library build time.
template class TensorView<float>;
template class TensorView<const float>;
template class BasicTensor<float>;
template class BasicTensor<double>;
}  // namespace normlab
