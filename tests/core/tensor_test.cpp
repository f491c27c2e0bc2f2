// Strided views and owning tensors: views of views without copies, shapes, errors.
#include <normlab/tensor.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "support/tolerance.h"

namespace normlab {
namespace {

Tensor iota(Dims shape) {
  Tensor t(shape);
  for (Index i = 0; i < t.numel(); ++i) t[i] = static_cast<float>(i);
  return t;
}

TEST(Tensor, OwningTensorIsAlignedAndZeroed) {
  for (Index n : {1, 3, 17, 1000}) {
    Tensor t({n});
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data()) % kAlignment, 0u);
    for (Index i = 0; i < n; ++i) EXPECT_EQ(t[i], 0.0f);
  }
  Tensor e({0, 4});
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(e.data()) % kAlignment, 0u);
}

// The VmFlags line of the mapping that holds p, from /proc/self/smaps ("" where there is none).
std::string vm_flags_of(const void* p) {
  std::FILE* f = std::fopen("/proc/self/smaps", "r");
  if (!f) return "";
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  char line[512];
  bool inside = false;
  std::string flags;
  while (std::fgets(line, sizeof line, f)) {
    unsigned long lo = 0, hi = 0;
    char dash = 0;
    if (std::sscanf(line, "%lx%c%lx ", &lo, &dash, &hi) == 3 && dash == '-') {
      inside = lo <= a && a < hi;
      continue;
    }
    if (inside && std::string(line).rfind("VmFlags:", 0) == 0) {
      flags = line;
      break;
    }
  }
  std::fclose(f);
  return flags;
}

// Sets (or, with nullptr, unsets) an environment variable for a scope and puts the outer value back.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* outer = std::getenv(name);
    had_ = outer != nullptr;
    if (outer) outer_ = outer;
    set(value);
  }
  ~ScopedEnv() { had_ ? setenv(name_, outer_.c_str(), 1) : unsetenv(name_); }
  void set(const char* value) { value ? setenv(name_, value, 1) : unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string outer_;
};

// tensor.h, "storage": 2 MiB or more in a mapping of its own, starting on a 2 MiB boundary, advised for
// transparent huge pages ("hg" in the mapping's VmFlags); less than that, or with NORMLAB_HUGE_PAGES=0, or in
// an AddressSanitizer build, from the aligned operator new. Zeroed and writable to the last element either
// way.
TEST(Tensor, LargeStorageIsAdvisedForHugePagesUnlessTurnedOff) {
  const Index big = static_cast<Index>(kHugePageBytes / sizeof(float)) + 1001;  // 2 MiB and a tail
  // A kernel built without transparent huge pages has no such file and refuses the advice (the memory is
  // then in 4 KiB pages): everything but the advice flag is checked there, and the test says so.
  std::FILE* const thp_file = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  const bool thp = thp_file != nullptr;
  if (thp_file) std::fclose(thp_file);
  ScopedEnv env("NORMLAB_HUGE_PAGES", nullptr);
  EXPECT_FALSE(detail::huge_page_storage(kHugePageBytes - 1));
  {
    Tensor t({big});
    const auto addr = reinterpret_cast<std::uintptr_t>(t.data());
    EXPECT_EQ(addr % kAlignment, 0u);
    EXPECT_EQ(t[0], 0.0f);
    EXPECT_EQ(t[big - 1], 0.0f);
    t[big - 1] = 7.0f;
    Tensor moved = std::move(t);  // the storage (and its unmapping) goes with it
    EXPECT_EQ(moved[big - 1], 7.0f);
#if defined(__linux__) && !defined(__SANITIZE_ADDRESS__)
    EXPECT_TRUE(detail::huge_page_storage(kHugePageBytes));
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(detail::mapping_start(moved.data())) % kHugePageBytes, 0u);
    if (thp) {
      EXPECT_NE(vm_flags_of(moved.data()).find(" hg"), std::string::npos) << vm_flags_of(moved.data());
    }
#else
    EXPECT_FALSE(detail::huge_page_storage(kHugePageBytes));
#endif
  }
  env.set("0");
  EXPECT_FALSE(detail::huge_page_storage(kHugePageBytes));
  {
    Tensor t({big});
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data()) % kAlignment, 0u);
    EXPECT_EQ(vm_flags_of(t.data()).find(" hg"), std::string::npos);
    EXPECT_EQ(t[big - 1], 0.0f);
  }
  if (!thp) GTEST_SKIP() << "no transparent huge pages in this kernel: the advice flag was not checked";
}

