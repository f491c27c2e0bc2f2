// Tests of the channel kernels' entries that other kernels of the table must match bit for bit
// (src/norm/channel_kernels.h).
#include "norm/channel_kernels.h"

#include <gtest/gtest.h>
#include <normlab/simd.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace normlab {
namespace {

std::uint64_t bits(double v) {
  std::uint64_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}

// segments_stats against segment_stats called segment by segment: every column entry the same bits, for
// segment lengths n = 1 .. 18 and from 20 to 65 around multiples of 8 and 16 (n ≤ 40 goes sixteen segments
// at a time, one per lane, and the rest one by one) and counts around multiples of 16, with and without dy,
// on every target. The segments hold −0.0, all −0.0 (also with every dy·e −0), a constant,
// huge and tiny values, an offset of 1e4, a NaN and ±Inf (x and dy).
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
        for (const bool with_dy : {false, true}) {
          const float* d = with_dy ? dy.data() : nullptr;
          std::vector<double> c[5];
          for (auto& v : c) v.assign(static_cast<std::size_t>(count), -7.0);  // sdy, sdyd stay without dy
          k.segments_stats({c[0].data(), c[1].data(), c[2].data(), c[3].data(), c[4].data()}, x.data(), d, n,
                           count);
          for (Index s = 0; s < count; ++s) {
            kernels::SegmentStats r;
            k.segment_stats(&r, x.data() + s * n, d ? d + s * n : nullptr, n, kernels::StatsPrefetch{});
            const std::size_t i = static_cast<std::size_t>(s);
            const std::string what = std::string(isa_name(isa)) + " n " + std::to_string(n) + " count " +
                                     std::to_string(count) + " segment " + std::to_string(s) +
                                     (with_dy ? " with dy" : "");
            EXPECT_EQ(bits(c[0][i]), bits(r.sum)) << what << " sum " << c[0][i] << " vs " << r.sum;
            EXPECT_EQ(bits(c[1][i]), bits(r.mean)) << what << " mean " << c[1][i] << " vs " << r.mean;
            EXPECT_EQ(bits(c[2][i]), bits(r.m2)) << what << " m2 " << c[2][i] << " vs " << r.m2;
            EXPECT_EQ(bits(c[3][i]), bits(with_dy ? r.sdy : -7.0)) << what << " sdy";
            EXPECT_EQ(bits(c[4][i]), bits(with_dy ? r.sdyd : -7.0)) << what << " sdyd";
          }
        }
      }
    }
  }
  set_isa(saved);
}

}  // namespace
}  // namespace normlab
