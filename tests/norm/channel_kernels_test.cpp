// Tests of the channel kernels' entries that other kernels of the table must match bit for bit
// (src/norm/channel_kernels.h).
#include "norm/channel_kernels.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <normlab/simd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace normlab {
namespace {

// The bits of a double or a float.
template <typename T>
auto bits(T v) {
  std::conditional_t<sizeof(T) == 8, std::uint64_t, std::uint32_t> u;
  static_assert(sizeof u == sizeof v);
  std::memcpy(&u, &v, sizeof u);
  return u;
}

// segments_stats against segment_stats called segment by segment: every column entry the same bits, for
// segment lengths n = 1 .. 18 and from 20 to 65 around multiples of 8 and 16 (n ≤ 40 goes sixteen segments
// at a time, one per lane, and the rest one by one) and counts around multiples of 16, with and without dy,
// with both lane loads (gathered and transposed), on every target. The segments hold −0.0, all −0.0 (also
// with every dy·e −0), a constant, huge and tiny values, an offset of 1e4, a NaN and ±Inf (x and dy).
// With dy, the kernels given each segment's mean (segments_grad_stats, segment_grad_stats) against
// segment_stats likewise: mean, sdy and sdyd (an all −0.0 segment's mean, +0 given, takes segment_stats).
TEST(ChannelKernels, SegmentsStatsIsSegmentStatsOneByOne) {
  std::mt19937_64 rng(91);
  std::normal_distribution<float> nd;
  const Isa saved = active_isa();
  for (const Index n : {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16, 17, 18, 20,
                        23, 24, 25, 28, 30, 31, 32, 33, 36, 39, 40, 41, 47, 48, 49, 57, 63, 64, 65}) {
    for (const Index count : {1, 15, 16, 17, 33, 48}) {
      const Index total = n * count;
      std::vector<float> x(static_cast<std::size_t>(total)), dy(x.size());
      for (Index i = 0; i < total; ++i) {
        x[static_cast<std::size_t>(i)] = nd(rng) * 3.0f + 1.0f;
        dy[static_cast<std::size_t>(i)] = nd(rng);
      }
      auto seg = [&](Index s, Index j) -> float& { return x[static_cast<std::size_t>(s * n + j)]; };
      const float inf = std::numeric_limits<float>::infinity();
      if (count > 1) seg(1, 0) = -0.0f;
      if (count > 2)
        for (Index j = 0; j < n; ++j) seg(2, j) = -0.0f;  // Σx = −0.0 + ... : the sum's sign of zero
      if (count > 3)
        for (Index j = 0; j < n; ++j) seg(3, j) = 1.5f;  // M2 = 0
      if (count > 5)
        for (Index j = 0; j < n; ++j) seg(5, j) = 1e4f + static_cast<float>(j % 3);
      if (count > 6) seg(6, n - 1) = 3e38f;
      if (count > 7) seg(7, 0) = 1e-40f;  // subnormal
      if (count > 9) seg(9, n / 2) = std::numeric_limits<float>::quiet_NaN();
      if (count > 10)
        for (Index j = 0; j < n; ++j) {  // every dy·e = 1·(−0 − 0) = −0: the product sums' + 0
          seg(10, j) = -0.0f;
          dy[static_cast<std::size_t>(10 * n + j)] = 1.0f;
        }
      if (count > 12) seg(12, 0) = inf;
      if (count > 13) seg(13, n - 1) = -inf;
      if (count > 14) dy[static_cast<std::size_t>(14 * n)] = inf;
      if (count > 16) dy[static_cast<std::size_t>(16 * n + n - 1)] = -0.0f;
      for (const Isa isa : supported_isas()) {
        set_isa(isa);
        const kernels::ChannelKernels& k = kernels::channel_kernels();
        for (const auto& [with_dy, loads] :
             {std::pair{false, kernels::LaneLoads::kGather}, std::pair{true, kernels::LaneLoads::kGather},
              std::pair{false, kernels::LaneLoads::kTranspose},
              std::pair{true, kernels::LaneLoads::kTranspose}}) {
          const float* d = with_dy ? dy.data() : nullptr;
          std::vector<double> c[5];
          for (auto& v : c) v.assign(static_cast<std::size_t>(count), -7.0);  // sdy, sdyd stay without dy
          k.segments_stats({c[0].data(), c[1].data(), c[2].data(), c[3].data(), c[4].data()}, x.data(), d, n,
                           count, loads);
          // With dy, also segments_grad_stats and segment_grad_stats given each segment's mean as
          // InstanceNorm's group mean, (0 + Σx)/n (segment_stats' Σx/n but for Σx = −0): their mean, sdy,
          // sdyd.
          std::vector<kernels::SegmentStats> rs(static_cast<std::size_t>(count));
          std::vector<double> means(rs.size()), g[5];
          for (Index s = 0; s < count; ++s) {
            kernels::SegmentStats& r = rs[static_cast<std::size_t>(s)];
            k.segment_stats(&r, x.data() + s * n, d ? d + s * n : nullptr, n, kernels::StatsPrefetch{});
            means[static_cast<std::size_t>(s)] = (0.0 + r.sum) / static_cast<double>(n);
          }
          if (with_dy) {
            for (auto& v : g) v.assign(static_cast<std::size_t>(count), -7.0);
            k.segments_grad_stats({g[0].data(), g[1].data(), g[2].data(), g[3].data(), g[4].data()}, x.data(),
                                  d, n, count, means.data(), loads);
          }
          for (Index s = 0; s < count; ++s) {
            const kernels::SegmentStats& r = rs[static_cast<std::size_t>(s)];
            const std::size_t i = static_cast<std::size_t>(s);
            const std::string what = std::string(isa_name(isa)) + " n " + std::to_string(n) + " count " +
                                     std::to_string(count) + " segment " + std::to_string(s) +
                                     (with_dy ? " with dy" : "") +
                                     (loads == kernels::LaneLoads::kGather ? " gathered" : " transposed");
            EXPECT_EQ(bits(c[0][i]), bits(r.sum)) << what << " sum " << c[0][i] << " vs " << r.sum;
            EXPECT_EQ(bits(c[1][i]), bits(r.mean)) << what << " mean " << c[1][i] << " vs " << r.mean;
            EXPECT_EQ(bits(c[2][i]), bits(r.m2)) << what << " m2 " << c[2][i] << " vs " << r.m2;
            EXPECT_EQ(bits(c[3][i]), bits(with_dy ? r.sdy : -7.0)) << what << " sdy";
            EXPECT_EQ(bits(c[4][i]), bits(with_dy ? r.sdyd : -7.0)) << what << " sdyd";
            if (!with_dy) continue;
            kernels::SegmentStats q;
            k.segment_grad_stats(&q, x.data() + s * n, d + s * n, n, means[i], kernels::StatsPrefetch{});
            for (const auto& [m, sd, sdd, src] :
                 {std::tuple{g[1][i], g[3][i], g[4][i], " segments_grad_stats"},
                  std::tuple{q.mean, q.sdy, q.sdyd, " segment_grad_stats"}}) {
              EXPECT_EQ(bits(m), bits(r.mean)) << what << src << " mean " << m << " vs " << r.mean;
              EXPECT_EQ(bits(sd), bits(r.sdy)) << what << src << " sdy";
              EXPECT_EQ(bits(sdd), bits(r.sdyd)) << what << src << " sdyd " << sdd << " vs " << r.sdyd;
            }
          }
        }
      }
    }
  }
  set_isa(saved);
}

// segments_normalize / segments_input_grad against normalize / input_grad called segment by segment with
// the same constants: every output the same bits, nothing written outside the output, for n = 1 .. 17 (n < 16
// goes through the run as one stream of vectors, each lane with its segment's constants; so do 16, 32 and 64
// when streamed to an output off a 64-byte boundary, lanes of at most two segments; otherwise n = 16 is one
// vector per segment in a loop of its own) and a few longer segments, counts around multiples of 16,
// outputs 0, 1, 5 and 15 floats past a 64-byte boundary, with and without streaming stores (a streamed run
// starts with a shorter head), on every target. The constant arrays hold exactly count entries (a read past
// them shows under the sanitizers); they include −0.0, a NaN and an infinity, and x a NaN and an infinity.
TEST(ChannelKernels, SegmentsElementwiseIsPerSegment) {
  std::mt19937_64 rng(93);
  std::normal_distribution<float> nd;
  const Isa saved = active_isa();
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const Index n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 31, 32, 33, 48, 64}) {
    for (const Index count : {1, 2, 15, 16, 17, 40}) {
      const Index total = n * count;
      std::vector<float> x(static_cast<std::size_t>(total)), dy(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) {
        x[i] = nd(rng) * 2.0f + 0.5f;
        dy[i] = nd(rng);
      }
      if (total > 3) x[3] = nan;
      if (total > 5) x[static_cast<std::size_t>(total - 2)] = -inf;
      std::vector<float>
          c[6];  // mh, ml, s, b (normalize); mh, ml, r, w, c0, c2 (input_grad: c[0], c[1], c[2..5])
      for (auto& v : c) {
        v.resize(static_cast<std::size_t>(count));
        for (float& e : v) e = nd(rng);
      }
      c[3][0] = -0.0f;
      if (count > 1) c[2][1] = nan;
      if (count > 2) c[5][2] = inf;
      const std::size_t cn = static_cast<std::size_t>(count);
      const kernels::RowNormalizeConsts kn{c[0].data(), c[1].data(), c[2].data(), c[3].data()};
      const kernels::RowInputGradConsts kg{c[0].data(), c[1].data(), c[2].data(),
                                           c[3].data(), c[4].data(), c[5].data()};
      for (const Isa isa : supported_isas()) {
        set_isa(isa);
        const kernels::ChannelKernels& k = kernels::channel_kernels();
        for (const bool stream : {false, true}) {
          for (const Index off : {Index{0}, Index{1}, Index{5}, Index{15}}) {
            const float guard = 1234.5f;
            // the outputs from float `off` past a 64-byte boundary, 16 floats or more into their buffers
            std::vector<float> ya(static_cast<std::size_t>(total + 48), guard), yb = ya, ga = ya, gb = ya;
            auto at = [&](std::vector<float>& v) {
              const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(v.data() + 16);
              return v.data() + 16 + ((64 - (a & 63)) & 63) / 4 + off;
            };
            float *y1 = at(ya), *y2 = at(yb), *g1 = at(ga), *g2 = at(gb);
            k.segments_normalize(y1, x.data(), n, count, kn, stream);
            k.segments_input_grad(g1, dy.data(), x.data(), n, count, kg, stream);
            for (std::size_t s = 0; s < cn; ++s) {
              const Index o = static_cast<Index>(s) * n;
              k.normalize(y2 + o, x.data() + o, n,
                          kernels::NormalizeConsts{c[0][s], c[1][s], c[2][s], c[3][s]}, false);
              k.input_grad(g2 + o, dy.data() + o, x.data() + o, n,
                           kernels::InputGradConsts{c[0][s], c[1][s], c[2][s], c[3][s], c[4][s], c[5][s]},
                           false);
            }
            k.fence();
            const std::string what = std::string(isa_name(isa)) + " n " + std::to_string(n) + " count " +
                                     std::to_string(count) + " offset " + std::to_string(off) +
                                     (stream ? " streamed" : "");
            for (Index i = 0; i < total; ++i) {
              ASSERT_EQ(bits(y1[i]), bits(y2[i])) << what << " normalize, element " << i;
              ASSERT_EQ(bits(g1[i]), bits(g2[i])) << what << " input_grad, element " << i;
            }
            for (const float* p : {y1, g1}) {
              EXPECT_EQ(bits(p[-1]), bits(guard)) << what;
              EXPECT_EQ(bits(p[total]), bits(guard)) << what;
            }
          }
        }
      }
    }
  }
  set_isa(saved);
}

