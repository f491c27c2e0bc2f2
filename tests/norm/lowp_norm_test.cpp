// bf16/fp16 storage: the conversions (hand cases, every SIMD target against the scalar definition),
// LayerNorm and RMSNorm forward/backward against the fp32 path rounded once, against the float64
// reference, over odd lengths and strided views; determinism; NaN/Inf and out-of-range values; errors.
//
// Budget against the fp32 path: the storage kernels run the fp32 row kernels on the widened inputs and
// round each output once, so today y16 == round(y32) bit for bit (the tests check that too). The
// tolerance allows 1 storage ulp: the fp32 path (row_norm.cpp) and the storage engine may sum the same
// values through differently organised but equally accurate code, and an fp32 difference of a few fp32
// ulps can move a value across a rounding boundary of the 16-bit type, by exactly one of its ulps, never
// more.
// Budget against float64: half a storage ulp for the final rounding plus the fp32 path's own budget
// (4·FLT_EPSILON·max(|ref|, 1), tests/norm/layer_norm_test.cpp), since round(y32) is within half an ulp
// of y32.
#include <normlab/norm.h>
#include <normlab/parallel.h>
#include <normlab/reference.h>
#include <normlab/simd.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "norm/convert_kernels.h"
#include "norm/lowp_support.h"
#include "norm/streaming.h"
#include "support/random.h"
#include "support/tolerance.h"

