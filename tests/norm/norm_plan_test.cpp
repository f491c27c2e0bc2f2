// plan::split_rows (src/norm/norm_plan.h): how rows (or segments, groups, channels) are cut into one range
// per thread and tasks within it. Every row in exactly one task, in order; a thread's range contiguous
// (parallel_for's static schedule gives thread j the tasks of range j); ranges within a block of each other;
// no task longer than `chunk`, nor than max_rows rounded up to a block.
#include "norm/norm_plan.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace normlab {
namespace {

struct Case {
  Index groups, n, max_rows;
  int threads;
  Index block;
};

void check_split(const Case& c) {
  SCOPED_TRACE(fmt::format("groups {}, n {}, max_rows {}, threads {}, block {}", c.groups, c.n, c.max_rows,
                           c.threads, c.block));
  const plan::RowSplit s = plan::split_rows(c.groups, c.n, c.max_rows, c.threads, c.block);
  ASSERT_EQ(s.tasks, s.ranges * s.range_tasks);
  ASSERT_GE(s.ranges, 1);
  EXPECT_LE(s.ranges, std::max(c.threads, 1));
  EXPECT_LE(s.ranges, std::max<Index>(c.groups, 1));
  Index next = 0, most = 0;
  std::vector<Index> per_range(static_cast<std::size_t>(s.ranges), 0);
  for (Index t = 0; t < s.tasks; ++t) {
    const Index rows = s.rows(t);
    ASSERT_GE(rows, 0);
    if (rows == 0) continue;
    EXPECT_EQ(s.first(t), next) << "task " << t;  // in order, no gap, no overlap
    next += rows;
    most = std::max(most, rows);
    per_range[static_cast<std::size_t>(t / s.range_tasks)] += rows;
    // Whole blocks but for the very last task.
    if (next < c.groups) {
      EXPECT_EQ(rows % s.unit, 0) << "task " << t;
    }
  }
  EXPECT_EQ(next, c.groups);
  EXPECT_LE(most, s.chunk);
  EXPECT_LE(s.chunk, (std::max<Index>(c.max_rows, 1) + s.unit - 1) / s.unit * s.unit);
  const auto [lo, hi] = std::minmax_element(per_range.begin(), per_range.end());
  EXPECT_LE(*hi - *lo, s.unit) << "ranges of " << *lo << " and " << *hi << " rows";
  EXPECT_GT(*lo, 0) << "a thread without rows";  // (never more ranges than rows)
}

TEST(SplitRows, EveryRowOnceInRangesWithinABlockOfEachOther) {
  for (const Case& c : {Case{1024, 100, 163, 2, 1},  // the segments of BatchNorm [16, 64, 100]
                        Case{1024, 100, 163, 3, 1}, Case{64, 12544, 10, 2, 1}, Case{64, 12544, 5, 3, 1},
                        Case{3, Index{1} << 20, 1, 2, 8},  // few long rows: not all on one thread
                        Case{3, Index{1} << 20, 1, 4, 8}, Case{20, 1024, 1000, 2, 8},
                        Case{4096, 64, 256, 2, 8}, Case{4095, 64, 256, 3, 8}, Case{32000, 80, 204, 2, 8},
                        Case{100, 10, 1638, 2, 8},  // under 8K elements per thread: one range
                        Case{1, 10, 1, 4, 8}, Case{7, 5000, 3, 2, 1}, Case{9, 100000, 1, 8, 8}}) {
    check_split(c);
  }
}

TEST(SplitRows, ShapesThatSplit) {
  // Eight-row blocks where every range gets one; the long rows one by one.
  const plan::RowSplit a = plan::split_rows(20, 1024, 1000, 2);
  EXPECT_EQ(a.unit, 8);
  EXPECT_EQ(a.ranges, 2);
  ASSERT_EQ(a.tasks, 2);
  EXPECT_EQ(a.rows(0), 8);  // one block of eight, and two (the last one short)
  EXPECT_EQ(a.rows(1), 12);
  const plan::RowSplit b = plan::split_rows(3, Index{1} << 20, 1, 2);
  EXPECT_EQ(b.unit, 1);
  EXPECT_EQ(b.ranges, 2);
  EXPECT_EQ(b.tasks, 4);  // (ranges of one and two rows, two tasks each)
  // Nothing to split.
  EXPECT_EQ(plan::split_rows(0, 100, 10, 2).tasks, 0);
  EXPECT_EQ(plan::split_rows(100, 10, 1638, 2).ranges, 1);
}

TEST(TaskRows, AboutSixteenKiElementsAndSixteenRowsOutOfCache) {
  EXPECT_EQ(plan::task_rows(64), 256);
  EXPECT_EQ(plan::task_rows(80), 204);
  EXPECT_EQ(plan::task_rows(4096), 4);
  EXPECT_EQ(plan::task_rows(Index{1} << 20), 1);
  EXPECT_EQ(plan::task_rows(0), 16384);  // (n taken as 1)
  // Out of cache (stream): at least kStreamTaskMinRows.
  EXPECT_EQ(plan::kStreamTaskMinRows, 16);
  EXPECT_EQ(plan::task_rows(64, true), 256);
  EXPECT_EQ(plan::task_rows(1024, true), 16);
  EXPECT_EQ(plan::task_rows(2048, true), 16);
  EXPECT_EQ(plan::task_rows(4096, true), 16);
  EXPECT_EQ(plan::task_rows(Index{1} << 20, true), 16);
}

}  // namespace
}  // namespace normlab
