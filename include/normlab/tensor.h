// normlab/tensor.h — strided views and owning tensors.
//
// Vocabulary used across normlab:
//   * rank ≤ kMaxRank (8); shape and strides are counted in ELEMENTS, never bytes;
//   * a stride may be negative (reversed views) or 0 (broadcast inputs); outputs must not have a
//     0 stride on an axis longer than 1 (every output element must be written exactly once);
//   * TensorView<T> never owns memory; BasicTensor<T> owns a 64-byte aligned buffer.
// Element types: float (and double in the references); the 16-bit storage types bfloat16 and float16
// are defined at the end of this file. Views and tensors are templates on the element type.
#pragma once

#include <normlab/error.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <new>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace normlab {

using Index = std::int64_t;
inline constexpr int kMaxRank = 8;
inline constexpr std::size_t kAlignment = 64;

// A fixed-capacity list of up to kMaxRank integers (a shape, strides, or axes).
class Dims {
 public:
  Dims() = default;
  Dims(std::initializer_list<Index> v) { assign(std::span<const Index>(v.begin(), v.size())); }
  explicit Dims(std::span<const Index> v) { assign(v); }
  explicit Dims(const std::vector<Index>& v) { assign(std::span<const Index>(v)); }

  int size() const { return n_; }
  bool empty() const { return n_ == 0; }
  Index operator[](int i) const { return v_[static_cast<std::size_t>(i)]; }
  Index& operator[](int i) { return v_[static_cast<std::size_t>(i)]; }
  const Index* begin() const { return v_.data(); }
  const Index* end() const { return v_.data() + n_; }
  void push_back(Index x) {
    NL_CHECK(n_ < kMaxRank, "rank {} exceeds the maximum rank {}", n_ + 1, kMaxRank);
    v_[static_cast<std::size_t>(n_++)] = x;
  }
  std::span<const Index> span() const { return {v_.data(), static_cast<std::size_t>(n_)}; }
  std::vector<Index> vec() const { return {begin(), end()}; }
  Index product() const {
    Index p = 1;
    for (int i = 0; i < n_; ++i) p *= v_[static_cast<std::size_t>(i)];
    return p;
  }
  friend bool operator==(const Dims& a, const Dims& b) {
    return a.n_ == b.n_ && std::equal(a.begin(), a.end(), b.begin());
  }
  std::string str() const;  // "[2, 3, 4]"

 private:
  void assign(std::span<const Index> v) {
    NL_CHECK(v.size() <= static_cast<std::size_t>(kMaxRank), "rank {} exceeds the maximum rank {}",
             v.size(), kMaxRank);
    n_ = static_cast<int>(v.size());
    std::copy(v.begin(), v.end(), v_.begin());
  }
  std::array<Index, kMaxRank> v_{};
  int n_ = 0;
};

inline std::string Dims::str() const {
  std::string s = "[";
  for (int i = 0; i < n_; ++i) s += (i ? ", " : "") + std::to_string(v_[static_cast<std::size_t>(i)]);
  return s + "]";
}

// Row-major (C order) strides for a shape.
inline Dims contiguous_strides(const Dims& shape) {
  Dims s = shape;
  Index acc = 1;
  for (int i = shape.size() - 1; i >= 0; --i) {
    s[i] = acc;
    acc *= shape[i];
  }
  return s;
}