namespace normlab {
namespace {

using testing::convert_copy;
using testing::storage_ulp;
using testing::within_ulps;

std::uint32_t fbits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bitsf(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint16_t bf(float f) { return bfloat16(f).bits; }
std::uint16_t hf(float f) { return float16(f).bits; }

// ---- conversions ------------------------------------------------------------------------------------

TEST(StorageConversion, Bf16HandCases) {
  EXPECT_EQ(bf(1.0f), 0x3F80);
  EXPECT_EQ(bf(-2.0f), 0xC000);
  EXPECT_EQ(bf(0.0f), 0x0000);
  EXPECT_EQ(bf(-0.0f), 0x8000);
  EXPECT_EQ(bf(1.0f + 0x1p-8f), 0x3F80);        // tie → even (down)
  EXPECT_EQ(bf(1.0f + 3 * 0x1p-8f), 0x3F82);    // tie → even (up)
  EXPECT_EQ(bf(bitsf(0x3F808001)), 0x3F81);     // just above the tie
  EXPECT_EQ(bf(bitsf(0x7F7F7FFF)), 0x7F7F);     // just below halfway past the largest finite: stays
  EXPECT_EQ(bf(bitsf(0x7F7F8000)), 0x7F80);     // halfway (odd below): overflows to +Inf
  EXPECT_EQ(bf(FLT_MAX), 0x7F80);
  EXPECT_EQ(bf(-FLT_MAX), 0xFF80);
  EXPECT_EQ(bf(INFINITY), 0x7F80);
  EXPECT_EQ(bf(-INFINITY), 0xFF80);
  EXPECT_EQ(bf(bitsf(0x00010000)), 0x0001);     // fp32 subnormals are bf16 subnormals
  EXPECT_EQ(bf(bitsf(0x00008000)), 0x0000);     // tie → even
  EXPECT_EQ(bf(bitsf(0x00018000)), 0x0002);
  EXPECT_EQ(bf(bitsf(0xFFA12345)), 0xFFE1);     // NaN: sign and top payload kept, made quiet
  EXPECT_EQ(bf(bitsf(0x7F800001)), 0x7FC0);     // a NaN whose payload is all below bit 16 stays NaN
  EXPECT_EQ(fbits(static_cast<float>(bfloat16::from_bits(0x7F81))), 0x7F810000u);  // widening is exact
  EXPECT_EQ(static_cast<float>(bfloat16::from_bits(0x0001)), 0x1p-133f);
  EXPECT_EQ(bfloat16{}.bits, 0);
}

TEST(StorageConversion, Fp16HandCases) {
  EXPECT_EQ(hf(1.0f), 0x3C00);
  EXPECT_EQ(hf(-2.0f), 0xC000);
  EXPECT_EQ(hf(65504.0f), 0x7BFF);              // largest finite
  EXPECT_EQ(hf(bitsf(0x477FEFFF)), 0x7BFF);     // 65519.996: below halfway, stays finite
  EXPECT_EQ(hf(65520.0f), 0x7C00);              // halfway to 2^16: overflows to +Inf
  EXPECT_EQ(hf(1e10f), 0x7C00);
  EXPECT_EQ(hf(-1e10f), 0xFC00);
  EXPECT_EQ(hf(0x1p-14f), 0x0400);              // smallest normal
  EXPECT_EQ(hf(0x1p-24f), 0x0001);              // smallest subnormal
  EXPECT_EQ(hf(0x1p-25f), 0x0000);              // tie → even (0)
  EXPECT_EQ(hf(3 * 0x1p-25f), 0x0002);          // tie → even (2)
  EXPECT_EQ(hf(bitsf(0x33000001)), 0x0001);     // just above 2^-25
  EXPECT_EQ(hf(0x1p-26f), 0x0000);
  EXPECT_EQ(hf(-0x1p-30f), 0x8000);
  EXPECT_EQ(hf(bitsf(0x387FF000)), 0x0400);     // the largest subnormal + ½ rounds up into the normals
  EXPECT_EQ(hf(1.0f + 0x1p-11f), 0x3C00);       // tie → even
  EXPECT_EQ(hf(1.0f + 3 * 0x1p-11f), 0x3C02);
  EXPECT_EQ(hf(bitsf(0x7F800001)), 0x7E00);     // NaNs: quiet, sign and top payload kept (as F16C)
  EXPECT_EQ(hf(bitsf(0xFFC00000)), 0xFE00);
  EXPECT_EQ(hf(bitsf(0x7FA00000)), 0x7F00);
  EXPECT_EQ(hf(INFINITY), 0x7C00);
  EXPECT_EQ(static_cast<float>(float16::from_bits(0x0001)), 0x1p-24f);
  EXPECT_EQ(fbits(static_cast<float>(float16::from_bits(0x03FF))), 0x387FC000u);
  EXPECT_EQ(fbits(static_cast<float>(float16::from_bits(0x7C01))), 0x7FC02000u);  // sNaN → qNaN (as F16C)
  EXPECT_EQ(static_cast<float>(float16::from_bits(0xFC00)), -INFINITY);
}

TEST(StorageConversion, EveryValueRoundTrips) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    const float fb = static_cast<float>(bfloat16::from_bits(b)), fh = static_cast<float>(float16::from_bits(b));
    if (std::isnan(fb)) {
      ASSERT_EQ(bf(fb), b | 0x0040) << std::hex << h;  // made quiet, nothing else
    } else {
      ASSERT_EQ(bf(fb), b) << std::hex << h;
    }
    if (std::isnan(fh)) {
      ASSERT_EQ(hf(fh), b | 0x0200) << std::hex << h;
    } else {
      ASSERT_EQ(hf(fh), b) << std::hex << h;
    }
  }
}

// Float bit patterns that exercise every rounding boundary of both formats in every binade.
std::vector<float> boundary_floats() {
  std::vector<float> v;
  for (std::uint32_t sign : {0u, 0x80000000u})
    for (std::uint32_t e = 0; e < 256; ++e)
      for (std::uint32_t low : {0x0u, 0x1u, 0xFFFu, 0x1000u, 0x1001u, 0x2FFFu, 0x3000u, 0x7FFFu, 0x8000u, 0x8001u,
                                0x18000u, 0x7FFFFFu, 0x400000u, 0x401000u, 0x3FF000u})
        v.push_back(bitsf(sign | (e << 23) | low));
  // Every bf16 value (every high half) with the low halves that decide its rounding: exact, just above,
  // just below and at the tie, and the largest.
  for (std::uint32_t high = 0; high < 0x10000; ++high)
    for (std::uint32_t low : {0x0u, 0x1u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu})
      v.push_back(bitsf(high << 16 | low));
  // Random bit patterns: about one in 256 is subnormal, so some vectors mix subnormal and normal lanes.
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) v.push_back(bitsf(static_cast<std::uint32_t>(rng())));
  return v;
}

