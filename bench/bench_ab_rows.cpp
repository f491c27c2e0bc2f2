// A paired A/B of two versions of the row kernels (src/norm/row_kernels-inl.h with src/simd/vec.h) in one
// process, for machines whose speed drifts between runs seconds apart (docs/PERFORMANCE.md, "2026-11-30,
// eighth session"). scripts/ab-rows builds this file with two copies of the kernel sources, compiled under
// the target namespaces `ab_a` and `ab_b` (each vec.h copy ends in its own comment line, so that GCC's
// #pragma once, which takes files of equal content and time for one, includes both), and runs it:
//
//   scripts/ab-rows REV KERNELS SHAPES [CALLS]     # A = REV's kernel files, B = the working tree's
//   scripts/ab-rows HEAD~1 ln-bwd-saved,ln-fwd 8192x64,2048x256 1000
//
// Each of CALLS rounds times one call of A and one of B, alternating which goes first; it prints the
// minimum, 10th percentile and median of each, the quartiles of the per-round ratio B/A (both calls
// of a round see the same machine), and a hash of each version's outputs (whether the bits are the same).
// KERNELS and SHAPES are comma-separated lists (ROWSxD); every kernel runs at every shape. A KERNEL is
// ln-fwd | ln-fwd-bf16 (y, mean, rstd from x, γ, β; one call over all rows) | ln-bwd-saved |
// ln-bwd-saved-bf16 (dx, dγ, dβ from dy, x, γ and saved double statistics) | ln-bwd (the same, the
// statistics recomputed from x) | rms-bwd-saved (dx, dγ). A
// backward makes one kernel call per 1024 rows, each assigning its own dγ/dβ partial rows, as the
// library's chunks do. x, dy ~ N(1, 2), γ = 1 + 0.01·i, β = 0.1 (those of normlab_bench_loop).
// Only the kernel sources differ between A and B: both use the working tree's row_kernels.h, so a
// revision whose argument structs differ from it cannot be compared this way.
#ifndef NL_AB_A
#error "build with scripts/ab-rows (NL_AB_A, NL_AB_B: the paths of the two row_kernels-inl.h copies)"
#endif
#define NL_TARGET ab_a
#include NL_AB_A
#undef NL_TARGET
#define NL_TARGET ab_b
#include NL_AB_B
#undef NL_TARGET

#include <normlab/tensor.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_support.h"

namespace {

using normlab::bfloat16;
using normlab::Index;
using normlab::bench::parse_positive;
namespace k = normlab::kernels;

template <typename T>
std::uint64_t hash_bits(const T* p, std::size_t n, std::uint64_t h = 0) {
  for (std::size_t i = 0; i < n; ++i) {
    unsigned char b[sizeof(T)];
    std::memcpy(b, p + i, sizeof(T));
    for (unsigned char c : b) h = (h ^ c) * 1099511628211ull;
  }
  return h;
}

struct Problem {
  Index rows = 0, n = 0;
  bool center = true;
  std::vector<float> w, b, mean, rstd;
  std::vector<double> smean, srstd, dw, db;
};

// One timed call of version V (0: A, 1: B) on storage type T.
template <typename T>
struct Run {
  Problem& p;
  std::vector<T>& x;
  std::vector<T>& dy;
  std::vector<T>& out;
  bool backward;
  bool saved;

  double operator()(int v) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!backward) {
      k::RowsForwardOf<T> a;
      a.y = out.data();
      a.ldy = p.n;
      a.x = x.data();
      a.ldx = p.n;
      a.rows = p.rows;
      a.n = p.n;
      a.w = p.w.data();
      a.b = p.b.data();
      a.eps = 1e-5;
      a.center = true;
      a.mean = p.mean.data();
      a.rstd = p.rstd.data();
      a.ld_stats = 1;
      if (v == 0)
        k::ab_a::rows_forward_of<T>(a);
      else
        k::ab_b::rows_forward_of<T>(a);
    } else {
      constexpr Index kChunk = 1024;
      for (Index r0 = 0, c = 0; r0 < p.rows; r0 += kChunk, ++c) {
        k::RowsBackwardOf<T> a;
        a.dx = out.data() + r0 * p.n;
        a.lddx = p.n;
        a.dy = dy.data() + r0 * p.n;
        a.lddy = p.n;
        a.x = x.data() + r0 * p.n;
        a.ldx = p.n;
        a.rows = std::min(kChunk, p.rows - r0);
        a.n = p.n;
        a.w = p.w.data();
        a.eps = 1e-5;
        a.center = p.center;
        a.dw = p.dw.data() + c * p.n;
        a.db = p.center ? p.db.data() + c * p.n : nullptr;
        a.init = true;
        a.smean = p.center && saved ? p.smean.data() + r0 : nullptr;
        a.srstd = saved ? p.srstd.data() + r0 : nullptr;
        if (v == 0)
          k::ab_a::rows_backward_of<T>(a);
        else
          k::ab_b::rows_backward_of<T>(a);
      }
    }
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
};

