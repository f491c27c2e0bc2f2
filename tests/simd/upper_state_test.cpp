// Every kernel entry returns with the upper halves of the vector registers clean (simd/vec.h,
// leave_clean): the code that calls the kernels is compiled for the baseline instruction set, and on Intel
// cores an SSE instruction after an AVX-512 or AVX2 function that left ymm0–15/zmm0–15 dirty pays an
// SSE/AVX transition (about 150 ns a call on the Xeon of docs/PERFORMANCE.md's twenty-fourth session).
// The state is read with XGETBV(ECX = 1), XINUSE: bit 2 (YMM_Hi128) and bit 6 (ZMM_Hi256) must be 0
// after each call. Each public operation below is run on one thread (so its kernels run on this thread)
// under every supported vector target, with the state cleared (vzeroupper) before it.
#include <gtest/gtest.h>
#include <normlab/norm.h>
#include <normlab/parallel.h>
#include <normlab/simd.h>
#include <normlab/speech/fbank.h>
#include <normlab/tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "norm/channel_kernels.h"
#include "norm/convert_kernels.h"
#include "norm/row_kernels.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace normlab {
namespace {

#if defined(__x86_64__)
// Whether XGETBV with ECX = 1 is available: OSXSAVE (CPUID.1:ECX[27]) and CPUID.(EAX=0DH,ECX=1):EAX[2].
bool xinuse_readable() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return false;
  if (!__get_cpuid_count(0xd, 1, &a, &b, &c, &d)) return false;
  return (a >> 2) & 1;
}
std::uint64_t xinuse() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(1));
  return (std::uint64_t{hi} << 32) | lo;
}
// Clears the upper state; only called where the CPU has AVX (an avx2 or avx512 target is supported).
void clear_upper() {
  __asm__ volatile("vzeroupper");
}
#else
bool xinuse_readable() {
  return false;
}
std::uint64_t xinuse() {
  return 0;
}
void clear_upper() {}
#endif

constexpr std::uint64_t kYmmHi128 = std::uint64_t{1} << 2, kZmmHi256 = std::uint64_t{1} << 6;

// A tensor of the given shape with values 0.25·((i·7) mod 13) − 1.5 (exactly representable).
Tensor filled(const Dims& shape) {
  Tensor t(shape);
  for (Index i = 0; i < t.numel(); ++i) t.data()[i] = 0.25f * static_cast<float>((i * 7) % 13) - 1.5f;
  return t;
}

struct Call {
  std::string name;
  std::function<void()> run;
};