TEST(StorageConversion, EverySimdTargetGivesTheScalarBits) {
  const Isa saved = active_isa();
  const std::vector<float> src = boundary_floats();
  const Index n = static_cast<Index>(src.size());
  std::vector<std::uint16_t> halves(static_cast<std::size_t>(n));
  for (Index i = 0; i < n; ++i) halves[static_cast<std::size_t>(i)] = static_cast<std::uint16_t>(i * 40503u);
  for (Isa isa : supported_isas()) {
    set_isa(isa);
    const kernels::ConvertKernels& cv = kernels::convert_kernels();
    for (int f : {kernels::kBf16, kernels::kF16}) {
      SCOPED_TRACE(std::string(isa_name(isa)) + (f == kernels::kBf16 ? " bf16" : " fp16"));
      auto narrow1 = [&](float x) { return f == kernels::kBf16 ? bf(x) : hf(x); };
      auto widen1 = [&](std::uint16_t h) {
        return f == kernels::kBf16 ? static_cast<float>(bfloat16::from_bits(h))
                                   : static_cast<float>(float16::from_bits(h));
      };
      // Offsets 0..3 and odd lengths: misaligned heads, every tail length.
      for (Index off : {0, 1, 3}) {
        for (bool stream : {false, true}) {
          std::vector<std::uint16_t> out(static_cast<std::size_t>(n));
          cv.narrow[f](out.data() + off, src.data() + off, n - off - 5, stream);
          for (Index i = off; i < n - 5; ++i)
            ASSERT_EQ(out[static_cast<std::size_t>(i)], narrow1(src[static_cast<std::size_t>(i)]))
                << "narrow at " << i << " of bits " << std::hex << fbits(src[static_cast<std::size_t>(i)]);
        }
        std::vector<float> wide(static_cast<std::size_t>(n));
        cv.widen[f](wide.data() + off, halves.data() + off, n - off - 7);
        for (Index i = off; i < n - 7; ++i)
          ASSERT_EQ(fbits(wide[static_cast<std::size_t>(i)]), fbits(widen1(halves[static_cast<std::size_t>(i)])))
              << "widen of " << std::hex << halves[static_cast<std::size_t>(i)];
      }
      // Every 16-bit value widened.
      std::vector<std::uint16_t> all(0x10000);
      for (std::uint32_t h = 0; h < 0x10000; ++h) all[h] = static_cast<std::uint16_t>(h);
      std::vector<float> wide(0x10000);
      cv.widen[f](wide.data(), all.data(), 0x10000);
      for (std::uint32_t h = 0; h < 0x10000; ++h)
        ASSERT_EQ(fbits(wide[h]), fbits(widen1(static_cast<std::uint16_t>(h)))) << std::hex << h;
    }
  }
  set_isa(saved);
}

// ---- LayerNorm / RMSNorm in storage types ------------------------------------------------------------

// A random strided view of a fresh parent tensor of T: sliced, stepped and/or transposed.
template <typename T>
struct Case {
  BasicTensor<T> parent;
  TensorView<const T> x;
  Axes axes;
};

template <typename T>
Case<T> random_case(std::mt19937_64& rng, const Dims& shape, bool strided, double scale, double offset) {
  const int rank = shape.size();
  Dims pshape;
  for (int d = 0; d < rank; ++d) pshape.push_back(shape[d] + (strided ? static_cast<Index>(rng() % 2) : 0));
  Case<T> c{convert_copy<T>(testing::random_tensor(pshape, rng, scale, offset).cview()), {}, {}};
  TensorView<const T> x = c.parent.cview();
  for (int d = 0; d < rank; ++d)
    if (pshape[d] != shape[d]) x = x.slice(d, 1, pshape[d]);
  if (strided && rank >= 2 && rng() % 2) x = x.transpose(0, rank - 1);
  c.x = x;
  for (int d = 0; d < rank; ++d)
    if (rng() % 2) c.axes.push_back(d);
  if (c.axes.empty()) c.axes.push_back(rank - 1);
  return c;
}

