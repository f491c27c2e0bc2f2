// Row kernels: the inner loops of the normalization family over one contiguous group of n floats
// (internal).
//
// One source file (row_kernels-inl.h) is compiled once per instruction set (src/simd/kernels_*.cpp);
// src/simd/dispatch.cpp hands out the table of the active target. The fused entries rows_forward /
// rows_backward (LayerNorm and RMSNorm) work in float at full vector width with double accumulation where
// it matters (docs/numerics.md); they are written against simd/vec.h and give the same bits on every
// target. (The memory-efficient backward from y runs rows_backward too, on x − mean recovered from y;
// storage_norm.h.)
#pragma once

#include <normlab/tensor.h>

#include <cstdint>
#include <initializer_list>
#include <type_traits>

namespace normlab::kernels {

// The row kernels' choices that depend on the machine and never on the bits (each gives the same results).
// The machines of docs/PERFORMANCE.md measured them in different ways (paired, scripts/ab-rows, 1 thread, out
// of cache). On a Zen 4 the row blocks took 0.73-0.86 of the pipelined kernel's time for fp32 LayerNorm rows
// of 2048-16384 ("eighteenth session") and the prefetch gained 13-17 % from D = 1024 on but came and went at
// 512 and 768 and cost 4 % at 256 ("sixteenth session"). On an Intel Xeon the pipelined kernel took 0.74-0.81
// of the row blocks' time, and the prefetch from D = 256 on 0.79-0.92 of the time of none for fp32 LayerNorm
// (D = 256-768), 0.82-0.93 for RMSNorm, 0.65-0.80 for bf16 LayerNorm ("twenty-seventh session"). On a Zen 5
// ("thirty-ninth session") the pipelined kernel took 0.87-0.92 of the row blocks' time, the forward's
// prefetch from D = 512 on 0.80-0.93 (from 256 on, 1.05-1.13 at D = 256), the backward's at D = 256 and 768
// 0.67-0.89, and, unlike on the other two, the eight-row forward of fp32 rows 0.55-0.79 of the time at D = 64
// and 80 with its rows prefetched two blocks ahead. row_tuning_for gives each its own; other AMD processors
// (before family 0x1A: Zen 3 and Zen 4) take the Zen 4 choices, later families the Zen 5 ones, other vendors
// the Xeon's.
struct RowTuning {
  // fp32 LayerNorm rows of kUnpipelinedMinN or more out of cache run in row blocks (forward_pipelined).
  bool long_rows_blocked = false;
  // Out of cache, the pipelined forward prefetches rows of at least this many elements ahead of the pass
  // that first reads them (row_kernels-inl.h, kRowPrefetchBytes).
  Index prefetch_min_n = 256;
  // Out of cache, the eight-row forward of 16-bit rows prefetches its rows two blocks ahead
  // (row_kernels-inl.h, kBatchPrefetchBlocks): 0.82-0.97 of the time on the Xeon; not measured on a Zen 4;
  // 0.91-1.06 on a Zen 5. The eight-row backward of 16-bit rows likewise (0.93 on a Zen 5).
  bool batched_prefetch = true;
  // Out of cache, the eight-row forward of fp32 rows does the same: 1.15-1.19 of the time on the Xeon,
  // 1.05-1.27 on a Zen 4, 0.55-0.79 on a Zen 5 (D = 64, 80; about even at 32). (The fp32 backward never does:
  // 1.11-1.17 on the Xeon, 0.96-1.43 on a Zen 5.)
  bool batched_prefetch_fp32 = false;
  // Out of cache, the backward's groups of four rows prefetch rows of at least this many elements ahead of
  // the passes that first read x and dy (row_kernels-inl.h, kRowPrefetchBytes) and, in their column pass,
  // the next group's rows (next_group_rows): every length gained from D = 128 on the Xeon and at D = 256 and
  // 768 on a Zen 5; on the Zen 4 the forward's length, unmeasured there.
  Index backward_prefetch_min_n = 0;
  // Out of cache, fp32 LayerNorm rows of 64, 80, 128, 192 or 256 elements run from registers with ordinary
  // stores (forward_in_registers below): one at a time, on a Zen 5 0.52-0.93 of the eight-row blocks' time at
  // 1 thread, 0.54-1.16 at 2 (streaming stores); rows of 64 and 80 now with consecutive rows' stages skewed;
  // rows of 256 0.76-0.99 of the pipelined kernel's in most runs (row_kernels-inl.h, rows_forward_registers).
  bool rows_in_registers = false;
  // Out of cache, the register kernel (rows_in_registers) prefetches rows of at least this many elements
  // kRegisterPrefetchBytes ahead, without the fused add (row_kernels-inl.h, rows_forward_registers): on a
  // Zen 5 0.91-0.98 of the time at D = 256 and 0.92-1.00 at 192 at 1 and 2 threads; at 128 1.01-1.08, at 64
  // and 80 no gain. Only the Zen 5 runs the register kernel.
  Index register_prefetch_min_n = 192;
  // Out of cache, rows whose length is not a whole number of 16-element vectors ("ragged": 24, 40, 100 ...)
  // write their outputs (the forward's y, the backward's dx) with streaming stores where a vector starts on a
  // 64-byte boundary and with ordinary stores elsewhere (stream_rows below); without it, with ordinary stores
  // throughout. On a Zen 5 (docs/PERFORMANCE.md, "forty-eighth session"; scripts/ab-rows, 1 thread, 64 MiB
  // per operand) ordinary stores took 0.37-0.45 of the time for the LayerNorm backward at D = 24, 0.44-0.62
  // at 40, 0.58 at 56 (bf16 from saved statistics: 0.17 and 0.22 at 24 and 40), 0.95-1.04 at 100, 200 and
  // 1029, and 0.74-0.97 for the forward from D = 24 to 1029. Not measured on the other two.
  bool stream_ragged_rows = true;
};
enum class CpuKind { kIntel, kZen4, kZen5 };  // the machines measured (docs/PERFORMANCE.md)
inline RowTuning row_tuning_for(CpuKind kind) {
  RowTuning r;
  if (kind == CpuKind::kZen4) {
    r.long_rows_blocked = true;
    r.prefetch_min_n = 1024;
    r.batched_prefetch = false;
    r.backward_prefetch_min_n = 1024;
  } else if (kind == CpuKind::kZen5) {
    r.prefetch_min_n = 512;
    r.batched_prefetch_fp32 = true;
    r.rows_in_registers = true;
    r.stream_ragged_rows = false;
  }
  return r;
}
// Which of them this processor is taken for: AMD by family (CPUID leaf 1; Zen 5 is family 0x1A), any other
// vendor as the Xeon; or NORMLAB_ROW_TUNING=intel|zen4|zen5 (any machine's choices on any machine: the same
// bits, for measuring them against each other; another value is an Error the first time a RowsForwardOf or
// RowsBackwardOf is made: the drivers make theirs on the calling thread, before their parallel loops).
CpuKind machine_cpu_kind();
// The choices of machine_cpu_kind(), decided once (row_tuning.cpp).
const RowTuning& machine_row_tuning();
// "intel", "zen4" or "zen5"; anything else is an Error.
CpuKind parse_cpu_kind(const char* name);
const char* cpu_kind_name(CpuKind kind);

// Rows of a fused kernel: `rows` rows of n contiguous floats, row r of x at x + r·ldx (likewise y).
// LayerNorm (center) or RMSNorm (mean ≡ 0). w, b may be null (γ = 1, β = 0). mean and rstd, when not
// null, receive float(mean) and float(rstd) of row r at r·ld_stats. y may equal x (ldy = ldx). stream:
// non-temporal stores for y where a row is aligned for them (same values, bypasses the cache).
// T: the storage type of x and y: float, or bfloat16 / float16 (the same float arithmetic on the exactly
// widened x, each y rounded once to nearest even: y_T = round(y of the float kernel on widened x)).
template <typename T>
struct RowsForwardOf {
  T* y = nullptr;
  Index ldy = 0;
  const T* x = nullptr;
  Index ldx = 0;
  Index rows = 0, n = 0;
  const float* w = nullptr;
  const float* b = nullptr;
  double eps = 0;
  bool center = true;
  bool stream = false;
  // x is in cache (the fused add's s, just written): with stream, the kernel does not prefetch ahead of
  // its rows as it does for rows that come from memory (row_kernels-inl.h, kRowPrefetchBytes).
  bool x_cached = false;
  // The machine's choices (RowTuning above) unless set.
  RowTuning tuning = machine_row_tuning();
  float* mean = nullptr;
  float* rstd = nullptr;
  Index ld_stats = 0;
  // Optional: the double mean and rstd of row r at smean[r], srstd[r], the exact values the kernel
  // computes (kept for a backward that takes them instead of recomputing; smean only with center).
  double* smean = nullptr;
  double* srstd = nullptr;
  // Fused residual add (r not null): the rows normalized are s = x + r (the float sum of the widened
  // values, rounded once to T), which is also written to s (row r at s + r·lds; s may equal x or r,
  // never y); y, mean and rstd are bitwise those of the plain kernel on the stored s. Rows that take the
  // pipelined kernel (forward_pipelined) are formed there one by one, by the pass that reads them first, and
  // rows from registers (forward_in_registers) as they are loaded, s stored with ordinary stores as their y;
  // the others in chunks of add_chunk_rows(n) rows: a chunk's s is formed and stored, then normalized by the
  // plain kernel while it is still in cache. With stream, s goes out with non-temporal stores and is read
  // from a copy in `work` (add_chunk_rows(n)·n elements of T, one per caller thread: the chunk, or the
  // pipelined kernel's last three rows), so s is never read back from memory.
  const T* r = nullptr;
  Index ldr = 0;
  T* s = nullptr;
  Index lds = 0;
  T* work = nullptr;
};
using RowsForward = RowsForwardOf<float>;
// Rows per chunk of the fused add: about 64 KiB of fp32 s (in L2 while it is normalized), at least four
// rows (the pipelined kernels keep three rows in flight).
inline constexpr Index kAddChunkElems = Index{1} << 14;
inline Index add_chunk_rows(Index n) {
  return n > 0 && kAddChunkElems / n > 4 ? kAddChunkElems / n : 4;
}

// Rows are taken in groups of kParamGradRowGroup from the first row of a call: per column, the
// contributions dy·x̂ (the product rounded to float) and dy of the group's rows are summed in float as
// (t0 + t1) + (t2 + t3) (a smaller last group: ((t0 + t1) + t2), (t0 + t1), t0), and that sum, converted
// to double, is added to the double partial rows dw, db (or, with init, assigned by the call's first
// group).
inline constexpr int kParamGradRowGroup = 4;

// Backward of the fused kernel: dx (may equal dy or x) from dy, x, w (may be null); mean and rstd are
// recomputed from x exactly as the forward computes them, or taken from smean/srstd (below). dw, db: double
// partial rows of n (may be null). T: the storage type of dx, dy, x (as RowsForwardOf: dx_T = round(dx of the
// float kernel on widened dy, x); dw, db exactly those of the float kernel).
template <typename T>
struct RowsBackwardOf {
  T* dx = nullptr;
  Index lddx = 0;
  const T* dy = nullptr;
  Index lddy = 0;
  const T* x = nullptr;
  Index ldx = 0;
  Index rows = 0, n = 0;
  const float* w = nullptr;
  double eps = 0;
  bool center = true;
  bool stream = false;
  double* dw = nullptr;
  double* db = nullptr;
  bool init = false;  // the first group assigns dw/db instead of adding
  // Fused add + norm backward (ds not null): dx = dnorm + ds, added in float to the float dnorm before
  // the one rounding to T (dx may equal ds). dw, db are those of dnorm.
  const T* ds = nullptr;
  Index ldds = 0;
  // Saved statistics (srstd not null): the double mean (center) and rstd of row r at smean[r], srstd[r],
  // as RowsForwardOf::smean/srstd wrote them. They replace the recomputation from x (the Σx pass and
  // Σe²), so the results are bitwise those of the call without them.
  const double* smean = nullptr;
  const double* srstd = nullptr;
  // x and dy are in cache (the memory-efficient backward's scratch rows): with stream, the kernel does not
  // prefetch ahead of its rows as it does for rows that come from memory (row_kernels-inl.h,
  // kRowPrefetchBytes).
  bool cached = false;
  // The machine's choices (RowTuning above) unless set.
  RowTuning tuning = machine_row_tuning();
};
using RowsBackward = RowsBackwardOf<float>;

// (b − a) modulo 4 KiB, in bytes: how far b starts after a within a page (the layout rules below).
inline std::uintptr_t page_delta(const void* a, const void* b) {
  return (reinterpret_cast<std::uintptr_t>(b) - reinterpret_cast<std::uintptr_t>(a)) & (kPageBytes - 1);
}

// The backward's column pass over a full group of rows of n ≥ kSplitMinN runs in two halves (same bits;
// row_kernels-inl.h, backward_columns) where column_halves says so.
inline constexpr Index kSplitMinN = 1024;

// Whether the column pass of the four rows from dx, x, dy takes the halves: counted over the 32 pairs (row of
// dx, row of x or dy), whether 16 or more start, modulo 4 KiB, within one cache line of each other (either
// way), or, in cache (no streaming stores), within two. Fitted to paired runs over layouts at D = 1024, 1536
// and 4000 (row_kernels-inl.h, backward_columns): in L3 the halves gained wherever the rows of dx started
// within two lines of four of the eight rows of x and dy, out of cache only where they started at the same
// offsets; elsewhere they lost 3-12 %.
template <typename T>
inline bool column_halves(const RowsBackwardOf<T>& a, Index r0) {
  int same = 0, near = 0;
  for (Index j = r0; j < r0 + 4; ++j) {
    const T* const dx = a.dx + j * a.lddx;
    for (Index k = r0; k < r0 + 4; ++k)
      for (const T* p : {a.x + k * a.ldx, a.dy + k * a.lddy}) {
        const std::uintptr_t d = page_delta(dx, p);
        same += d < 64 || d > kPageBytes - 64;
        near += d <= 128 || d >= kPageBytes - 128;
      }
  }
  return same >= 16 || (!a.stream && near >= 16);
}

// Whether the pipelined forward (rows of n a multiple of 64 from 256 on; row_kernels-inl.h) stores each block
// of 64 outputs late, after the next block's loads. A store to y followed soon by a load of x at the same
// offset modulo 4 KiB stalls the load; with y starting one to five cache lines after x (modulo 4 KiB) the
// loads of the next block or two meet the stores of this one. Paired runs (scripts/ab-rows with
// NORMLAB_AB_PAGE_OFFSETS, 1 thread, in L3; docs/PERFORMANCE.md, "seventeenth session"), storing late
// against storing at once: 0.71-0.98 of the time with y 64 or 128 bytes ahead, 0.77-1.01 at 256, 0.91-1.01
// at 320, 0.99-1.03 at 384, 1.00-1.12 from 448 on (the stall then meets the next blocks' loads), 0.98-1.02
// with y at x's offset. The same bits either way.
inline constexpr std::uintptr_t kLateMaxBytes = 320;
template <typename T>
inline bool output_late(const T* y, const T* x) {
  const std::uintptr_t d = page_delta(x, y);
  return d > 0 && d <= kLateMaxBytes;
}

// Whether the forward runs the software-pipelined kernel (Σx of row s, the second pass of row s − 1 and the
// output of row s − 2 in one loop; row_kernels-inl.h): rows of n a multiple of 64 from 256 on, except, where
// a.tuning.long_rows_blocked (RowTuning above), fp32 LayerNorm rows of kUnpipelinedMinN or more out of
// cache (stream), which take the kernel of row blocks (each stage over a block of rows before the next; the
// same bits). Paired runs on transparent huge pages (scripts/ab-rows, 1 thread; docs/PERFORMANCE.md), blocks
// against pipelined: on a Zen 4 ("eighteenth session", three processes) 0.84-0.86 of the time at D = 2048,
// 0.82-0.85 at 4096, 0.76-0.77 at 8192, 0.73-0.74 at 16384, but 1.04-1.06 at 1024 and 1.42-1.52 at 768; the
// bf16 LayerNorm took 1.02-1.23 at 2048-16384 and RMSNorm 0.97-1.41 at 512-4096, so those stay pipelined. On
// an Intel Xeon ("twenty-seventh session") 1.24-1.34 at D = 2048-16384, on a Zen 5 ("thirty-ninth session")
// 1.09-1.15 at 2048 and 4096.
inline constexpr Index kUnpipelinedMinN = 2048;
template <typename T>
inline bool forward_pipelined(const RowsForwardOf<T>& a) {
  const bool long_fp32_ln_stream = std::is_same_v<T, float> && a.center && a.stream &&
                                   a.n >= kUnpipelinedMinN && a.tuning.long_rows_blocked;
  return a.n % 64 == 0 && a.n >= 256 && !long_fp32_ln_stream;
}

// Rows of up to kBatchMaxN elements go through the kernels of eight-row blocks (rows_forward_batched and
// rows_backward_batched in row_kernels-inl.h) where forward_batched and backward_batched say so.
inline constexpr Index kBatchMaxN = 512;

// Whether the forward runs the eight-row blocks: rows of n ≤ kBatchMaxN, more than one, that do not take the
// pipelined kernel (forward_pipelined).
template <typename T>
inline bool forward_batched(const RowsForwardOf<T>& a) {
  return a.n <= kBatchMaxN && a.rows > 1 && !forward_pipelined(a);
}

// Whether the forward runs rows from registers (rows_forward_registers in row_kernels-inl.h):
// fp32 LayerNorm rows of 64, 80, 128, 192 or 256 elements that come from memory (not a chunk of the fused
// add's s in cache, x_cached; the fused add on such rows forms s in that kernel) out of cache, where
// tuning.rows_in_registers says so. Before forward_batched, which such rows would otherwise take.
template <typename T>
inline bool forward_in_registers(const RowsForwardOf<T>& a) {
  return std::is_same_v<T, float> && a.center && a.stream && !a.x_cached && a.tuning.rows_in_registers &&
         (a.n == 64 || a.n == 80 || a.n == 128 || a.n == 192 || a.n == 256);
}

// Whether the fused residual add (RowsForwardOf::r) forms s inside the kernel, row by row (the pipelined
// kernel, or rows from registers), rather than by chunks (rows_add_forward in row_kernels-inl.h).
template <typename T>
inline bool forward_fuses_add(const RowsForwardOf<T>& a) {
  return forward_pipelined(a) || forward_in_registers(a);
}

// Whether the backward runs the eight-row blocks (rows_backward_batched, software-pipelined over three
// blocks) rather than the groups of four rows (rows_backward_impl): rows of n ≤ kBatchMaxN, more than one,
// and out of cache (stream) only those shorter than kBatchStreamMaxN. Paired runs (scripts/ab-rows, 1
// thread; docs/PERFORMANCE.md, "twenty-first session"), the groups against the blocks: in L3 1.15-1.28 of the
// time at D = 64 and 80, 1.04-1.09 at 96 and 112, 0.96-1.03 from 128 to 512; out of cache 0.63 at D = 256
// (LayerNorm from saved statistics), 0.76-0.94 from 96 to 384, 0.98-1.10 at 64 and 80, and at 448 and 512
// 0.90-1.09 by kernel. The same bits either way.
inline constexpr Index kBatchStreamMaxN = 96;
template <typename T>
inline bool backward_batched(const RowsBackwardOf<T>& a) {
  return a.n <= kBatchMaxN && a.rows > 1 && (!a.stream || a.n < kBatchStreamMaxN);
}

// Whether rows of n elements that are out of cache take streaming stores under the choices t: rows of whole
// 16-element vectors, and the others where t.stream_ragged_rows says so. (Also the channel norms' segments:
// chnorm::stream_output.)
inline bool stream_rows_of(Index n, const RowTuning& t) {
  return n % 16 == 0 || t.stream_ragged_rows;
}
// Whether a kernel of rows `a` (RowsForwardOf or RowsBackwardOf) writes its outputs with streaming stores
// (where a row's vectors are aligned for them): out of cache (a.stream), per stream_rows_of.
template <typename Rows>
inline bool stream_rows(const Rows& a) {
  return a.stream && stream_rows_of(a.n, a.tuning);
}

struct RowKernels {
  // Fused LayerNorm/RMSNorm forward over rows (docs/numerics.md): one call per block of rows.
  void (*rows_forward)(const RowsForward& args);
  // Fused backward: dx and the dγ/dβ partials of a block of rows.
  void (*rows_backward)(const RowsBackward& args);
};

// The table for the active instruction set (see normlab/simd.h).
const RowKernels& row_kernels();

}  // namespace normlab::kernels