// Normalizes a possibly negative axis against `rank`; throws when out of range.
inline int normalize_axis(Index axis, int rank) {
  NL_CHECK(axis >= -rank && axis < rank, "axis {} is out of range for a tensor of rank {} (valid: {}..{})",
           axis, rank, -rank, rank - 1);
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

// A non-owning strided view. An undefined view (default constructed) stands for "not given".
template <typename T>
class TensorView {
 public:
  using value_type = T;

  TensorView() = default;
  TensorView(T* data, Dims shape, Dims strides) : data_(data), shape_(shape), strides_(strides), defined_(true) {
    NL_CHECK(shape.size() == strides.size(), "shape {} and strides {} differ in rank", shape.str(),
             strides.str());
    for (int i = 0; i < shape.size(); ++i)
      NL_CHECK(shape[i] >= 0, "negative size {} on axis {} of shape {}", shape[i], i, shape.str());
  }
  TensorView(T* data, Dims shape) : TensorView(data, shape, contiguous_strides(shape)) {}

  // A view of T converts to a view of const T.
  template <typename U, typename = std::enable_if_t<std::is_same_v<const U, T> && !std::is_same_v<U, T>>>
  TensorView(const TensorView<U>& o)  // NOLINT(google-explicit-constructor)
      : data_(o.data()), shape_(o.shape()), strides_(o.strides()), defined_(o.defined()) {}

  bool defined() const { return defined_; }
  T* data() const { return data_; }
  int rank() const { return shape_.size(); }
  const Dims& shape() const { return shape_; }
  const Dims& strides() const { return strides_; }
  Index size(int axis) const { return shape_[normalize_axis(axis, rank())]; }
  Index stride(int axis) const { return strides_[normalize_axis(axis, rank())]; }
  Index numel() const { return shape_.product(); }
  bool empty() const { return numel() == 0; }

  bool is_contiguous() const {
    Index expect = 1;
    for (int i = rank() - 1; i >= 0; --i) {
      if (shape_[i] != 1 && strides_[i] != expect) return false;
      expect *= shape_[i];
    }
    return true;
  }

  // Element access by a full multi-index (bounds-checked; meant for tests and small tools).
  T& at(std::initializer_list<Index> idx) const { return at(std::span<const Index>(idx.begin(), idx.size())); }
  T& at(std::span<const Index> idx) const {
    NL_CHECK(static_cast<int>(idx.size()) == rank(), "index of rank {} for a view of rank {}", idx.size(),
             rank());
    Index off = 0;
    for (int i = 0; i < rank(); ++i) {
      Index k = idx[static_cast<std::size_t>(i)];
      NL_CHECK(k >= 0 && k < shape_[i], "index {} out of range [0, {}) on axis {}", k, shape_[i], i);
      off += k * strides_[i];
    }
    return data_[off];
  }

  // Reorders the axes: result axis i is this view's axis order[i].
  TensorView permute(std::span<const int> order) const {
    NL_CHECK(static_cast<int>(order.size()) == rank(), "permute order has {} entries for a view of rank {}",
             order.size(), rank());
    Dims sh, st;
    std::array<bool, kMaxRank> seen{};
    for (int o : order) {
      int a = normalize_axis(o, rank());
      NL_CHECK(!seen[static_cast<std::size_t>(a)], "axis {} repeated in permute order", a);
      seen[static_cast<std::size_t>(a)] = true;
      sh.push_back(shape_[a]);
      st.push_back(strides_[a]);
    }
    return TensorView(data_, sh, st);
  }
  TensorView permute(std::initializer_list<int> order) const {
    return permute(std::span<const int>(order.begin(), order.size()));
  }
  TensorView transpose(int a, int b) const {
    std::array<int, kMaxRank> order{};
    for (int i = 0; i < rank(); ++i) order[static_cast<std::size_t>(i)] = i;
    std::swap(order[static_cast<std::size_t>(normalize_axis(a, rank()))],
              order[static_cast<std::size_t>(normalize_axis(b, rank()))]);
    return permute(std::span<const int>(order.data(), static_cast<std::size_t>(rank())));
  }

  // Elements start, start+step, ... (< stop for step > 0, > stop for step < 0) of `axis`.
  TensorView slice(int axis, Index start, Index stop, Index step = 1) const {
    int a = normalize_axis(axis, rank());
    Index n = shape_[a];
    NL_CHECK(step != 0, "slice step must not be 0");
    NL_CHECK(start >= 0 && start <= n && stop >= -1 && stop <= n,
             "slice [{}, {}) out of range for axis {} of size {}", start, stop, a, n);
    Index count = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0)
                           : (start > stop ? (start - stop + (-step) - 1) / (-step) : 0);
    NL_CHECK(count == 0 || start < n, "slice start {} out of range for axis {} of size {}", start, a, n);
    Dims sh = shape_, st = strides_;
    sh[a] = count;
    st[a] = strides_[a] * step;
    return TensorView(count ? data_ + start * strides_[a] : data_, sh, st);
  }

  // Drops `axis`, fixing it at `index`.
  TensorView select(int axis, Index index) const {
    int a = normalize_axis(axis, rank());
    NL_CHECK(index >= 0 && index < shape_[a], "select index {} out of range [0, {}) on axis {}", index,
             shape_[a], a);
    Dims sh, st;
    for (int i = 0; i < rank(); ++i)
      if (i != a) {
        sh.push_back(shape_[i]);
        st.push_back(strides_[i]);
      }
    return TensorView(data_ + index * strides_[a], sh, st);
  }

  // Same elements, new shape; only for contiguous views.
  TensorView reshape(Dims shape) const {
    NL_CHECK(is_contiguous(), "reshape needs a contiguous view (shape {}, strides {})", shape_.str(),
             strides_.str());
    NL_CHECK(shape.product() == numel(), "cannot reshape {} elements of shape {} to {}", numel(), shape_.str(),
             shape.str());
    return TensorView(data_, shape);
  }

 private:
  T* data_ = nullptr;
  Dims shape_;
  Dims strides_;
  bool defined_ = false;
};