// The operations, on small odd shapes (tails included): each table of kernels is reached by at least one.
std::vector<Call> calls() {
  std::vector<Call> v;
  // Contiguous rows (row kernels: forward, backward, and the saved-statistics backward).
  v.push_back(
      {"layer_norm rows", [] {
         const Tensor x = filled({7, 33}), dy = filled({7, 33}), w = filled({33}), b = filled({33});
         Tensor y({7, 33}), dx({7, 33}), dw({33}), db({33});
         NormStats st;
         layer_norm_forward(y.view(), View{}, View{}, x.cview(), w.cview(), b.cview(), {-1}, 1e-5, &st);
         layer_norm_backward(dx.view(), dw.view(), db.view(), dy.cview(), x.cview(), w.cview(), {-1});
         layer_norm_backward_saved(dx.view(), dw.view(), db.view(), dy.cview(), x.cview(), w.cview(), st);
       }});
  v.push_back({"rms_norm rows", [] {
                 const Tensor x = filled({5, 80}), dy = filled({5, 80}), w = filled({80});
                 Tensor y({5, 80}), dx({5, 80}), dw({80});
                 rms_norm_forward(y.view(), View{}, x.cview(), w.cview(), {-1});
                 rms_norm_backward(dx.view(), dw.view(), dy.cview(), x.cview(), w.cview(), {-1});
               }});
  // A strided middle axis ([B, F, T] over F: column kernels).
  v.push_back({"layer_norm [B,F,T] over F", [] {
                 const Tensor x = filled({2, 9, 37}), dy = filled({2, 9, 37});
                 Tensor y({2, 9, 37}), dx({2, 9, 37});
                 layer_norm_forward(y.view(), View{}, View{}, x.cview(), ConstView{}, ConstView{}, {1});
                 layer_norm_backward(dx.view(), View{}, View{}, dy.cview(), x.cview(), ConstView{}, {1});
               }});
  // Channel norms (channel kernels).
  v.push_back({"batch_norm training", [] {
                 const Tensor x = filled({3, 4, 33}), dy = filled({3, 4, 33});
                 Tensor y({3, 4, 33}), dx({3, 4, 33});
                 batch_norm_forward(y.view(), View{}, View{}, View{}, View{}, nullptr, x.cview(), ConstView{},
                                    ConstView{});
                 batch_norm_backward(dx.view(), View{}, View{}, dy.cview(), x.cview(), ConstView{},
                                     ConstView{}, ConstView{});
               }});
  v.push_back({"group_norm", [] {
                 const Tensor x = filled({2, 4, 17}), dy = filled({2, 4, 17});
                 Tensor y({2, 4, 17}), dx({2, 4, 17});
                 group_norm_forward(y.view(), View{}, View{}, x.cview(), ConstView{}, ConstView{}, 2);
                 group_norm_backward(dx.view(), View{}, View{}, dy.cview(), x.cview(), ConstView{}, 2);
               }});
  // 16-bit storage (the conversion table's row kernels).
  v.push_back({"layer_norm bf16 and fp16 rows", [] {
                 const Tensor xf = filled({3, 65});
                 const BF16Tensor xb = BF16Tensor::copy_of(xf.cview());
                 const F16Tensor xh = F16Tensor::copy_of(xf.cview());
                 BF16Tensor yb({3, 65}), dxb({3, 65});
                 F16Tensor yh({3, 65}), dxh({3, 65});
                 layer_norm_forward(yb.view(), View{}, View{}, xb.cview(), ConstView{}, ConstView{}, {-1});
                 layer_norm_backward(dxb.view(), View{}, View{}, xb.cview(), xb.cview(), ConstView{}, {-1});
                 layer_norm_forward(yh.view(), View{}, View{}, xh.cview(), ConstView{}, ConstView{}, {-1});
                 layer_norm_backward(dxh.view(), View{}, View{}, xh.cview(), xh.cview(), ConstView{}, {-1});
               }});
  // The channel table's entries one by one (an operation's last kernel could otherwise hide an earlier
  // one's dirty state: BatchNorm's statistics pass is followed by its elementwise pass).
  v.push_back({"channel segment_stats of x", [] {
                 const Tensor x = filled({37});
                 kernels::SegmentStats st;
                 kernels::channel_kernels().segment_stats(&st, x.data(), nullptr, 37,
                                                          kernels::StatsPrefetch{});
               }});
  v.push_back({"channel segment_stats of x and dy", [] {
                 const Tensor x = filled({37}), dy = filled({37});
                 kernels::SegmentStats st;
                 kernels::channel_kernels().segment_stats(&st, x.data(), dy.data(), 37,
                                                          kernels::StatsPrefetch{});
               }});
  v.push_back({"channel segments_stats of x and dy", [] {
                 const Tensor x = filled({17, 37}), dy = filled({17, 37});
                 double c[5][17];
                 const kernels::SegmentColumns st{c[0], c[1], c[2], c[3], c[4]};
                 for (const auto loads : {kernels::LaneLoads::kGather, kernels::LaneLoads::kTranspose}) {
                   kernels::channel_kernels().segments_stats(st, x.data(), dy.data(), 37, 3, loads);
                   kernels::channel_kernels().segments_stats(st, x.data(), dy.data(), 5, 17,
                                                             loads);  // n ≤ 16
                 }
               }});
  v.push_back({"channel normalize", [] {
                 const Tensor x = filled({37});
                 Tensor y({37});
                 kernels::channel_kernels().normalize(y.data(), x.data(), 37, kernels::NormalizeConsts{},
                                                      false);
               }});
  v.push_back({"channel input_grad", [] {
                 const Tensor x = filled({37}), dy = filled({37});
                 Tensor dx({37});
                 kernels::channel_kernels().input_grad(dx.data(), dy.data(), x.data(), 37,
                                                       kernels::InputGradConsts{}, false);
               }});
  v.push_back({"channel segments_normalize", [] {
                 const Tensor x = filled({3, 37});
                 Tensor y({3, 37});
                 const float c[4][17] = {};
                 const kernels::RowNormalizeConsts k{c[0], c[1], c[2], c[3]};
                 kernels::channel_kernels().segments_normalize(y.data(), x.data(), 37, 3, k, false);
                 kernels::channel_kernels().segments_normalize(y.data(), x.data(), 5, 17, k,
                                                               false);  // n < 16
               }});
  v.push_back({"channel segments_input_grad", [] {
                 const Tensor x = filled({3, 37}), dy = filled({3, 37});
                 Tensor dx({3, 37});
                 const float c[6][17] = {};
                 const kernels::RowInputGradConsts k{c[0], c[1], c[2], c[3], c[4], c[5]};
                 kernels::channel_kernels().segments_input_grad(dx.data(), dy.data(), x.data(), 37, 3, k,
                                                                false);
                 kernels::channel_kernels().segments_input_grad(dx.data(), dy.data(), x.data(), 5, 17, k,
                                                                false);  // n < 16
               }});
  v.push_back(
      {"channel single_moments, group_means, single_normalize_consts, single_input_grad_consts, "
       "spread_groups(d), single_grad_terms",
       [] {
         const Tensor x = filled({37}), dy = filled({37});
         std::vector<double> m(48, 0.5), r(48, 1.0), a(48), b(48), c(48), d(48);
         kernels::channel_kernels().single_moments(a.data(), b.data(), c.data(), x.data(), 3, 12, 3.0,
                                                   1e-5);  // a block of eight groups and four more
         kernels::channel_kernels().group_means(a.data(), m.data(), 3, 12, 3.0);
         std::vector<float> f0(48), f1(48), f2(48), f3(48, 1.0f), f4(48);
         kernels::channel_kernels().single_normalize_consts(f0.data(), f1.data(), f2.data(), m.data(),
                                                            r.data(), x.data(), 3, 12);
         kernels::channel_kernels().single_normalize_consts(f0.data(), f1.data(), f2.data(), m.data(),
                                                            r.data(), x.data(), 1, 37);  // one per group
         kernels::channel_kernels().single_normalize_consts(f0.data(), f1.data(), f2.data(), m.data(),
                                                            r.data(), f3.data(), 4, 12);  // vector stores
         for (Index spg : {4, 1})
           kernels::channel_kernels().single_input_grad_consts(
               {f0.data(), f1.data(), f2.data(), f3.data(), f4.data()}, m.data(), r.data(), a.data(),
               b.data(), spg, spg == 4 ? 12 : 37);
         kernels::channel_kernels().spread_groups(f0.data(), f1.data(), 3, 12);
         kernels::channel_kernels().spread_groupsd(a.data(), m.data(), 3, 12);
         kernels::channel_kernels().single_grad_terms({a.data(), b.data(), c.data(), d.data()}, x.data(),
                                                      dy.data(), x.data(), m.data(), r.data(), 37);
       }});
  v.push_back({"channel fence", [] { kernels::channel_kernels().fence(); }});
  // The channel-rows entries: 3 rows of 37 channels (per-channel arrays padded to 48).
  struct Rows {
    Tensor x = filled({3, 37}), dy = filled({3, 37}), out{Dims{3, 37}};
    std::vector<Index> off{0, 37, 74};
    std::vector<double> d0 = std::vector<double>(48, 0.5), d1 = std::vector<double>(48, 1.0);
    std::vector<double> a0 = std::vector<double>(48), a1 = a0, a2 = a0, a3 = a0;
    std::vector<float> f = std::vector<float>(48, 1.0f);
    kernels::ChannelRows rows() {
      kernels::ChannelRows a;
      a.x = x.data();
      a.xo = off.data();
      a.dy = dy.data();
      a.dyo = off.data();
      a.out = out.data();
      a.oo = off.data();
      a.rows = 3;
      a.nc = 37;
      return a;
    }
  };
  v.push_back({"channel rows_sum", [] {
                 Rows r;
                 kernels::channel_kernels().rows_sum(r.a0.data(), r.rows());
               }});
  v.push_back({"channel rows_sqdev", [] {
                 Rows r;
                 kernels::channel_kernels().rows_sqdev(r.a0.data(), r.d0.data(), r.rows());
               }});
  v.push_back({"channel rows_grads", [] {
                 Rows r;
                 kernels::channel_kernels().rows_grads({r.a0.data(), r.a1.data(), r.a2.data(), r.a3.data()},
                                                       r.d0.data(), r.d1.data(), r.d1.data(), r.rows());
               }});
  v.push_back({"channel rows_normalize", [] {
                 Rows r;
                 const float* f = r.f.data();
                 kernels::channel_kernels().rows_normalize({f, f, f, f}, r.rows(), false);
               }});
  v.push_back({"channel rows_input_grad", [] {
                 Rows r;
                 const float* f = r.f.data();
                 kernels::channel_kernels().rows_input_grad({f, f, f, f, f, f}, r.rows(), false);
               }});
  // The conversion table's own entries.
  v.push_back({"convert narrow", [] {
                 const kernels::ConvertKernels& k = kernels::convert_kernels();
                 std::vector<float> f(37, 1.5f);
                 std::vector<std::uint16_t> h(37);
                 for (int t = 0; t < 2; ++t) k.narrow[t](h.data(), f.data(), 37, false);
               }});
  v.push_back({"convert widen", [] {
                 const kernels::ConvertKernels& k = kernels::convert_kernels();
                 std::vector<float> g(37);
                 std::vector<std::uint16_t> h(37, 0x3fc0);
                 for (int t = 0; t < 2; ++t) k.widen[t](g.data(), h.data(), 37);
               }});
  v.push_back({"convert recover_centered", [] {
                 const kernels::ConvertKernels& k = kernels::convert_kernels();
                 std::vector<float> f(37, 1.5f), g(37);
                 const std::vector<double> iw(37, 0.5);
                 k.recover_centered(g.data(), f.data(), 37, 2.0, iw.data(), f.data(), f.data());
               }});
  // The speech front end's per-target functions (window, power spectrum and mel banks, log).
  v.push_back({"fbank", [] {
                 std::vector<float> samples(1600);
                 for (std::size_t i = 0; i < samples.size(); ++i)
                   samples[i] = static_cast<float>(static_cast<int>(i * 37 % 201) - 100);
                 speech::FbankOptions o;
                 o.frame_opts.dither = 0.0f;
                 (void)speech::ComputeFbank(o, samples, 16000.0f);
               }});
  return v;
}

