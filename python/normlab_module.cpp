// The `normlab` Python module (pybind11): the normalization family, CMVN and the Kaldi fbank on NumPy arrays.
//
// Arrays go to the kernels without a copy when they are float32 (float16 for the LayerNorm / RMSNorm
// storage kernels), whatever their strides: a transposed or sliced array is read in place, as the C++ API
// reads a strided view. Other dtypes are converted to float32 first (one copy, in the library's storage), as
// np.asarray(x, np.float32) would. Outputs are new C-contiguous arrays in that storage. Running statistics of
// BatchNorm are updated in place and must therefore be writable float32 arrays.
//
// bfloat16 has no NumPy dtype (Debian 12 has no ml_dtypes), so LayerNorm / RMSNorm take bfloat16 storage by
// name: storage="bfloat16" with x (and dy) the bits in a uint16 or int16 array (to_bfloat16 makes one from
// float32; a PyTorch bfloat16 tensor gives them as t.view(torch.int16).numpy()), read in place; y and dx come
// back as uint16 arrays of bits (from_bfloat16 widens them exactly).
//
// Errors: every normlab::Error (bad shape, axis, eps, file ...) becomes normlab.Error, a subclass of
// ValueError, with the library's message. The kernels run without the GIL.
#include <normlab/cmvn.h>
#include <normlab/error.h>
#include <normlab/norm.h>
#include <normlab/parallel.h>
#include <normlab/simd.h>
#include <normlab/speech/fbank.h>
#include <normlab/speech/wav.h>
#include <normlab/tensor.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace py = pybind11;
using namespace normlab;

namespace {

// A float32 argument: the array itself when it is float32 (whatever its strides); any other array or
// array-like becomes a C-contiguous float32 copy in the library's storage (f32 below, through the type
// caster at the end of this file).
struct F32Array : py::array {
  F32Array() = default;
  explicit F32Array(py::array a) : py::array(std::move(a)) {}
};
using OptArray = std::optional<F32Array>;

bool is_float16(const py::array& a) {
  return a.dtype().kind() == 'f' && a.dtype().itemsize() == 2;
}

// Shape and element strides of a NumPy array (NumPy counts strides in bytes).
Dims shape_of(const py::array& a) {
  Dims d;
  for (py::ssize_t i = 0; i < a.ndim(); ++i) d.push_back(a.shape(i));
  return d;
}
Dims strides_of(const py::array& a, const char* name) {
  Dims d;
  const py::ssize_t item = a.itemsize();
  for (py::ssize_t i = 0; i < a.ndim(); ++i) {
    NL_CHECK(a.strides(i) % item == 0, "{}: stride {} bytes is not a multiple of the element size {}", name,
             a.strides(i), item);
    d.push_back(a.strides(i) / item);
  }
  return d;
}

// NumPy allows an array at any byte offset (np.frombuffer(buf, offset=1)); the kernels read whole elements.
void check_aligned(const py::array& a, const char* name) {
  NL_CHECK(reinterpret_cast<std::uintptr_t>(a.data()) % static_cast<std::uintptr_t>(a.itemsize()) == 0,
           "{}: the data is not aligned to its element size ({} bytes); pass a copy (x.copy())", name,
           a.itemsize());
}

template <class T>
TensorView<const T> cview(const py::array& a, const char* name) {
  check_aligned(a, name);
  return TensorView<const T>(static_cast<const T*>(a.data()), shape_of(a), strides_of(a, name));
}
ConstView cview(const OptArray& a, const char* name) {
  return a ? cview<float>(*a, name) : ConstView();
}

// A new C-contiguous array of `shape` and dtype `dt`, uninitialized, in the storage of a BasicTensor
// (normlab/tensor.h): 2 MiB or more on transparent huge pages, freed mappings kept for reuse. NumPy's own
// allocation is neither: out of cache the kernels ran 1.3-1.9× faster on huge pages, and a result of
// 128 MiB from NumPy paid its page faults at every call (docs/PERFORMANCE.md, "eighteenth" and "nineteenth
// session"). A capsule frees it with the array.
py::array storage_array(const py::dtype& dt, const std::vector<py::ssize_t>& shape) {
  const std::size_t bytes =
      detail::storage_bytes(std::span<const py::ssize_t>(shape), static_cast<std::size_t>(dt.itemsize()));
  constexpr auto release = [](void* p) {
    auto* st = static_cast<detail::Storage*>(p);
    detail::StorageFree{st->mapped}(st->p);
    delete st;
  };
  std::unique_ptr<detail::Storage, void (*)(void*)> owned(new detail::Storage{}, release);
  *owned = detail::allocate_storage(bytes);
  const py::capsule base(owned.get(), release);
  detail::Storage* const st = owned.release();  // the capsule frees it from here on
  return py::array(dt, shape, st->p, base);
}
// a as float32: a itself when it is float32; otherwise converted as np.asarray(a, np.float32) would (unsafe
// casting: float64 rounded, integers converted), into a new C-contiguous array in the storage above. (From
// NumPy's own allocation, a large converted input paid its page faults at every call, as the results did.)
py::array f32(const py::array& a) {
  if (a.dtype().is(py::dtype::of<float>())) return a;
  py::array out =
      storage_array(py::dtype::of<float>(), std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim()));
  py::module_::import("numpy").attr("copyto")(out, a, py::arg("casting") = "unsafe");
  return out;
}

template <class T>
py::array_t<T> new_array(const Dims& shape) {
  return py::array_t<T>(
      storage_array(py::dtype::of<T>(), std::vector<py::ssize_t>(shape.begin(), shape.end())));
}
template <class T>
TensorView<T> view(py::array_t<T>& a) {
  return TensorView<T>(a.mutable_data(), shape_of(a), strides_of(a, "output"));
}

// A running statistic updated in place: exactly float32 and writable (a converted copy would drop the
// update).
View inout_view(const std::optional<py::array>& a, const char* name) {
  if (!a) return View();
  NL_CHECK(a->dtype().is(py::dtype::of<float>()),
           "{} must be a float32 array (it is updated in place), got {}", name,
           std::string(py::str(a->dtype())));
  NL_CHECK(a->writeable(), "{} must be writable (it is updated in place)", name);
  py::array arr = *a;
  check_aligned(arr, name);
  return View(static_cast<float*>(arr.mutable_data()), shape_of(arr), strides_of(arr, name));
}

Axes axes_of(const std::vector<int>& axes) {
  return Axes(axes.begin(), axes.end());
}

}  // namespace

// NumPy's float16 has the bits of normlab::float16; normlab::bfloat16 travels as the uint16 of its bits.
namespace pybind11::detail {
template <>
struct npy_format_descriptor<normlab::float16> {
  static constexpr auto name = _("float16");
  static pybind11::dtype dtype() { return pybind11::dtype("float16"); }
};
template <>
struct npy_format_descriptor<normlab::bfloat16> {
  static constexpr auto name = _("uint16");
  static pybind11::dtype dtype() { return pybind11::dtype("uint16"); }
};
}  // namespace pybind11::detail

