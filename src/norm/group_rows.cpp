// GroupNorm of short contiguous segments through the LayerNorm row kernels (channel_norm.h, group_rows_*).
//
// With x contiguous as [B, C, S], group g of batch item b is the row of n = (C/G)·S consecutive floats at
// (b·C + g·C/G)·S: a LayerNorm row whose γ and β are those of its channels, each repeated S times. The
// rows are taken in tiles of batch items (about 64 KiB of x each) and, within a tile, group by group: one
// kernel call per (tile, group) over the tile's items (rows C·S floats apart), with γ, β expanded once per
// call of the op. So the arithmetic of each group is that of the fused LayerNorm kernels (docs/numerics.md,
// "LayerNorm"): the mean and rstd are those of layer_norm_forward on the row, y and dx its elementwise
// formulas with γ_c, β_c. dγ_c, dβ_c: the kernels' per-element double partial rows (one pair per chunk of
// tiles, a function of the shape only), summed per channel over the chunks in order and over the channel's
// S elements in order. Every result is a function of the shape and data only, never of the thread count.
#include <algorithm>
#include <vector>

#include "norm/channel_norm.h"
#include "norm/norm_plan.h"
#include "norm/row_kernels.h"
#include "norm/streaming.h"
#include "parallel/parallel.h"

namespace normlab::chnorm {

namespace {

// Batch items per tile: about kTileFloats floats of x.
constexpr Index kTileFloats = Index{1} << 14;
Index tile_items(const Plan& p) {
  return std::max<Index>(1, kTileFloats / (p.C * p.S));
}

// γ (or β) repeated S times per channel: C·S floats; empty when v is null.
std::vector<float> expand(const float* v, const Plan& p) {
  std::vector<float> e;
  if (!v) return e;
  e.resize(static_cast<std::size_t>(p.C * p.S));
  for (Index c = 0; c < p.C; ++c) std::fill_n(e.begin() + c * p.S, p.S, v[c]);
  return e;
}

}  // namespace

bool group_rows_apply(const Plan& p, std::initializer_list<ConstView> operands) {
  const Index n = p.cpg * p.S;
  if (p.grouping != Grouping::kGroup || p.masked() || p.cpg < kGroupRowsMinCpg || p.S < 2 ||
      p.S > kGroupRowsMaxS || (n % 16 != 0 && n < 64))
    return false;
  for (const ConstView& v : operands)
    if (!v.is_contiguous()) return false;
  return true;
}

void group_rows_forward(const Plan& p, float* y, const float* x, double eps, const float* w, const float* b,
                        std::vector<double>& mean, std::vector<double>& rstd) {
  const Index n = p.cpg * p.S, cs = p.C * p.S, K = tile_items(p);
  const Index tiles = (p.B + K - 1) / K;
  const std::vector<float> we = expand(w, p), be = expand(b, p);
  mean.assign(static_cast<std::size_t>(p.B * p.G), 0.0);
  rstd.assign(static_cast<std::size_t>(p.B * p.G), 0.0);
  const kernels::RowKernels& k = kernels::row_kernels();
  kernels::RowsForward args;
  args.n = n;
  args.ldx = args.ldy = cs;
  args.eps = eps;
  args.center = true;
  args.stream = kernels::stream_output_bytes(p.B * cs * Index{sizeof(float)});
  parallel::parallel_for(tiles, [&](Index t) {
    const Index b0 = t * K, rows = std::min(K, p.B - b0);
    std::vector<double> sm(static_cast<std::size_t>(rows)), sr(static_cast<std::size_t>(rows));
    for (Index g = 0; g < p.G; ++g) {
      kernels::RowsForward a = args;
      a.rows = rows;
      a.x = x + b0 * cs + g * n;
      a.y = y + b0 * cs + g * n;
      a.w = we.empty() ? nullptr : we.data() + g * n;
      a.b = be.empty() ? nullptr : be.data() + g * n;
      a.smean = sm.data();
      a.srstd = sr.data();
      k.rows_forward(a);
      for (Index r = 0; r < rows; ++r) {
        mean[static_cast<std::size_t>((b0 + r) * p.G + g)] = sm[r];
        rstd[static_cast<std::size_t>((b0 + r) * p.G + g)] = sr[r];
      }
    }
  });
}

void group_rows_backward(const Plan& p, float* dx, const float* dy, const float* x, double eps,
                         const float* w, std::vector<double>& sw, std::vector<double>& sb) {
  const Index n = p.cpg * p.S, cs = p.C * p.S, K = tile_items(p);
  const Index tiles = (p.B + K - 1) / K;
  // Chunks of consecutive tiles, each with its own partial rows of dγ and dβ (2·C·S doubles), a function of
  // the shape only: at most 32, fewer where their partial rows would pass 4 MiB, but at least 8 (the
  // threads' unit of work).
  const Index max_chunks = std::clamp<Index>((Index{4} << 20) / (16 * cs), 8, 32);
  const Index per_chunk = (tiles + max_chunks - 1) / max_chunks;
  const Index chunks = (tiles + per_chunk - 1) / per_chunk;
  const std::vector<float> we = expand(w, p);
  // The calling thread's buffer, reused from call to call: every chunk's first tile assigns its rows (init).
  thread_local std::vector<double> partials;
  const plan::PartialRows part(partials, chunks, cs, true, true);
  const kernels::RowKernels& k = kernels::row_kernels();
  kernels::RowsBackward args;
  args.n = n;
  args.ldx = args.lddy = args.lddx = cs;
  args.eps = eps;
  args.center = true;
  args.stream = kernels::stream_output_bytes(p.B * cs * Index{sizeof(float)});
  parallel::parallel_for(chunks, [&](Index c) {
    double* const pw = part.dw_row(c);
    double* const pb = part.db_row(c);
    const Index t1 = std::min(tiles, (c + 1) * per_chunk);
    for (Index t = c * per_chunk; t < t1; ++t) {
      const Index b0 = t * K, rows = std::min(K, p.B - b0);
      for (Index g = 0; g < p.G; ++g) {
        kernels::RowsBackward a = args;
        a.rows = rows;
        a.x = x + b0 * cs + g * n;
        a.dy = dy + b0 * cs + g * n;
        a.dx = dx + b0 * cs + g * n;
        a.w = we.empty() ? nullptr : we.data() + g * n;
        a.dw = pw + g * n;
        a.db = pb + g * n;
        a.init = t == c * per_chunk;
        k.rows_backward(a);
      }
    }
  });
  // Per channel: over the chunks in order, within each over the channel's S elements in order.
  sw.assign(static_cast<std::size_t>(p.C), 0.0);
  sb.assign(static_cast<std::size_t>(p.C), 0.0);
  for (Index ch = 0; ch < chunks; ++ch) {
    const double* pw = part.dw_row(ch);
    const double* pb = part.db_row(ch);
    for (Index c = 0; c < p.C; ++c)
      for (Index s = 0; s < p.S; ++s) {
        sw[static_cast<std::size_t>(c)] += pw[c * p.S + s];
        sb[static_cast<std::size_t>(c)] += pb[c * p.S + s];
      }
  }
}

}  // namespace normlab::chnorm