// run_moments / run_grads (a sample run's groups, eight at a time in the lanes) against the scalar chains
// of combine_group / group_grads written out here: every output the same bits, for spg = 1, 2, 3, 8, 16
// segments per group and 1 .. 17 groups (a block of eight and the groups after it one by one), with and
// without γ, count 0 (every result 0), on every target. The statistics hold −0.0, a NaN and ±Inf; the
// outputs exactly the entries the kernels may write (a write past them shows under the sanitizers).
TEST(ChannelKernels, RunCombinationIsTheScalarChains) {
  std::mt19937_64 rng(93);
  std::normal_distribution<double> nd;
  const Isa saved = active_isa();
  const double eps = 1e-5, ns = 3.0;  // (not a power of two: (ns·d)·d and ns·(d·d) differ)
  for (const Index spg : {1, 2, 3, 8, 16}) {
    for (const Index groups : {1, 7, 8, 9, 16, 17}) {
      const Index segs = spg * groups;
      std::vector<double> sum(static_cast<std::size_t>(segs)), mean_s(sum.size()), m2(sum.size()),
          sdy(sum.size()), sdyd(sum.size());
      std::vector<float> w(sum.size());
      for (Index s = 0; s < segs; ++s) {
        const std::size_t i = static_cast<std::size_t>(s);
        mean_s[i] = nd(rng) + 2.0;
        sum[i] = mean_s[i] * ns;
        m2[i] = std::abs(nd(rng)) * 3.0;
        sdy[i] = nd(rng);
        sdyd[i] = nd(rng);
        w[i] = static_cast<float>(nd(rng));
      }
      sum[0] = -0.0;
      sdy[0] = -0.0;
      if (segs > 3) sum[3] = std::numeric_limits<double>::quiet_NaN();
      if (segs > 5) sdyd[5] = std::numeric_limits<double>::infinity();
      if (segs > 6) m2[6] = std::numeric_limits<double>::infinity();
      if (segs > 10) sdy[10] = -std::numeric_limits<double>::infinity();
      const kernels::SegmentColumns st{sum.data(), mean_s.data(), m2.data(), sdy.data(), sdyd.data()};
      for (const double count : {ns * static_cast<double>(spg), 0.0}) {
        // The scalar chains (channel_norm.cpp's combine_group / group_grads on a run), group by group.
        const std::size_t ng = static_cast<std::size_t>(groups);
        std::vector<double> rmean(ng), rvar(ng), rrstd(ng);
        for (Index g = 0; g < groups; ++g) {
          double m = 0.0, v = 0.0;
          for (Index j = 0; j < spg; ++j) m += sum[static_cast<std::size_t>(g * spg + j)];
          m = count > 0 ? m / count : 0.0;
          for (Index j = 0; j < spg; ++j) {
            const std::size_t s = static_cast<std::size_t>(g * spg + j);
            const double d = mean_s[s] - m;
            v += m2[s] + ns * d * d;
          }
          v = count > 0 ? v / count : 0.0;
          const std::size_t gi = static_cast<std::size_t>(g);
          rmean[gi] = m;
          rvar[gi] = v;
          rrstd[gi] = count > 0 ? 1.0 / std::sqrt(v + eps) : 0.0;
        }
        for (const bool with_w : {true, false}) {
          std::vector<double> rmg(ng), rmgx(ng), rsdyxh(sum.size());
          for (Index g = 0; g < groups; ++g) {
            const std::size_t gi = static_cast<std::size_t>(g);
            double a = 0.0, b = 0.0;
            for (Index j = 0; j < spg; ++j) {
              const std::size_t s = static_cast<std::size_t>(g * spg + j);
              const double v = rrstd[gi] * (sdyd[s] + (mean_s[s] - rmean[gi]) * sdy[s]);
              const double wc = with_w ? static_cast<double>(w[s]) : 1.0;
              a += wc * sdy[s];
              b += wc * v;
              rsdyxh[s] = v;
            }
            rmg[gi] = count > 0 ? a / count : 0.0;
            rmgx[gi] = count > 0 ? b / count : 0.0;
          }
          for (const Isa isa : supported_isas()) {
            set_isa(isa);
            const kernels::ChannelKernels& k = kernels::channel_kernels();
            const std::string what = fmt::format("spg {} groups {} count {}{} {}", spg, groups, count,
                                                 with_w ? " w" : "", isa_name(isa));
            std::vector<double> mean(ng), var(ng), rstd(ng), mg(ng), mgx(ng), sdyxh(sum.size());
            k.run_moments(mean.data(), var.data(), rstd.data(), st, spg, groups, ns, count, eps);
            // From the reference moments, so that a difference shows in run_grads itself.
            k.run_grads(mg.data(), mgx.data(), sdyxh.data(), st, rmean.data(), rrstd.data(),
                        with_w ? w.data() : nullptr, spg, groups, count);
            for (std::size_t g = 0; g < ng; ++g) {
              EXPECT_EQ(bits(mean[g]), bits(rmean[g])) << what << " mean, group " << g;
              EXPECT_EQ(bits(var[g]), bits(rvar[g])) << what << " var, group " << g;
              EXPECT_EQ(bits(rstd[g]), bits(rrstd[g])) << what << " rstd, group " << g;
              EXPECT_EQ(bits(mg[g]), bits(rmg[g])) << what << " mg, group " << g;
              EXPECT_EQ(bits(mgx[g]), bits(rmgx[g])) << what << " mgx, group " << g;
            }
            for (std::size_t s = 0; s < sdyxh.size(); ++s)
              EXPECT_EQ(bits(sdyxh[s]), bits(rsdyxh[s])) << what << " sdyxh, segment " << s;
          }
        }
      }
    }
  }
  set_isa(saved);
}

