// The column path of LayerNorm and RMSNorm (see column_norm.h and column_kernels.h).
//
// Work units: x's groups are (outer kept index o, column t of the innermost kept axis K). A unit is o
// and a tile of up to kColumnTile neighbouring columns. Per unit, in double, one accumulator per
// column, rows r (the normalized elements, row-major) in increasing order:
//   forward:  mean = Σx/n; var = Σ(x − mean)²/n (second pass over the tile, still in cache);
//             rstd = 1/√(var + eps); y = (x − mean)·rstd·γ_r + β_r.   (RMSNorm: mean ≡ 0, no β.)
//   backward: mean, rstd as above; Σg, Σg·x̂ with g = dy·γ_r; dx = rstd·(g − Σg/n − x̂·Σg·x̂/n)
//             (RMSNorm: without the Σg term); dγ_r += Σ_columns dy·x̂, dβ_r += Σ_columns dy.
// Units are independent, so the forward's bits do not depend on the schedule. dγ/dβ: units are cut
// into chunks by plan::param_grad_chunks (shape only); each chunk adds its units' tile sums into its
// own double row in unit order; the rows are summed in chunk order and rounded once.
#include "norm/column_norm.h"

#include <normlab/simd.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "norm/column_kernels.h"
#include "parallel/parallel.h"