TEST(UpperState, EveryKernelEntryLeavesItClean) {
  if (!xinuse_readable()) GTEST_SKIP() << "this CPU does not report XINUSE (XGETBV with ECX = 1)";
  const Isa start = active_isa();
  const int threads = num_threads();
  set_num_threads(1);
  int checked = 0;
  for (Isa isa : supported_isas()) {
    if (isa == Isa::kScalar) continue;
    set_isa(isa);
    for (const Call& c : calls()) {
      clear_upper();
      c.run();
      const std::uint64_t s = xinuse();
      EXPECT_EQ(s & (kYmmHi128 | kZmmHi256), 0u)
          << c.name << " under " << isa_name(isa) << " left the upper state in use (XINUSE 0x" << std::hex
          << s << ")";
      ++checked;
    }
  }
  set_isa(start);
  set_num_threads(threads);
  if (checked == 0) GTEST_SKIP() << "no vector target on this CPU";
}

// The check itself: a 256-bit operation puts YMM_Hi128 in use until vzeroupper, so a missing vzeroupper
// would be seen. (One asm statement: GCC would add a vzeroupper at the end of a function doing it.)
TEST(UpperState, TheCheckSeesADirtyState) {
  if (!xinuse_readable() || !isa_supported(Isa::kAvx2)) GTEST_SKIP() << "needs AVX2 and XINUSE";
#if defined(__x86_64__)
  clear_upper();
  EXPECT_EQ(xinuse() & kYmmHi128, 0u);
  unsigned lo = 0, hi = 0;
  __asm__ volatile("vpcmpeqd %%ymm0, %%ymm0, %%ymm0\n\txgetbv\n\tvzeroupper"
                   : "=a"(lo), "=d"(hi)
                   : "c"(1)
                   : "xmm0");
  EXPECT_NE(lo & kYmmHi128, 0u);
  EXPECT_EQ(xinuse() & kYmmHi128, 0u);
#endif
}

}  // namespace
}  // namespace normlab