// Forward and backward of one case through the storage API and through the fp32 API on the widened
// inputs; asserts the budgets.
template <typename T>
void check_against_fp32(bool center, const Case<T>& c, bool use_w, bool use_b, double eps, std::mt19937_64& rng) {
  const TensorView<const T> x = c.x;
  const Dims ns = normalized_shape(x.shape(), c.axes), ks = kept_shape(x.shape(), c.axes);
  const Tensor w = testing::random_tensor(ns, rng, 0.5, 1.0), b = testing::random_tensor(ns, rng, 0.5, 0.0);
  const ConstView wv = use_w ? w.cview() : ConstView{}, bv = use_b && center ? b.cview() : ConstView{};
  const BasicTensor<T> dy = convert_copy<T>(testing::random_tensor(x.shape(), rng, 1.0, 0.0).cview());
  const Tensor xf = Tensor::copy_of(x), dyf = Tensor::copy_of(dy.cview());

  // storage path
  BasicTensor<T> y(x.shape()), dx(x.shape());
  Tensor mean(ks), rstd(ks), dw(ns), db(ns);
  // fp32 path on the widened inputs
  Tensor y32(x.shape()), dx32(x.shape()), mean32(ks), rstd32(ks), dw32(ns), db32(ns);
  if (center) {
    layer_norm_forward(y.view(), mean.view(), rstd.view(), x, wv, bv, c.axes, eps);
    layer_norm_backward(dx.view(), dw.view(), db.view(), dy.cview(), x, wv, c.axes, eps);
    layer_norm_forward(y32.view(), mean32.view(), rstd32.view(), xf.cview(), wv, bv, c.axes, eps);
    layer_norm_backward(dx32.view(), dw32.view(), db32.view(), dyf.cview(), xf.cview(), wv, c.axes, eps);
  } else {
    rms_norm_forward(y.view(), rstd.view(), x, wv, c.axes, eps);
    rms_norm_backward(dx.view(), dw.view(), dy.cview(), x, wv, c.axes, eps);
    rms_norm_forward(y32.view(), rstd32.view(), xf.cview(), wv, c.axes, eps);
    rms_norm_backward(dx32.view(), dw32.view(), dyf.cview(), xf.cview(), wv, c.axes, eps);
  }
  Index exact_y = 0, exact_dx = 0;
  ASSERT_TRUE(within_ulps<T>(y.cview(), convert_copy<T>(y32.cview()).cview(), 1, "y vs round(fp32 y)", &exact_y));
  ASSERT_TRUE(within_ulps<T>(dx.cview(), convert_copy<T>(dx32.cview()).cview(), 1, "dx vs round(fp32 dx)", &exact_dx));
  EXPECT_EQ(exact_y, y.numel()) << "today the storage path rounds the fp32 kernels' result: bitwise";
  EXPECT_EQ(exact_dx, dx.numel());
  EXPECT_TRUE(testing::bitwise_equal(rstd.cview(), rstd32.cview(), "rstd"));
  if (center) {
    EXPECT_TRUE(testing::bitwise_equal(mean.cview(), mean32.cview(), "mean"));
  }
  // dγ, dβ: the storage backward runs the fp32 arithmetic in the fp32 function's own chunks (or the fp32
  // function itself): bitwise.
  EXPECT_TRUE(testing::bitwise_equal(dw.cview(), dw32.cview(), "dγ bitwise"));
  if (center) {
    EXPECT_TRUE(testing::bitwise_equal(db.cview(), db32.cview(), "dβ bitwise"));
  }
  // dγ, dβ: both are sums over the groups of dy·x̂ and dy; an fp32 path may round each product to fp32 before
  // summing, so the budget is relative to Σ|dy·x̂| (≤ groups·max|dy|·max|x̂|), not to the (cancelling) sum.
  const double groups = static_cast<double>(x.numel() / ns.product());
  const double max_xhat = testing::max_abs(center ? ref::layer_norm_forward(xf.cview(), {}, {}, c.axes, eps).y
                                                  : ref::rms_norm_forward(xf.cview(), {}, c.axes, eps).y);
  const double max_dy = testing::max_abs(dyf);
  if (std::isfinite(max_xhat)) {
    EXPECT_TRUE(testing::all_close(dw.cview(), ref::to_double(dw32.cview()), testing::Tol{8, groups * max_dy * max_xhat}, "dγ"));
  }
  if (center) {
    EXPECT_TRUE(testing::all_close(db.cview(), ref::to_double(db32.cview()), testing::Tol{8, groups * max_dy}, "dβ"));
  }

  // float64 reference of the forward on the widened input: half a storage ulp + the fp32 budget.
  const ref::LayerNormOut r = center ? ref::layer_norm_forward(xf.cview(), wv, bv, c.axes, eps)
                                     : ref::rms_norm_forward(xf.cview(), wv, c.axes, eps);
  const Tensor yw = Tensor::copy_of(y.cview());
  for (Index i = 0; i < yw.numel(); ++i) {
    const double ref = r.y[i], got = yw[i];
    if (std::isnan(ref)) {  // eps 0 on a constant group: NaN, as in fp32
      ASSERT_TRUE(std::isnan(got)) << "flat index " << i;
      continue;
    }
    const double fp32_budget = 4 * FLT_EPSILON * std::max(std::fabs(ref), 1.0);
    const double bound = 0.5 * storage_ulp<T>(std::fabs(ref) + fp32_budget) + fp32_budget;
    ASSERT_LE(std::fabs(got - ref), bound) << "flat index " << i << " ref " << ref;
  }
}

template <typename T>
class StorageNorm : public ::testing::Test {};
using StorageTypes = ::testing::Types<bfloat16, float16>;
TYPED_TEST_SUITE(StorageNorm, StorageTypes);