using View = TensorView<float>;
using ConstView = TensorView<const float>;

// Calls f(offset) for every element of `shape` with the given strides, in row-major index order.
template <typename F>
void for_each_offset(const Dims& shape, const Dims& strides, F&& f) {
  const int r = shape.size();
  if (shape.product() == 0) return;
  std::array<Index, kMaxRank> idx{};
  Index off = 0;
  for (;;) {
    f(off);
    int d = r - 1;
    for (; d >= 0; --d) {
      if (++idx[static_cast<std::size_t>(d)] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= (shape[d] - 1) * strides[d];
      idx[static_cast<std::size_t>(d)] = 0;
    }
    if (d < 0) return;
  }
}

// ---- storage ------------------------------------------------------------------------------------------
//
// BasicTensor's storage: 64-byte aligned. On Linux an allocation of kHugePageBytes (2 MiB) or more is its
// own anonymous mapping, starting on a 2 MiB boundary and advised for transparent huge pages
// (madvise(MADV_HUGEPAGE)), so that the kernel can back it with 2 MiB pages where the system allows them
// (/sys/kernel/mm/transparent_hugepage/enabled set to "madvise" or "always"). A kernel streaming through
// hundreds of MiB then misses the TLB once per 2 MiB instead of once per 4 KiB: on the development VM the
// LayerNorm forward out of cache took 0.54-0.73 of the time on such memory (docs/PERFORMANCE.md,
// "eighteenth session"). The environment variable NORMLAB_HUGE_PAGES=0 turns this off (read at each
// allocation), and an AddressSanitizer build never does it (a mapping of its own has no redzones): every
// allocation then comes from the aligned operator new.
// A freed mapping is kept (up to kStorageCacheMappings of them and kStorageCacheBytes of data in all, the
// oldest given back first) for the next allocation of its length or up to 1/8 shorter: a tensor made and
// freed at each call would otherwise pay for a new mapping, its page faults and the kernel's zeroing every
// time (a 4 MiB result of the Python module took 1.3-4.7× as long as from NumPy's allocator before the kept
// mappings; docs/PERFORMANCE.md, "nineteenth session").
// Such a tensor's data do not start at the mapping's start but detail::storage_offset(k) bytes into it, k
// counting these allocations: 0, 2560, 1024, 3584, 2048, 512, 3072, 1536, again and again. Otherwise every
// large tensor would start at the same offset in its 4 KiB pages, and a kernel's loads of one tensor would
// wait on its stores to another at the same address bits 0-11 (4 KiB aliasing): the LayerNorm backward in L3
// at D = 1024 and 4096 took 1.06-1.17× the time of staggered buffers (docs/PERFORMANCE.md, "twentieth
// session"). Consecutive allocations (such as x, then y or dy, then dx) lie 1024 or 1536 bytes apart.
// The base page of x86-64 Linux, within which the offsets above stagger the data.
inline constexpr std::size_t kPageBytes = 4096;
inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;
inline constexpr std::size_t kStorageCacheBytes = std::size_t{256} << 20;
inline constexpr std::size_t kStorageCacheMappings = 16;
namespace detail {
struct Storage {
  void* p = nullptr;
  std::size_t mapped = 0;  // the length of its own mapping (from p's page on); 0: from operator new
};
// The offset of the k-th mapped allocation's data in its first page (above): multiples of kPageBytes / 8
// (512) below kPageBytes, five such steps apart (modulo kPageBytes) from one allocation to the next.
constexpr std::size_t storage_offset(unsigned k) {
  return (k * 5u % 8u) * (kPageBytes / 8);
}
// The start of the mapping of a mapped allocation's data p (the start of p's page).
inline void* mapping_start(void* p) {
  return reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(p) / kPageBytes * kPageBytes);
}
// The bytes of storage for a tensor of `shape` with elements of `item` bytes (at least kAlignment), for
// BasicTensor and the Python module's arrays. A negative size, or more bytes than a pointer difference can
// count (the element count then fits an Index too), is an Error: the product is checked before it is formed.
// A size 0 on any axis makes an empty tensor, whatever the other sizes.
template <typename Int>
std::size_t storage_bytes(std::span<const Int> shape, std::size_t item) {
  constexpr auto kMax = static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max());
  bool empty = false;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    NL_CHECK(shape[i] >= 0, "negative size {} on axis {}", shape[i], i);
    empty = empty || shape[i] == 0;
  }
  std::size_t bytes = empty ? 0 : item;
  for (std::size_t i = 0; i < shape.size() && !empty; ++i) {
    const auto u = static_cast<std::size_t>(shape[i]);
    NL_CHECK(bytes <= kMax / u,
             "a tensor of this shape ({} bytes per element) has more bytes than fit in memory", item);
    bytes *= u;
  }
  return std::max(bytes, kAlignment);
}
// Throws std::bad_alloc when the memory cannot be had.
Storage allocate_storage(std::size_t bytes);
void free_storage(void* p, std::size_t mapped) noexcept;
// Whether allocate_storage(bytes) maps and advises the memory (Linux, bytes ≥ kHugePageBytes, and not
// NORMLAB_HUGE_PAGES=0).
bool huge_page_storage(std::size_t bytes);
// The bytes of data the freed mappings kept for reuse can hold (above; without their offset pages).
std::size_t storage_cache_bytes();
struct StorageFree {
  std::size_t mapped = 0;
  void operator()(void* p) const noexcept { free_storage(p, mapped); }
};
}  // namespace detail