namespace {

// Runs f(views...) without the GIL.
template <class F>
void nogil(F&& f) {
  py::gil_scoped_release release;
  f();
}

// The storage type of a LayerNorm / RMSNorm call: `storage` when given ("float32", "float16" or "bfloat16"),
// else x's: float16 when x is float16, float32 otherwise.
using Storage = std::optional<std::string>;

bool is_bf16_bits(const py::array& a) {
  return (a.dtype().kind() == 'u' || a.dtype().kind() == 'i') && a.dtype().itemsize() == 2;
}

// f(storage tag) runs the operation for the storage type of x (see Storage).
template <class F>
auto by_storage(const py::array& x, const Storage& storage, F&& f) {
  if (!storage) {
    if (is_float16(x)) return f(std::type_identity<float16>{});
    return f(std::type_identity<float>{});
  }
  if (*storage == "float32") return f(std::type_identity<float>{});
  if (*storage == "float16") return f(std::type_identity<float16>{});
  NL_CHECK(*storage == "bfloat16", "storage must be \"float32\", \"float16\" or \"bfloat16\", got \"{}\"",
           *storage);
  return f(std::type_identity<bfloat16>{});
}

// An input of a storage-typed operation: float16 as is (dy must be float16 when x is); bfloat16: the bits in
// a uint16 or int16 array, as is; else float32.
template <class T>
py::array storage_input(const py::array& a, const char* name) {
  if constexpr (std::is_same_v<T, float16>) {
    NL_CHECK(is_float16(a), "{} must be float16 (the storage type), got {}", name,
             std::string(py::str(a.dtype())));
    return a;
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    NL_CHECK(is_bf16_bits(a),
             "{}: storage=\"bfloat16\" takes the bfloat16 bits in a uint16 or int16 array (to_bfloat16 makes "
             "one), got {}",
             name, std::string(py::str(a.dtype())));
    return a;
  } else {
    return f32(a);
  }
}

// The result of a forward: y, then (mean,) rstd when asked for, then the NormStats when saved.
py::object forward_result(const py::array& y, std::initializer_list<py::object> stats, bool return_stats,
                          std::optional<NormStats>& saved) {
  if (!return_stats && !saved) return y;
  py::list out;
  out.append(y);
  if (return_stats)
    for (const py::object& a : stats) out.append(a);
  if (saved) out.append(py::cast(std::move(*saved)));
  return py::tuple(out);
}

py::object py_layer_norm(const py::array& x_in, const OptArray& weight, const OptArray& bias,
                         const std::vector<int>& axes_in, double eps, bool return_stats, bool save_stats,
                         const Storage& storage) {
  const Axes axes = axes_of(axes_in);
  const Dims xs = shape_of(x_in);
  auto mean = new_array<float>(kept_shape(xs, axes)), rstd = new_array<float>(kept_shape(xs, axes));
  std::optional<NormStats> saved;
  if (save_stats) saved.emplace();
  const py::array y = by_storage(x_in, storage, [&](auto tag) -> py::array {
    using T = typename decltype(tag)::type;
    const py::array xa = storage_input<T>(x_in, "x");
    auto out = new_array<T>(xs);
    auto yv = view(out);
    auto mv = view(mean), rv = view(rstd);
    const auto x = cview<T>(xa, "x");
    const auto w = cview(weight, "weight"), b = cview(bias, "bias");
    NormStats* st = saved ? &*saved : nullptr;
    nogil([&] {
      if (st)
        layer_norm_forward(yv, mv, rv, x, w, b, axes, eps, st);
      else
        layer_norm_forward(yv, mv, rv, x, w, b, axes, eps);
    });
    return out;
  });
  return forward_result(y, {mean, rstd}, return_stats, saved);
}

// A LayerNorm / RMSNorm backward on x's storage type (Fused: the residual add + norm's, whose x is s): dx
// (new, x's type) and the float32 parameter gradients (dweight, and dbias for LayerNorm), each of the
// normalized axes' shape. run(dx, dweight, dbias, dy, ds, x, weight) calls the library (dbias is an empty
// view for RMSNorm; ds, the fused backward's skip-path gradient, an empty view when not given).
template <bool Fused = false, class Run>
py::tuple norm_backward(const py::array& dy_in, const py::array& x_in, const OptArray& weight,
                        const Axes& axes, bool with_db, const Storage& storage, Run&& run,
                        const std::optional<py::array>& ds_in = std::nullopt) {
  const Dims xs = shape_of(x_in);
  auto dw = new_array<float>(normalized_shape(xs, axes));
  std::optional<py::array_t<float>> db;
  if (with_db) db = new_array<float>(normalized_shape(xs, axes));
  const char* const x_name = Fused ? "s" : "x";
  const py::array dx = by_storage(x_in, storage, [&](auto tag) -> py::array {
    using T = typename decltype(tag)::type;
    const py::array xa = storage_input<T>(x_in, x_name), dya = storage_input<T>(dy_in, "dy");
    const std::optional<py::array> dsa =
        ds_in ? std::optional<py::array>(storage_input<T>(*ds_in, "ds")) : std::nullopt;
    auto out = new_array<T>(xs);
    auto dxv = view(out);
    auto dwv = view(dw);
    const View dbv = db ? view(*db) : View();
    const auto x = cview<T>(xa, x_name), dy = cview<T>(dya, "dy");
    const auto ds = dsa ? cview<T>(*dsa, "ds") : TensorView<const T>();
    const auto w = cview(weight, "weight");
    nogil([&] { run(dxv, dwv, dbv, dy, ds, x, w); });
    return out;
  });
  if (with_db) return py::make_tuple(dx, dw, *db);
  return py::make_tuple(dx, dw);
}

py::tuple py_layer_norm_backward(const py::array& dy_in, const py::array& x_in, const OptArray& weight,
                                 const std::vector<int>& axes_in, double eps, const Storage& storage) {
  const Axes axes = axes_of(axes_in);
  return norm_backward(dy_in, x_in, weight, axes, true, storage,
                       [&](auto dx, View dw, View db, auto dy, auto, auto x, ConstView w) {
                         layer_norm_backward(dx, dw, db, dy, x, w, axes, eps);
                       });
}

py::object py_rms_norm(const py::array& x_in, const OptArray& weight, const std::vector<int>& axes_in,
                       double eps, bool return_stats, bool save_stats, const Storage& storage) {
  const Axes axes = axes_of(axes_in);
  const Dims xs = shape_of(x_in);
  auto rstd = new_array<float>(kept_shape(xs, axes));
  std::optional<NormStats> saved;
  if (save_stats) saved.emplace();
  const py::array y = by_storage(x_in, storage, [&](auto tag) -> py::array {
    using T = typename decltype(tag)::type;
    const py::array xa = storage_input<T>(x_in, "x");
    auto out = new_array<T>(xs);
    auto yv = view(out);
    auto rv = view(rstd);
    const auto x = cview<T>(xa, "x");
    const auto w = cview(weight, "weight");
    NormStats* st = saved ? &*saved : nullptr;
    nogil([&] {
      if (st)
        rms_norm_forward(yv, rv, x, w, axes, eps, st);
      else
        rms_norm_forward(yv, rv, x, w, axes, eps);
    });
    return out;
  });
  return forward_result(y, {rstd}, return_stats, saved);
}

py::tuple py_rms_norm_backward(const py::array& dy_in, const py::array& x_in, const OptArray& weight,
                               const std::vector<int>& axes_in, double eps, const Storage& storage) {
  const Axes axes = axes_of(axes_in);
  return norm_backward(dy_in, x_in, weight, axes, false, storage,
                       [&](auto dx, View dw, View, auto dy, auto, auto x, ConstView w) {
                         rms_norm_backward(dx, dw, dy, x, w, axes, eps);
                       });
}

// The backward from a forward's saved statistics: axes and eps come from `stats` (the library checks that x
// has the forward's shape; checked here first because the gradients' shapes come from it).
Axes saved_axes(const py::array& x, const NormStats& stats, const char* op) {
  NL_CHECK(shape_of(x) == stats.x_shape, "{}: x has shape {}, the saved statistics are of {}", op,
           shape_of(x).str(), stats.x_shape.str());
  return Axes(stats.axes.begin(), stats.axes.end());
}

py::tuple py_layer_norm_backward_saved(const py::array& dy_in, const py::array& x_in, const NormStats& stats,
                                       const OptArray& weight, const Storage& storage) {
  const Axes axes = saved_axes(x_in, stats, "layer_norm_backward_saved");
  return norm_backward(dy_in, x_in, weight, axes, true, storage,
                       [&](auto dx, View dw, View db, auto dy, auto, auto x, ConstView w) {
                         layer_norm_backward_saved(dx, dw, db, dy, x, w, stats);
                       });
}

py::tuple py_rms_norm_backward_saved(const py::array& dy_in, const py::array& x_in, const NormStats& stats,
                                     const OptArray& weight, const Storage& storage) {
  const Axes axes = saved_axes(x_in, stats, "rms_norm_backward_saved");
  return norm_backward(dy_in, x_in, weight, axes, false, storage,
                       [&](auto dx, View dw, View, auto dy, auto, auto x, ConstView w) {
                         rms_norm_backward_saved(dx, dw, dy, x, w, stats);
                       });
}

// A saved statistic as a float64 array of the kept axes' shape (a copy; the object keeps its own).
py::array stats_array(const NormStats& st, const std::vector<double>& v) {
  const Dims k = kept_shape(st.x_shape, Axes(st.axes.begin(), st.axes.end()));
  auto a = new_array<double>(k);
  std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(double));
  return a;
}