TYPED_TEST(StorageNorm, MatchesRoundedFp32OnRandomLayouts) {
  using T = TypeParam;
  std::mt19937_64 rng(11);
  static const Index kSizes[] = {1, 2, 3, 7, 16, 33};
  for (int i = 0; i < 120; ++i) {
    const int rank = 1 + static_cast<int>(rng() % 4);
    Dims shape;
    for (int d = 0; d < rank; ++d) {
      Index s = kSizes[rng() % 6];
      if (shape.product() * s > 20000) s = 1;
      shape.push_back(s);
    }
    const Case<T> c = random_case<T>(rng, shape, true, 1.5, 0.25);
    const bool center = i % 2 == 0;
    const double eps = i % 5 == 0 ? 0.0 : 1e-5;
    SCOPED_TRACE(fmt::format("case {}: {} shape {} strides {} axes [{}] centre={} eps={}", i, testing::type_name<T>(),
                             c.x.shape().str(), c.x.strides().str(), fmt::join(c.axes, ","), center, eps));
    check_against_fp32<T>(center, c, rng() % 2, rng() % 2, eps, rng);
  }
}

TYPED_TEST(StorageNorm, OddLengthsContiguousAndMisaligned) {
  using T = TypeParam;
  std::mt19937_64 rng(12);
  for (Index d : {1, 7, 33, 1025, 4100}) {
    for (bool center : {true, false}) {
      SCOPED_TRACE(fmt::format("{} D={} centre={}", testing::type_name<T>(), d, center));
      // Contiguous rows (the flat path: several rows per conversion call) ...
      Case<T> c = random_case<T>(rng, Dims{5, d}, false, 2.0, 0.5);
      c.axes = {1};
      check_against_fp32<T>(center, c, true, true, 1e-5, rng);
      // ... and rows that start one element into the buffer (misaligned conversions).
      BasicTensor<T> parent = convert_copy<T>(testing::random_tensor(Dims{5 * d + 1}, rng, 2.0, 0.5).cview());
      Case<T> m{std::move(parent), {}, {1}};
      m.x = TensorView<const T>(m.parent.data() + 1, Dims{5, d});
      check_against_fp32<T>(center, m, true, false, 1e-5, rng);
    }
  }
}

// Bitwise equal, except that a NaN may meet a NaN of another payload: which NaN operand an IEEE operation
// passes on is not fixed for the scalar target (the compiler may swap the operands of an add), so NaN
// payloads are not part of any bitwise promise.
template <typename T>
::testing::AssertionResult same_bits_any_nan(TensorView<const T> a, TensorView<const T> b, const char* what) {
  if (a.shape() != b.shape()) return ::testing::AssertionFailure() << what << ": shapes differ";
  const BasicTensor<T> ca = BasicTensor<T>::copy_of(a), cb = BasicTensor<T>::copy_of(b);
  for (Index i = 0; i < ca.numel(); ++i) {
    if (std::memcmp(&ca[i], &cb[i], sizeof(T)) == 0) continue;
    if (std::isnan(static_cast<float>(ca[i])) && std::isnan(static_cast<float>(cb[i]))) continue;
    return ::testing::AssertionFailure() << what << ": flat index " << i << ": " << static_cast<float>(ca[i])
                                         << " vs " << static_cast<float>(cb[i]);
  }
  return ::testing::AssertionSuccess();
}