// An owning, contiguous, 64-byte-aligned tensor (storage: above). Zero-initialized on construction.
template <typename T>
class BasicTensor {
 public:
  BasicTensor() = default;
  explicit BasicTensor(Dims shape) : BasicTensor(shape, Uninitialized{}) {
    std::fill_n(data_.get(), numel(), T{});
  }
  BasicTensor(Dims shape, std::initializer_list<T> values) : BasicTensor(shape) {
    NL_CHECK(static_cast<Index>(values.size()) == numel(), "{} values for shape {} ({} elements)",
             values.size(), shape.str(), numel());
    std::copy(values.begin(), values.end(), data_.get());
  }
  // A contiguous copy of any view (converted element by element to T; a contiguous view of T: one memcpy).
  template <typename U>
  static BasicTensor copy_of(const TensorView<U>& v) {
    BasicTensor t(v.shape(), Uninitialized{});
    T* out = t.data();
    if constexpr (std::is_same_v<std::remove_const_t<U>, T>) {
      if (v.is_contiguous()) {
        if (t.numel() > 0) std::memcpy(out, v.data(), static_cast<std::size_t>(t.numel()) * sizeof(T));
        return t;
      }
    }
    for_each_offset(v.shape(), v.strides(), [&](Index off) { *out++ = static_cast<T>(v.data()[off]); });
    return t;
  }
  BasicTensor clone() const { return copy_of(view()); }

  BasicTensor(BasicTensor&&) noexcept = default;
  BasicTensor& operator=(BasicTensor&&) noexcept = default;

  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  const Dims& shape() const { return shape_; }
  int rank() const { return shape_.size(); }
  Index size(int axis) const { return shape_[normalize_axis(axis, rank())]; }
  Index numel() const { return shape_.product(); }
  T& operator[](Index i) { return data_.get()[i]; }
  const T& operator[](Index i) const { return data_.get()[i]; }

  TensorView<T> view() { return TensorView<T>(data_.get(), shape_); }
  TensorView<const T> view() const { return TensorView<const T>(data_.get(), shape_); }
  TensorView<const T> cview() const { return view(); }

 private:
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>,
                "BasicTensor holds plain values (its storage is raw memory)");
  // The storage, each element written before it is read: for copy_of, which writes them all.
  struct Uninitialized {};
  BasicTensor(Dims shape, Uninitialized) : shape_(shape) {
    const detail::Storage st = detail::allocate_storage(detail::storage_bytes(shape.span(), sizeof(T)));
    data_ = std::unique_ptr<T, detail::StorageFree>(static_cast<T*>(st.p), detail::StorageFree{st.mapped});
  }

  std::unique_ptr<T, detail::StorageFree> data_;
  Dims shape_;
};

using Tensor = BasicTensor<float>;

