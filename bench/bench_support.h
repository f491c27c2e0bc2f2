// bench/bench_support.h — helpers shared by the benchmark sources of normlab_bench (bench_norm.cpp,
// bench_norm_lowp.cpp): aligned buffers, deterministic fills, and the hook that registers the bf16/fp16
// and fused benchmarks; the argument parsing of the timing loops (bench_loop.cpp, bench_ab_rows.cpp); and
// the timing and quantiles of the paired drivers (bench_bft_pair.cpp, bench_peer_pair.cpp).
#pragma once

#include <normlab/tensor.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

namespace normlab::bench {

// Buffers come from the allocation of normlab's tensors (tensor.h, "storage": 2 MiB or more on
// transparent huge pages unless NORMLAB_HUGE_PAGES=0), so that every implementation a benchmark compares
// reads and writes the memory a normlab user's tensors get.
template <typename T>
using BufferOf = std::unique_ptr<T, detail::StorageFree>;
using Buffer = BufferOf<float>;

// n elements of T, 64-byte aligned, uninitialized.
template <typename T>
BufferOf<T> Allocate(Index n) {
  const detail::Storage st = detail::allocate_storage(static_cast<std::size_t>(n) * sizeof(T));
  return BufferOf<T>(static_cast<T*>(st.p), detail::StorageFree{st.mapped});
}
inline Buffer AllocateFloats(Index n) { return Allocate<float>(n); }

// How the benchmark's large buffers are backed, for the run's context: whether the library advises huge
// pages (NORMLAB_HUGE_PAGES), the system's transparent-huge-page mode, and how much of the process is on
// anonymous huge pages now (/proc/self/smaps_rollup), e.g. "advised; THP madvise; 1536 MiB on huge pages".
inline std::string huge_page_report() {
  auto first_line = [](const char* path, const char* key) -> std::string {
    std::FILE* f = std::fopen(path, "r");
    if (!f) return "";
    char line[256];
    std::string found;
    while (std::fgets(line, sizeof line, f)) {
      const std::string l = line;
      if (key == nullptr || l.rfind(key, 0) == 0) {
        found = l;
        break;
      }
    }
    std::fclose(f);
    while (!found.empty() && (found.back() == '\n' || found.back() == ' ')) found.pop_back();
    return found;
  };
  std::string r = detail::huge_page_storage(kHugePageBytes) ? "advised" : "not advised";
  const std::string mode = first_line("/sys/kernel/mm/transparent_hugepage/enabled", nullptr);
  const std::size_t a = mode.find('['), b = mode.find(']');
  r += "; THP " + (a != std::string::npos && b > a ? mode.substr(a + 1, b - a - 1) : std::string("unknown"));
  const std::string anon = first_line("/proc/self/smaps_rollup", "AnonHugePages:");
  if (!anon.empty())
    r += "; " + std::to_string(std::strtoll(anon.c_str() + 14, nullptr, 10) / 1024) + " MiB on huge pages";
  return r;
}

// Where p starts in its 4 KiB page, in bytes (the row kernels' speed depends on the buffers' offsets:
// docs/PERFORMANCE.md, "seventeenth session").
inline int page_offset(const void* p) {
  return static_cast<int>(reinterpret_cast<std::uintptr_t>(p) % 4096);
}

// A command-line count: a positive decimal integer, or std::invalid_argument naming `what`.
inline long parse_positive(const char* s, const char* what) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v <= 0)
    throw std::invalid_argument(std::string(what) + " must be a positive integer, got '" + s + "'");
  return v;
}

// The main() of a timing tool: run(argc, argv), with an exception reported as "tool: message" on stderr
// (exit status 1).
inline int run_tool(const char* tool, int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", tool, e.what());
    return 1;
  }
}

// Wall time of one call of f, in microseconds (the paired drivers).
template <typename F>
double time_us(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

// The q-quantile of v (0 ≤ q ≤ 1; v not empty), the element of rank round(q·(size − 1)).
inline double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

// Deterministic uniform values in [lo, hi) (splitmix64; fast enough to fill 128 MiB in a blink).
inline void FillUniform(float* p, Index n, std::uint64_t seed, float lo, float hi) {
  std::uint64_t s = seed;
  for (Index i = 0; i < n; ++i) {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    p[i] = lo + (hi - lo) * static_cast<float>(static_cast<double>(z >> 40) * 0x1.0p-24);
  }
}

// bench_norm_lowp.cpp: registers BM_LayerNormFwdBF16, ... (after the fp32 benchmarks) and checks its peers
// on small shapes; exits when a peer disagrees. Returns the context lines' values: oneDNN bf16 support and
// the self-check's worst difference.
struct LowPrecisionContext {
  std::string onednn_bf16;
  std::string selfcheck;
};
LowPrecisionContext RegisterLowPrecision();

}  // namespace normlab::bench