// float32 → bfloat16 bits, rounded to nearest even as the kernels' stores round (normlab/tensor.h: a NaN
// stays a quiet NaN, overflow goes to ±Inf); and back, exactly. Shapes are kept; results are C-contiguous.
py::array py_to_bfloat16(const F32Array& a_in) {
  const py::array_t<float, py::array::c_style> a(a_in);  // a C-contiguous copy only when a_in is strided
  auto out = new_array<bfloat16>(shape_of(a));
  const float* src = a.data();
  bfloat16* dst = out.mutable_data();
  const std::size_t n = static_cast<std::size_t>(a.size());
  nogil([&] {
    for (std::size_t i = 0; i < n; ++i) dst[i] = bfloat16(src[i]);
  });
  return out;
}
py::array py_from_bfloat16(const py::array& bits_in) {
  NL_CHECK(is_bf16_bits(bits_in), "from_bfloat16 takes the bfloat16 bits in a uint16 or int16 array, got {}",
           std::string(py::str(bits_in.dtype())));
  const py::array bits = py::array::ensure(bits_in, py::array::c_style);
  auto out = new_array<float>(shape_of(bits));
  const auto* src = static_cast<const std::uint16_t*>(bits.data());
  float* dst = out.mutable_data();
  const std::size_t n = static_cast<std::size_t>(bits.size());
  nogil([&] {
    for (std::size_t i = 0; i < n; ++i) dst[i] = detail::float_from_bf16_bits(src[i]);
  });
  return out;
}

// The fused residual add + LayerNorm (Center) / RMSNorm forward: (y, s), then (mean,) rstd when asked for,
// then the NormStats when saved.
template <bool Center>
py::tuple py_add_norm(const py::array& x_in, const py::array& r_in, const OptArray& weight,
                      const OptArray& bias, const std::vector<int>& axes_in, double eps, bool return_stats,
                      bool save_stats, const Storage& storage) {
  const Axes axes = axes_of(axes_in);
  const Dims xs = shape_of(x_in);
  auto mean = new_array<float>(kept_shape(xs, axes)), rstd = new_array<float>(kept_shape(xs, axes));
  std::optional<NormStats> saved;
  if (save_stats) saved.emplace();
  py::list out;
  by_storage(x_in, storage, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const py::array xa = storage_input<T>(x_in, "x"), ra = storage_input<T>(r_in, "residual");
    auto s = new_array<T>(xs), y = new_array<T>(xs);
    auto sv = view(s), yv = view(y);
    auto mv = view(mean), rv = view(rstd);
    const auto x = cview<T>(xa, "x"), r = cview<T>(ra, "residual");
    const auto w = cview(weight, "weight"), b = cview(bias, "bias");
    NormStats* st = saved ? &*saved : nullptr;
    nogil([&] {
      if constexpr (Center) {
        if (st)
          add_layer_norm_forward(sv, yv, mv, rv, x, r, w, b, axes, eps, st);
        else
          add_layer_norm_forward(sv, yv, mv, rv, x, r, w, b, axes, eps);
      } else {
        if (st)
          add_rms_norm_forward(sv, yv, rv, x, r, w, axes, eps, st);
        else
          add_rms_norm_forward(sv, yv, rv, x, r, w, axes, eps);
      }
    });
    out.append(y);
    out.append(s);
  });
  if (return_stats) {
    if (Center) out.append(mean);
    out.append(rstd);
  }
  if (saved) out.append(py::cast(std::move(*saved)));
  return py::tuple(out);
}

template <bool Center>
py::tuple py_add_norm_backward(const py::array& dy_in, const py::array& s_in, const OptArray& weight,
                               const std::optional<py::array>& ds_in, const std::vector<int>& axes_in,
                               double eps, const Storage& storage) {
  const Axes axes = axes_of(axes_in);
  return norm_backward<true>(
      dy_in, s_in, weight, axes, Center, storage,
      [&](auto dx, View dw, View db, auto dy, auto ds, auto s, ConstView w) {
        if constexpr (Center)
          add_layer_norm_backward(dx, dw, db, dy, ds, s, w, axes, eps);
        else
          add_rms_norm_backward(dx, dw, dy, ds, s, w, axes, eps);
      },
      ds_in);
}

template <bool Center>
py::tuple py_add_norm_backward_saved(const py::array& dy_in, const py::array& s_in, const NormStats& stats,
                                     const OptArray& weight, const std::optional<py::array>& ds_in,
                                     const Storage& storage) {
  const Axes axes =
      saved_axes(s_in, stats, Center ? "add_layer_norm_backward_saved" : "add_rms_norm_backward_saved");
  return norm_backward<true>(
      dy_in, s_in, weight, axes, Center, storage,
      [&](auto dx, View dw, View db, auto dy, auto ds, auto s, ConstView w) {
        if constexpr (Center)
          add_layer_norm_backward_saved(dx, dw, db, dy, ds, s, w, stats);
        else
          add_rms_norm_backward_saved(dx, dw, dy, ds, s, w, stats);
      },
      ds_in);
}

// The memory-efficient backward from the forward's output y and rstd (float32).
template <bool Center>
py::tuple py_norm_backward_from_output(const F32Array& dy, const F32Array& y, const F32Array& rstd,
                                       const OptArray& weight, const OptArray& bias,
                                       const std::vector<int>& axes_in) {
  const Axes axes = axes_of(axes_in);
  const Dims ys = shape_of(y);
  auto dx = new_array<float>(ys), dw = new_array<float>(normalized_shape(ys, axes));
  std::optional<py::array_t<float>> db;
  if (Center) db = new_array<float>(normalized_shape(ys, axes));
  auto dxv = view(dx), dwv = view(dw);
  const View dbv = db ? view(*db) : View();
  const auto dyv = cview<float>(dy, "dy"), yv = cview<float>(y, "y"), rv = cview<float>(rstd, "rstd");
  const auto w = cview(weight, "weight"), b = cview(bias, "bias");
  nogil([&] {
    if constexpr (Center)
      layer_norm_backward_from_output(dxv, dwv, dbv, dyv, yv, rv, w, b, axes);
    else
      rms_norm_backward_from_output(dxv, dwv, dyv, yv, rv, w, axes);
  });
  if (Center) return py::make_tuple(dx, dw, *db);
  return py::make_tuple(dx, dw);
}

// y = op(y, x) for an operation whose output has x's shape (float32).
template <class F>
py::array map_forward(const F32Array& x, F&& op) {
  auto y = new_array<float>(shape_of(x));
  auto yv = view(y);
  const auto xv = cview<float>(x, "x");
  nogil([&] { op(yv, xv); });
  return y;
}

Index channels_of(const Dims& xs, int channel_axis) {
  NL_CHECK(xs.size() >= 2, "x must have at least 2 dimensions, got shape {}", xs.str());
  NL_CHECK(channel_axis >= -xs.size() && channel_axis < xs.size(),
           "channel_axis {} is out of range for rank {}", channel_axis, xs.size());
  return xs[channel_axis < 0 ? channel_axis + xs.size() : channel_axis];
}

// (dx, dweight, dbias) of a channel norm: op(dx, dweight, dbias, dy, x, weight).
template <class F>
py::tuple channel_backward(const F32Array& dy, const F32Array& x, const OptArray& weight, int channel_axis,
                           F&& op) {
  const Dims xs = shape_of(x);
  const Index c = channels_of(xs, channel_axis);
  auto dx = new_array<float>(xs);
  auto dw = new_array<float>(Dims{c}), db = new_array<float>(Dims{c});
  auto dxv = view(dx), dwv = view(dw), dbv = view(db);
  const auto dyv = cview<float>(dy, "dy"), xv = cview<float>(x, "x");
  const auto w = cview(weight, "weight");
  nogil([&] { op(dxv, dwv, dbv, dyv, xv, w); });
  return py::make_tuple(dx, dw, db);
}

std::vector<Index> lengths_of(const std::optional<std::vector<Index>>& lengths) {
  return lengths ? *lengths : std::vector<Index>{};
}

BatchNormOptions bn_options(bool training, double momentum, double eps, int channel_axis, int time_axis) {
  BatchNormOptions o;
  o.training = training;
  o.momentum = momentum;
  o.eps = eps;
  o.channel_axis = channel_axis;
  o.time_axis = time_axis;
  return o;
}