template <typename T>
void run(const std::string& kernel, Index rows, Index n, int calls) {
  const bool backward = kernel.find("bwd") != std::string::npos;
  const bool rms = kernel == "rms-bwd-saved";
  Problem p;
  p.rows = rows;
  p.n = n;
  p.center = !rms;
  std::vector<T> x(static_cast<std::size_t>(rows * n)), dy(x.size()), out(x.size());
  std::mt19937 gen(1);
  std::normal_distribution<float> dist(1.0f, 2.0f);
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = T(dist(gen));
    dy[i] = T(dist(gen));
  }
  for (Index i = 0; i < n; ++i) {
    p.w.push_back(1.0f + 0.01f * static_cast<float>(i));
    p.b.push_back(0.1f);
  }
  p.mean.resize(static_cast<std::size_t>(rows));
  p.rstd.resize(static_cast<std::size_t>(rows));
  // The saved statistics of the backward, in double from the stored values (eps 1e-5 as the kernels').
  for (Index r = 0; r < rows; ++r) {
    double s = 0, q = 0;
    for (Index i = 0; i < n; ++i) s += static_cast<double>(static_cast<float>(x[r * n + i]));
    const double m = rms ? 0.0 : s / static_cast<double>(n);
    for (Index i = 0; i < n; ++i) {
      const double e = static_cast<double>(static_cast<float>(x[r * n + i])) - m;
      q += e * e;
    }
    p.smean.push_back(m);
    p.srstd.push_back(1.0 / std::sqrt(q / static_cast<double>(n) + 1e-5));
  }
  const std::size_t parts = static_cast<std::size_t>((rows + 1023) / 1024 * n);
  p.dw.resize(parts);
  p.db.resize(parts);

  Run<T> r{p, x, dy, out, backward, kernel.find("saved") != std::string::npos};
  std::uint64_t hash[2];
  for (int v = 0; v < 2; ++v) {  // one untimed call each; its outputs are hashed
    r(v);
    hash[v] = hash_bits(out.data(), out.size());
    if (backward) hash[v] = hash_bits(p.dw.data(), p.dw.size(), hash_bits(p.db.data(), p.db.size(), hash[v]));
  }
  std::vector<double> us[2], ratio;
  for (int c = 0; c < calls; ++c) {
    const int first = c & 1;
    const double t_first = r(first), t_second = r(1 - first);
    us[first].push_back(t_first);
    us[1 - first].push_back(t_second);
    ratio.push_back(first == 0 ? t_second / t_first : t_first / t_second);
  }
  const std::size_t m = static_cast<std::size_t>(calls);
  std::printf("%s %lldx%lld, %d rounds\n", kernel.c_str(), static_cast<long long>(rows),
              static_cast<long long>(n), calls);
  for (int v = 0; v < 2; ++v) {
    std::sort(us[v].begin(), us[v].end());
    std::printf("%s: min %.1f us, p10 %.1f us, median %.1f us, output hash %016llx\n", v == 0 ? "A" : "B",
                us[v][0], us[v][m / 10], us[v][m / 2], static_cast<unsigned long long>(hash[v]));
  }
  std::sort(ratio.begin(), ratio.end());
  std::printf("B/A per round: p25 %.3f, median %.3f, p75 %.3f; same bits: %s\n", ratio[m / 4], ratio[m / 2],
              ratio[3 * m / 4], hash[0] == hash[1] ? "yes" : "no");
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = s.find(',', start);
    out.push_back(s.substr(start, comma - start));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 3 || argc > 4) {
      std::fprintf(stderr, "usage: %s KERNELS SHAPES [CALLS]  (normally run by scripts/ab-rows)\n", argv[0]);
      return 2;
    }
    const int calls = argc > 3 ? static_cast<int>(parse_positive(argv[3], "CALLS")) : 1000;
    for (const std::string& kernel : split(argv[1])) {
      for (const std::string& shape : split(argv[2])) {
        const std::size_t x = shape.find('x');
        if (x == std::string::npos) throw std::invalid_argument("a shape is ROWSxD, got '" + shape + "'");
        const Index rows = parse_positive(shape.substr(0, x).c_str(), "ROWS");
        const Index n = parse_positive(shape.substr(x + 1).c_str(), "D");
        if (kernel == "ln-fwd" || kernel == "ln-bwd" || kernel == "ln-bwd-saved" || kernel == "rms-bwd-saved")
          run<float>(kernel, rows, n, calls);
        else if (kernel == "ln-fwd-bf16" || kernel == "ln-bwd-saved-bf16")
          run<bfloat16>(kernel, rows, n, calls);
        else
          throw std::invalid_argument("unknown kernel '" + kernel + "'");
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ab_rows: %s\n", e.what());
    return 1;
  }
}
