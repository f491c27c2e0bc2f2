#include "norm/streaming.h"

#include <atomic>

#include "normlab/error.h"

namespace normlab::kernels {

namespace {
std::atomic<std::int64_t> g_stream_min_bytes{kStreamMinBytes};
}  // namespace

std::int64_t stream_min_bytes() {
  return g_stream_min_bytes.load(std::memory_order_relaxed);
}

ScopedStreamMinBytes::ScopedStreamMinBytes(std::int64_t bytes) : saved_(stream_min_bytes()) {
  NL_CHECK(bytes >= 0, "streaming-store threshold must be at least 0 bytes, got {}", bytes);
  g_stream_min_bytes.store(bytes, std::memory_order_relaxed);
}

ScopedStreamMinBytes::~ScopedStreamMinBytes() {
  g_stream_min_bytes.store(saved_, std::memory_order_relaxed);
}

}  // namespace normlab::kernels
