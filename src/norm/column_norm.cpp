// The column path of LayerNorm and RMSNorm (see column_norm.h and column_kernels.h).
//
// Work units: x's groups are (outer kept index o, column t of the innermost kept axis K). A unit is o
// and a tile of up to kColumnTile neighbouring columns, handed to one kernel call. Per column, the
// kernels form exactly the row kernels' quantities in their order (docs/numerics.md "Precision"):
//   forward:  mean = Σx/n in double; m_hi, m_lo; e = x − m_hi in fp32, var = Σe²/n − m_lo² (fp32 squares,
//             double accumulation); rstd = 1/√(var + eps); y = ((x − m_hi) − m_lo)·r·γ_r + β_r in fp32.
//             (RMSNorm: mean ≡ 0, no β.)
//   backward: mean, rstd as above; Σg, Σg·e with g = dy·γ_r; dx = r·((g − mean_g) − d·rstd·mean_gx̂) in
//             fp32 (RMSNorm: without mean_g); dγ_r += Σ_columns dy·x̂, dβ_r += Σ_columns dy.
// so y, mean, rstd and dx are bitwise those of the row path on the transposed copy. Units are
// independent, so the forward's bits do not depend on the schedule. dγ/dβ: units are cut into chunks by
// plan::param_grad_chunks (shape only); each chunk adds its units' tile sums (column_kernels.h) into its
// own double row in unit order; the rows are summed in chunk order and rounded once.
#include "norm/column_norm.h"

#include <normlab/simd.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "norm/column_kernels.h"
#include "norm/streaming.h"
#include "parallel/parallel.h"
#include "simd/isa_select.h"

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
  return *for_isa(active_isa(), &scalar::kColumnTable, &avx2::kColumnTable, &avx512::kColumnTable);
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
};

Index tile_width(const Units& un, Index u) {
  return std::min(kColumnTile, un.K - (u % un.tiles) * kColumnTile);
}

// The group (row-major over the kept axes) of unit u's first column.
Index first_group(const Units& un, Index u) {
  return u / un.tiles * un.K + (u % un.tiles) * kColumnTile;
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
             const plan::PartOperand& rstd, double eps, double* smean, double* srstd) {
  const Units un = units_of(s);
  const Operand xo(s, x), yo(s, y);
  const kernels::ColumnKernels& k = kernels::column_kernels();
  // Outputs of kernels::stream_min_bytes() or more (norm/streaming.h) are written with non-temporal stores
  // where a row of a block is 64-byte aligned, as on the row path (same values); the backward likewise.
  // (With the output prefetched ahead, streaming a 10 MB output measured slower, not faster.)
  const bool stream = kernels::stream_output_bytes(s.groups * s.n * Index{sizeof(float)});
  const bool stage = kernels::crowds_l1(xo.at<const float>(un, 0), xo.rows.data(), s.n);
  const bool x_ahead_in_sum = 2 * s.groups * s.n * Index{sizeof(float)} > parallel::l2_cache_bytes();
  parallel::parallel_for(un.count, [&](Index u) {
    float mu[kColumnTile], rs[kColumnTile];
    kernels::ColumnForward a;
    a.y = yo.at<float>(un, u);
    a.yoff = yo.rows.data();
    a.x = xo.at<const float>(un, u);
    a.xoff = xo.rows.data();
    a.n = s.n;
    a.w = tile_width(un, u);
    a.wt = w;
    a.b = b;
    a.eps = eps;
    a.center = kind.center;
    a.stream = stream;
    a.stage = stage;
    a.x_ahead_in_sum = x_ahead_in_sum;
    a.mean = mean.defined ? mu : nullptr;
    a.rstd = rstd.defined ? rs : nullptr;
    // The tile's groups are consecutive along the innermost kept axis.
    const Index g0 = first_group(un, u);
    a.smean = smean ? smean + g0 : nullptr;
    a.srstd = srstd ? srstd + g0 : nullptr;
    if (u + 1 < un.count) {
      a.next_x = xo.at<const float>(un, u + 1);
      a.next_y = yo.at<float>(un, u + 1);
    }
    k.forward(a);
    auto write_stats = [&](const plan::PartOperand& p, const float* v) {
      if (!p.defined) return;
      float* at = reinterpret_cast<float*>(p.base) + plan::group_offset(g0, s.k_shape, p.strides);
      const Index step = p.strides[p.strides.size() - 1];
      for (Index j = 0; j < a.w; ++j) at[j * step] = v[j];
    };
    write_stats(mean, mu);
    write_stats(rstd, rs);
  });
}

void backward(const RowNormKind& kind, const plan::AxisSplit& s, const plan::FullOperand& dx,
              const plan::PartOperand& dweight, const plan::PartOperand& dbias, const plan::FullOperand& dy,
              const plan::FullOperand& x, const float* w, double eps, GradMode mode, const double* smean,
              const double* srstd) {
  const Units un = units_of(s);
  const Operand xo(s, x), dyo(s, dy), dxo(s, dx);
  const kernels::ColumnKernels& k = kernels::column_kernels();
  const std::size_t n = static_cast<std::size_t>(s.n);
  const bool stream = kernels::stream_output_bytes(s.groups * s.n * Index{sizeof(float)});
  const bool stage = kernels::crowds_l1(xo.at<const float>(un, 0), xo.rows.data(), s.n) ||
                     kernels::crowds_l1(dyo.at<const float>(un, 0), dyo.rows.data(), s.n);

  const plan::Chunks ch = plan::param_grad_chunks(un.count, s.n);
  const plan::PartialRows part(ch.count, s.n, dweight.defined, dbias.defined);
  parallel::parallel_for(ch.count, [&](Index c) {
    std::vector<double> lanes(dweight.defined || dbias.defined ? 16 * n : 0);
    kernels::ColumnBackward a;
    a.dxoff = dxo.rows.data();
    a.dyoff = dyo.rows.data();
    a.xoff = xo.rows.data();
    a.n = s.n;
    a.wt = w;
    a.eps = eps;
    a.center = kind.center;
    a.stream = stream;
    a.stage = stage;
    a.dw = part.dw_row(c);
    a.db = part.db_row(c);
    a.lanes = lanes.data();
    const Index u_end = std::min(un.count, (c + 1) * ch.size);
    for (Index u = c * ch.size; u < u_end; ++u) {
      a.w = tile_width(un, u);
      a.x = xo.at<const float>(un, u);
      a.dy = dyo.at<const float>(un, u);
      a.dx = dxo.at<float>(un, u);
      a.next_x = u + 1 < un.count ? xo.at<const float>(un, u + 1) : nullptr;
      a.next_dy = u + 1 < un.count ? dyo.at<const float>(un, u + 1) : nullptr;
      a.next_dx = u + 1 < un.count ? dxo.at<float>(un, u + 1) : nullptr;
      if (srstd) {
        a.smean = smean ? smean + first_group(un, u) : nullptr;
        a.srstd = srstd + first_group(un, u);
      }
      k.backward(a);
    }
  });
  if (!dweight.defined && !dbias.defined) return;

  // Sum the chunk rows in chunk order, round once, then write (or add) in the parameter's own layout.
  if (dweight.defined) plan::write_chunk_sums(dweight, s.n_shape, part.dw(), ch.count, mode);
  if (dbias.defined) plan::write_chunk_sums(dbias, s.n_shape, part.db(), ch.count, mode);
}

}  // namespace column
}  // namespace normlab