// The in-kernel path (16-bit rows straight through the fused kernels, widened at each load, rounded at
// each store) on every target: lengths around the vector widths and the pipelined forward (n a multiple
// of 64, ≥ 256), rows starting 0, 1 or 3 elements into the buffer (misaligned loads, masked tails),
// values whose fp32 results land on every kind of rounding case: ties, overflow to Inf (fp16 past 65520),
// subnormal results, NaN rows (eps 0 on a constant row) and Inf inputs. Everything bitwise against
// round(the fp32 function on the widened inputs), dγ/dβ against the fp32 function's, in place too.
TYPED_TEST(StorageNorm, InKernelPathRoundsExactlyOnEveryTarget) {
  using T = TypeParam;
  std::mt19937_64 rng(16);
  const Isa saved = active_isa();
  const int saved_threads = num_threads();
  // (150: a paired bf16 Σx with a tail of 22 on AVX-512; row_kernels-inl.h, kPairsMinN)
  for (Index d : {1, 7, 16, 33, 64, 150, 256, 320, 1025}) {
    for (Index off : {0, 1, 3}) {
      const Index rows = 9;
      BasicTensor<T> parent(Dims{rows * d + off}), dyp(Dims{rows * d + off});
      const Tensor r = testing::random_tensor(Dims{rows * d + off}, rng, 2.0, 0.5);
      const Tensor rd = testing::random_tensor(Dims{rows * d + off}, rng, 1.0, 0.0);
      for (Index i = 0; i < parent.numel(); ++i) {
        parent[i] = T(r[i]);
        dyp[i] = T(rd[i]);
      }
      // Row 2: constant (NaN with eps 0, else 0); row 3: one Inf (a NaN row); row 4: tiny values
      // (subnormal outputs through a tiny γ below); row 5: one huge value.
      for (Index j = 0; j < d; ++j) parent[off + 2 * d + j] = T(0.75f);
      parent[off + 3 * d + d / 2] = T(INFINITY);
      for (Index j = 0; j < d; ++j) parent[off + 4 * d + j] = T(r[off + 4 * d + j] * 1e-3f);
      parent[off + 5 * d + d / 3] = T(std::is_same_v<T, float16> ? 60000.0f : 1e30f);
      const TensorView<const T> x(parent.data() + off, Dims{rows, d});
      const TensorView<const T> dy(dyp.data() + off, Dims{rows, d});
      // γ: random, with huge (fp16 overflow), tiny (subnormal results) and exact-power entries; β random.
      Tensor w = testing::random_tensor(Dims{d}, rng, 0.5, 1.0), b = testing::random_tensor(Dims{d}, rng, 0.5, 0.0);
      for (Index j = 0; j < d; j += 5) w[j] = std::is_same_v<T, float16> ? 4e4f : 1e38f;
      for (Index j = 2; j < d; j += 7) w[j] = std::is_same_v<T, float16> ? 3e-6f : 1e-39f;
      for (Index j = 3; j < d; j += 11) w[j] = 0.5f;
      // A NaN γ with a full payload (0x7FFFFFFF once quieted): rounding it like a number would carry
      // into the sign bit; the NaN rule keeps it a NaN.
      if (d > 4) w[4] = bitsf(0x7FBFFFFFu);
      const Tensor xf = Tensor::copy_of(x), dyf = Tensor::copy_of(dy);
      for (bool center : {true, false})
        for (double eps : {0.0, 1e-5}) {
          // The fp32 function on the widened inputs (scalar target, 1 thread).
          set_isa(Isa::kScalar);
          set_num_threads(1);
          Tensor y32(x.shape()), m32(Dims{rows}), r32(Dims{rows}), dx32(x.shape()), dw32(Dims{d}), db32(Dims{d});
          if (center) {
            layer_norm_forward(y32.view(), m32.view(), r32.view(), xf.cview(), w.cview(), b.cview(), {1}, eps);
            layer_norm_backward(dx32.view(), dw32.view(), db32.view(), dyf.cview(), xf.cview(), w.cview(), {1}, eps);
          } else {
            rms_norm_forward(y32.view(), r32.view(), xf.cview(), w.cview(), {1}, eps);
            rms_norm_backward(dx32.view(), dw32.view(), dyf.cview(), xf.cview(), w.cview(), {1}, eps);
          }
          const BasicTensor<T> y_want = convert_copy<T>(y32.cview()), dx_want = convert_copy<T>(dx32.cview());
          for (Isa isa : supported_isas())
            for (int threads : {1, 2}) {
              set_isa(isa);
              set_num_threads(threads);
              SCOPED_TRACE(fmt::format("{} {} D={} offset={} centre={} eps={} {} threads", testing::type_name<T>(),
                                       isa_name(isa), d, off, center, eps, threads));
              BasicTensor<T> y(x.shape()), dx(x.shape());
              Tensor m(Dims{rows}), rs(Dims{rows}), dw(Dims{d}), db(Dims{d});
              if (center) {
                layer_norm_forward(y.view(), m.view(), rs.view(), x, w.cview(), b.cview(), {1}, eps);
                layer_norm_backward(dx.view(), dw.view(), db.view(), dy, x, w.cview(), {1}, eps);
              } else {
                rms_norm_forward(y.view(), rs.view(), x, w.cview(), {1}, eps);
                rms_norm_backward(dx.view(), dw.view(), dy, x, w.cview(), {1}, eps);
              }
              ASSERT_TRUE(same_bits_any_nan<T>(y.cview(), y_want.cview(), "y vs round(fp32 y)"));
              ASSERT_TRUE(same_bits_any_nan<T>(dx.cview(), dx_want.cview(), "dx vs round(fp32 dx)"));
              EXPECT_TRUE(same_bits_any_nan<float>(rs.cview(), r32.cview(), "rstd"));
              EXPECT_TRUE(same_bits_any_nan<float>(dw.cview(), dw32.cview(), "dγ"));
              if (center) {
                EXPECT_TRUE(same_bits_any_nan<float>(m.cview(), m32.cview(), "mean"));
                EXPECT_TRUE(same_bits_any_nan<float>(db.cview(), db32.cview(), "dβ"));
              }
              // In place: y = x, dx = dy.
              BasicTensor<T> io = BasicTensor<T>::copy_of(x), gio = BasicTensor<T>::copy_of(dy);
              if (center) {
                layer_norm_backward(gio.view(), {}, {}, gio.cview(), x, w.cview(), {1}, eps);
                layer_norm_forward(io.view(), {}, {}, io.cview(), w.cview(), b.cview(), {1}, eps);
              } else {
                rms_norm_backward(gio.view(), {}, gio.cview(), x, w.cview(), {1}, eps);
                rms_norm_forward(io.view(), {}, io.cview(), w.cview(), {1}, eps);
              }
              ASSERT_TRUE(same_bits_any_nan<T>(io.cview(), y_want.cview(), "y in place"));
              ASSERT_TRUE(same_bits_any_nan<T>(gio.cview(), dx_want.cview(), "dx in place"));
            }
        }
    }
  }
  set_isa(saved);
  set_num_threads(saved_threads);
}