// single_normalize_consts and single_input_grad_consts against their formulas written out in scalar code
// (channel_norm.cpp's normalize_consts and input_grad_consts), every entry the same bits, on every target:
// one channel per group (sixteen groups per vector, then the rest), two and three (stored one by one), five
// and seventeen (vector stores, a group's last one overlapping the next groups' channels), group counts
// around multiples of 16, with and without γ, the statistics holding −0.0, values whose fp32 pair needs m_lo,
// huge values that round to ±Inf in fp32, a subnormal m_lo, NaN and ±Inf.
TEST(ChannelKernels, SingleConstsAreTheirScalarFormulas) {
  std::mt19937_64 rng(94);
  std::normal_distribution<double> nd;
  const Isa saved = active_isa();
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (const Index spg : {1, 2, 3, 5, 17}) {
    for (const Index groups : {1, 7, 16, 17, 33, 48}) {
      const std::size_t ng = static_cast<std::size_t>(groups), nc = static_cast<std::size_t>(spg * groups);
      std::vector<double> mean(ng), rstd(ng), mg(ng), mgx(ng);
      for (std::size_t g = 0; g < ng; ++g) {
        mean[g] = nd(rng) * 1e3 + 1e4;
        rstd[g] = std::abs(nd(rng)) * 10.0;
        mg[g] = nd(rng);
        mgx[g] = nd(rng);
      }
      const double odd[] = {-0.0, 1e39, -1e39, 1e-32, nan, inf, -inf};  // 1e-32: m_lo subnormal
      for (std::size_t i = 0; i < std::size(odd) && i < ng; ++i) {
        const std::size_t g = (i * 5 + 1) % ng;
        mean[g] = odd[i];
        rstd[(g + 1) % ng] = odd[(i + 1) % std::size(odd)];
        mg[(g + 2) % ng] = odd[(i + 2) % std::size(odd)];
        mgx[(g + 3) % ng] = odd[(i + 3) % std::size(odd)];
      }
      std::vector<float> w(nc);
      for (float& v : w) v = static_cast<float>(nd(rng));
      if (nc > 2) w[2] = -0.0f;
      for (const bool with_w : {true, false}) {
        // The scalar formulas, channel by channel.
        std::vector<float> rmh(nc), rml(nc), rs(nc), rr(nc), rc0(nc), rc2(nc);
        for (std::size_t c = 0; c < nc; ++c) {
          const std::size_t g = c / static_cast<std::size_t>(spg);
          rmh[c] = static_cast<float>(mean[g]);
          rml[c] = static_cast<float>(mean[g] - static_cast<double>(rmh[c]));
          rs[c] = static_cast<float>(rstd[g] * (with_w ? static_cast<double>(w[c]) : 1.0));
          rr[c] = static_cast<float>(rstd[g]);
          rc0[c] = static_cast<float>(mg[g]);
          rc2[c] = static_cast<float>(rstd[g] * mgx[g]);
        }
        for (const Isa isa : supported_isas()) {
          set_isa(isa);
          const kernels::ChannelKernels& k = kernels::channel_kernels();
          const std::string what =
              fmt::format("spg {} groups {}{} {}", spg, groups, with_w ? " w" : "", isa_name(isa));
          // One entry past the channels, which neither kernel may write.
          const float mark = 7.0f;
          std::vector<float> mh(nc + 1, mark), ml(mh), sc(mh), r(mh), c0(mh), c2(mh);
          k.single_normalize_consts(mh.data(), ml.data(), sc.data(), mean.data(), rstd.data(),
                                    with_w ? w.data() : nullptr, spg, groups);
          for (std::size_t c = 0; c < nc; ++c) {
            EXPECT_EQ(bits(mh[c]), bits(rmh[c])) << what << " normalize mh, channel " << c;
            EXPECT_EQ(bits(ml[c]), bits(rml[c])) << what << " normalize ml, channel " << c;
            EXPECT_EQ(bits(sc[c]), bits(rs[c])) << what << " normalize s, channel " << c;
          }
          EXPECT_TRUE(mh[nc] == mark && ml[nc] == mark && sc[nc] == mark) << what << " wrote past the end";
          if (!with_w) continue;  // (input_grad_consts take no γ)
          std::fill(mh.begin(), mh.end(), mark);
          std::fill(ml.begin(), ml.end(), mark);
          k.single_input_grad_consts({mh.data(), ml.data(), r.data(), c0.data(), c2.data()}, mean.data(),
                                     rstd.data(), mg.data(), mgx.data(), spg, groups);
          for (std::size_t c = 0; c < nc; ++c) {
            EXPECT_EQ(bits(mh[c]), bits(rmh[c])) << what << " input_grad mh, channel " << c;
            EXPECT_EQ(bits(ml[c]), bits(rml[c])) << what << " input_grad ml, channel " << c;
            EXPECT_EQ(bits(r[c]), bits(rr[c])) << what << " input_grad r, channel " << c;
            EXPECT_EQ(bits(c0[c]), bits(rc0[c])) << what << " input_grad c0, channel " << c;
            EXPECT_EQ(bits(c2[c]), bits(rc2[c])) << what << " input_grad c2, channel " << c;
          }
          EXPECT_TRUE(mh[nc] == mark && ml[nc] == mark && r[nc] == mark && c0[nc] == mark && c2[nc] == mark)
              << what << " wrote past the end";
        }
      }
    }
  }
  set_isa(saved);
}

}  // namespace
}  // namespace normlab
