// Grouping machinery shared by the normalization family (internal).
//
// A "plan" splits the axes of x into normalized axes N and kept axes K. A group is one combination of
// the kept indices; its n elements are all combinations of the normalized indices. Operands are
// described by strides over K and over N so that any strided layout can be walked without copies.
#pragma once

#include <normlab/norm.h>
#include <normlab/tensor.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

namespace normlab::plan {

struct AxisSplit {
  int rank = 0;
  std::array<bool, kMaxRank> normalized{};
  Dims n_axes;   // normalized axes, increasing
  Dims k_axes;   // kept axes, increasing
  Dims n_shape;  // sizes at n_axes
  Dims k_shape;  // sizes at k_axes
  Index n = 1;       // elements per group
  Index groups = 1;  // number of groups
};

// Validates `axes` against x's shape (range, duplicates, at least one axis, non-empty x) and splits.
AxisSplit split_axes(const Dims& x_shape, const Axes& axes, const char* op);

// A full-shaped operand (shape of x) seen as strides over K and over N.
struct FullOperand {
  const char* name = "";
  char* base = nullptr;  // as bytes-agnostic pointer; cast by the user
  Dims k_strides, n_strides;
  bool n_contiguous = false;  // the group's elements are n consecutive floats, in N's row-major order
};

// An operand shaped like K (mean, rstd) or like N (weight, bias).
struct PartOperand {
  const char* name = "";
  char* base = nullptr;
  Dims strides;
  bool defined = false;
};

// Checks that v has exactly x's shape; throws naming `name` and `op` otherwise.
void check_same_shape(const Dims& x_shape, const Dims& v_shape, const char* name, const char* op);
// Checks that an output view writes every element once (no 0 stride on an axis longer than 1).
void check_writable(const Dims& shape, const Dims& strides, const char* name, const char* op);
// Checks that an output either is exactly the input (same pointer and strides) or does not overlap it.
template <typename A, typename B>
void check_no_partial_overlap(const TensorView<A>& out, const TensorView<B>& in, const char* out_name,
                              const char* in_name, const char* op);

template <typename T>
FullOperand full_operand(const TensorView<T>& v, const AxisSplit& s, const char* name);
template <typename T>
PartOperand part_operand(const TensorView<T>& v, const Dims& expect_shape, const char* name, const char* op);

// Offset (in elements) of group g's first element for strides over K.
inline Index group_offset(Index g, const Dims& k_shape, const Dims& k_strides) {
  Index off = 0;
  for (int d = k_shape.size() - 1; d >= 0; --d) {
    const Index q = g / k_shape[d];
    off += (g - q * k_shape[d]) * k_strides[d];
    g = q;
  }
  return off;
}

// Copies one group to/from a contiguous buffer (row-major over N).
void gather(float* dst, const float* base, const Dims& n_shape, const Dims& n_strides);
void scatter(float* base, const float* src, const Dims& n_shape, const Dims& n_strides);

// Reads a K- or N-shaped operand into a contiguous row-major buffer.
std::vector<float> gather_part(const PartOperand& p, const Dims& shape);

// Chunking of groups for deterministic parameter-gradient reduction: depends on the shape only.
struct Chunks {
  Index count = 1;
  Index size = 1;  // groups per chunk (last may be shorter)
};
Chunks param_grad_chunks(Index groups, Index n);

// Rows (or any items of about n elements each) split for parallel::parallel_for, for work whose results do
// not depend on the split (each row's arithmetic is its own): each thread one contiguous range, cut into
// tasks of at most max_rows rows; parallel_for's static schedule hands thread j the tasks of range j.
// Ranges and tasks are whole blocks of `unit` rows (but for the very last): `block` rows (8 by default, the
// short-row kernels' block) where every range gets at least one block, else single rows. Ranges differ by at
// most one block, and so do a range's tasks. Fewer threads where the work is under about 8K elements per
// thread, and never more than there are rows. (Tasks of a fixed size left one thread up to a whole task more
// than the other; ranges rounded up to whole blocks left 3 long rows all on one thread.)
struct RowSplit {
  Index groups = 0;
  Index unit = 1;         // rows per block
  Index units = 0;        // blocks: ceil(groups / unit)
  Index ranges = 1;       // thread ranges
  Index range_tasks = 1;  // tasks per range
  Index chunk = 0;        // the most rows of any task
  Index tasks = 0;        // ranges · range_tasks
  // The first row of task t and its row count (0: nothing to do).
  Index first(Index t) const { return bound(t, 0); }
  Index rows(Index t) const { return bound(t, 1) - bound(t, 0); }