// tensor.h, "storage": a freed mapping is kept and taken by the next allocation of its length or up to 1/8
// shorter (zeroed again by BasicTensor), within kStorageCacheBytes and kStorageCacheMappings. Where no
// allocation is a mapping of its own (an AddressSanitizer build, not Linux), nothing is kept.
TEST(Tensor, FreedMappingsAreKeptForReuseWithinTheirBounds) {
  ScopedEnv env("NORMLAB_HUGE_PAGES", nullptr);
  const Index big = static_cast<Index>(3 * kHugePageBytes / sizeof(float));  // 6 MiB
  if (!detail::huge_page_storage(kHugePageBytes)) {
    { Tensor t({big}); }
    EXPECT_EQ(detail::storage_cache_bytes(), 0u);
    return;
  }
  // The same mapping again: the same start, the data at another offset in it (detail::storage_offset).
  auto start = [](Tensor& t) { return detail::mapping_start(t.data()); };
  const void* first = nullptr;
  {
    Tensor t({big});
    first = start(t);
    t[5] = 3.0f;
  }
  EXPECT_GE(detail::storage_cache_bytes(), 3 * kHugePageBytes);
  {
    Tensor t({big});
    EXPECT_EQ(start(t), first);
    EXPECT_EQ(t[5], 0.0f);
    t[big - 1] = 1.0f;  // the last element, whatever the offset, lies in the mapping
  }
  {
    Tensor t({big - big / 10});  // within 1/8 shorter: the same mapping
    EXPECT_EQ(start(t), first);
    EXPECT_EQ(t[5], 0.0f);
  }
  {
    Tensor t({big / 2 + 4096});  // much shorter: a mapping of its own, while the 6 MiB one stays kept
    EXPECT_NE(start(t), first);
    Tensor u({big});
    EXPECT_EQ(start(u), first);
  }
  // The bounds: four mappings of 100 MiB (never touched) freed keep at most kStorageCacheBytes; twenty of
  // 2 MiB after them leave at most kStorageCacheMappings of those.
  std::vector<detail::Storage> kept;
  for (int i = 0; i < 4; ++i) kept.push_back(detail::allocate_storage(std::size_t{100} << 20));
  for (const detail::Storage& st : kept) detail::free_storage(st.p, st.mapped);
  EXPECT_LE(detail::storage_cache_bytes(), kStorageCacheBytes);
  EXPECT_GE(detail::storage_cache_bytes(), std::size_t{200} << 20);
  kept.clear();
  for (int i = 0; i < 20; ++i) kept.push_back(detail::allocate_storage(kHugePageBytes));
  for (const detail::Storage& st : kept) detail::free_storage(st.p, st.mapped);
  EXPECT_LE(detail::storage_cache_bytes(), kStorageCacheMappings * kHugePageBytes);
  // Two freed tensors of 128 MiB (a Python forward's converted input and its result) are both kept: the
  // bounds count the data's pages, not the page each mapping adds for its offset.
  kept.clear();
  for (int i = 0; i < 2; ++i) kept.push_back(detail::allocate_storage(kStorageCacheBytes / 2));
  for (const detail::Storage& st : kept) detail::free_storage(st.p, st.mapped);
  EXPECT_EQ(detail::storage_cache_bytes(), kStorageCacheBytes);
}

