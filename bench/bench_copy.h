// The copy roofline shared by the benchmark sources of normlab_bench: y = x with ordinary vector stores or
// with non-temporal (streaming) stores, split into one contiguous part per thread.
#pragma once

#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <normlab/tensor.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>

// libgomp's entry point for `#pragma omp parallel num_threads(n)`. The bench target is not compiled with
// -fopenmp, so the copy kernels call it directly; it runs them on the same OpenMP thread pool that
// normlab, ATen and oneDNN use.
extern "C" void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags);

namespace normlab::bench {

using CopyFn = void (*)(float* dst, const float* src, Index n);

// Scalar math (all four): dst[i] = src[i].
__attribute__((target("avx512f"))) inline void CopyStoreAvx512(float* dst, const float* src, Index n) {
  Index i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, _mm512_loadu_ps(src + i));
  for (; i < n; ++i) dst[i] = src[i];
}

// Non-temporal stores need a 64-byte aligned destination: a scalar head reaches the boundary first.
__attribute__((target("avx512f"))) inline void CopyStreamAvx512(float* dst, const float* src, Index n) {
  Index i = 0;
  for (; i < n && (reinterpret_cast<std::uintptr_t>(dst + i) & 63) != 0; ++i) dst[i] = src[i];
  for (; i + 16 <= n; i += 16) _mm512_stream_ps(dst + i, _mm512_loadu_ps(src + i));
  for (; i < n; ++i) dst[i] = src[i];
  _mm_sfence();
}

__attribute__((target("avx"))) inline void CopyStoreAvx(float* dst, const float* src, Index n) {
  Index i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_loadu_ps(src + i));
  for (; i < n; ++i) dst[i] = src[i];
}

__attribute__((target("avx"))) inline void CopyStreamAvx(float* dst, const float* src, Index n) {
  Index i = 0;
  for (; i < n && (reinterpret_cast<std::uintptr_t>(dst + i) & 31) != 0; ++i) dst[i] = src[i];
  for (; i + 8 <= n; i += 8) _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
  for (; i < n; ++i) dst[i] = src[i];
  _mm_sfence();
}

inline CopyFn StoreCopy() { return __builtin_cpu_supports("avx512f") ? CopyStoreAvx512 : CopyStoreAvx; }
inline CopyFn StreamCopy() { return __builtin_cpu_supports("avx512f") ? CopyStreamAvx512 : CopyStreamAvx; }

struct CopyJob {
  CopyFn fn;
  float* dst;
  const float* src;
  Index n;
};

// One contiguous part per thread, cut at multiples of 16 floats so that every part starts on a line.
inline void CopyPart(void* arg) {
  const auto* job = static_cast<const CopyJob*>(arg);
  const Index t = omp_get_thread_num(), nt = omp_get_num_threads();
  const Index blocks = (job->n + 15) / 16;
  const Index begin = std::min(job->n, blocks * t / nt * 16);
  const Index end = std::min(job->n, blocks * (t + 1) / nt * 16);
  job->fn(job->dst + begin, job->src + begin, end - begin);
}

inline void ParallelCopy(CopyFn fn, float* dst, const float* src, Index n, int threads) {
  CopyJob job{fn, dst, src, n};
  if (threads <= 1) {
    fn(dst, src, n);
  } else {
    GOMP_parallel(CopyPart, &job, static_cast<unsigned>(threads), 0);
  }
}

// BM_Copy / BM_CopyStream: n floats from src to dst, bytes = read + write.
inline void RunCopyBenchmark(benchmark::State& state, bool stream, float* dst, const float* src, Index n,
                             int threads) {
  const CopyFn fn = stream ? StreamCopy() : StoreCopy();
  ParallelCopy(fn, dst, src, n, threads);  // untimed warm-up (page touch)
  for (auto _ : state) {
    ParallelCopy(fn, dst, src, n, threads);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * static_cast<std::int64_t>(sizeof(float)) * n);
}

}  // namespace normlab::bench
