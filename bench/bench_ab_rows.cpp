// A paired A/B of two versions of the row and column kernels (src/norm/row_kernels-inl.h and
// column_kernels-inl.h with src/simd/vec.h) in one process, for machines whose speed drifts between runs
// seconds apart (docs/PERFORMANCE.md, "2026-11-30, eighth session"). scripts/ab-rows builds this file with
// two copies of the kernel sources, compiled under the target namespaces `ab_a` and `ab_b` (each vec.h copy
// ends in its own comment line, so that GCC's #pragma once, which takes files of equal content and time
// for one, includes both), and runs it:
//
//   scripts/ab-rows REV KERNELS SHAPES [CALLS]     # A = REV's kernel files, B = the working tree's
//   scripts/ab-rows HEAD~1 ln-bwd-saved,ln-fwd 8192x64,2048x256 1000
//
// Each of CALLS rounds times one call of A and one of B, alternating which goes first; it prints the
// minimum, 10th percentile and median of each, the quartiles of the per-round ratio B/A (both calls
// of a round see the same machine), and a hash of each version's outputs (whether the bits are the same).
// KERNELS and SHAPES are comma-separated lists (ROWSxD); every kernel runs at every shape. A KERNEL is
// ln-fwd | ln-fwd-bf16 (y, mean, rstd from x, γ, β) | rms-fwd | rms-fwd-bf16
// (RMSNorm: y, rstd from x, γ) | add-ln-fwd | add-rms-fwd | add-ln-fwd-bf16 (the fused residual add:
// s = x + r stored too, r the dy buffer; with streaming stores, the scratch `work` the library gives) |
// ln-bwd-saved | ln-bwd-saved-bf16 (dx, dγ, dβ from dy, x, γ and saved double statistics) | ln-bwd (the
// same, the statistics recomputed from x) | rms-bwd-saved (dx, dγ). A forward makes one kernel call per
// task of the library driver at 1 thread (forward_call_rows: about 16384 / D rows in blocks of eight, at
// least 16 out of cache; NORMLAB_AB_CALL_ROWS=N: N rows per call; 0: one call over all rows); a backward
// one per 1024 rows, each assigning its own dγ/dβ partial rows, as the library's chunks do. The column
// kernels:
// col-fwd (y, mean, rstd) | col-bwd (dx, dγ, dβ, the statistics recomputed), LayerNorm of x [B, F, T] over
// F (the strided path, no transpose), at shapes BxFxT: one call per tile of up to 64 columns of T, each
// told the next tile (for its prefetches), as column_norm.cpp does.
// x, dy ~ N(1, 2), γ = 1 + 0.01·i, β = 0.1 (those of normlab_bench_loop).
// Where the row kernels' x, dy and output (y or dx) lie relative to each other modulo 4 KiB changes their
// speed (docs/PERFORMANCE.md, "seventeenth session"): each shape prints the three page offsets it ran
// with, and NORMLAB_AB_PAGE_OFFSETS=X,DY,OUT (bytes, multiples of 64 below 4096) places them there.
// Without it they are wherever the allocator put them.
// Only the kernel sources differ between A and B: both use the working tree's row_kernels.h and
// column_kernels.h, so a revision whose argument structs differ from them cannot be compared this way, and
// the dispatch predicates there (forward_pipelined, forward_in_registers ...) are the working tree's on both
// sides: where a change alters one that REV's kernels also call, REV's side runs a mix (the fifty-second
// session's first comparison of the fused RMSNorm printed "same bits: no" for this reason); take a REV whose
// kernels do not call the changed predicate.
// A and B read the same x (and dy): where the last-level cache holds a good part of it (the Intel Xeon's
// 480 MiB L3, docs/PERFORMANCE.md, "thirty-sixth session"), the second call of a round finds some of it
// there, so "out of cache" shapes are not quite that; a prefetch change measured here wants confirming
// with normlab_bench (old and new binaries alternating), which rereads its x from memory as the copy does.
#ifndef NL_AB_A
#error \
    "build with scripts/ab-rows (NL_AB_A, NL_AB_B: the two copies of row_kernels-inl.h; NL_AB_A_COL, NL_AB_B_COL: of column_kernels-inl.h)"
#endif
#define NL_TARGET ab_a
#include NL_AB_A
#include NL_AB_A_COL
#undef NL_TARGET
#define NL_TARGET ab_b
#include NL_AB_B
#include NL_AB_B_COL
#undef NL_TARGET