 private:
  Index bound(Index t, Index end) const {
    const Index r = t / range_tasks, i = t % range_tasks + end;
    const Index u0 = units * r / ranges, u1 = units * (r + 1) / ranges;
    return std::min(groups, unit * (u0 + (u1 - u0) * i / range_tasks));
  }
};
RowSplit split_rows(Index groups, Index n, Index max_rows, int threads, Index block = 8);

// The tasks' size for split_rows: rows (or items) of n elements per task, about 16 Ki elements
// (kTaskElems), at least one; with stream (the forward's output out of cache, streaming.h), at least
// kStreamTaskMinRows rows. The row drivers (row_norm.cpp, storage_norm.h) call their forward kernels on one
// task at a time: split_rows(groups, n, task_rows(n, stream), threads).chunk rows per call (its blocks of
// eight rows make that 8 from n = 2048 on in cache, where task_rows is 8 or fewer); scripts/ab-rows
// times the forward kernels in calls of that size (bench/bench_ab_rows.cpp). The size only schedules: no
// result depends on it.
// Why the floor out of cache (measured; the cause not isolated): the pipelined forward (rows of 256 or more
// elements, row_kernels-inl.h) starts its pipeline of three rows afresh at every call, its first and last
// steps running one or two of its three passes (a fence less per call changed nothing). Calls of 16
// rows against the 8 before, paired out of cache on a Zen 5 (docs/PERFORMANCE.md, "fifty-eighth session";
// the library's kernels called as the drivers call them, 128 MiB per operand, 1 and 2 threads, B/A medians
// at D = 2048, 4096, 8192): fp32 LayerNorm 0.94-0.99, RMSNorm 0.95-1.00, bf16 LayerNorm and RMSNorm
// 0.95-0.99, the fused add + LayerNorm 0.96-1.01. Calls of 32 or 64 rows gained no more (0.92-0.99); at
// D = 512 and 768 (calls of 32 and 16-24 rows) longer calls (84 to 1344 rows) took 0.94-1.11 of the time,
// 1.01 or more in 16 of 18 runs, so no longer floor.
inline constexpr Index kTaskElems = Index{1} << 14;
inline constexpr Index kStreamTaskMinRows = 16;
inline Index task_rows(Index n, bool stream = false) {
  const Index rows = std::max<Index>(1, kTaskElems / std::max<Index>(1, n));
  return stream ? std::max(rows, kStreamTaskMinRows) : rows;
}

// Whether a γ/β-shaped operand is its elements in consecutive floats, row-major (size-1 axes ignored).
bool part_contiguous(const PartOperand& p, const Dims& shape);

// The partial rows of the chunked dγ/dβ reductions: one row of n doubles per chunk, row c at
// part + c·partial_stride(n), every row on a 64-byte boundary (the stride is n rounded up to 8 doubles).
// The kernels add each row group's contribution to such a row with full-vector loads and stores; where the
// rows were only 16-byte aligned (std::vector's allocation), each 64-byte access spanned two cache lines and
// the fp32 LayerNorm backward from saved statistics took 1.04-1.07x as long in L3 on Zen 4
// (docs/PERFORMANCE.md, fifteenth session).
inline Index partial_stride(Index n) {
  return (n + 7) / 8 * 8;
}
// The first 64-byte boundary in buf after growing it (value-initialized, so new entries are 0) to hold
// `need` doubles from there. The pointer is valid until buf is next resized.
double* aligned_doubles(std::vector<double>& buf, std::size_t need);

// Partial rows of dγ (want_w) and dβ (want_b) for `count` chunks, laid out as above: dw_row(c) and
// db_row(c) are chunk c's rows (nullptr where not wanted), dw() and db() the first for write_chunk_sums.
class PartialRows {
 public:
  // Zeroed rows in a buffer of their own.
  PartialRows(Index count, Index n, bool want_w, bool want_b);
  // Rows in `storage`, grown as needed and otherwise reused as it is (old values stay): for kernels that
  // assign each chunk's rows before adding to them. The pointers are valid until storage is next resized.
  PartialRows(std::vector<double>& storage, Index count, Index n, bool want_w, bool want_b);
  PartialRows(const PartialRows&) = delete;  // the pointers are into a buffer
  PartialRows& operator=(const PartialRows&) = delete;
  double* dw_row(Index c) const { return dw_ ? dw_ + static_cast<std::size_t>(c) * stride_ : nullptr; }
  double* db_row(Index c) const { return db_ ? db_ + static_cast<std::size_t>(c) * stride_ : nullptr; }
  const double* dw() const { return dw_; }
  const double* db() const { return db_; }

 private:
  void place(std::vector<double>& storage, Index count, bool want_w, bool want_b);

  std::vector<double> buf_;  // the rows of the first constructor
  std::size_t stride_;
  double* dw_ = nullptr;
  double* db_ = nullptr;
};

// The last step of every chunked dγ/dβ reduction: `count` partial rows of n doubles (row c at
// part + c·partial_stride(n)) summed per column in chunk order from +0 (0 + p_0 + p_1 + ...), each column
// rounded once to float, and written into p (γ/β-shaped, n_shape, any strides) per mode (= or +=). Parallel
// over blocks of columns (up to 4096 partial values on the calling thread); the bits depend on the partials
// only.
void write_chunk_sums(const PartOperand& p, const Dims& n_shape, const double* part, Index count, GradMode mode);

}  // namespace normlab::plan