py::object py_batch_norm(const F32Array& x, const std::optional<py::array>& running_mean,
                         const std::optional<py::array>& running_var, const OptArray& weight,
                         const OptArray& bias, bool training, double momentum, double eps,
                         const std::optional<std::vector<Index>>& lengths, int channel_axis, int time_axis,
                         bool save_stats) {
  const BatchNormOptions opt = bn_options(training, momentum, eps, channel_axis, time_axis);
  const std::vector<Index> len = lengths_of(lengths);
  View rm = inout_view(running_mean, "running_mean"), rv = inout_view(running_var, "running_var");
  const auto w = cview(weight, "weight"), b = cview(bias, "bias");
  std::optional<BatchNormStats> saved;
  if (save_stats) saved.emplace();
  py::array out = map_forward(x, [&](View y, ConstView xv) {
    if (saved)
      batch_norm_forward(y, View(), View(), rm, rv, nullptr, xv, w, b, len, opt, &*saved);
    else
      batch_norm_forward(y, View(), View(), rm, rv, nullptr, xv, w, b, len, opt);
  });
  if (!saved) return out;
  return py::make_tuple(out, py::cast(std::move(*saved)));
}

py::tuple py_batch_norm_backward(const F32Array& dy, const F32Array& x, const OptArray& weight,
                                 const OptArray& running_mean, const OptArray& running_var, bool training,
                                 double eps, const std::optional<std::vector<Index>>& lengths,
                                 int channel_axis, int time_axis) {
  const BatchNormOptions opt = bn_options(training, 0.1, eps, channel_axis, time_axis);
  const std::vector<Index> len = lengths_of(lengths);
  const auto rm = cview(running_mean, "running_mean"), rv = cview(running_var, "running_var");
  return channel_backward(dy, x, weight, channel_axis,
                          [&](View dx, View dw, View db, ConstView dyv, ConstView xv, ConstView w) {
                            batch_norm_backward(dx, dw, db, dyv, xv, w, rm, rv, len, opt);
                          });
}

InstanceNormOptions in_options(double eps, int channel_axis, int time_axis) {
  InstanceNormOptions opt;
  opt.eps = eps;
  opt.channel_axis = channel_axis;
  opt.time_axis = time_axis;
  return opt;
}

// y, or (y, the ChannelNormStats) when saved.
py::object channel_forward_result(py::array y, std::optional<ChannelNormStats>& saved) {
  if (!saved) return y;
  return py::make_tuple(y, py::cast(std::move(*saved)));
}

py::object py_instance_norm(const F32Array& x, const OptArray& weight, const OptArray& bias, double eps,
                            const std::optional<std::vector<Index>>& lengths, int channel_axis, int time_axis,
                            bool save_stats) {
  const InstanceNormOptions opt = in_options(eps, channel_axis, time_axis);
  const std::vector<Index> len = lengths_of(lengths);
  const auto w = cview(weight, "weight"), b = cview(bias, "bias");
  std::optional<ChannelNormStats> saved;
  if (save_stats) saved.emplace();
  py::array out = map_forward(x, [&](View y, ConstView xv) {
    if (saved)
      instance_norm_forward(y, View(), View(), xv, w, b, len, opt, &*saved);
    else
      instance_norm_forward(y, View(), View(), xv, w, b, len, opt);
  });
  return channel_forward_result(out, saved);
}

py::tuple py_instance_norm_backward(const F32Array& dy, const F32Array& x, const OptArray& weight, double eps,
                                    const std::optional<std::vector<Index>>& lengths, int channel_axis,
                                    int time_axis) {
  const InstanceNormOptions opt = in_options(eps, channel_axis, time_axis);
  const std::vector<Index> len = lengths_of(lengths);
  return channel_backward(dy, x, weight, channel_axis,
                          [&](View dx, View dw, View db, ConstView dyv, ConstView xv, ConstView w) {
                            instance_norm_backward(dx, dw, db, dyv, xv, w, len, opt);
                          });
}

GroupNormOptions gn_options(double eps, int channel_axis) {
  GroupNormOptions opt;
  opt.eps = eps;
  opt.channel_axis = channel_axis;
  return opt;
}

py::object py_group_norm(const F32Array& x, int groups, const OptArray& weight, const OptArray& bias,
                         double eps, int channel_axis, bool save_stats) {
  const GroupNormOptions opt = gn_options(eps, channel_axis);
  const auto w = cview(weight, "weight"), b = cview(bias, "bias");
  std::optional<ChannelNormStats> saved;
  if (save_stats) saved.emplace();
  py::array out = map_forward(x, [&](View y, ConstView xv) {
    if (saved)
      group_norm_forward(y, View(), View(), xv, w, b, groups, opt, &*saved);
    else
      group_norm_forward(y, View(), View(), xv, w, b, groups, opt);
  });
  return channel_forward_result(out, saved);
}

py::tuple py_group_norm_backward(const F32Array& dy, const F32Array& x, int groups, const OptArray& weight,
                                 double eps, int channel_axis) {
  const GroupNormOptions opt = gn_options(eps, channel_axis);
  return channel_backward(dy, x, weight, channel_axis,
                          [&](View dx, View dw, View db, ConstView dyv, ConstView xv, ConstView w) {
                            group_norm_backward(dx, dw, db, dyv, xv, w, groups, opt);
                          });
}

// The backward `op` from a forward's ChannelNormStats or BatchNormStats, run by
// saved(dx, dw, db, dy, x, w, stats) (the library checks x against them; the shape first here, because the
// gradients' shapes come from it).
template <typename Stats, typename F>
py::tuple backward_from_stats(const F32Array& dy, const F32Array& x, const Stats& stats,
                              const OptArray& weight, const char* op, F&& saved) {
  NL_CHECK(shape_of(x) == stats.x_shape, "{}: x has shape {}, the saved statistics are of {}", op,
           shape_of(x).str(), stats.x_shape.str());
  return channel_backward(dy, x, weight, stats.channel_axis,
                          [&](View dx, View dw, View db, ConstView dyv, ConstView xv, ConstView w) {
                            saved(dx, dw, db, dyv, xv, w, stats);
                          });
}

py::tuple py_channel_norm_backward_saved(const F32Array& dy, const F32Array& x, const ChannelNormStats& stats,
                                         const OptArray& weight, bool group) {
  if (group)
    return backward_from_stats(dy, x, stats, weight, "group_norm_backward_saved",
                               [](auto&&... a) { group_norm_backward_saved(a...); });
  return backward_from_stats(dy, x, stats, weight, "instance_norm_backward_saved",
                             [](auto&&... a) { instance_norm_backward_saved(a...); });
}

py::tuple py_batch_norm_backward_saved(const F32Array& dy, const F32Array& x, const BatchNormStats& stats,
                                       const OptArray& weight) {
  return backward_from_stats(dy, x, stats, weight, "batch_norm_backward_saved",
                             [](auto&&... a) { batch_norm_backward_saved(a...); });
}

// A vector of doubles as a float64 array of `shape` (a copy; default: one axis).
py::array double_array(const std::vector<double>& v, const Dims& shape) {
  auto a = new_array<double>(shape);
  std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(double));
  return a;
}
py::array double_array(const std::vector<double>& v) {
  return double_array(v, Dims{static_cast<Index>(v.size())});
}

// A ChannelNormStats statistic as a float64 array of save_mean's shape (a copy).
py::array channel_stats_array(const ChannelNormStats& st, const std::vector<double>& v) {
  return double_array(v, st.group ? group_stats_shape(st.x_shape, st.groups, st.channel_axis)
                                  : instance_stats_shape(st.x_shape, st.channel_axis));
}

SlidingCmvnOptions sliding_options(int cmn_window, int min_cmn_window, bool center, bool norm_vars,
                                   int time_axis) {
  SlidingCmvnOptions opt;
  opt.cmn_window = cmn_window;
  opt.min_cmn_window = min_cmn_window;
  opt.center = center;
  opt.norm_vars = norm_vars;
  opt.time_axis = time_axis;
  return opt;
}
CmvnOptions cmvn_options(bool norm_means, bool norm_vars, int time_axis) {
  CmvnOptions opt;
  opt.norm_means = norm_means;
  opt.norm_vars = norm_vars;
  opt.time_axis = time_axis;
  return opt;
}

// lengths given: x is a padded batch ([B, T, D] or [B, D, T]) and the masked function runs.
py::array py_sliding_cmvn(const F32Array& x, int cmn_window, int min_cmn_window, bool center, bool norm_vars,
                          int time_axis, const std::optional<std::vector<Index>>& lengths) {
  const SlidingCmvnOptions opt = sliding_options(cmn_window, min_cmn_window, center, norm_vars, time_axis);
  return map_forward(x, [&](View y, ConstView xv) {
    if (lengths)
      sliding_cmvn_masked(y, xv, *lengths, opt);
    else
      sliding_cmvn(y, xv, opt);
  });
}