#include <normlab/tensor.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_support.h"
#include "norm/norm_plan.h"

namespace {

using normlab::bfloat16;
using normlab::Index;
using normlab::bench::page_offset;
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

// Storage as the library's tensors have it (tensor.h, "storage"): 64-byte aligned, so that an output row
// that starts on a cache line can take the non-temporal stores (stream_ok) as it does through the library,
// and 2 MiB or more on transparent huge pages unless NORMLAB_HUGE_PAGES=0.
template <typename T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <typename U>
  Aligned64(const Aligned64<U>&) {}
  T* allocate(std::size_t n) {
    const normlab::detail::Storage st = normlab::detail::allocate_storage(n * sizeof(T));
    mapped_[st.p] = st.mapped;
    return static_cast<T*>(st.p);
  }
  void deallocate(T* p, std::size_t) {
    const auto it = mapped_.find(p);
    normlab::detail::free_storage(p, it->second);
    mapped_.erase(it);
  }
  bool operator==(const Aligned64&) const { return true; }

 private:
  static inline std::map<void*, std::size_t> mapped_;  // the mapping lengths of the live buffers
};
template <typename T>
using Buf = std::vector<T, Aligned64<T>>;

// A buffer of n elements at a chosen offset from the start of a 4 KiB page (off < 0: where the allocator
// puts a Buf of n elements).
template <typename T>
struct Placed {
  Buf<T> storage;
  T* p;
  Placed(std::size_t n, int off) : storage(off < 0 ? n : n + (8192 + sizeof(T) - 1) / sizeof(T)) {
    if (off < 0) {
      p = storage.data();
      return;
    }
    const auto base = reinterpret_cast<std::uintptr_t>(storage.data());
    const std::uintptr_t page = (base + 4095) / 4096 * 4096;
    p = reinterpret_cast<T*>(page + static_cast<std::uintptr_t>(off));
  }
};

// NORMLAB_AB_PAGE_OFFSETS=X,DY,OUT: the page offsets of the row kernels' buffers; unset: -1 (the
// allocator's).
struct PageOffsets {
  int x = -1, dy = -1, out = -1;
};
PageOffsets page_offsets() {
  PageOffsets po;
  const char* env = std::getenv("NORMLAB_AB_PAGE_OFFSETS");
  if (!env || !*env) return po;
  int* const slot[3] = {&po.x, &po.dy, &po.out};
  const std::string s = env;
  std::size_t start = 0;
  for (int k = 0; k < 3; ++k) {
    const std::size_t comma = s.find(',', start);
    if ((k < 2) != (comma != std::string::npos))
      throw std::invalid_argument("NORMLAB_AB_PAGE_OFFSETS must be X,DY,OUT (three byte offsets), got '" + s +
                                  "'");
    const std::string part = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    const long v = std::strtol(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || v < 0 || v >= 4096 || v % 64 != 0)
      throw std::invalid_argument("NORMLAB_AB_PAGE_OFFSETS: each offset a multiple of 64 below 4096, got '" +
                                  part + "'");
    *slot[k] = static_cast<int>(v);
    start = comma + 1;
  }
  return po;
}

// Rows per forward call: NORMLAB_AB_CALL_ROWS=N (0: one call over all rows); unset: the first task of the
// library driver's split at 1 thread, split_rows(rows, n, task_rows(n, stream), 1) (norm_plan.h), since a
// kernel's speed can depend on it (docs/PERFORMANCE.md, "fifty-fourth session": the skewed register kernel
// at D = 128 gained in one call and lost in the driver's calls; "fifty-eighth session": the pipelined kernel
// out of cache in calls of 8 rows). Before the fifty-eighth session this took task_rows(n) alone, which
// from D = 2048 on is fewer rows than the driver's calls (4 at 4096 where the driver's blocks of eight made
// them 8).
Index forward_call_rows(Index rows, Index n, bool stream) {
  const char* env = std::getenv("NORMLAB_AB_CALL_ROWS");
  if (env == nullptr) {
    const normlab::plan::RowSplit split =
        normlab::plan::split_rows(rows, n, normlab::plan::task_rows(n, stream), 1);
    return std::max<Index>(split.rows(0), 1);
  }
  char* end = nullptr;
  const long long v = std::strtoll(env, &end, 10);
  if (*env == '\0' || *end != '\0' || v < 0)
    throw std::invalid_argument(std::string("NORMLAB_AB_CALL_ROWS: a count of rows (0: all), got '") + env +
                                "'");
  return v == 0 ? std::max<Index>(rows, 1) : static_cast<Index>(v);
}