TYPED_TEST(StorageNorm, StridedAxisMatchesTransposedCopy) {
  using T = TypeParam;
  std::mt19937_64 rng(13);
  // [B, F, T] over F (the speech layout) against the contiguous [B, T, F] copy over the last axis.
  const BasicTensor<T> x = convert_copy<T>(testing::random_tensor(Dims{3, 80, 37}, rng, 1.0, 0.0).cview());
  const BasicTensor<T> xt = BasicTensor<T>::copy_of(x.cview().transpose(1, 2));
  const Tensor w = testing::random_tensor(Dims{80}, rng, 0.5, 1.0);
  BasicTensor<T> y(x.shape()), yt(xt.shape());
  layer_norm_forward(y.view(), {}, {}, x.cview(), w.cview(), {}, {1}, 1e-5);
  layer_norm_forward(yt.view(), {}, {}, xt.cview(), w.cview(), {}, {2}, 1e-5);
  const BasicTensor<T> back = BasicTensor<T>::copy_of(yt.cview().transpose(1, 2));
  // The fp32 functions normalize a strided axis with their own (column) kernels, within fp32 rounding of
  // the row kernels' result: after one rounding to T, at most one ulp apart.
  EXPECT_TRUE(within_ulps<T>(y.cview(), back.cview(), 1, "over F vs transposed"));
  // In place (y = x) gives the same bits.
  BasicTensor<T> inplace = x.clone();
  layer_norm_forward(inplace.view(), {}, {}, inplace.cview(), w.cview(), {}, {1}, 1e-5);
  EXPECT_TRUE(within_ulps<T>(inplace.cview(), y.cview(), 0, "in place"));
}

TYPED_TEST(StorageNorm, SameBitsForEveryTargetAndThreadCount) {
  using T = TypeParam;
  std::mt19937_64 rng(14);
  // The streaming-store threshold lowered to 64 KiB (norm/streaming.h; its default pinned by
  // Streaming.ThresholdIs16MiBUnlessAScopeLowersIt), so that the out-of-cache paths run on small tensors:
  // 64 × 4100 (the per-row kernels), 65 × 4096 (the pipelined forward, n a multiple of 64), 600 × 64 and
  // 500 × 80 (the eight-row kernels at their compile-time lengths) are streamed, 37 × 129 is not.
  const kernels::ScopedStreamMinBytes lowered(Index{64} << 10);
  for (const Dims& shape : {Dims{64, 4100}, Dims{65, 4096}, Dims{600, 64}, Dims{500, 80}, Dims{37, 129}}) {
    const BasicTensor<T> x = convert_copy<T>(testing::random_tensor(shape, rng, 1.0, 3.0).cview());
    const BasicTensor<T> dy = convert_copy<T>(testing::random_tensor(shape, rng, 1.0, 0.0).cview());
    const Tensor w = testing::random_tensor(Dims{shape[1]}, rng, 0.5, 1.0);
    auto run = [&] {
      BasicTensor<T> y(shape), dx(shape);
      Tensor dw(Dims{shape[1]});
      layer_norm_forward(y.view(), {}, {}, x.cview(), w.cview(), w.cview(), {1}, 1e-5);
      layer_norm_backward(dx.view(), dw.view(), {}, dy.cview(), x.cview(), w.cview(), {1}, 1e-5);
      return std::tuple(std::move(y), std::move(dx), std::move(dw));
    };
    const Isa saved_isa = active_isa();
    const int saved_threads = num_threads();
    set_isa(Isa::kScalar);
    set_num_threads(1);
    const auto [y0, dx0, dw0] = run();
    for (Isa isa : supported_isas())
      for (int t : {1, 2, 3}) {
        set_isa(isa);
        set_num_threads(t);
        const auto [y, dx, dw] = run();
        SCOPED_TRACE(fmt::format("{} {} threads shape {}", isa_name(isa), t, shape.str()));
        EXPECT_TRUE(within_ulps<T>(y.cview(), y0.cview(), 0, "y"));
        EXPECT_TRUE(within_ulps<T>(dx.cview(), dx0.cview(), 0, "dx"));
        EXPECT_TRUE(testing::bitwise_equal(dw.cview(), dw0.cview(), "dγ"));
      }
    set_isa(saved_isa);
    set_num_threads(saved_threads);
  }
}