// tensor.h, "storage": the data of consecutive mapped allocations start 512·((5k) mod 8) bytes into their
// mappings, so that two tensors made one after the other are 1024 or 1536 bytes apart in their pages (four
// at a time, no two at one offset); the mapping still starts on a 2 MiB boundary and holds every element.
TEST(Tensor, MappedStorageIsStaggeredWithinItsPages) {
  EXPECT_EQ(detail::storage_offset(0), 0u);
  EXPECT_EQ(detail::storage_offset(1), 2560u);
  EXPECT_EQ(detail::storage_offset(2), 1024u);
  EXPECT_EQ(detail::storage_offset(8), 0u);
  for (unsigned k = 0; k < 8; ++k) {
    const std::size_t a = detail::storage_offset(k), b = detail::storage_offset(k + 1);
    const std::size_t apart = (b + 4096 - a) % 4096;
    EXPECT_EQ(std::min(apart, 4096 - apart), 1536u) << k;
    EXPECT_EQ(a % kAlignment, 0u);
  }
  ScopedEnv env("NORMLAB_HUGE_PAGES", nullptr);
  // Where nothing is mapped (an AddressSanitizer build, not Linux, NORMLAB_HUGE_PAGES=0) nothing is
  // staggered either: the offsets above are all there is to check.
  if (!detail::huge_page_storage(kHugePageBytes)) return;
  const Index big = static_cast<Index>(kHugePageBytes / sizeof(float));  // exactly 2 MiB
  std::vector<Tensor> ts;
  std::vector<std::size_t> offsets;
  for (int i = 0; i < 4; ++i) {
    ts.emplace_back(Dims{big});
    const auto addr = reinterpret_cast<std::uintptr_t>(ts.back().data());
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(detail::mapping_start(ts.back().data())) % kHugePageBytes, 0u);
    offsets.push_back(addr % 4096);
    ts.back()[big - 1] = 1.0f;
  }
  std::sort(offsets.begin(), offsets.end());
  EXPECT_EQ(std::unique(offsets.begin(), offsets.end()), offsets.end());
}

TEST(Tensor, ContiguousStridesAreRowMajor) {
  EXPECT_EQ(contiguous_strides({2, 3, 4}), (Dims{12, 4, 1}));
  Tensor t = iota({2, 3, 4});
  EXPECT_TRUE(t.view().is_contiguous());
  EXPECT_EQ(t.view().at({1, 2, 3}), 23.0f);
}