py::array py_cmvn_per_utterance(const F32Array& x, bool norm_vars, int time_axis,
                                const std::optional<std::vector<Index>>& lengths) {
  const CmvnOptions opt = cmvn_options(true, norm_vars, time_axis);
  return map_forward(x, [&](View y, ConstView xv) {
    if (lengths)
      apply_cmvn_masked(y, xv, *lengths, opt);
    else
      apply_cmvn_per_utterance(y, xv, opt);
  });
}

py::array py_cmvn_per_utterance_backward(const F32Array& dy, const F32Array& x, bool norm_vars, int time_axis,
                                         const std::optional<std::vector<Index>>& lengths) {
  const CmvnOptions opt = cmvn_options(true, norm_vars, time_axis);
  const auto xv = cview<float>(x, "x");
  return map_forward(dy, [&](View dx, ConstView dyv) {
    if (lengths)
      apply_cmvn_masked_backward(dx, dyv, xv, *lengths, opt);
    else
      apply_cmvn_per_utterance_backward(dx, dyv, xv, opt);
  });
}

py::array py_apply_cmvn(const F32Array& x, const CmvnStats& stats, bool norm_means, bool norm_vars,
                        int time_axis) {
  const CmvnOptions opt = cmvn_options(norm_means, norm_vars, time_axis);
  return map_forward(x, [&](View y, ConstView xv) { apply_cmvn(y, xv, stats, opt); });
}

py::array py_apply_cmvn_backward(const F32Array& dy, const CmvnStats& stats, bool norm_means, bool norm_vars,
                                 int time_axis) {
  const CmvnOptions opt = cmvn_options(norm_means, norm_vars, time_axis);
  return map_forward(dy, [&](View dx, ConstView dyv) { apply_cmvn_backward(dx, dyv, stats, opt); });
}

// A float64 NumPy copy of a span (CmvnStats' sums).
py::array_t<double> doubles(std::span<const double> v) {
  auto a = new_array<double>(Dims{static_cast<Index>(v.size())});
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

py::tuple py_read_wav(const std::string& path, float expected_sample_rate, bool normalize) {
  speech::WavReadOptions opt;
  opt.expected_samp_freq = expected_sample_rate;
  opt.normalize = normalize;
  speech::Waveform w = speech::read_wav(path, opt);
  auto samples = new_array<float>(Dims{static_cast<Index>(w.samples.size())});
  std::memcpy(samples.mutable_data(), w.samples.data(), w.samples.size() * sizeof(float));
  return py::make_tuple(samples, w.samp_freq);
}

py::array py_fbank(const F32Array& samples, float sample_rate, int num_mel_bins, float frame_length_ms,
                   float frame_shift_ms, float dither, float preemphasis_coefficient, bool remove_dc_offset,
                   const std::string& window_type, bool round_to_power_of_two, bool snip_edges,
                   float low_freq, float high_freq, bool use_energy, float energy_floor, bool raw_energy,
                   bool htk_compat, bool use_log_fbank, bool use_power, std::uint64_t seed) {
  NL_CHECK(samples.ndim() == 1, "samples must be 1-D (mono), got {} dimensions", samples.ndim());
  speech::FbankOptions o;
  o.frame_opts.samp_freq = sample_rate;
  o.frame_opts.frame_length_ms = frame_length_ms;
  o.frame_opts.frame_shift_ms = frame_shift_ms;
  o.frame_opts.dither = dither;
  o.frame_opts.preemph_coeff = preemphasis_coefficient;
  o.frame_opts.remove_dc_offset = remove_dc_offset;
  o.frame_opts.window_type = window_type;
  o.frame_opts.round_to_power_of_two = round_to_power_of_two;
  o.frame_opts.snip_edges = snip_edges;
  o.frame_opts.dither_seed = seed;
  o.mel_opts.num_bins = num_mel_bins;
  o.mel_opts.low_freq = low_freq;
  o.mel_opts.high_freq = high_freq;
  o.use_energy = use_energy;
  o.energy_floor = energy_floor;
  o.raw_energy = raw_energy;
  o.htk_compat = htk_compat;
  o.use_log_fbank = use_log_fbank;
  o.use_power = use_power;
  // The samples as one contiguous run (a strided 1-D array is copied once).
  const Index n = samples.shape(0);
  std::vector<float> buf(static_cast<std::size_t>(n));
  const auto sv = cview<float>(samples, "samples");
  for (Index i = 0; i < n; ++i) buf[static_cast<std::size_t>(i)] = sv.data()[i * sv.strides()[0]];
  Tensor feats;
  nogil([&] { feats = speech::ComputeFbank(o, buf, sample_rate); });
  auto out = new_array<float>(feats.shape());
  std::memcpy(out.mutable_data(), feats.data(), static_cast<std::size_t>(feats.numel()) * sizeof(float));
  return out;
}

}  // namespace

// F32Array's conversion: a float32 ndarray as it is; in the converting pass of overload resolution anything
// NumPy makes an array of, through f32. (pybind11's array_t<float, forcecast> converts in NumPy's memory.)
namespace pybind11::detail {
template <>
struct type_caster<F32Array> {
  PYBIND11_TYPE_CASTER(F32Array, const_name("numpy.ndarray[numpy.float32]"));
  bool load(handle src, bool convert) {
    if (!convert && !array_t<float>::check_(src)) return false;
    array a = array::ensure(src);
    if (!a) return false;
    value = F32Array(f32(a));
    return true;
  }
  static handle cast(const F32Array& src, return_value_policy, handle) { return src.inc_ref(); }
};
}  // namespace pybind11::detail