// ---- 16-bit storage types -------------------------------------------------------------------------
//
// bfloat16 (1 sign, 8 exponent, 7 mantissa bits: fp32's range, 8 significant bits) and float16 (IEEE
// binary16: 1, 5, 10; largest finite 65504, subnormals down to 2^-24). They are STORAGE types: normlab
// widens them to fp32 (exactly) and computes in fp32/double; there is no arithmetic on them.
//
// Conversions (the same bits on every SIMD target; the vectorized kernels are tested against these):
//   to float:   exact. bfloat16: the bits shifted left by 16 (a NaN stays the same NaN). float16: as
//               x86 F16C (vcvtph2ps) does it: subnormals exact, a NaN keeps its sign and payload and
//               becomes quiet (mantissa bit 9 → float bit 22 set).
//   from float: round to nearest, ties to even. Values beyond the largest finite value round to ±Inf
//               when they are at or above halfway to the next power of two (bfloat16: |x| ≥ 0x1.FF8p127;
//               float16: |x| ≥ 65520), as IEEE rounding requires; tiny values round to subnormals or ±0.
//               A NaN stays a NaN with its sign and the top payload bits, made quiet (bfloat16: the upper
//               16 bits | 0x0040; float16: as F16C vcvtps2ph, sign | 0x7E00 | top 9 payload bits). Note
//               that PyTorch's c10::BFloat16 maps every NaN to 0x7FC0 (sign and payload dropped).
namespace detail {
inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline std::uint16_t bf16_bits_from_float(float f) {
  const std::uint32_t x = float_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);  // NaN
  return static_cast<std::uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);  // RNE; carries into the exponent
}
inline float float_from_bf16_bits(std::uint16_t h) { return bits_float(static_cast<std::uint32_t>(h) << 16); }
inline std::uint16_t f16_bits_from_float(float f) {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));  // NaN
  if (ax >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // ≥ 65520 (and Inf) → Inf
  if (ax >= 0x38800000u) {                                                   // normal: ≥ 2^-14
    const std::uint32_t r = ax + 0xFFFu + ((ax >> 13) & 1u) - (std::uint32_t{112} << 23);
    return static_cast<std::uint16_t>(sign | (r >> 13));
  }
  // Subnormal or zero: count units of 2^-24, rounding to nearest even.
  const std::uint32_t e = ax >> 23;
  if (e < 102) return static_cast<std::uint16_t>(sign);  // |x| < 2^-25: rounds to ±0
  const std::uint32_t mant = (ax & 0x7FFFFFu) | 0x800000u, shift = 126 - e;  // 14 ≤ shift ≤ 24
  std::uint32_t r = mant >> shift;
  const std::uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return static_cast<std::uint16_t>(sign | r);
}
inline float float_from_f16_bits(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1F) return bits_float(sign | 0x7F800000u | (m << 13) | (m ? 0x400000u : 0u));  // Inf, NaN (quiet)
  if (e != 0) return bits_float(sign | ((e + 112) << 23) | (m << 13));
  if (m == 0) return bits_float(sign);
  int p = 9;  // subnormal m·2^-24: the leading bit of m is bit p
  while (!(m >> p)) --p;
  return bits_float(sign | (static_cast<std::uint32_t>(p + 103) << 23) | ((m << (23 - p)) & 0x7FFFFFu));
}
}  // namespace detail

struct bfloat16 {
  std::uint16_t bits;
  bfloat16() = default;  // bfloat16{} is +0
  explicit bfloat16(float f) : bits(detail::bf16_bits_from_float(f)) {}
  explicit operator float() const { return detail::float_from_bf16_bits(bits); }
  static bfloat16 from_bits(std::uint16_t b) {
    bfloat16 h;
    h.bits = b;
    return h;
  }
};

struct float16 {
  std::uint16_t bits;
  float16() = default;  // float16{} is +0
  explicit float16(float f) : bits(detail::f16_bits_from_float(f)) {}
  explicit operator float() const { return detail::float_from_f16_bits(bits); }
  static float16 from_bits(std::uint16_t b) {
    float16 h;
    h.bits = b;
    return h;
  }
};
static_assert(sizeof(bfloat16) == 2 && sizeof(float16) == 2 && std::is_trivially_copyable_v<bfloat16> &&
              std::is_trivially_copyable_v<float16>);

using BF16View = TensorView<bfloat16>;
using ConstBF16View = TensorView<const bfloat16>;
using F16View = TensorView<float16>;
using ConstF16View = TensorView<const float16>;
using BF16Tensor = BasicTensor<bfloat16>;
using F16Tensor = BasicTensor<float16>;

}  // namespace normlab
