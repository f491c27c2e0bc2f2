#include "norm/norm_plan.h"

#include <algorithm>
#include <cstdint>

#include "parallel/parallel.h"

namespace normlab::plan {

AxisSplit split_axes(const Dims& x_shape, const Axes& axes, const char* op) {
  AxisSplit s;
  s.rank = x_shape.size();
  NL_CHECK(s.rank >= 1, "{}: x must have rank ≥ 1, got a rank-0 tensor", op);
  NL_CHECK(!axes.empty(), "{}: no axes to normalize over were given", op);
  for (int a : axes) {
    NL_CHECK(a >= -s.rank && a < s.rank, "{}: axis {} is out of range for x of shape {} (valid: {}..{})", op,
             a, x_shape.str(), -s.rank, s.rank - 1);
    const int ax = a < 0 ? a + s.rank : a;
    NL_CHECK(!s.normalized[static_cast<std::size_t>(ax)], "{}: axis {} is given twice (axes refer to x of shape {})",
             op, ax, x_shape.str());
    s.normalized[static_cast<std::size_t>(ax)] = true;
  }
  NL_CHECK(x_shape.product() > 0, "{}: x is empty (shape {})", op, x_shape.str());
  for (int d = 0; d < s.rank; ++d) {
    if (s.normalized[static_cast<std::size_t>(d)]) {
      s.n_axes.push_back(d);
      s.n_shape.push_back(x_shape[d]);
      s.n *= x_shape[d];
    } else {
      s.k_axes.push_back(d);
      s.k_shape.push_back(x_shape[d]);
      s.groups *= x_shape[d];
    }
  }
  return s;
}

void check_same_shape(const Dims& x_shape, const Dims& v_shape, const char* name, const char* op) {
  NL_CHECK(x_shape == v_shape, "{}: {} has shape {} but x has shape {}", op, name, v_shape.str(), x_shape.str());
}

void check_writable(const Dims& shape, const Dims& strides, const char* name, const char* op) {
  for (int d = 0; d < shape.size(); ++d)
    NL_CHECK(shape[d] <= 1 || strides[d] != 0,
             "{}: output {} has stride 0 on axis {} of size {} (a broadcast view cannot be written)", op, name, d,
             shape[d]);
}

namespace {
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
}  // namespace

template <typename A, typename B>
void check_no_partial_overlap(const TensorView<A>& out, const TensorView<B>& in, const char* out_name,
                              const char* in_name, const char* op) {
  if (!out.defined() || !in.defined() || out.empty() || in.empty()) return;
  if (static_cast<const void*>(out.data()) == static_cast<const void*>(in.data()) &&
      out.shape() == in.shape() && out.strides() == in.strides())
    return;  // exact aliasing is allowed
  const auto [olo, ohi] = byte_range(out);
  const auto [ilo, ihi] = byte_range(in);
  NL_CHECK(ohi <= ilo || ihi <= olo,
           "{}: output {} overlaps input {} without being the same view (same data and strides)", op, out_name,
           in_name);
}
template void check_no_partial_overlap(const TensorView<float>&, const TensorView<const float>&, const char*,
                                       const char*, const char*);
template void check_no_partial_overlap(const TensorView<float>&, const TensorView<float>&, const char*,
                                       const char*, const char*);

template <typename T>
FullOperand full_operand(const TensorView<T>& v, const AxisSplit& s, const char* name) {
  FullOperand f;
  f.name = name;
  f.base = reinterpret_cast<char*>(const_cast<std::remove_const_t<T>*>(v.data()));
  for (int d : s.k_axes) f.k_strides.push_back(v.stride(d));
  for (int d : s.n_axes) f.n_strides.push_back(v.stride(d));
  Index expect = 1;
  bool contiguous = true;
  for (int i = s.n_shape.size() - 1; i >= 0; --i) {
    if (s.n_shape[i] == 1) continue;
    if (f.n_strides[i] != expect) contiguous = false;
    expect *= s.n_shape[i];
  }
  f.n_contiguous = contiguous;
  return f;
}
template FullOperand full_operand(const TensorView<float>&, const AxisSplit&, const char*);
template FullOperand full_operand(const TensorView<const float>&, const AxisSplit&, const char*);
template FullOperand full_operand(const TensorView<bfloat16>&, const AxisSplit&, const char*);
template FullOperand full_operand(const TensorView<const bfloat16>&, const AxisSplit&, const char*);
template FullOperand full_operand(const TensorView<float16>&, const AxisSplit&, const char*);
template FullOperand full_operand(const TensorView<const float16>&, const AxisSplit&, const char*);

template <typename T>
PartOperand part_operand(const TensorView<T>& v, const Dims& expect_shape, const char* name, const char* op) {
  PartOperand p;
  p.name = name;
  if (!v.defined()) return p;
  NL_CHECK(v.shape() == expect_shape, "{}: {} has shape {} but {} is expected", op, name, v.shape().str(),
           expect_shape.str());
  p.defined = true;
  p.base = reinterpret_cast<char*>(const_cast<std::remove_const_t<T>*>(v.data()));
  p.strides = v.strides();
  return p;
}
template PartOperand part_operand(const TensorView<float>&, const Dims&, const char*, const char*);
template PartOperand part_operand(const TensorView<const float>&, const Dims&, const char*, const char*);

void gather(float* dst, const float* base, const Dims& n_shape, const Dims& n_strides) {
  for_each_offset(n_shape, n_strides, [&](Index off) { *dst++ = base[off]; });
}

void scatter(float* base, const float* src, const Dims& n_shape, const Dims& n_strides) {
  for_each_offset(n_shape, n_strides, [&](Index off) { base[off] = *src++; });
}

std::vector<float> gather_part(const PartOperand& p, const Dims& shape) {
  std::vector<float> out(static_cast<std::size_t>(shape.product()));
  gather(out.data(), reinterpret_cast<const float*>(p.base), shape, p.strides);
  return out;
}

Chunks param_grad_chunks(Index groups, Index n) {
  // At most 64 chunks, and at most ~64 MiB of double partials (two arrays of n per chunk).
  const Index by_memory = std::max<Index>(1, (Index{64} << 20) / (16 * n));
  Chunks c;
  c.count = std::max<Index>(1, std::min({groups, Index{64}, by_memory}));
  c.size = (groups + c.count - 1) / c.count;
  c.count = (groups + c.size - 1) / c.size;
  return c;
}

RowSplit split_rows(Index groups, Index n, Index max_rows, int threads, Index block) {
  RowSplit r;
  r.groups = groups;
  if (groups <= 0) return r;
  r.ranges =
      std::clamp<Index>(groups * n / (Index{1} << 13), 1, std::min<Index>(std::max(threads, 1), groups));
  r.unit = block > 1 && groups >= block * r.ranges ? block : 1;
  r.units = (groups + r.unit - 1) / r.unit;
  const Index range_units = (r.units + r.ranges - 1) / r.ranges;  // the longest range's
  const Index most = std::max<Index>(max_rows, 1);
  r.range_tasks = std::clamp<Index>((range_units * r.unit + most - 1) / most, 1, range_units);
  r.chunk = r.unit * ((range_units + r.range_tasks - 1) / r.range_tasks);
  r.tasks = r.ranges * r.range_tasks;
  return r;
}

bool part_contiguous(const PartOperand& p, const Dims& shape) {
  Index expect = 1;
  for (int d = shape.size() - 1; d >= 0; --d) {
    if (shape[d] != 1 && p.strides[d] != expect) return false;
    expect *= shape[d];
  }
  return true;
}

double* aligned_doubles(std::vector<double>& buf, std::size_t need) {
  constexpr std::size_t kSlack = 64 / sizeof(double) - 1;  // at most 7 doubles before the boundary
  if (buf.size() < need + kSlack) buf.resize(need + kSlack);
  const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(buf.data());
  return reinterpret_cast<double*>((a + 63) & ~std::uintptr_t{63});
}

PartialRows::PartialRows(Index count, Index n, bool want_w, bool want_b)
    : stride_(static_cast<std::size_t>(partial_stride(n))) {
  place(buf_, count, want_w, want_b);
}

PartialRows::PartialRows(std::vector<double>& storage, Index count, Index n, bool want_w, bool want_b)
    : stride_(static_cast<std::size_t>(partial_stride(n))) {
  place(storage, count, want_w, want_b);
}

void PartialRows::place(std::vector<double>& storage, Index count, bool want_w, bool want_b) {
  const std::size_t per = static_cast<std::size_t>(count) * stride_;
  double* const p = aligned_doubles(storage, (want_w ? per : 0) + (want_b ? per : 0));
  if (want_w) dw_ = p;
  if (want_b) db_ = p + (want_w ? per : 0);
}

void write_chunk_sums(const PartOperand& p, const Dims& n_shape, const double* part, Index count, GradMode mode) {
  const Index n = n_shape.product();
  const std::size_t nn = static_cast<std::size_t>(n), stride = static_cast<std::size_t>(partial_stride(n));
  std::vector<float> row(nn);
  constexpr Index kCols = 512;
  // Small sums run on the calling thread, where waking a second one costs more than the additions (64x768:
  // 12.6-12.8 against 11.5 µs for the whole backward at 2 threads). Larger ones run in parallel: the
  // partial rows a thread reads back come in part from the other core, and this machine moves them slowly
  // (128x4096, 4 chunks: 206-217 µs in parallel, 244-246 on one thread).
  constexpr Index kSerialSums = Index{1} << 12;
  const Index blocks = (n + kCols - 1) / kCols;
  const auto block = [&](Index t) {
    const Index j0 = t * kCols, m = std::min(n, j0 + kCols) - j0;
    double acc[kCols] = {};
    for (Index c = 0; c < count; ++c) {
      const double* pc = part + static_cast<std::size_t>(c) * stride + static_cast<std::size_t>(j0);
      // Scalar math: acc[j] += part[c][j]  (columns are independent: one chain per column)
      for (Index j = 0; j < m; ++j) acc[j] += pc[j];
    }
    for (Index j = 0; j < m; ++j) row[static_cast<std::size_t>(j0 + j)] = static_cast<float>(acc[j]);
  };
  if (count * n <= kSerialSums)
    for (Index t = 0; t < blocks; ++t) block(t);
  else
    parallel::parallel_for(blocks, block);
  float* base = reinterpret_cast<float*>(p.base);
  const bool add = mode == GradMode::kAccumulate;
  if (part_contiguous(p, n_shape)) {
    // Scalar math: out[j] = add ? out[j] + row[j] : row[j]
    if (add)
      for (Index j = 0; j < n; ++j) base[j] += row[static_cast<std::size_t>(j)];
    else
      std::copy(row.begin(), row.end(), base);
    return;
  }
  const float* src = row.data();
  for_each_offset(n_shape, p.strides, [&](Index off) {
    base[off] = add ? base[off] + *src : *src;
    ++src;
  });
}

}  // namespace normlab::plan
