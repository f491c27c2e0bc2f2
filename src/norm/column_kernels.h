// Column kernels: the inner loops of LayerNorm/RMSNorm when the normalized elements are strided and
// the innermost kept axis is contiguous (internal; driver in column_norm.cpp).
//
// A TILE is w ≤ kColumnTile neighbouring groups ("columns") that sit side by side in memory: row r of
// the tile (r < n, the r-th normalized element in row-major order of the normalized axes) holds the w
// columns' elements at base + off[r] + j, j < w. The kernels are written against simd/vec.h and work on
// the columns 16 at a time (one VF per row), so lanes are columns: every per-column quantity is formed
// with exactly the operations, and in exactly the order, that the fused row kernels (row_kernels-inl.h,
// docs/numerics.md "Precision") apply to that group as a contiguous row. Hence y, mean, rstd and dx are
// bitwise those of normalizing the transposed copy on the row path, on every target (vec.h gives the
// same bits on avx512, avx2 and scalar). Concretely, for one column with elements x_i, i < n:
//   Σx:  row i goes to partial P[i mod 32] (summed in double from 0, in increasing i);
//        S_l = (P_l + P_{8+l}) + (P_{16+l} + P_{24+l}), Σx = ((S0 + S4) + (S2 + S6)) + ((S1 + S5) + (S3 +
//        S7)).
//   Second pass (e = x − m_hi in float): blocks of 64 rows; in block k, "lane" L < 16 forms the float
//        q_L = (e²_{64k+L} + e²_{64k+16+L}) + (e²_{64k+32+L} + e²_{64k+48+L}) (rows ≥ n count as e = 0),
//        Q_L = Σ_k double(q_L), T_l = Q_l + Q_{l+8}, Σe² = ((T0 + T4) + (T2 + T6)) + ((T1 + T5) + (T3 + T7));
//        the backward forms Σg and Σg·e (g = dy·γ) the same way.
// The only cross-column sums are the dγ/dβ contributions of a tile (backward), see ColumnBackward.
//
// One source file (column_kernels-inl.h) is compiled once per instruction set (src/simd/kernels_*.cpp).
#pragma once

#include <normlab/tensor.h>

#include <cstdint>

namespace normlab::kernels {

inline constexpr Index kColumnTile = 64;  // columns per tile (four vectors of 16)
// Rows of the staging buffer of crowded tiles (ColumnForward::stage): 256 rows of one 16-column block
// are 16 KiB, half an L1 data cache of 32 KiB. The backward stages x and dy, up to half as many rows each.
inline constexpr Index kColumnStageRows = 256;
// Prefetch distance in blocks of 16 columns (one tile): far enough ahead to hide a memory access.
inline constexpr Index kColumnPrefetch = 4;
// The distance for tiles whose rows crowd a few cache sets (ColumnForward::stage): their lines also share
// L2 sets, and the lines four blocks ahead evicted those still to be read. Paired (scripts/ab-rows 299a278
// col-bwd,col-fwd; docs/PERFORMANCE.md, twenty-sixth session), against 4: backward 0.87 of the time at
// [4, 80, 1024], 0.92 at [16, 80, 256], 0.87 at [2, 128, 1024], 1.00 at [8, 40, 512], 1.04 at [1, 80, 1024]
// (in L2); forward 0.86-0.99, 0.95 in L2.
inline constexpr Index kColumnPrefetchCrowded = 3;

// Forward of one tile: y (may equal x), and float(mean), float(rstd) of column j into mean[j], rstd[j]
// when not null. wt, b: per row (γ_r, β_r), may be null. stream: non-temporal stores for the rows of y
// whose 16-column block is 64-byte aligned (same values).
struct ColumnForward {
  float* y = nullptr;
  const Index* yoff = nullptr;
  const float* x = nullptr;
  const Index* xoff = nullptr;
  Index n = 0, w = 0;
  const float* wt = nullptr;
  const float* b = nullptr;
  double eps = 0;
  bool center = true;
  bool stream = false;
  float* mean = nullptr;
  float* rstd = nullptr;
  // Optional: the double mean (center) and rstd of column j into smean[j], srstd[j] (NormStats).
  double* smean = nullptr;
  double* srstd = nullptr;
  // The next tile the caller will hand over (same row offsets; null: none). While the output pass of
  // block v runs, the rows of x and y of the block kColumnPrefetch blocks ahead are prefetched, from
  // this tile or from the next (the tile's strided rows are too many streams for the hardware
  // prefetchers).
  const float* next_x = nullptr;
  const float* next_y = nullptr;
  // Prefetch x's rows while Σx is formed rather than in the output pass (y's stay there): where x and y
  // together are larger than the L2 cache, and the statistics passes would otherwise wait on memory with
  // nothing in flight.
  bool x_ahead_in_sum = false;
  // Copy each block's rows of x into a contiguous buffer before the passes over them (same bits), when
  // n ≤ kColumnStageRows: for rows that crowd the L1 cache's sets (crowds_l1), which would evict each other
  // between the passes.
  bool stage = false;
};

// Backward of one tile: dx (may equal dy or x) from dy, x, wt (may be null), with mean and rstd
// recomputed from x as the forward does (or taken from smean/srstd, below). dw, db (double, per row, may be
// null): dw[r] += Σ_j dy·x̂ and db[r] += Σ_j dy over the tile's columns, where the float terms (dy·(d·r), or
// dy) of columns c0 + l and c0 + l + 8 of each block of 16 columns from c0 (0 beyond the tile) are added in
// float, and that sum is added in double to lane l of a per-row accumulator starting at 0, block after block;
// the 8 lanes are combined by vec::hsum's tree ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
// lanes: scratch of 16·n doubles (needed when dw or db is given).
struct ColumnBackward {
  float* dx = nullptr;
  const Index* dxoff = nullptr;
  const float* dy = nullptr;
  const Index* dyoff = nullptr;
  const float* x = nullptr;
  const Index* xoff = nullptr;
  Index n = 0, w = 0;
  const float* wt = nullptr;
  double eps = 0;
  bool center = true;
  bool stream = false;
  double* dw = nullptr;
  double* db = nullptr;
  double* lanes = nullptr;
  // Saved statistics (srstd not null): the double mean (center) and rstd of column j at smean[j],
  // srstd[j], as ColumnForward wrote them; they replace Σx and Σe² (same bits as without).
  const double* smean = nullptr;
  const double* srstd = nullptr;
  const float* next_x = nullptr;  // as in ColumnForward (x, dy and dx are prefetched)
  const float* next_dy = nullptr;
  const float* next_dx = nullptr;
  bool stage = false;  // as in ColumnForward, for x and dy, when n ≤ kColumnStageRows / 2
};

// Whether more than 4 of the n rows at p + off[i] start in one set of the L1 data cache (64-byte lines,
// 64 sets: the L1 data caches of 32 and 48 KiB of current x86 cores). The sets of a tile further along
// the same rows are those shifted by a constant, so one answer serves every tile of a call.
inline bool crowds_l1(const float* p, const Index* off, Index n) {
  unsigned count[64] = {};
  for (Index i = 0; i < n; ++i)
    if (++count[(reinterpret_cast<std::uintptr_t>(p + off[i]) >> 6) & 63] > 4) return true;
  return false;
}

struct ColumnKernels {
  void (*forward)(const ColumnForward& a);
  void (*backward)(const ColumnBackward& a);
};

// The table for the active instruction set (see normlab/simd.h).
const ColumnKernels& column_kernels();

}  // namespace normlab::kernels
