// When the norm kernels write their outputs with streaming (non-temporal) stores (internal).
#pragma once

#include <cstdint>

namespace normlab::kernels {

// Outputs of at least this many bytes are written with streaming stores (and the row kernels prefetch
// their inputs ahead, RowTuning): they would not stay in the cache anyway, and would evict the inputs
// from the last-level cache. A result never depends on it (the same values either way).
inline constexpr std::int64_t kStreamMinBytes = std::int64_t{16} << 20;

// The threshold in force: kStreamMinBytes unless a test lowered it (ScopedStreamMinBytes).
std::int64_t stream_min_bytes();

// Whether an output of `bytes` bytes is written with streaming stores.
inline bool stream_output_bytes(std::int64_t bytes) {
  return bytes >= stream_min_bytes();
}

// Sets the threshold for the process (bytes ≥ 0; 0 streams every output) until restored: for tests, which
// run the out-of-cache paths on tensors far smaller than 16 MiB (fast under the sanitizers). Not for
// concurrent use with running kernels.
class ScopedStreamMinBytes {
 public:
  explicit ScopedStreamMinBytes(std::int64_t bytes);
  ~ScopedStreamMinBytes();
  ScopedStreamMinBytes(const ScopedStreamMinBytes&) = delete;
  ScopedStreamMinBytes& operator=(const ScopedStreamMinBytes&) = delete;

 private:
  std::int64_t saved_;
};

}  // namespace normlab::kernels
