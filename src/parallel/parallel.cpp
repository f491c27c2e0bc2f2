#include "parallel/parallel.h"

#include <omp.h>
#include <unistd.h>

#include <atomic>

namespace normlab {

namespace {
std::atomic<int> g_threads{0};  // 0: not set, use the OpenMP default
}  // namespace

void set_num_threads(int n) {
  NL_CHECK(n >= 1, "thread count must be at least 1, got {}", n);
  g_threads.store(n);
}

int num_threads() {
  const int n = g_threads.load();
  return n > 0 ? n : omp_get_max_threads();
}

namespace parallel {

Index l2_cache_bytes() {
  static const Index bytes = [] {
    const long r = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return r > 0 ? static_cast<Index>(r) : Index{1} << 20;
  }();
  return bytes;
}

}  // namespace parallel

}  // namespace normlab