TYPED_TEST(StorageNorm, NaNAndInfStayInTheirGroup) {
  using T = TypeParam;
  std::mt19937_64 rng(15);
  BasicTensor<T> x = convert_copy<T>(testing::random_tensor(Dims{4, 33}, rng, 1.0, 0.0).cview());
  x.view().at({1, 5}) = T(std::numeric_limits<float>::quiet_NaN());
  x.view().at({2, 7}) = T(INFINITY);
  BasicTensor<T> y(x.shape());
  layer_norm_forward(y.view(), {}, {}, x.cview(), {}, {}, {1});
  for (Index r = 0; r < 4; ++r)
    for (Index j = 0; j < 33; ++j) {
      const float v = static_cast<float>(y.cview().at({r, j}));
      if (r == 1 || r == 2) {
        EXPECT_TRUE(std::isnan(v)) << r << "," << j << ": " << v;
      } else {
        EXPECT_TRUE(std::isfinite(v)) << r << "," << j;
      }
    }
}

TEST(StorageNormRange, Fp16OutputsBeyond65504BecomeInfAndLargeInputsAreExact) {
  // Inputs at the fp16 extremes are widened exactly: 65504 and −65504 normalize to ±1.
  F16Tensor x(Dims{1, 2});
  x[0] = float16(65504.0f);
  x[1] = float16(-65504.0f);
  F16Tensor y(x.shape());
  layer_norm_forward(y.view(), {}, {}, x.cview(), {}, {}, {1}, 0.0);
  EXPECT_EQ(static_cast<float>(y[0]), 1.0f);
  EXPECT_EQ(static_cast<float>(y[1]), -1.0f);
  // γ = 1e5 pushes |y| past 65520: ±Inf in fp16 (round to nearest), finite in bf16.
  const Tensor w(Dims{2}, {1e5f, 0.5f});
  layer_norm_forward(y.view(), {}, {}, x.cview(), w.cview(), {}, {1}, 0.0);
  EXPECT_EQ(static_cast<float>(y[0]), INFINITY);
  EXPECT_EQ(static_cast<float>(y[1]), -0.5f);
  // bf16 holds fp32's range; the fp32 path normalizes values up to ~1e18 (its squared deviations stay
  // finite in fp32) and the bf16 result is its rounding.
  BF16Tensor xb(Dims{1, 2}), yb(Dims{1, 2});
  xb[0] = bfloat16(1e18f);
  xb[1] = bfloat16(-1e18f);
  layer_norm_forward(yb.view(), {}, {}, xb.cview(), w.cview(), {}, {1}, 0.0);
  EXPECT_EQ(static_cast<float>(yb[0]), static_cast<float>(bfloat16(1e5f)));
  EXPECT_EQ(static_cast<float>(yb[1]), -0.5f);
}

TEST(StorageNormErrors, BadInputGetsClearMessages) {
  BF16Tensor x(Dims{4, 8}), y(Dims{4, 7});
  EXPECT_NL_ERROR(layer_norm_forward(y.view(), {}, {}, x.cview(), {}, {}, {1}), "y has shape [4, 7]");
  BF16Tensor big(Dims{40});
  BF16View a(big.data(), Dims{4, 8}), b(big.data() + 3, Dims{4, 8});
  EXPECT_NL_ERROR(layer_norm_forward(b, {}, {}, ConstBF16View(a), {}, {}, {1}), "overlaps input x");
  Tensor mean(Dims{4});
  EXPECT_NL_ERROR(rms_norm_forward(a, mean.view(), ConstBF16View(a), {}, {1}, -1.0), "eps must be finite");
  F16Tensor dx(Dims{4, 8}), dyh(Dims{4, 9});
  EXPECT_NL_ERROR(layer_norm_backward(dx.view(), {}, {}, dyh.cview(), F16Tensor(Dims{4, 8}).cview(), {}, {1}),
                  "dy has shape [4, 9]");
}

}  // namespace
}  // namespace normlab
