// The row-group engine for storage types other than fp32 and for the fused variants (internal):
// bf16/fp16 LayerNorm and RMSNorm, residual add + norm, and the memory-efficient backward.
//
// Contract: a bf16/fp16 y or dx is exactly round(the fp32 function's result on the widened inputs) (round
// to nearest even, once), and mean/rstd are exactly the fp32 function's. Three routes give it:
//
// Direct (every forward, and every backward from x, when x, y / dy, dx (and residual, s / ds) are
// contiguous with the normalized axes last): the rows go straight through the fused row kernels
// instantiated for the storage type (RowsForwardOf<T>, RowsBackwardOf<T>; convert_kernels.h for the
// 16-bit types): each element is widened in registers at every load and rounded at the store, the
// arithmetic is the fp32 kernels' own code, so every pass reads and writes sizeof(T) bytes per element.
// The fused add + norm forms s = x + residual inside the kernel, chunk by chunk, and normalizes the stored
// s while it is in cache; its backward adds ds to the float dnorm before the one rounding. dγ/dβ there:
// the fused kernel's double partials per chunk of rows (fused_row_chunks, row_norm_backward's chunks),
// summed in chunk order and rounded once: bitwise the fp32 function's dγ/dβ.
//
// Whole (other layouts, "layouts other than ..." below): the fp32 function on the caller's views, or on
// contiguous fp32 copies widened exactly, narrowed once.
//
// Scratch (the memory-efficient backward, which has no x to recompute from): every group is brought into
// an fp32 scratch row (widened exactly from bf16/fp16, or the fp32 data itself, gathered through its
// strides when it is not contiguous), x − mean is recovered from y into another (recover_centered,
// convert_kernels.h), and the fused fp32 row kernel runs on it with saved statistics (mean 0, the
// forward's rstd): dx and dγ/dβ are then the standard backward's arithmetic on the recovered x − mean. dx
// is narrowed once into the storage type. dγ/dβ there: one double partial row per chunk of groups (the
// fused kernel's chunks, fused_row_chunks), the chunks summed in chunk order. Units: runs of whole row
// groups of the fused backward, up to kUnitElems elements, when the layout is flat, else one group at a
// time.
//
// Units and tasks only change the schedule, never the arithmetic: the same bits for any thread count and
// SIMD target.
#pragma once

#include <normlab/norm.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "norm/convert_kernels.h"
#include "norm/norm_plan.h"
#include "norm/row_kernels.h"
#include "norm/row_norm.h"
#include "norm/streaming.h"
#include "parallel/parallel.h"

