// The streaming-store threshold (src/norm/streaming.h): its default, the scope that lowers it for tests,
// and that it never changes a result. The per-area tests of the streaming paths (BatchNorm, GroupNorm and
// InstanceNorm, [B,F,T] columns, the fused add, bf16/fp16 storage) run at a lowered threshold on small
// tensors; this pins what they stand in for.
#include "norm/streaming.h"

#include <normlab/norm.h>
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

}  // namespace
}  // namespace normlab
