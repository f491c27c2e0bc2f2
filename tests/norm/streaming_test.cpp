// The streaming-store threshold (src/norm/streaming.h): its default, the scope that lowers it for tests,
// and that it never changes a result. The per-area tests of the streaming paths (BatchNorm, GroupNorm and
// InstanceNorm, [B,F,T] columns, the fused add, bf16/fp16 storage) run at a lowered threshold on small
// tensors; this pins what they stand in for.
#include "norm/streaming.h"

#include <normlab/norm.h>
#include <normlab/parallel.h>
#include <normlab/simd.h>

#include <random>

#include "support/random.h"
#include "support/tolerance.h"

namespace normlab {
namespace {

using testing::bitwise_equal;

TEST(Streaming, ThresholdIs16MiBUnlessAScopeLowersIt) {
  EXPECT_EQ(kernels::kStreamMinBytes, std::int64_t{16} << 20);
  EXPECT_EQ(kernels::stream_min_bytes(), kernels::kStreamMinBytes);
  EXPECT_TRUE(kernels::stream_output_bytes(std::int64_t{16} << 20));
  EXPECT_FALSE(kernels::stream_output_bytes((std::int64_t{16} << 20) - 1));
  {
    const kernels::ScopedStreamMinBytes lowered(4096);
    EXPECT_TRUE(kernels::stream_output_bytes(4096));
    EXPECT_FALSE(kernels::stream_output_bytes(4095));
    {
      const kernels::ScopedStreamMinBytes every(0);
      EXPECT_TRUE(kernels::stream_output_bytes(0));
    }
    EXPECT_EQ(kernels::stream_min_bytes(), 4096);
  }
  EXPECT_EQ(kernels::stream_min_bytes(), kernels::kStreamMinBytes);
  EXPECT_NL_ERROR(kernels::ScopedStreamMinBytes(-1),
                  "streaming-store threshold must be at least 0 bytes, got -1");
  EXPECT_EQ(kernels::stream_min_bytes(), kernels::kStreamMinBytes);
}

// LayerNorm forward and backward with every output streamed (threshold 0) and none (the default, for
// these sizes): the same bits on every target, for rows of the eight-row kernels (64), the pipelined
// forward (4096) and the per-row kernels (1025), and over the middle axis of [B,F,T].
TEST(Streaming, TheThresholdNeverChangesAResult) {
  std::mt19937_64 rng(91);
  struct Case {
    Dims shape;
    Axes axes;
  };
  for (const Case& c :
       {Case{{300, 64}, {1}}, Case{{9, 4096}, {1}}, Case{{21, 1025}, {1}}, Case{{3, 80, 200}, {1}}}) {
    const Tensor x = testing::random_tensor(c.shape, rng, 1.0, 2.0),
                 dy = testing::random_tensor(c.shape, rng, 1.0, 0.0);
    const Index d = c.shape[1];
    const Tensor w = testing::random_tensor(Dims{d}, rng, 0.5, 1.0),
                 b = testing::random_tensor(Dims{d}, rng, 0.5, 0.0);
    auto run = [&] {
      Tensor y(c.shape), dx(c.shape), dw(Dims{d}), db(Dims{d});
      layer_norm_forward(y.view(), {}, {}, x.cview(), w.cview(), b.cview(), c.axes);
      layer_norm_backward(dx.view(), dw.view(), db.view(), dy.cview(), x.cview(), w.cview(), c.axes);
      return std::tuple(std::move(y), std::move(dx), std::move(dw), std::move(db));
    };
    const Isa saved_isa = active_isa();
    for (Isa isa : supported_isas()) {
      set_isa(isa);
      SCOPED_TRACE(fmt::format("{} shape {}", isa_name(isa), c.shape.str()));
      const auto [y0, dx0, dw0, db0] = run();
      const kernels::ScopedStreamMinBytes every(0);
      const auto [y, dx, dw, db] = run();
      EXPECT_TRUE(bitwise_equal(y.cview(), y0.cview(), "y"));
      EXPECT_TRUE(bitwise_equal(dx.cview(), dx0.cview(), "dx"));
      EXPECT_TRUE(bitwise_equal(dw.cview(), dw0.cview(), "dγ"));
      EXPECT_TRUE(bitwise_equal(db.cview(), db0.cview(), "dβ"));
    }
    set_isa(saved_isa);
  }
}

// Out of cache the row drivers give each forward call at least 16 rows (plan::task_rows with stream): calls
// of 16 rows and a shorter last one at D = 2048 and 4096 (8 rows per call in cache), a single row of 8192,
// and 1024 (16 rows either way). LayerNorm (mean and rstd too) and RMSNorm, streamed at 1, 2 and 3
// threads, against the in-cache result at 1 thread: the same bits.
TEST(Streaming, OutOfCacheTasksKeepTheBitsAtAnyThreadCount) {
  std::mt19937_64 rng(92);
  const int saved_threads = num_threads();
  for (const Dims& shape : {Dims{37, 2048}, Dims{16, 4096}, Dims{17, 4096}, Dims{1, 8192}, Dims{35, 1024}}) {
    const Tensor x = testing::random_tensor(shape, rng, 1.0, 2.0);
    const Index d = shape[1];
    const Tensor w = testing::random_tensor(Dims{d}, rng, 0.5, 1.0),
                 b = testing::random_tensor(Dims{d}, rng, 0.5, 0.0);
    auto run = [&] {
      Tensor y(shape), mean(Dims{shape[0]}), rstd(Dims{shape[0]}), yr(shape), rr(Dims{shape[0]});
      layer_norm_forward(y.view(), mean.view(), rstd.view(), x.cview(), w.cview(), b.cview(), {1});
      rms_norm_forward(yr.view(), rr.view(), x.cview(), w.cview(), {1});
      return std::tuple(std::move(y), std::move(mean), std::move(rstd), std::move(yr), std::move(rr));
    };
    set_num_threads(1);
    const auto [y0, m0, r0, yr0, rr0] = run();
    const kernels::ScopedStreamMinBytes every(0);
    for (int t : {1, 2, 3}) {
      set_num_threads(t);
      SCOPED_TRACE(fmt::format("{} threads shape {}", t, shape.str()));
      const auto [y, m, r, yr, rr] = run();
      EXPECT_TRUE(bitwise_equal(y.cview(), y0.cview(), "y"));
      EXPECT_TRUE(bitwise_equal(m.cview(), m0.cview(), "mean"));
      EXPECT_TRUE(bitwise_equal(r.cview(), r0.cview(), "rstd"));
      EXPECT_TRUE(bitwise_equal(yr.cview(), yr0.cview(), "RMSNorm y"));
      EXPECT_TRUE(bitwise_equal(rr.cview(), rr0.cview(), "RMSNorm rstd"));
    }
  }
  set_num_threads(saved_threads);
}

}  // namespace
}  // namespace normlab