struct Problem {
  Index rows = 0, n = 0;
  Index call_rows = 0;  // rows per forward call (forward_call_rows)
  bool center = true;
  bool stream = false;  // non-temporal stores, as the library's drivers set them (see run)
  std::vector<float> w, b, mean, rstd;
  std::vector<double> smean, srstd, dw, db;
};

// One timed call of version V (0: A, 1: B) on storage type T.
template <typename T>
struct Run {
  Problem& p;
  T* x;
  T* dy;
  T* out;
  bool backward;
  bool saved;
  T* s = nullptr;  // the fused add (add-…): s, and the scratch (work) with streaming stores
  T* work = nullptr;

  double operator()(int v) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!backward) {
      for (Index r0 = 0; r0 < p.rows; r0 += p.call_rows) {
        k::RowsForwardOf<T> a;
        a.y = out + r0 * p.n;
        a.ldy = p.n;
        a.x = x + r0 * p.n;
        a.ldx = p.n;
        a.rows = std::min(p.call_rows, p.rows - r0);
        a.n = p.n;
        a.w = p.w.data();
        a.b = p.center ? p.b.data() : nullptr;
        a.eps = 1e-5;
        a.center = p.center;
        a.mean = p.center ? p.mean.data() + r0 : nullptr;
        a.rstd = p.rstd.data() + r0;
        a.ld_stats = 1;
        a.stream = p.stream;
        if (s) {  // r = the dy buffer
          a.r = dy + r0 * p.n;
          a.ldr = a.lds = p.n;
          a.s = s + r0 * p.n;
          a.work = p.stream ? work : nullptr;
        }
        if (v == 0)
          k::ab_a::rows_forward_of<T>(a);
        else
          k::ab_b::rows_forward_of<T>(a);
      }
    } else {
      constexpr Index kChunk = 1024;
      for (Index r0 = 0, c = 0; r0 < p.rows; r0 += kChunk, ++c) {
        k::RowsBackwardOf<T> a;
        a.dx = out + r0 * p.n;
        a.lddx = p.n;
        a.dy = dy + r0 * p.n;
        a.lddy = p.n;
        a.x = x + r0 * p.n;
        a.ldx = p.n;
        a.rows = std::min(kChunk, p.rows - r0);
        a.n = p.n;
        a.w = p.w.data();
        a.eps = 1e-5;
        a.center = p.center;
        a.dw = p.dw.data() + c * p.n;
        a.db = p.center ? p.db.data() + c * p.n : nullptr;
        a.init = true;
        a.stream = p.stream;
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

// One untimed call of each version (its outputs hashed after `reset`), then `calls` rounds of one timed
// call of each, alternating which goes first; prints each version's min, p10 and median, the quartiles of
// the per-round ratio B/A and whether the hashes agree.
template <typename Call, typename Hash, typename Reset = void (*)()>
void paired(
    const std::string& kernel, const char* shape, int calls, Call& call, Hash&& hash, Reset&& reset = [] {}) {
  std::uint64_t h[2];
  for (int v = 0; v < 2; ++v) {
    reset();
    call(v);
    h[v] = hash();
  }
  std::vector<double> us[2], ratio;
  for (int c = 0; c < calls; ++c) {
    const int first = c & 1;
    const double t_first = call(first), t_second = call(1 - first);
    us[first].push_back(t_first);
    us[1 - first].push_back(t_second);
    ratio.push_back(first == 0 ? t_second / t_first : t_first / t_second);
  }
  const std::size_t m = static_cast<std::size_t>(calls);
  std::printf("%s %s, %d rounds\n", kernel.c_str(), shape, calls);
  for (int v = 0; v < 2; ++v) {
    std::sort(us[v].begin(), us[v].end());
    std::printf("%s: min %.1f us, p10 %.1f us, median %.1f us, output hash %016llx\n", v == 0 ? "A" : "B",
                us[v][0], us[v][m / 10], us[v][m / 2], static_cast<unsigned long long>(h[v]));
  }
  std::sort(ratio.begin(), ratio.end());
  std::printf("B/A per round: p25 %.3f, median %.3f, p75 %.3f; same bits: %s\n", ratio[m / 4], ratio[m / 2],
              ratio[3 * m / 4], h[0] == h[1] ? "yes" : "no");
}

template <typename T>
void run(const std::string& kernel, Index rows, Index n, int calls) {
  const bool backward = kernel.find("bwd") != std::string::npos;
  const bool fused = kernel.rfind("add-", 0) == 0;
  const bool rms = kernel.rfind(fused ? "add-rms-" : "rms-", 0) == 0;
  Problem p;
  p.rows = rows;
  p.n = n;
  p.center = !rms;
  // From 16 MiB of output, as row_norm.cpp (float) and storage_norm.h (sizeof(T)) decide it.
  p.stream = rows * n * Index{sizeof(T)} >= (Index{16} << 20);
  p.call_rows = forward_call_rows(rows, n, p.stream);
  const std::size_t size = static_cast<std::size_t>(rows * n);
  const PageOffsets po = page_offsets();
  Placed<T> x(size, po.x), dy(size, po.dy), out(size, po.out);
  std::mt19937 gen(1);
  std::normal_distribution<float> dist(1.0f, 2.0f);
  for (std::size_t i = 0; i < size; ++i) {
    x.p[i] = T(dist(gen));
    dy.p[i] = T(dist(gen));
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
    for (Index i = 0; i < n; ++i) s += static_cast<double>(static_cast<float>(x.p[r * n + i]));
    const double m = rms ? 0.0 : s / static_cast<double>(n);
    for (Index i = 0; i < n; ++i) {
      const double e = static_cast<double>(static_cast<float>(x.p[r * n + i])) - m;
      q += e * e;
    }
    p.smean.push_back(m);
    p.srstd.push_back(1.0 / std::sqrt(q / static_cast<double>(n) + 1e-5));
  }
  const std::size_t parts = static_cast<std::size_t>((rows + 1023) / 1024 * n);
  p.dw.resize(parts);
  p.db.resize(parts);

  Run<T> r{p, x.p, dy.p, out.p, backward, kernel.find("saved") != std::string::npos};
  Buf<T> s(fused ? size : 0), work(fused ? static_cast<std::size_t>(k::add_chunk_rows(n) * n) : 0);
  if (fused) {
    r.s = s.data();
    r.work = work.data();
  }
  char label[160];
  std::snprintf(
      label, sizeof label, "%lldx%lld (page offsets: x %d, dy %d, out %d; huge pages: %s%s)",
      static_cast<long long>(rows), static_cast<long long>(n), page_offset(x.p), page_offset(dy.p),
      page_offset(out.p),
      normlab::detail::huge_page_storage(static_cast<std::size_t>(size) * sizeof(T)) ? "advised" : "no",
      backward ? "" : ("; " + std::to_string(std::min(p.call_rows, rows)) + " rows per call").c_str());
  paired(kernel, label, calls, r, [&] {
    std::uint64_t h = hash_bits(out.p, size);
    if (fused) h = hash_bits(s.data(), size, h);
    if (backward) h = hash_bits(p.dw.data(), p.dw.size(), hash_bits(p.db.data(), p.db.size(), h));
    return h;
  });
}

// The column kernels on x [B, F, T] over F: one call per tile of up to kColumnTile columns, as
// column_norm.cpp cuts them (the rows of a tile are its F elements at stride T).
void run_columns(const std::string& kernel, Index B, Index F, Index T, int calls) {
  const bool backward = kernel == "col-bwd";
  const std::size_t size = static_cast<std::size_t>(B * F * T);
  Buf<float> x(size), dy(size), out(size);
  std::vector<float> w, b, mean(static_cast<std::size_t>(B * T)), rstd(mean.size());
  std::mt19937 gen(1);
  std::normal_distribution<float> dist(1.0f, 2.0f);
  for (std::size_t i = 0; i < size; ++i) {
    x[i] = dist(gen);
    dy[i] = dist(gen);
  }
  for (Index i = 0; i < F; ++i) {
    w.push_back(1.0f + 0.01f * static_cast<float>(i));
    b.push_back(0.1f);
  }
  std::vector<Index> off;
  for (Index i = 0; i < F; ++i) off.push_back(i * T);
  std::vector<double> dw(static_cast<std::size_t>(F)), db(dw.size()), lanes(static_cast<std::size_t>(16 * F));
  // As column_norm.cpp decides it (a side whose kernels predate the field ignores it).
  const bool stage_fwd = k::crowds_l1(x.data(), off.data(), F);
  const bool stage_bwd = stage_fwd || k::crowds_l1(dy.data(), off.data(), F);
  const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  const bool x_ahead_in_sum = 2 * B * F * T * Index{sizeof(float)} > (l2 > 0 ? l2 : Index{1} << 20);
  auto call = [&](int v) {
    const k::ColumnKernels& table = v == 0 ? k::ab_a::kColumnTable : k::ab_b::kColumnTable;
    const auto t0 = std::chrono::steady_clock::now();
    for (Index bi = 0; bi < B; ++bi)
      for (Index t = 0; t < T; t += k::kColumnTile) {
        const Index wd = std::min(k::kColumnTile, T - t), at = bi * F * T + t;
        const Index next = t + wd < T ? at + wd : bi + 1 < B ? (bi + 1) * F * T : -1;
        auto next_of = [&](auto* base) { return next < 0 ? nullptr : base + next; };
        if (!backward) {
          k::ColumnForward a;
          a.y = out.data() + at;
          a.yoff = off.data();
          a.x = x.data() + at;
          a.xoff = off.data();
          a.n = F;
          a.w = wd;
          a.wt = w.data();
          a.b = b.data();
          a.eps = 1e-5;
          a.mean = mean.data() + bi * T + t;
          a.rstd = rstd.data() + bi * T + t;
          a.next_x = next_of(x.data());
          a.next_y = next_of(out.data());
          a.stage = stage_fwd;
          a.x_ahead_in_sum = x_ahead_in_sum;
          table.forward(a);
        } else {
          k::ColumnBackward a;
          a.dx = out.data() + at;
          a.dxoff = off.data();
          a.dy = dy.data() + at;
          a.dyoff = off.data();
          a.x = x.data() + at;
          a.xoff = off.data();
          a.n = F;
          a.w = wd;
          a.wt = w.data();
          a.eps = 1e-5;
          a.dw = dw.data();
          a.db = db.data();
          a.lanes = lanes.data();
          a.next_x = next_of(x.data());
          a.next_dy = next_of(dy.data());
          a.next_dx = next_of(out.data());
          a.stage = stage_bwd;
          table.backward(a);
        }
      }
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  };
  char label[96];
  std::snprintf(label, sizeof label, "%lldx%lldx%lld", static_cast<long long>(B), static_cast<long long>(F),
                static_cast<long long>(T));
  paired(
      kernel, label, calls, call,
      [&] {
        std::uint64_t h = hash_bits(out.data(), out.size());
        h = hash_bits(mean.data(), mean.size(), hash_bits(rstd.data(), rstd.size(), h));
        return backward ? hash_bits(dw.data(), dw.size(), hash_bits(db.data(), db.size(), h)) : h;
      },
      [&] {  // dγ, dβ accumulate (+=) call after call: from 0 for the hashed calls
        std::fill(dw.begin(), dw.end(), 0.0);
        std::fill(db.begin(), db.end(), 0.0);
      });
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
        std::vector<Index> dims;  // the shape's x-separated sizes
        for (std::size_t at = 0;;) {
          const std::size_t x = shape.find('x', at);
          dims.push_back(parse_positive(shape.substr(at, x - at).c_str(), "a size in SHAPES"));
          if (x == std::string::npos) break;
          at = x + 1;
        }
        const bool columns = kernel == "col-fwd" || kernel == "col-bwd";
        if (dims.size() != (columns ? 3u : 2u))
          throw std::invalid_argument(std::string("a shape of ") + kernel + " is " +
                                      (columns ? "BxFxT" : "ROWSxD") + ", got '" + shape + "'");
        if (columns)
          run_columns(kernel, dims[0], dims[1], dims[2], calls);
        else if (kernel == "ln-fwd" || kernel == "ln-bwd" || kernel == "ln-bwd-saved" ||
                 kernel == "rms-fwd" || kernel == "rms-bwd-saved" || kernel == "add-ln-fwd" ||
                 kernel == "add-rms-fwd")
          run<float>(kernel, dims[0], dims[1], calls);
        else if (kernel == "ln-fwd-bf16" || kernel == "rms-fwd-bf16" || kernel == "ln-bwd-bf16" ||
                 kernel == "ln-bwd-saved-bf16" || kernel == "add-ln-fwd-bf16")
          run<bfloat16>(kernel, dims[0], dims[1], calls);
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