TEST(Tensor, PermuteSliceSelectShareStorage) {
  Tensor t = iota({2, 3, 4});
  View p = t.view().permute({2, 0, 1});  // [4, 2, 3]
  EXPECT_EQ(p.shape(), (Dims{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Dims{1, 12, 4}));
  EXPECT_EQ(p.at({3, 1, 2}), t.view().at({1, 2, 3}));
  EXPECT_FALSE(p.is_contiguous());
  EXPECT_EQ(p.data(), t.data());

  View s = t.view().slice(2, 1, 4, 2);  // columns 1, 3
  EXPECT_EQ(s.shape(), (Dims{2, 3, 2}));
  EXPECT_EQ(s.at({0, 0, 1}), 3.0f);
  View r = t.view().slice(2, 3, -1, -1);  // reversed last axis
  EXPECT_EQ(r.shape(), (Dims{2, 3, 4}));
  EXPECT_EQ(r.stride(2), -1);
  EXPECT_EQ(r.at({0, 0, 0}), 3.0f);
  EXPECT_EQ(r.at({1, 2, 3}), 20.0f);

  View sel = t.view().select(1, 2);  // [2, 4]
  EXPECT_EQ(sel.shape(), (Dims{2, 4}));
  EXPECT_EQ(sel.at({1, 0}), 20.0f);
  // A view of a view of a view.
  View vvv = t.view().permute({1, 0, 2}).slice(0, 1, 3).select(2, 1);  // [2 (rows 1..2), 2]
  EXPECT_EQ(vvv.shape(), (Dims{2, 2}));
  EXPECT_EQ(vvv.at({1, 1}), t.view().at({1, 2, 1}));

  // Writes through a view land in the owner.
  sel.at({0, 0}) = -1;
  EXPECT_EQ(t[8], -1.0f);
}

TEST(Tensor, CopyOfMakesContiguousCopies) {
  Tensor t = iota({3, 4});
  Tensor c = Tensor::copy_of(t.cview().transpose(0, 1));
  EXPECT_EQ(c.shape(), (Dims{4, 3}));
  EXPECT_TRUE(c.view().is_contiguous());
  EXPECT_EQ(c[1], 4.0f);
  EXPECT_EQ(c[3], 1.0f);
  BasicTensor<double> d = BasicTensor<double>::copy_of(t.cview());
  EXPECT_EQ(d[11], 11.0);
  // A contiguous view of the same type (copied at once): every element, in storage of its own.
  Tensor same = Tensor::copy_of(t.cview());
  EXPECT_NE(same.data(), t.data());
  for (Index i = 0; i < 12; ++i) EXPECT_EQ(same[i], t[i]) << i;
  Tensor row = Tensor::copy_of(t.cview().select(0, 2));  // contiguous, not at the start
  EXPECT_EQ(row.shape(), (Dims{4}));
  EXPECT_EQ(row[0], 8.0f);
  EXPECT_EQ(row[3], 11.0f);
  Tensor column = Tensor::copy_of(t.cview().select(1, 1));  // strided
  EXPECT_EQ(column.shape(), (Dims{3}));
  EXPECT_EQ(column[2], 9.0f);
  EXPECT_EQ(Tensor::copy_of(Tensor({0, 5}).cview()).shape(), (Dims{0, 5}));
  Tensor scalar({}, {2.5f});
  EXPECT_EQ(Tensor::copy_of(scalar.cview())[0], 2.5f);
  // Large enough for a mapping of its own: the last element too.
  Tensor big({static_cast<Index>(kHugePageBytes / sizeof(float)) + 7});
  big[big.numel() - 1] = 4.0f;
  EXPECT_EQ(Tensor::copy_of(big.cview())[big.numel() - 1], 4.0f);
}

TEST(Tensor, ConstViewConversionAndRankZero) {
  Tensor t = iota({5});
  ConstView c = t.view();
  EXPECT_EQ(c.numel(), 5);
  View scalar = t.view().select(0, 2);
  EXPECT_EQ(scalar.rank(), 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.at({}), 2.0f);
}

TEST(Tensor, ForEachOffsetWalksRowMajor) {
  std::vector<Index> offs;
  for_each_offset({2, 3}, {1, 2}, [&](Index o) { offs.push_back(o); });
  EXPECT_EQ(offs, (std::vector<Index>{0, 2, 4, 1, 3, 5}));
  offs.clear();
  for_each_offset({2, 0}, {1, 2}, [&](Index o) { offs.push_back(o); });
  EXPECT_TRUE(offs.empty());
}

TEST(Tensor, BadInputGetsClearMessages) {
  Tensor t = iota({2, 3});
  EXPECT_NL_ERROR(t.view().permute({0, 0}), "axis 0 repeated");
  EXPECT_NL_ERROR(t.view().permute({0}), "permute order has 1 entries");
  EXPECT_NL_ERROR(t.view().slice(1, 0, 4), "out of range");
  EXPECT_NL_ERROR(t.view().slice(1, 0, 2, 0), "step must not be 0");
  EXPECT_NL_ERROR(t.view().select(0, 2), "select index 2 out of range");
  EXPECT_NL_ERROR(t.view().select(2, 0), "axis 2 is out of range");
  EXPECT_NL_ERROR(t.view().at({0, 3}), "index 3 out of range");
  EXPECT_NL_ERROR(t.view().transpose(0, 1).reshape({6}), "contiguous");
  EXPECT_NL_ERROR(t.view().reshape({4}), "cannot reshape 6 elements");
  EXPECT_NL_ERROR(Tensor({2, -1}), "negative size -1 on axis 1");
  // A shape whose element count overflows (2^62 · 4 elements; 2^31 · 2^31 · 4 bytes) is refused before its
  // product is formed, and a zero size anywhere makes any shape fit.
  EXPECT_NL_ERROR(Tensor({Index{1} << 62, 4}), "more bytes than fit in memory");
  EXPECT_NL_ERROR(Tensor({Index{1} << 31, Index{1} << 31}), "more bytes than fit in memory");
  EXPECT_EQ(Tensor({Index{1} << 62, 0, Index{1} << 62}).numel(), 0);
  EXPECT_NL_ERROR((Dims{1, 2, 3, 4, 5, 6, 7, 8, 9}), "exceeds the maximum rank 8");
  EXPECT_NL_ERROR(Tensor({2}, {1.0f, 2.0f, 3.0f}), "3 values for shape [2]");
}

}  // namespace
}  // namespace normlab
