// Row-major general matrix multiply for the layer library (internal).
//
//   C = alpha · op(A) · op(B) + beta · C        op(X) = X or Xᵀ
//   op(A) is (M,K), op(B) is (K,N), C is (M,N); all row-major with leading dimensions lda, ldb, ldc
//   (the distance in elements between consecutive rows of A, B, C as stored).
// beta = 0 means "write" (C is not read, so it may hold garbage or NaN); beta = 1 means "accumulate".
//
// float   oneDNN's dnnl_sgemm (row-major C API); a non-success status throws normlab::Error.
// double  a plain loop (the float64 reference; used by tests and finite differences only), summing
//         over k in increasing order. Rows of C are computed in parallel (each row alone: same bits for
//         any thread count).
// M, N or K may be 0: an empty C is left alone; K = 0 gives C = beta·C.
#pragma once

#include <normlab/tensor.h>

namespace normlab::nn {

// one_thread: the float product runs on the calling thread alone (the per-head products of attention,
// whose bits must not depend on the thread count even when a single chunk runs outside a parallel
// region); otherwise oneDNN uses normlab's thread count (set_num_threads), or one thread when called
// inside a parallel region.
template <typename Real>
void gemm(bool trans_a, bool trans_b, Index M, Index N, Index K, Real alpha, const Real* A, Index lda,
          const Real* B, Index ldb, Real beta, Real* C, Index ldc, bool one_thread = false);

}  // namespace normlab::nn
