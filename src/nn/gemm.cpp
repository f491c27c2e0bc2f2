// Row-major GEMM: oneDNN for float, a plain loop for double (see gemm.h).
#include "nn/gemm.h"

#include <dnnl.h>
#include <omp.h>

#include <algorithm>

#include "parallel/parallel.h"

namespace normlab::nn {

namespace {

// C = beta·C for the K = 0 case (beta = 0 writes zeros without reading C).
template <typename Real>
void scale_c(Index M, Index N, Real beta, Real* C, Index ldc) {
  for (Index i = 0; i < M; ++i)
    for (Index j = 0; j < N; ++j) C[i * ldc + j] = beta == Real(0) ? Real(0) : beta * C[i * ldc + j];
}

void check_args(Index M, Index N, Index K, Index lda, Index ldb, Index ldc, bool ta, bool tb) {
  NL_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size M={} N={} K={}", M, N, K);
  // Row-major: a stored matrix of r rows and c columns needs ld ≥ c.
  const Index a_cols = ta ? M : K, b_cols = tb ? K : N;
  NL_CHECK(lda >= std::max<Index>(a_cols, 1) && ldb >= std::max<Index>(b_cols, 1) && ldc >= std::max<Index>(N, 1),
           "gemm: leading dimensions lda={} ldb={} ldc={} too small for M={} N={} K={}", lda, ldb, ldc, M, N, K);
}

}  // namespace

template <>
void gemm<float>(bool trans_a, bool trans_b, Index M, Index N, Index K, float alpha, const float* A, Index lda,
                 const float* B, Index ldb, float beta, float* C, Index ldc, bool one_thread) {
  check_args(M, N, K, lda, ldb, ldc, trans_a, trans_b);
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_c(M, N, beta, C, ldc);
  // oneDNN threads its GEMM with OpenMP over omp_get_max_threads() threads: make that normlab's thread
  // count (set_num_threads) for this call, and restore the caller's setting after it. Inside a parallel
  // region (the per-head products of attention) oneDNN runs on the calling thread alone.
  const bool nested = omp_in_parallel() != 0;
  const int saved = nested ? 0 : omp_get_max_threads(), nt = nested ? 0 : one_thread ? 1 : num_threads();
  if (!nested && saved != nt) omp_set_num_threads(nt);
  const dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb,
                                      beta, C, ldc);
  if (!nested && saved != nt) omp_set_num_threads(saved);
  NL_CHECK(st == dnnl_success, "gemm: dnnl_sgemm failed with status {} (M={} N={} K={})", static_cast<int>(st), M,
           N, K);
}

template <>
void gemm<double>(bool trans_a, bool trans_b, Index M, Index N, Index K, double alpha, const double* A, Index lda,
                  const double* B, Index ldb, double beta, double* C, Index ldc, bool /*one_thread*/) {
  check_args(M, N, K, lda, ldb, ldc, trans_a, trans_b);
  if (M == 0 || N == 0) return;
  auto row = [&](Index i) {
    for (Index j = 0; j < N; ++j) {
      double acc = 0;
      for (Index k = 0; k < K; ++k) {
        const double a = trans_a ? A[k * lda + i] : A[i * lda + k];
        const double b = trans_b ? B[j * ldb + k] : B[k * ldb + j];
        acc += a * b;
      }
      double& c = C[i * ldc + j];
      c = beta == 0.0 ? alpha * acc : alpha * acc + beta * c;
    }
  };
  // Small products (finite-difference tests call thousands) run on the calling thread; either way every
  // row is computed alone, so the bits do not depend on the thread count.
  if (M * N * K < (Index{1} << 16)) {
    for (Index i = 0; i < M; ++i) row(i);
  } else {
    parallel::parallel_for(M, row);
  }
}

}  // namespace normlab::nn
