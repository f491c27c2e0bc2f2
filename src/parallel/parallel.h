// Deterministic parallel loops (internal).
#pragma once

#include <normlab/parallel.h>
#include <normlab/tensor.h>

#include <exception>
#include <mutex>

namespace normlab::parallel {

// This core's L2 cache in bytes (1 MiB when the system does not say).
Index l2_cache_bytes();

// Runs body(i) for i in [0, n) on the configured threads with a static schedule. Each i is one fixed
// chunk of work decided by the caller from the problem shape, so results never depend on the thread
// count. The first exception thrown by a body is rethrown on the calling thread.
template <typename Body>
void parallel_for(Index n, Body&& body) {
  const int nt = num_threads();
  if (n <= 1 || nt <= 1) {
    for (Index i = 0; i < n; ++i) body(i);
    return;
  }
  std::exception_ptr error;
  std::mutex error_mutex;
#pragma omp parallel for schedule(static) num_threads(nt)
  for (Index i = 0; i < n; ++i) {
    try {
      body(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace normlab::parallel