namespace normlab::storage {

// Elements per unit (flat layouts): 128 KiB of fp32 rows in L2.
inline constexpr Index kUnitElems = Index{1} << 15;

// The format index of a 16-bit storage type (kernels::kBf16 / kF16); -1 for float.
template <typename T>
constexpr int format_of() {
  if constexpr (std::is_same_v<std::remove_const_t<T>, bfloat16>) return kernels::kBf16;
  else if constexpr (std::is_same_v<std::remove_const_t<T>, float16>) return kernels::kF16;
  else return -1;
}

// The fused row kernels for storage type T (float: the fp32 table's own entries).
template <typename T>
auto rows_forward_kernel(const kernels::ConvertKernels& cv) {
  if constexpr (format_of<T>() < 0) return kernels::row_kernels().rows_forward;
  else return kernels::rows_forward_for<T>(cv);
}
template <typename T>
auto rows_backward_kernel(const kernels::ConvertKernels& cv) {
  if constexpr (format_of<T>() < 0) return kernels::row_kernels().rows_backward;
  else return kernels::rows_backward_for<T>(cv);
}

// A full-shaped operand (shape of x) of element type T (float, bfloat16 or float16).
template <typename T>
struct Operand {
  bool defined = false;
  T* base = nullptr;  // T may be const
  Dims k_strides, n_strides;
  bool n_contiguous = false;  // a group's n elements are consecutive, in N's row-major order
  bool flat = false;          // contiguous with the normalized axes last: group g starts at g·n
};

template <typename T>
Operand<T> make_operand(const TensorView<T>& v, const plan::AxisSplit& s) {
  Operand<T> o;
  if (!v.defined()) return o;
  o.defined = true;
  o.base = v.data();
  const plan::FullOperand f = plan::full_operand(v, s, "");  // the strides and contiguity, as for fp32
  o.k_strides = f.k_strides;
  o.n_strides = f.n_strides;
  o.n_contiguous = f.n_contiguous;
  bool trailing = true;  // every normalized axis comes after every kept axis of size > 1
  for (int i = 0; i < s.k_axes.size(); ++i)
    if (s.k_shape[i] > 1 && s.n_axes.size() > 0 && s.k_axes[i] > s.n_axes[0]) trailing = false;
  o.flat = v.is_contiguous() && trailing;
  return o;
}

// Byte range [lo, hi) touched by a view.
template <typename T>
std::pair<std::uintptr_t, std::uintptr_t> byte_range(const TensorView<T>& v) {
  Index lo = 0, hi = 0;
  for (int d = 0; d < v.rank(); ++d) {
    const Index ext = (v.size(d) - 1) * v.stride(d);
    (ext < 0 ? lo : hi) += ext;
  }
  const auto p = reinterpret_cast<std::uintptr_t>(v.data());
  return {p + static_cast<std::uintptr_t>(lo * static_cast<Index>(sizeof(T))),
          p + static_cast<std::uintptr_t>((hi + 1) * static_cast<Index>(sizeof(T)))};
}

// An output must either be exactly an input (same data, shape, strides, type) or not overlap it.
// With `exact_ok` false, no overlap at all is allowed.
template <typename A, typename B>
void check_overlap(const TensorView<A>& out, const TensorView<B>& in, const char* out_name, const char* in_name,
                   const char* op, bool exact_ok = true) {
  if (!out.defined() || !in.defined() || out.empty() || in.empty()) return;
  if (exact_ok && sizeof(A) == sizeof(B) && static_cast<const void*>(out.data()) == static_cast<const void*>(in.data()) &&
      out.shape() == in.shape() && out.strides() == in.strides())
    return;
  const auto [olo, ohi] = byte_range(out);
  const auto [ilo, ihi] = byte_range(in);
  if (exact_ok)
    NL_CHECK(ohi <= ilo || ihi <= olo,
             "{}: output {} overlaps input {} without being the same view (same data and strides)", op, out_name,
             in_name);
  else
    NL_CHECK(ohi <= ilo || ihi <= olo, "{}: {} and {} must not overlap", op, out_name, in_name);
}

// A full-shaped output: shape, writability.
template <typename T>
void check_full_output(const TensorView<T>& v, const Dims& x_shape, const char* name, const char* op) {
  NL_CHECK(v.defined(), "{}: {} is required", op, name);
  plan::check_same_shape(x_shape, v.shape(), name, op);
  plan::check_writable(v.shape(), v.strides(), name, op);
}

inline void check_eps(double eps, const char* op) {
  NL_CHECK(std::isfinite(eps) && eps >= 0, "{}: eps must be finite and ≥ 0, got {}", op, eps);
}

// Per-thread scratch, grown on demand and never cleared: fp32 rows f[0..3] of `len`, f[4] of 2·len (row
// statistics), and one 16-bit row of `len`.
struct Scratch {
  std::unique_ptr<float[]> f_mem;
  std::unique_ptr<std::uint16_t[]> h_mem;
  Index cap = 0;
  float* f[5] = {};
  std::uint16_t* h = nullptr;
  static Scratch& get(Index len) {
    thread_local Scratch sc;
    if (len > sc.cap) {
      sc.f_mem.reset(new float[static_cast<std::size_t>(6 * len)]);  // f[4] has 2·len
      sc.h_mem.reset(new std::uint16_t[static_cast<std::size_t>(len)]);
      sc.cap = len;
    }
    for (int i = 0; i < 5; ++i) sc.f[i] = sc.f_mem.get() + i * sc.cap;
    sc.h = sc.h_mem.get();
    return sc;
  }
};

// Where a unit lives in one operand: the element offset and whether it is one contiguous run of len.
struct Where {
  Index off;
  bool contiguous;
};

template <typename T>
Where where(const Operand<T>& o, Index g0, bool flat, Index n, const Dims& k_shape) {
  if (flat) return {g0 * n, true};
  return {plan::group_offset(g0, k_shape, o.k_strides), o.n_contiguous};
}

// The unit's values as fp32: the tensor's own memory when it is contiguous fp32, else `buf`.
template <typename T>
const float* load(const Operand<T>& o, Where w, Index len, const Dims& n_shape, float* buf, std::uint16_t* hbuf,
                  const kernels::ConvertKernels& cv) {
  const T* p = o.base + w.off;
  if constexpr (format_of<T>() < 0) {
    if (w.contiguous) return p;
    plan::gather(buf, p, n_shape, o.n_strides);
    return buf;
  } else {
    const std::uint16_t* src;
    if (w.contiguous) {
      src = reinterpret_cast<const std::uint16_t*>(p);
    } else {
      std::uint16_t* d = hbuf;
      for_each_offset(n_shape, o.n_strides, [&](Index off) { std::memcpy(d++, p + off, 2); });
      src = hbuf;
    }
    cv.widen[format_of<T>()](buf, src, len);
    return buf;
  }
}

// Where to compute an output unit in fp32: the tensor itself (contiguous fp32) or `buf`.
template <typename T>
float* out_row(const Operand<T>& o, Where w, float* buf) {
  if constexpr (format_of<T>() < 0) {
    if (w.contiguous) return o.base + w.off;
  }
  return buf;
}

// Writes an fp32 unit computed by out_row into the tensor (narrowing, scattering) when it is not there.
template <typename T>
void store(const Operand<T>& o, Where w, Index len, const Dims& n_shape, const float* row, std::uint16_t* hbuf,
           bool stream, const kernels::ConvertKernels& cv) {
  T* p = o.base + w.off;
  if constexpr (format_of<T>() < 0) {
    if (!w.contiguous) plan::scatter(p, row, n_shape, o.n_strides);
  } else {
    if (w.contiguous) {
      cv.narrow[format_of<T>()](reinterpret_cast<std::uint16_t*>(p), row, len, stream);
    } else {
      cv.narrow[format_of<T>()](hbuf, row, len, false);
      const std::uint16_t* s = hbuf;
      for_each_offset(n_shape, o.n_strides, [&](Index off) { std::memcpy(p + off, s++, 2); });
    }
  }
}

// Groups per unit: as many whole row groups of the fused backward (kernels::kParamGradRowGroup) as fit in
// kUnitElems elements, at least one, when the layout is flat; else one group. With chunks of whole row
// groups (fused_row_chunks) every call then starts a row group where the chunk's own grouping does.
inline Index unit_groups(Index n, bool flat) {
  constexpr Index rg = kernels::kParamGradRowGroup;
  return flat ? std::max<Index>(rg, kUnitElems / n / rg * rg) : 1;
}
// Runs unit(g0, g1) over the groups of one task [t0, t1): runs of unit_groups consecutive groups (the
// last one shorter).
template <typename Unit>
void for_units(Index t0, Index t1, Index n, bool flat, Unit&& unit) {
  const Index per = unit_groups(n, flat);
  for (Index g = t0; g < t1; g += per) unit(g, std::min(t1, g + per));
}

// ---- layouts other than "contiguous, normalized axes last" ------------------------------------------
//
// There the fp32 functions may take another route than row by row (e.g. the column kernels for a strided
// normalized axis), so the engine does not cut the problem into rows: it hands the whole problem to the
// fp32 function, on the caller's own views for fp32 storage, or on contiguous fp32 copies (widened
// exactly) for bf16/fp16, and narrows the result once. Temporary memory: up to four fp32 copies of x.

// Writes src (contiguous fp32, x's shape) into v (any strides), rounding to T.
template <typename T>
void write_all(TensorView<T> v, const Tensor& src) {
  const float* p = src.data();
  for_each_offset(v.shape(), v.strides(), [&](Index off) {
    if constexpr (format_of<T>() < 0)
      v.data()[off] = *p++;
    else
      v.data()[off] = T(*p++);
  });
}

// ---- forward -------------------------------------------------------------------------------------------

struct FwdNames {
  const char* op;
  bool center;
};

// y = norm(s) with s = x (residual undefined) or s = round(x + residual) written to `s_out`.
// T: the storage type of x, residual, s, y.
// stats (not null): filled as the fp32 forward on the (widened, stored) s fills it (NormStats, norm.h).
template <typename T>
void forward(const FwdNames& nm, TensorView<T> s_out, TensorView<T> y, View mean, View rstd,
             TensorView<const T> x, TensorView<const T> residual, ConstView weight, ConstView bias,
             const Axes& axes, double eps, NormStats* stats = nullptr) {
  const char* op = nm.op;
  NL_CHECK(x.defined(), "{}: x is required", op);
  const plan::AxisSplit s = plan::split_axes(x.shape(), axes, op);
  check_eps(eps, op);
  check_full_output(y, x.shape(), "y", op);
  check_overlap(y, x, "y", "x", op);
  const bool fused = residual.defined();
  if (fused) {
    plan::check_same_shape(x.shape(), residual.shape(), "residual", op);
    check_full_output(s_out, x.shape(), "s", op);
    check_overlap(s_out, x, "s", "x", op);
    check_overlap(s_out, residual, "s", "residual", op);
    check_overlap(y, residual, "y", "residual", op);
    check_overlap(y, s_out, "y", "s", op, /*exact_ok=*/false);
  }
  const plan::PartOperand w = plan::part_operand(weight, s.n_shape, "weight", op);
  const plan::PartOperand b = plan::part_operand(bias, s.n_shape, "bias", op);
  const plan::PartOperand pm = plan::part_operand(mean, s.k_shape, "mean", op);
  const plan::PartOperand pr = plan::part_operand(rstd, s.k_shape, "rstd", op);
  NL_CHECK(nm.center || !pm.defined, "{}: there is no mean to write (the norm does not centre)", op);
  NL_CHECK(nm.center || !b.defined, "{}: takes no bias", op);
  for (const auto& [v, name] : {std::pair{mean, "mean"}, std::pair{rstd, "rstd"}}) {
    if (!v.defined()) continue;
    plan::check_writable(v.shape(), v.strides(), name, op);
    check_overlap(v, x, name, "x", op, false);
    check_overlap(v, y, name, "y", op, false);
    if (fused) check_overlap(v, residual, name, "residual", op, false);
    if (fused) check_overlap(v, s_out, name, "s", op, false);
  }
  if (mean.defined() && rstd.defined()) check_overlap(mean, rstd, "mean", "rstd", op, false);

  const Operand<const T> xo = make_operand(x, s), ro = make_operand(residual, s);
  const Operand<T> yo = make_operand(y, s), so = make_operand(s_out, s);
  const bool flat = xo.flat && yo.flat && (!fused || (ro.flat && so.flat));
  if (!flat) {
    // s (written first: x and residual are copied before any output is written, for exact aliasing).
    Tensor in = Tensor::copy_of(x);
    if (fused) {
      const Tensor r = Tensor::copy_of(residual);
      for (Index i = 0; i < in.numel(); ++i) {
        in[i] = in[i] + r[i];  // fp32 add; rounded once to T below
        if constexpr (format_of<T>() >= 0) in[i] = static_cast<float>(T(in[i]));
      }
      write_all(s_out, in);
    }
    auto fp32_forward = [&](View out, ConstView src) {
      if (stats && nm.center)
        normlab::layer_norm_forward(out, mean, rstd, src, weight, bias, axes, eps, stats);
      else if (stats)
        normlab::rms_norm_forward(out, rstd, src, weight, axes, eps, stats);
      else if (nm.center)
        normlab::layer_norm_forward(out, mean, rstd, src, weight, bias, axes, eps);
      else
        normlab::rms_norm_forward(out, rstd, src, weight, axes, eps);
    };
    if constexpr (format_of<T>() < 0) {
      // fp32: exactly the fp32 function on the caller's views (s for the fused op).
      fp32_forward(y, fused ? ConstView(s_out) : ConstView(x));
    } else {
      Tensor out(x.shape());
      fp32_forward(out.view(), in.cview());
      write_all(y, out);
    }
    return;
  }
  const std::vector<float> wv = w.defined ? plan::gather_part(w, s.n_shape) : std::vector<float>{};
  const std::vector<float> bv = b.defined ? plan::gather_part(b, s.n_shape) : std::vector<float>{};
  const float* wp = w.defined ? wv.data() : nullptr;
  const float* bp = b.defined ? bv.data() : nullptr;
  const kernels::ConvertKernels& cv = kernels::convert_kernels();
  const bool stream = kernels::stream_output_bytes(x.numel() * static_cast<Index>(sizeof(T)));
  constexpr bool kNarrow = format_of<T>() >= 0;
  {
    // Direct route (every flat layout reaches here: bf16/fp16 storage, or the fused add + norm): the rows
    // go straight through the fused row kernels on T (RowKernels::rows_forward's code; for 16-bit types x
    // widened in registers and y rounded once at the store, convert_kernels.h). The fused add forms s in
    // the kernel, chunk by chunk, and normalizes the stored s while it is in cache (RowsForwardOf::r).
    // The same arithmetic as the fp32 function on the widened (stored) input, hence the same bits; tasks
    // of rows as row_norm.cpp.
    kernels::RowsForwardOf<T> args;
    args.n = s.n;
    args.w = wp;
    args.b = bp;
    args.eps = eps;
    args.center = nm.center;
    args.stream = stream;
    args.ldx = args.ldy = s.n;
    if (fused) args.ldr = args.lds = s.n;
    const auto fwd = rows_forward_kernel<T>(cv);
    const StatsOut keep = stats ? prepare_stats(stats, nm.center, x.shape(), s, eps) : StatsOut{};
    // mean and rstd straight from the kernel when both sit at one common stride, else via scratch.
    Index ldm = 0, ldr = 0;
    const bool stats_direct = (!pm.defined || groups_at_fixed_stride(s.k_shape, pm.strides, &ldm)) &&
                              (!pr.defined || groups_at_fixed_stride(s.k_shape, pr.strides, &ldr)) &&
                              (!pm.defined || !pr.defined || ldm == ldr);
    const plan::RowSplit split = plan::split_rows(s.groups, s.n, plan::task_rows(s.n, stream), num_threads());
    // Per-thread scratch: the copy of s for streaming (add_chunk_rows(n)·n elements) and f[4] for the
    // statistics (2·split.chunk floats).
    const bool need_work = fused && stream;
    const bool need_scratch = need_work || !stats_direct;
    const Index scratch_len =
        std::max(split.chunk, need_work ? kernels::add_chunk_rows(s.n) * s.n : Index{0});
    parallel::parallel_for(split.tasks, [&](Index t) {
      const Index g0 = split.first(t), rows = split.rows(t);
      if (rows == 0) return;
      kernels::RowsForwardOf<T> a = args;
      a.rows = rows;
      a.x = xo.base + g0 * s.n;
      a.y = yo.base + g0 * s.n;
      if (fused) {
        a.r = ro.base + g0 * s.n;
        a.s = so.base + g0 * s.n;
      }
      a.smean = keep.mean ? keep.mean + g0 : nullptr;
      a.srstd = keep.rstd ? keep.rstd + g0 : nullptr;
      Scratch* sc = need_scratch ? &Scratch::get(scratch_len) : nullptr;
      if (need_work) {
        if constexpr (kNarrow)
          a.work = reinterpret_cast<T*>(sc->h);
        else
          a.work = sc->f[0];
      }
      if (stats_direct) {
        a.ld_stats = pm.defined ? ldm : ldr;
        a.mean = pm.defined ? reinterpret_cast<float*>(pm.base) + g0 * ldm : nullptr;
        a.rstd = pr.defined ? reinterpret_cast<float*>(pr.base) + g0 * ldr : nullptr;
        fwd(a);
        return;
      }
      a.mean = pm.defined ? sc->f[4] : nullptr;  // f[4]: the rows' mean and rstd
      a.rstd = pr.defined ? sc->f[4] + rows : nullptr;
      a.ld_stats = 1;
      fwd(a);
      for (Index g = g0; g < g0 + rows; ++g) {
        if (pm.defined)
          reinterpret_cast<float*>(pm.base)[plan::group_offset(g, s.k_shape, pm.strides)] = sc->f[4][g - g0];
        if (pr.defined)
          reinterpret_cast<float*>(pr.base)[plan::group_offset(g, s.k_shape, pr.strides)] = sc->f[4][rows + g - g0];
      }
    });
  }
}

// ---- backward ------------------------------------------------------------------------------------------

struct BwdNames {
  const char* op;
  bool center;
};

// Two modes:
//   standard     (x given):            statistics recomputed from x in double, as row_norm.cpp; when ds
//                                      is given (the fused add + norm), dx = dnorm + ds (the residual
//                                      stream's gradient), added in fp32 before the one rounding to T;
//   from output  (y and rstd given):   x − mean recovered as (y − β)/(γ·rstd), rstd taken as saved, then
//                                      the saved route's arithmetic on it (fp32 storage, no ds: the
//                                      memory-efficient backward).
//   saved        (x and stats given):  as standard, with the forward's statistics (NormStats) instead of
//                                      recomputing them (same bits; with or without ds).
template <typename T>
void backward(const BwdNames& nm, TensorView<T> dx, View dweight, View dbias, TensorView<const T> dy,
              TensorView<const T> ds, TensorView<const T> x, TensorView<const T> y, ConstView rstd,
              ConstView weight, ConstView bias, const Axes& axes, double eps, GradMode mode,
              const NormStats* stats = nullptr) {
  const char* op = nm.op;
  const bool from_output = !x.defined();
  const TensorView<const T>& src = from_output ? y : x;  // the operand the statistics come from
  const char* src_name = from_output ? "y" : "x";
  NL_CHECK(src.defined() && dy.defined(), "{}: {} and dy are required", op, src_name);
  NL_CHECK(!from_output || !ds.defined(), "{}: the backward from the output takes no ds", op);
  NL_CHECK(!stats || !from_output, "{}: takes no stats", op);
  if (stats) check_stats_source(*stats, nm.center, src.shape(), op);
  const plan::AxisSplit s = plan::split_axes(src.shape(), axes, op);
  const StatsIn saved = stats ? saved_stats(*stats, nm.center, s, op) : StatsIn{};
  if (!from_output) check_eps(eps, op);
  plan::check_same_shape(src.shape(), dy.shape(), "dy", op);
  check_full_output(dx, src.shape(), "dx", op);
  check_overlap(dx, src, "dx", src_name, op);
  check_overlap(dx, dy, "dx", "dy", op);
  if (ds.defined()) {
    plan::check_same_shape(src.shape(), ds.shape(), "ds", op);
    check_overlap(dx, ds, "dx", "ds", op);
  }
  const plan::PartOperand w = plan::part_operand(weight, s.n_shape, "weight", op);
  const plan::PartOperand b = plan::part_operand(bias, s.n_shape, "bias", op);
  const plan::PartOperand dw = plan::part_operand(dweight, s.n_shape, "dweight", op);
  const plan::PartOperand db = plan::part_operand(dbias, s.n_shape, "dbias", op);
  const plan::PartOperand pr = plan::part_operand(rstd, s.k_shape, "rstd", op);
  NL_CHECK(nm.center || !db.defined, "{}: there is no bias gradient (the norm has no bias)", op);
  NL_CHECK(nm.center || !b.defined, "{}: takes no bias", op);
  if (from_output) NL_CHECK(pr.defined, "{}: rstd (saved by the forward pass) is required", op);
  for (const auto& [v, name] : {std::pair{dweight, "dweight"}, std::pair{dbias, "dbias"}}) {
    if (!v.defined()) continue;
    plan::check_writable(v.shape(), v.strides(), name, op);
    check_overlap(v, src, name, src_name, op, false);
    check_overlap(v, dy, name, "dy", op, false);
    check_overlap(v, dx, name, "dx", op, false);
  }
  if (dweight.defined() && dbias.defined()) check_overlap(dweight, dbias, "dweight", "dbias", op, false);

  const std::vector<float> wv = w.defined ? plan::gather_part(w, s.n_shape) : std::vector<float>{};
  const std::vector<float> bv = b.defined ? plan::gather_part(b, s.n_shape) : std::vector<float>{};
  const float* wp = w.defined ? wv.data() : nullptr;
  const float* bp = b.defined ? bv.data() : nullptr;
  if (from_output && wp)
    for (std::size_t j = 0; j < wv.size(); ++j)
      NL_CHECK(wv[j] != 0.0f,
               "{}: weight[{}] (flat index, in the normalized axes' row-major order) is 0: x̂ = (y − β)/γ cannot be "
               "recovered from the output there; use the backward that reads x",
               op, j);

  const Operand<const T> so = make_operand(src, s), dyo = make_operand(dy, s), dso = make_operand(ds, s);
  const Operand<T> dxo = make_operand(dx, s);
  const bool flat = so.flat && dyo.flat && dxo.flat && (!ds.defined() || dso.flat);
  if (!flat && !from_output) {
    // dnorm from the fp32 backward (dγ, dβ written by it, per mode), then dx = dnorm + ds in fp32.
    Tensor dn(src.shape());
    auto fp32_backward = [&](ConstView dyv, ConstView xv) {
      if (stats && nm.center)
        normlab::layer_norm_backward_saved(dn.view(), dweight, dbias, dyv, xv, weight, *stats, mode);
      else if (stats)
        normlab::rms_norm_backward_saved(dn.view(), dweight, dyv, xv, weight, *stats, mode);
      else if (nm.center)
        normlab::layer_norm_backward(dn.view(), dweight, dbias, dyv, xv, weight, axes, eps, mode);
      else
        normlab::rms_norm_backward(dn.view(), dweight, dyv, xv, weight, axes, eps, mode);
    };
    if constexpr (format_of<T>() < 0) {
      fp32_backward(dy, src);
    } else {
      const Tensor xf = Tensor::copy_of(src), dyf = Tensor::copy_of(dy);
      fp32_backward(dyf.cview(), xf.cview());
    }
    if (ds.defined()) {
      const Tensor dsf = Tensor::copy_of(ds);
      for (Index i = 0; i < dn.numel(); ++i) dn[i] = dn[i] + dsf[i];
    }
    write_all(dx, dn);
    return;
  }
  const kernels::RowKernels& k = kernels::row_kernels();
  const kernels::ConvertKernels& cv = kernels::convert_kernels();
  const bool stream = kernels::stream_output_bytes(src.numel() * static_cast<Index>(sizeof(T)));
  const float* rstd_base = pr.defined ? reinterpret_cast<const float*>(pr.base) : nullptr;

  // Direct path (x given, flat): the rows straight through the fused row kernels on T (for 16-bit types dx
  // rounded once at the store; with ds, dx = dnorm + ds added in float before that rounding,
  // RowsBackwardOf::ds), in row_norm_backward's chunks, each chunk's first row group assigning its partial
  // rows: dx, dγ, dβ the same arithmetic as the fp32 function on the widened inputs.
  // Both routes: row_norm_backward's chunks, each chunk's first call assigning its partial rows (init), so
  // the buffer is reused unzeroed.
  const bool direct = flat && !from_output;
  const plan::Chunks ch = fused_row_chunks(s.groups, s.n);
  thread_local std::vector<double> partials;
  const plan::PartialRows part(partials, ch.count, s.n, dw.defined, db.defined);
  if (direct) {
    kernels::RowsBackwardOf<T> args;
    args.n = s.n;
    args.w = wp;
    args.eps = eps;
    args.center = nm.center;
    args.stream = stream;
    args.ldx = args.lddy = args.lddx = args.ldds = s.n;
    args.init = true;
    const auto bwd = rows_backward_kernel<T>(cv);
    parallel::parallel_for(ch.count, [&](Index c) {
      const Index g0 = c * ch.size;
      kernels::RowsBackwardOf<T> a = args;
      a.rows = std::min(s.groups, g0 + ch.size) - g0;
      a.x = so.base + g0 * s.n;
      a.dy = dyo.base + g0 * s.n;
      a.dx = dxo.base + g0 * s.n;
      a.ds = ds.defined() ? dso.base + g0 * s.n : nullptr;
      a.dw = part.dw_row(c);
      a.db = part.db_row(c);
      a.smean = saved.mean ? saved.mean + g0 : nullptr;
      a.srstd = saved.rstd ? saved.rstd + g0 : nullptr;
      bwd(a);
    });
  }
  // The memory-efficient backward (the only user of this route), unit by unit: x − mean of every group
  // recovered from y into a scratch row, then the fused row kernel with saved statistics (mean 0 around the
  // recovered values, the forward's rstd) on it, the chunk's first unit assigning its partial rows.
  std::vector<double> inv_w;  // 1/γ in double, once per call
  if (!direct && wp) {
    inv_w.resize(static_cast<std::size_t>(s.n));
    for (std::size_t j = 0; j < inv_w.size(); ++j) inv_w[j] = 1.0 / static_cast<double>(wp[j]);
  }
  // The kernels' arguments, made once here (as the direct path's args above) and copied into each task.
  kernels::RowsBackward recovered;
  recovered.n = s.n;
  recovered.ldx = recovered.lddy = recovered.lddx = s.n;
  recovered.w = wp;
  recovered.center = nm.center;
  recovered.cached = true;  // the recovered x − mean and dy, read by recover_centered just before
  if (!direct) parallel::parallel_for(ch.count, [&](Index c) {
    const Index t0 = c * ch.size, t1 = std::min(s.groups, t0 + ch.size);
    Scratch& sc = Scratch::get(std::min(t1 - t0, unit_groups(s.n, flat)) * s.n);
    thread_local std::vector<double> unit_stats;  // per unit: the rows' mean (0), then their rstd
    kernels::RowsBackward a = recovered;
    a.dw = part.dw_row(c);
    a.db = part.db_row(c);
    for_units(t0, t1, s.n, flat, [&](Index g0, Index g1) {
      const Index len = (g1 - g0) * s.n, rows = g1 - g0;
      const Where wsrc = where(so, g0, flat, s.n, s.k_shape), wdy = where(dyo, g0, flat, s.n, s.k_shape);
      const Where wdx = where(dxo, g0, flat, s.n, s.k_shape);
      const float* in = load(so, wsrc, len, s.n_shape, sc.f[0], sc.h, cv);
      const float* dyr = load(dyo, wdy, len, s.n_shape, sc.f[1], sc.h, cv);
      float* out = out_row(dxo, wdx, sc.f[2]);
      float* xc = sc.f[3];  // x − mean of the unit's groups
      unit_stats.assign(static_cast<std::size_t>(2 * rows), 0.0);
      double* srstd = unit_stats.data() + rows;
      for (Index g = g0; g < g1; ++g) {
        const Index o = (g - g0) * s.n;
        srstd[g - g0] = static_cast<double>(rstd_base[plan::group_offset(g, s.k_shape, pr.strides)]);
        cv.recover_centered(xc + o, in + o, s.n, 1.0 / srstd[g - g0], wp ? inv_w.data() : nullptr, bp,
                            dyr + o);
      }
      a.rows = rows;
      a.x = xc;
      a.dy = dyr;
      a.dx = out;
      a.stream = stream && out != sc.f[2];
      a.smean = unit_stats.data();
      a.srstd = srstd;
      a.init = g0 == t0;
      k.rows_backward(a);
      store(dxo, wdx, len, s.n_shape, out, sc.h, stream, cv);
    });
  });
  if (!dw.defined && !db.defined) return;

  // Sum the chunk partials in chunk order, round once, then write (or add) in the weight's own layout.
  if (dw.defined) plan::write_chunk_sums(dw, s.n_shape, part.dw(), ch.count, mode);
  if (db.defined) plan::write_chunk_sums(db, s.n_shape, part.db(), ch.count, mode);
}

}  // namespace normlab::storage