namespace normlab {

namespace kernels {
namespace scalar {
extern const ColumnKernels kColumnTable;
}
namespace avx2 {
extern const ColumnKernels kColumnTable;
}
namespace avx512 {
extern const ColumnKernels kColumnTable;
}

const ColumnKernels& column_kernels() {
  switch (active_isa()) {
    case Isa::kAvx512:
      return avx512::kColumnTable;
    case Isa::kAvx2:
      return avx2::kColumnTable;
    case Isa::kScalar:
      break;
  }
  return scalar::kColumnTable;
}
}  // namespace kernels

namespace column {

namespace {

using kernels::kColumnTile;

// The geometry of the units: outer kept indices × tiles of the innermost kept axis.
struct Units {
  Dims outer_shape;  // kept axes but the innermost
  Index K = 1;       // size of the innermost kept axis (the columns)
  Index tiles = 1;   // tiles per outer index
  Index count = 1;   // units
};

Units units_of(const plan::AxisSplit& s) {
  Units u;
  u.K = s.k_shape[s.k_shape.size() - 1];
  for (int d = 0; d + 1 < s.k_shape.size(); ++d) u.outer_shape.push_back(s.k_shape[d]);
  u.tiles = (u.K + kColumnTile - 1) / kColumnTile;
  u.count = s.groups / u.K * u.tiles;
  return u;
}

Dims outer_strides(const plan::FullOperand& op) {
  Dims d;
  for (int i = 0; i + 1 < op.k_strides.size(); ++i) d.push_back(op.k_strides[i]);
  return d;
}

// Offsets of the n normalized elements (row-major over the normalized axes) for one operand.
std::vector<Index> row_offsets(const plan::AxisSplit& s, const plan::FullOperand& op) {
  std::vector<Index> off;
  off.reserve(static_cast<std::size_t>(s.n));
  for_each_offset(s.n_shape, op.n_strides, [&](Index o) { off.push_back(o); });
  return off;
}

// One full-shaped operand ready for the kernels: its base pointer, outer strides, row offsets.
struct Operand {
  char* base;
  Dims outer;
  std::vector<Index> rows;
  Operand(const plan::AxisSplit& s, const plan::FullOperand& op)
      : base(op.base), outer(outer_strides(op)), rows(row_offsets(s, op)) {}
  // The first element of unit u's tile.
  template <typename T>
  T* at(const Units& un, Index u) const {
    const Index o = u / un.tiles, t = u % un.tiles;
    return reinterpret_cast<T*>(base) + plan::group_offset(o, un.outer_shape, outer) + t * kColumnTile;
  }
  // Asks for unit u's tile ahead of its use: its rows are n short runs far apart, too many streams for
  // the hardware prefetcher to follow.
  void prefetch(const Units& un, Index u, bool write) const {
    if (u >= un.count) return;
    const char* t = at<const char>(un, u);
    const Index bytes = std::min(kColumnTile, un.K - (u % un.tiles) * kColumnTile) * Index{sizeof(float)};
    for (const Index r : rows)
      for (Index b = 0; b < bytes; b += 64) {
        if (write)
          __builtin_prefetch(t + r * Index{sizeof(float)} + b, 1, 3);
        else
          __builtin_prefetch(t + r * Index{sizeof(float)} + b, 0, 3);
      }
  }
};

Index tile_width(const Units& un, Index u) {
  return std::min(kColumnTile, un.K - (u % un.tiles) * kColumnTile);
}

}  // namespace

bool applies(const plan::AxisSplit& s, std::initializer_list<const plan::FullOperand*> ops) {
  if (s.k_shape.size() == 0 || s.n <= 1) return false;
  if (s.k_shape[s.k_shape.size() - 1] < 8) return false;
  for (const plan::FullOperand* op : ops) {
    if (op->n_contiguous) return false;
    if (op->k_strides[op->k_strides.size() - 1] != 1) return false;
  }
  return true;
}

void forward(const RowNormKind& kind, const plan::AxisSplit& s, const plan::FullOperand& y,
             const plan::FullOperand& x, const float* w, const float* b, const plan::PartOperand& mean,
             const plan::PartOperand& rstd, double eps) {
  const Units un = units_of(s);
  const Operand xo(s, x), yo(s, y);
  const kernels::ColumnKernels& k = kernels::column_kernels();
  parallel::parallel_for(un.count, [&](Index u) {
    const Index wd = tile_width(un, u);
    xo.prefetch(un, u + 1, false);
    yo.prefetch(un, u + 1, true);
    double mu[kColumnTile], rs[kColumnTile];
    const float* xt = xo.at<const float>(un, u);
    k.stats(mu, rs, xt, xo.rows.data(), s.n, wd, eps, kind.center);
    k.forward(yo.at<float>(un, u), yo.rows.data(), xt, xo.rows.data(), s.n, wd, mu, rs, w, b);
    // The tile's groups are consecutive along the innermost kept axis.
    const Index g0 = u / un.tiles * un.K + (u % un.tiles) * kColumnTile;
    auto write_stats = [&](const plan::PartOperand& p, const double* v) {
      if (!p.defined) return;
      float* at = reinterpret_cast<float*>(p.base) + plan::group_offset(g0, s.k_shape, p.strides);
      const Index step = p.strides[p.strides.size() - 1];
      for (Index j = 0; j < wd; ++j) at[j * step] = static_cast<float>(v[j]);
    };
    write_stats(mean, mu);
    write_stats(rstd, rs);
  });
}

void backward(const RowNormKind& kind, const plan::AxisSplit& s, const plan::FullOperand& dx,
              const plan::PartOperand& dweight, const plan::PartOperand& dbias, const plan::FullOperand& dy,
              const plan::FullOperand& x, const float* w, double eps, GradMode mode) {
  const Units un = units_of(s);
  const Operand xo(s, x), dyo(s, dy), dxo(s, dx);
  const kernels::ColumnKernels& k = kernels::column_kernels();
  const double nn = static_cast<double>(s.n);
  const std::size_t n = static_cast<std::size_t>(s.n);

  const plan::Chunks ch = plan::param_grad_chunks(un.count, s.n);
  std::vector<double> dw_part(dweight.defined ? static_cast<std::size_t>(ch.count) * n : 0);
  std::vector<double> db_part(dbias.defined ? static_cast<std::size_t>(ch.count) * n : 0);
  parallel::parallel_for(ch.count, [&](Index c) {
    double* dwc = dweight.defined ? dw_part.data() + static_cast<std::size_t>(c) * n : nullptr;
    double* dbc = dbias.defined ? db_part.data() + static_cast<std::size_t>(c) * n : nullptr;
    const Index u_end = std::min(un.count, (c + 1) * ch.size);
    for (Index u = c * ch.size; u < u_end; ++u) {
      const Index wd = tile_width(un, u);
      xo.prefetch(un, u + 1, false);
      dyo.prefetch(un, u + 1, false);
      dxo.prefetch(un, u + 1, true);
      double mu[kColumnTile], rs[kColumnTile], mg[kColumnTile], mgx[kColumnTile];
      const float* xt = xo.at<const float>(un, u);
      const float* dyt = dyo.at<const float>(un, u);
      k.stats(mu, rs, xt, xo.rows.data(), s.n, wd, eps, kind.center);
      k.backward_sums(mg, mgx, dwc, dbc, dyt, dyo.rows.data(), xt, xo.rows.data(), s.n, wd, mu, rs, w);
      for (Index j = 0; j < wd; ++j) {
        mg[j] = kind.center ? mg[j] / nn : 0.0;
        mgx[j] = mgx[j] / nn;
      }
      k.backward_dx(dxo.at<float>(un, u), dxo.rows.data(), dyt, dyo.rows.data(), xt, xo.rows.data(), s.n, wd,
                    mu, rs, w, mg, mgx);
    }
  });
  if (!dweight.defined && !dbias.defined) return;

  // Sum the chunk rows in chunk order, round once, then write (or add) in the parameter's own layout.
  const bool acc = mode == GradMode::kAccumulate;
  auto write = [&](const plan::PartOperand& p, const std::vector<double>& part) {
    std::vector<float> row(n);
    for (std::size_t r = 0; r < n; ++r) {
      double v = 0;
      for (Index c = 0; c < ch.count; ++c) v += part[static_cast<std::size_t>(c) * n + r];
      row[r] = static_cast<float>(v);
    }
    float* base = reinterpret_cast<float*>(p.base);
    const float* src = row.data();
    for_each_offset(s.n_shape, p.strides, [&](Index off) {
      base[off] = acc ? base[off] + *src : *src;
      ++src;
    });
  };
  if (dweight.defined) write(dweight, dw_part);
  if (dbias.defined) write(dbias, db_part);
}

}  // namespace column
}  // namespace normlab