PYBIND11_MODULE(normlab, m) {
  m.doc() =
      "normlab: LayerNorm over any axes of strided arrays, RMSNorm, BatchNorm, InstanceNorm, GroupNorm, CMVN "
      "and the Kaldi log-mel fbank, forward and backward, on NumPy arrays (float32; float16 and bfloat16 "
      "storage for LayerNorm and RMSNorm). Errors raise normlab.Error (a ValueError).";
  py::register_exception<Error>(m, "Error", PyExc_ValueError);

  py::class_<NormStats>(m, "NormStats",
                        "The statistics of a layer_norm / rms_norm forward, kept in double for the backward "
                        "(save_stats=True). Read-only.")
      .def_property_readonly(
          "center", [](const NormStats& s) { return s.center; }, "True for LayerNorm, False for RMSNorm")
      .def_property_readonly(
          "shape", [](const NormStats& s) { return std::vector<Index>(s.x_shape.begin(), s.x_shape.end()); },
          "the forward's x shape")
      .def_property_readonly(
          "axes", [](const NormStats& s) { return std::vector<Index>(s.axes.begin(), s.axes.end()); })
      .def_property_readonly("eps", [](const NormStats& s) { return s.eps; })
      .def_property_readonly(
          "mean",
          [](const NormStats& s) -> py::object {
            if (!s.center) return py::none();
            return stats_array(s, s.mean);
          },
          "float64 array of the kept axes' shape (None for RMSNorm)")
      .def_property_readonly(
          "rstd", [](const NormStats& s) { return stats_array(s, s.rstd); },
          "float64 array of the kept axes' shape");

  m.def(
      "layer_norm", &py_layer_norm, py::arg("x"), py::arg("weight") = py::none(),
      py::arg("bias") = py::none(), py::arg("axes") = std::vector<int>{-1}, py::arg("eps") = 1e-5,
      py::arg("return_stats") = false, py::arg("save_stats") = false, py::arg("storage") = py::none(),
      "LayerNorm over `axes` (any set of axes, any strides). y = (x - mean) * rstd * weight + bias with the "
      "biased variance, as torch.nn.functional.layer_norm. weight/bias have the shape of the normalized "
      "axes. "
      "return_stats=True returns (y, mean, rstd), float32 arrays of x's shape without the normalized axes. "
      "save_stats=True appends a NormStats (the statistics in double) for layer_norm_backward_saved: "
      "(y, stats) or (y, mean, rstd, stats). "
      "storage: the type x and y are stored in, \"float32\", \"float16\" or \"bfloat16\"; by default x's "
      "(float16 for a float16 x, else float32). \"bfloat16\" takes x as the bits in a uint16 or int16 array "
      "(to_bfloat16) and returns y as uint16 bits (from_bfloat16). 16-bit storage computes in float32 and "
      "rounds each output once: y is the float32 result on the widened x, rounded to nearest even; weight, "
      "bias, mean and rstd are float32 always.");
  m.def("layer_norm_backward", &py_layer_norm_backward, py::arg("dy"), py::arg("x"),
        py::arg("weight") = py::none(), py::arg("axes") = std::vector<int>{-1}, py::arg("eps") = 1e-5,
        py::arg("storage") = py::none(),
        "Gradients of layer_norm: (dx, dweight, dbias). The statistics are recomputed from x. storage as in "
        "layer_norm (dy in the same type as x; dx in it too, the float32 gradient rounded once; dweight and "
        "dbias float32).");
  m.def("layer_norm_backward_saved", &py_layer_norm_backward_saved, py::arg("dy"), py::arg("x"),
        py::arg("stats"), py::arg("weight") = py::none(), py::arg("storage") = py::none(),
        "Gradients of layer_norm from its saved statistics (layer_norm(..., save_stats=True)): (dx, dweight, "
        "dbias), the same bits as layer_norm_backward without a statistics pass; axes and eps come from "
        "stats. x must be the forward's x. storage as in layer_norm_backward.");
  m.def(
      "rms_norm", &py_rms_norm, py::arg("x"), py::arg("weight") = py::none(),
      py::arg("axes") = std::vector<int>{-1}, py::arg("eps") = kRmsNormEps, py::arg("return_stats") = false,
      py::arg("save_stats") = false, py::arg("storage") = py::none(),
      "RMSNorm over `axes`: y = x * rstd * weight, rstd = 1/sqrt(mean(x^2) + eps). return_stats=True returns "
      "(y, rstd); save_stats=True appends a NormStats for rms_norm_backward_saved. storage as in "
      "layer_norm.");
  m.def("rms_norm_backward", &py_rms_norm_backward, py::arg("dy"), py::arg("x"),
        py::arg("weight") = py::none(), py::arg("axes") = std::vector<int>{-1}, py::arg("eps") = kRmsNormEps,
        py::arg("storage") = py::none(),
        "Gradients of rms_norm: (dx, dweight). storage as in layer_norm_backward.");
  m.def("rms_norm_backward_saved", &py_rms_norm_backward_saved, py::arg("dy"), py::arg("x"), py::arg("stats"),
        py::arg("weight") = py::none(), py::arg("storage") = py::none(),
        "Gradients of rms_norm from its saved statistics (rms_norm(..., save_stats=True)): (dx, dweight), "
        "the same bits as rms_norm_backward. storage as in layer_norm_backward.");
  m.def(
      "to_bfloat16", &py_to_bfloat16, py::arg("x"),
      "x (converted to float32 as the float32 functions convert) rounded to bfloat16, to nearest even as the "
      "kernels round (a NaN stays a quiet NaN with its sign, overflow becomes +-inf): a uint16 array of the "
      "bits, x's shape, for storage=\"bfloat16\".");
  m.def("from_bfloat16", &py_from_bfloat16, py::arg("bits"),
        "bfloat16 bits (a uint16 or int16 array) widened to float32, exactly.");
  m.def(
      "add_layer_norm", &py_add_norm<true>, py::arg("x"), py::arg("residual"), py::arg("weight") = py::none(),
      py::arg("bias") = py::none(), py::arg("axes") = std::vector<int>{-1}, py::arg("eps") = 1e-5,
      py::arg("return_stats") = false, py::arg("save_stats") = false, py::arg("storage") = py::none(),
      "Fused residual add + LayerNorm (a pre-norm Transformer block's): s = x + residual, y = layer_norm(s), "
      "in one pass over memory; the same bits as the two calls. Returns (y, s); return_stats=True appends "
      "mean, rstd; save_stats=True a NormStats for add_layer_norm_backward_saved. storage: as layer_norm "
      "(float16 when x is float16, else \"float32\" with other dtypes converted; \"bfloat16\" the bits in "
      "uint16/int16 arrays); for float16 and bfloat16, s is x + residual in float32 rounded once to the "
      "storage type and y the norm of that s.");
  m.def(
      "add_rms_norm",
      [](const py::array& x, const py::array& residual, const OptArray& weight, const std::vector<int>& axes,
         double eps, bool return_stats, bool save_stats, const Storage& storage) {
        return py_add_norm<false>(x, residual, weight, OptArray(), axes, eps, return_stats, save_stats,
                                  storage);
      },
      py::arg("x"), py::arg("residual"), py::arg("weight") = py::none(),
      py::arg("axes") = std::vector<int>{-1}, py::arg("eps") = kRmsNormEps, py::arg("return_stats") = false,
      py::arg("save_stats") = false, py::arg("storage") = py::none(),
      "Fused residual add + RMSNorm: s = x + residual, y = rms_norm(s). Returns (y, s) (+ rstd, + "
      "NormStats), "
      "as add_layer_norm.");
  m.def(
      "add_layer_norm_backward", &py_add_norm_backward<true>, py::arg("dy"), py::arg("s"),
      py::arg("weight") = py::none(), py::arg("ds") = py::none(), py::arg("axes") = std::vector<int>{-1},
      py::arg("eps") = 1e-5, py::arg("storage") = py::none(),
      "Gradients of add_layer_norm from its s: (dx, dweight, dbias), dx = layer_norm_backward(dy, s) + ds "
      "being "
      "the gradient of x and of residual alike; ds (optional) is the gradient reaching s through the skip "
      "path. float32: the same bits as the two calls; float16 / bfloat16: the sum in float32, rounded once.");
  m.def("add_layer_norm_backward_saved", &py_add_norm_backward_saved<true>, py::arg("dy"), py::arg("s"),
        py::arg("stats"), py::arg("weight") = py::none(), py::arg("ds") = py::none(),
        py::arg("storage") = py::none(),
        "add_layer_norm_backward from add_layer_norm(..., save_stats=True)'s statistics: the same bits, axes "
        "and "
        "eps from stats.");
  m.def(
      "add_rms_norm_backward",
      [](const py::array& dy, const py::array& s, const OptArray& weight, const std::optional<py::array>& ds,
         const std::vector<int>& axes, double eps, const Storage& storage) {
        return py_add_norm_backward<false>(dy, s, weight, ds, axes, eps, storage);
      },
      py::arg("dy"), py::arg("s"), py::arg("weight") = py::none(), py::arg("ds") = py::none(),
      py::arg("axes") = std::vector<int>{-1}, py::arg("eps") = kRmsNormEps, py::arg("storage") = py::none(),
      "Gradients of add_rms_norm from its s: (dx, dweight), as add_layer_norm_backward.");
  m.def("add_rms_norm_backward_saved", &py_add_norm_backward_saved<false>, py::arg("dy"), py::arg("s"),
        py::arg("stats"), py::arg("weight") = py::none(), py::arg("ds") = py::none(),
        py::arg("storage") = py::none(),
        "add_rms_norm_backward from add_rms_norm(..., save_stats=True)'s statistics: the same bits.");
  m.def("layer_norm_backward_from_output", &py_norm_backward_from_output<true>, py::arg("dy"), py::arg("y"),
        py::arg("rstd"), py::arg("weight") = py::none(), py::arg("bias") = py::none(),
        py::arg("axes") = std::vector<int>{-1},
        "The memory-efficient backward of layer_norm (float32): (dx, dweight, dbias) from the forward's "
        "output y "
        "and rstd (layer_norm(..., return_stats=True)) instead of x, with x_hat = (y - bias) / weight. Any "
        "zero "
        "in weight raises normlab.Error (x_hat is lost there); small |weight| or |bias| >> |weight * x_hat| "
        "costs digits that layer_norm_backward keeps.");
  m.def(
      "rms_norm_backward_from_output",
      [](const F32Array& dy, const F32Array& y, const F32Array& rstd, const OptArray& weight,
         const std::vector<int>& axes) {
        return py_norm_backward_from_output<false>(dy, y, rstd, weight, OptArray(), axes);
      },
      py::arg("dy"), py::arg("y"), py::arg("rstd"), py::arg("weight") = py::none(),
      py::arg("axes") = std::vector<int>{-1},
      "The memory-efficient backward of rms_norm (float32): (dx, dweight) from its output y and rstd.");
  m.def(
      "batch_norm", &py_batch_norm, py::arg("x"), py::arg("running_mean") = py::none(),
      py::arg("running_var") = py::none(), py::arg("weight") = py::none(), py::arg("bias") = py::none(),
      py::arg("training") = true, py::arg("momentum") = 0.1, py::arg("eps") = 1e-5,
      py::arg("lengths") = py::none(), py::arg("channel_axis") = 1, py::arg("time_axis") = -1,
      py::arg("save_stats") = false,
      "BatchNorm as torch.nn.functional.batch_norm. training=True: batch statistics, and running_mean / "
      "running_var (float32, writable) are updated in place with PyTorch's rule (unbiased running variance). "
      "training=False: the running statistics. lengths[b]: only the first lengths[b] steps of time_axis "
      "count (padding-aware); padded outputs are 0. With save_stats (training only), (y, BatchNormStats) for "
      "batch_norm_backward_saved.");
  py::class_<BatchNormStats>(m, "BatchNormStats",
                             "The statistics of a batch_norm training forward, kept in double for the "
                             "backward (save_stats=True). Read-only.")
      .def_property_readonly(
          "shape",
          [](const BatchNormStats& s) { return std::vector<Index>(s.x_shape.begin(), s.x_shape.end()); },
          "the forward's x shape")
      .def_property_readonly("channel_axis", [](const BatchNormStats& s) { return s.channel_axis; })
      .def_property_readonly("eps", [](const BatchNormStats& s) { return s.eps; })
      .def_property_readonly(
          "mean", [](const BatchNormStats& s) { return double_array(s.mean); }, "float64 array [C]")
      .def_property_readonly(
          "rstd", [](const BatchNormStats& s) { return double_array(s.rstd); }, "float64 array [C]");
  m.def("batch_norm_backward_saved", &py_batch_norm_backward_saved, py::arg("dy"), py::arg("x"),
        py::arg("stats"), py::arg("weight") = py::none(),
        "batch_norm_backward (training) with the forward's statistics (options and lengths from stats): "
        "bitwise the same (dx, dweight, dbias).");
  m.def("batch_norm_backward", &py_batch_norm_backward, py::arg("dy"), py::arg("x"),
        py::arg("weight") = py::none(), py::arg("running_mean") = py::none(),
        py::arg("running_var") = py::none(), py::arg("training") = true, py::arg("eps") = 1e-5,
        py::arg("lengths") = py::none(), py::arg("channel_axis") = 1, py::arg("time_axis") = -1,
        "Gradients of batch_norm: (dx, dweight, dbias).");
  py::class_<ChannelNormStats>(
      m, "ChannelNormStats",
      "The statistics of an instance_norm / group_norm forward, kept in double for the "
      "backward (save_stats=True). Read-only.")
      .def_property_readonly(
          "group", [](const ChannelNormStats& s) { return s.group; },
          "True for GroupNorm, False for InstanceNorm")
      .def_property_readonly(
          "shape",
          [](const ChannelNormStats& s) { return std::vector<Index>(s.x_shape.begin(), s.x_shape.end()); },
          "the forward's x shape")
      .def_property_readonly("channel_axis", [](const ChannelNormStats& s) { return s.channel_axis; })
      .def_property_readonly("groups", [](const ChannelNormStats& s) { return s.groups; })
      .def_property_readonly("eps", [](const ChannelNormStats& s) { return s.eps; })
      .def_property_readonly(
          "mean", [](const ChannelNormStats& s) { return channel_stats_array(s, s.mean); },
          "float64 array: the axes before the channel axis, then C (InstanceNorm) or groups (GroupNorm)")
      .def_property_readonly(
          "rstd", [](const ChannelNormStats& s) { return channel_stats_array(s, s.rstd); },
          "float64 array, as mean");
  m.def("instance_norm", &py_instance_norm, py::arg("x"), py::arg("weight") = py::none(),
        py::arg("bias") = py::none(), py::arg("eps") = 1e-5, py::arg("lengths") = py::none(),
        py::arg("channel_axis") = 1, py::arg("time_axis") = -1, py::arg("save_stats") = false,
        "InstanceNorm: each (sample, channel) over the remaining axes (padding-aware with lengths). With "
        "save_stats, (y, ChannelNormStats) for instance_norm_backward_saved.");
  m.def(
      "instance_norm_backward_saved",
      [](const F32Array& dy, const F32Array& x, const ChannelNormStats& stats, const OptArray& weight) {
        return py_channel_norm_backward_saved(dy, x, stats, weight, false);
      },
      py::arg("dy"), py::arg("x"), py::arg("stats"), py::arg("weight") = py::none(),
      "instance_norm_backward with the forward's statistics (options and lengths from stats): bitwise the "
      "same (dx, dweight, dbias), without recomputing them.");
  m.def("instance_norm_backward", &py_instance_norm_backward, py::arg("dy"), py::arg("x"),
        py::arg("weight") = py::none(), py::arg("eps") = 1e-5, py::arg("lengths") = py::none(),
        py::arg("channel_axis") = 1, py::arg("time_axis") = -1,
        "Gradients of instance_norm: (dx, dweight, dbias).");
  m.def("group_norm", &py_group_norm, py::arg("x"), py::arg("groups"), py::arg("weight") = py::none(),
        py::arg("bias") = py::none(), py::arg("eps") = 1e-5, py::arg("channel_axis") = 1,
        py::arg("save_stats") = false,
        "GroupNorm as torch.nn.functional.group_norm (per-channel weight and bias). With save_stats, "
        "(y, ChannelNormStats) for group_norm_backward_saved.");
  m.def(
      "group_norm_backward_saved",
      [](const F32Array& dy, const F32Array& x, const ChannelNormStats& stats, const OptArray& weight) {
        return py_channel_norm_backward_saved(dy, x, stats, weight, true);
      },
      py::arg("dy"), py::arg("x"), py::arg("stats"), py::arg("weight") = py::none(),
      "group_norm_backward with the forward's statistics (groups and options from stats): bitwise the same "
      "(dx, dweight, dbias).");
  m.def("group_norm_backward", &py_group_norm_backward, py::arg("dy"), py::arg("x"), py::arg("groups"),
        py::arg("weight") = py::none(), py::arg("eps") = 1e-5, py::arg("channel_axis") = 1,
        "Gradients of group_norm: (dx, dweight, dbias).");

  m.def("sliding_cmvn", &py_sliding_cmvn, py::arg("x"), py::arg("cmn_window") = 600,
        py::arg("min_cmn_window") = 100, py::arg("center") = false, py::arg("norm_vars") = false,
        py::arg("time_axis") = 0, py::arg("lengths") = py::none(),
        "Kaldi apply-cmvn-sliding on x [T, D] (time_axis 0) or [D, T] (time_axis 1). With lengths, x is a "
        "padded batch [B, T, D] ([B, D, T]): utterance b is its first lengths[b] frames, normalized as if "
        "alone; "
        "padded frames come back 0.");
  m.def("cmvn_per_utterance", &py_cmvn_per_utterance, py::arg("x"), py::arg("norm_vars") = false,
        py::arg("time_axis") = 0, py::arg("lengths") = py::none(),
        "Kaldi apply-cmvn with the utterance's own statistics; lengths as in sliding_cmvn.");
  m.def(
      "cmvn_per_utterance_backward", &py_cmvn_per_utterance_backward, py::arg("dy"), py::arg("x"),
      py::arg("norm_vars") = false, py::arg("time_axis") = 0, py::arg("lengths") = py::none(),
      "Gradient of cmvn_per_utterance (its statistics depend on x): dx = dy - mean_t(dy), and with norm_vars "
      "istd * (dy - mean_t(dy) - x_hat * mean_t(dy * x_hat)).");
  m.def("apply_cmvn", &py_apply_cmvn, py::arg("x"), py::arg("stats"), py::arg("norm_means") = true,
        py::arg("norm_vars") = false, py::arg("time_axis") = 0,
        "Kaldi apply-cmvn with given (global or speaker) CmvnStats: y = x - mean, or (x - mean) / sqrt(var) "
        "with norm_vars (the biased variance floored at 1e-20).");
  m.def("apply_cmvn_backward", &py_apply_cmvn_backward, py::arg("dy"), py::arg("stats"),
        py::arg("norm_means") = true, py::arg("norm_vars") = false, py::arg("time_axis") = 0,
        "Gradient of apply_cmvn (fixed statistics): dx = dy, or dy / sqrt(var) with norm_vars.");

  py::class_<CmvnStats>(
      m, "CmvnStats",
      "Accumulated CMVN statistics in double (frame count, per-dim sum and sum of squares), as "
      "Kaldi's compute-cmvn-stats keeps them; read and written as Kaldi's [2, D+1] matrix "
      "(.npy) or WeNet's global_cmvn JSON.")
      .def(py::init<>(), "Empty statistics; the first add sets the width.")
      .def(py::init<Index>(), py::arg("dim"), "Zero statistics of width dim.")
      .def("add", py::overload_cast<const CmvnStats&>(&CmvnStats::add), py::arg("other"),
           "Adds another object's statistics (same width).")
      .def(
          "add",
          [](CmvnStats& st, const F32Array& feats, int time_axis) {
            const ConstView f = cview<float>(feats, "feats");
            nogil([&] { st.add(f, time_axis); });
          },
          py::arg("feats"), py::arg("time_axis") = 0,
          "Adds every frame of feats [T, D] (time_axis 0) or [D, T] (time_axis 1).")
      .def_property_readonly("dim", &CmvnStats::dim)
      .def_property_readonly("count", &CmvnStats::count)
      .def_property_readonly(
          "sum", [](const CmvnStats& st) { return doubles(st.sum()); }, "float64 [D] (a copy)")
      .def_property_readonly(
          "sum_sq", [](const CmvnStats& st) { return doubles(st.sum_sq()); }, "float64 [D] (a copy)")
      .def(
          "to_kaldi_matrix",
          [](const CmvnStats& st) {
            const BasicTensor<double> k = st.to_kaldi_matrix();
            auto a = new_array<double>(k.shape());
            std::copy(k.data(), k.data() + k.numel(), a.mutable_data());
            return a;
          },
          "Kaldi's layout, float64 [2, D+1]: [sum..., count; sum_sq..., 0].")
      .def_static(
          "from_kaldi_matrix",
          [](const py::array_t<double, py::array::c_style | py::array::forcecast>& matrix) {
            return CmvnStats::from_kaldi_matrix(cview<double>(matrix, "matrix"), "the matrix");
          },
          py::arg("matrix"), "Reads Kaldi's [2, D+1] layout (finite values, count >= 0).")
      .def("save_kaldi_npy", &CmvnStats::save_kaldi_npy, py::arg("path"))
      .def_static("load_kaldi_npy", &CmvnStats::load_kaldi_npy, py::arg("path"))
      .def("to_wenet_json", &CmvnStats::to_wenet_json)
      .def_static(
          "from_wenet_json", [](const std::string& text) { return CmvnStats::from_wenet_json(text); },
          py::arg("text"), "WeNet's {\"mean_stat\": [...], \"var_stat\": [...], \"frame_num\": n}.")
      .def("save_wenet_json", &CmvnStats::save_wenet_json, py::arg("path"))
      .def_static("load_wenet_json", &CmvnStats::load_wenet_json, py::arg("path"))
      .def("__repr__", [](const CmvnStats& st) {
        return py::str("CmvnStats(dim={}, count={})").format(st.dim(), st.count());
      });

  py::class_<StreamingCmvn>(
      m, "StreamingCmvn",
      "Causal sliding CMVN fed a frame or a chunk at a time: the concatenated outputs are "
      "sliding_cmvn(all frames, center=False) with the same cmn_window and norm_vars, bit "
      "for bit; frame t uses the frames [max(0, t - cmn_window), t].")
      .def(py::init([](Index dim, int cmn_window, int min_cmn_window, bool norm_vars, int time_axis) {
             return StreamingCmvn(dim,
                                  sliding_options(cmn_window, min_cmn_window, false, norm_vars, time_axis));
           }),
           py::arg("dim"), py::arg("cmn_window") = 600, py::arg("min_cmn_window") = 0,
           py::arg("norm_vars") = false, py::arg("time_axis") = 0,
           "min_cmn_window must be 0 or 1 (a larger one looks ahead at the start, which a stream cannot).")
      .def(
          "accept",
          [](StreamingCmvn& sc, const F32Array& frames) {
            return map_forward(frames, [&](View y, ConstView f) { sc.accept(y, f); });
          },
          py::arg("frames"), "Normalizes the next frames ([n, D], or [D, n] with time_axis 1); returns them.")
      .def_property_readonly("frames_seen", &StreamingCmvn::frames_seen)
      .def("reset", &StreamingCmvn::reset, "Starts a new utterance.");
  py::class_<StreamingLayerNormF>(
      m, "StreamingLayerNormF",
      "Per-frame LayerNorm over the feature axis fed a frame or a chunk at a time: the "
      "concatenated outputs are layer_norm over that axis of the whole utterance, bit "
      "for bit.")
      .def(py::init(
               [](Index features, const OptArray& weight, const OptArray& bias, double eps, int time_axis) {
                 return StreamingLayerNormF(features, cview(weight, "weight"), cview(bias, "bias"), eps,
                                            time_axis);
               }),
           py::arg("features"), py::arg("weight") = py::none(), py::arg("bias") = py::none(),
           py::arg("eps") = 1e-5, py::arg("time_axis") = 0,
           "weight, bias: optional [features] (copied); time_axis 1 takes [F, n] chunks.")
      .def(
          "accept",
          [](StreamingLayerNormF& ln, const F32Array& frames) {
            return map_forward(frames, [&](View y, ConstView f) { ln.accept(y, f); });
          },
          py::arg("frames"), "Normalizes the next frames ([n, F], or [F, n] with time_axis 1); returns them.")
      .def_property_readonly("frames_seen", &StreamingLayerNormF::frames_seen);
  m.def(
      "read_wav", &py_read_wav, py::arg("path"), py::arg("expected_sample_rate") = 16000.0f,
      py::arg("normalize") = false,
      "Reads a mono WAV file: (samples float32 on the int16 scale, or [-1, 1] with normalize, sample_rate). "
      "expected_sample_rate <= 0 accepts any rate.");
  m.def(
      "fbank", &py_fbank, py::arg("samples"), py::arg("sample_rate") = 16000.0f, py::arg("num_mel_bins") = 23,
      py::arg("frame_length_ms") = 25.0f, py::arg("frame_shift_ms") = 10.0f, py::arg("dither") = 1.0f,
      py::arg("preemphasis_coefficient") = 0.97f, py::arg("remove_dc_offset") = true,
      py::arg("window_type") = "povey", py::arg("round_to_power_of_two") = true, py::arg("snip_edges") = true,
      py::arg("low_freq") = 20.0f, py::arg("high_freq") = 0.0f, py::arg("use_energy") = false,
      py::arg("energy_floor") = 0.0f, py::arg("raw_energy") = true, py::arg("htk_compat") = false,
      py::arg("use_log_fbank") = true, py::arg("use_power") = true, py::arg("seed") = 0,
      "Kaldi compute-fbank-feats on mono samples (int16 scale): [frames, num_mel_bins (+1 with use_energy)]. "
      "Option names and defaults follow Kaldi's flags; seed seeds the dither.");

  m.def(
      "empty",
      [](const std::vector<py::ssize_t>& shape, const py::object& dtype) {
        return storage_array(py::dtype::from_args(dtype), shape);
      },
      py::arg("shape"), py::arg("dtype") = py::dtype::of<float>(),
      "A new uninitialized C-contiguous array (as numpy.empty) in the storage the module's results use: "
      "2 MiB or more on transparent huge pages, freed memory kept for reuse (NORMLAB_HUGE_PAGES=0 turns both "
      "off). Inputs filled in place there (np.copyto, out=) are read faster out of cache than NumPy's own "
      "arrays.");
  m.def("set_num_threads", &set_num_threads, py::arg("n"),
        "Threads the kernels use. Results are the same bits for every count.");
  m.def("num_threads", &num_threads);
  m.def(
      "isa", [] { return std::string(isa_name(active_isa())); },
      "The instruction set the kernels run on: scalar, avx2, avx512 or avx512bf16.");
  m.def(
      "set_isa", [](const std::string& name) { set_isa(parse_isa(name)); }, py::arg("name"),
      "Selects the kernels' instruction set (raises normlab.Error when this CPU lacks it).");
  m.def("supported_isas", [] {
    std::vector<std::string> v;
    for (Isa i : supported_isas()) v.emplace_back(isa_name(i));
    return v;
  });
  m.attr("__version__") = "0.1.0";
}
