// The storage of BasicTensor (tensor.h, "storage"): 2 MiB and more in a mapping of its own on transparent
// huge pages. Kept apart from tensor.cpp so that scripts/ab-rows can compile it into its standalone program.
#include <normlab/tensor.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace normlab {

namespace detail {

// Not in an AddressSanitizer build: memory of its own mapping would have no redzones there.
bool huge_page_storage(std::size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE) && !defined(__SANITIZE_ADDRESS__)
  if (bytes < kHugePageBytes) return false;
  const char* env = std::getenv("NORMLAB_HUGE_PAGES");
  return !(env && std::strcmp(env, "0") == 0);
#else
  (void)bytes;
  return false;
#endif
}

namespace {
std::size_t round_up(std::size_t n, std::size_t to) {
  return (n + to - 1) / to * to;
}

// The page each mapping has beyond its data's length, for the data's offset (storage_offset). The bounds of
// the kept mappings count their data's pages only (held), so that two freed tensors of 128 MiB each stay
// kept within kStorageCacheBytes, as they did before the offsets.
constexpr std::size_t kOffsetPage = kPageBytes;
std::size_t held(std::size_t mapped) {
  return mapped - kOffsetPage;
}

// Freed mappings kept for the next allocation of about their length (see allocate_storage), oldest first.
// Never destroyed: a tensor freed by another static's destructor at exit still finds it.
struct MappingCache {
  MappingCache() { kept.reserve(kStorageCacheMappings); }
  std::mutex mu;
  std::vector<Storage> kept;
  std::size_t bytes = 0;
};
MappingCache& mapping_cache() {
  static MappingCache* const cache = new MappingCache;
  return *cache;
}
}  // namespace

// (The data pages of the kept mappings, without their offset pages.)
std::size_t storage_cache_bytes() {
  MappingCache& c = mapping_cache();
  const std::lock_guard<std::mutex> lock(c.mu);
  return c.bytes;
}

// The huge-page path first takes a kept mapping (free_storage) of len to len + len/8 bytes, the shortest
// such, where len is bytes rounded up to a page (kPageBytes) plus one page for the offset below. Otherwise it
// maps len plus 2 MiB of slack, unmaps the slack before the first 2 MiB boundary and after the end, and
// advises what is left. Only the whole 2 MiB pieces can become huge pages; the kernel leaves a shorter tail
// in 4 KiB pages. A refused madvise (a kernel without THP) is not an error: the memory is still there, in
// 4 KiB pages. The data start detail::storage_offset(k) bytes into the mapping, k counting these
// allocations (tensor.h, "storage").
Storage allocate_storage(std::size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (huge_page_storage(bytes)) {
    static std::atomic<unsigned> next{0};
    const std::size_t offset = storage_offset(next.fetch_add(1, std::memory_order_relaxed));
    const std::size_t len = round_up(bytes, kPageBytes) + kOffsetPage;
    {
      MappingCache& c = mapping_cache();
      const std::lock_guard<std::mutex> lock(c.mu);
      auto best = c.kept.end();
      for (auto it = c.kept.begin(); it != c.kept.end(); ++it)
        if (it->mapped >= len && it->mapped - len <= len / 8 &&
            (best == c.kept.end() || it->mapped < best->mapped))
          best = it;
      if (best != c.kept.end()) {
        const Storage st = *best;
        c.kept.erase(best);
        c.bytes -= held(st.mapped);
        return {static_cast<char*>(st.p) + offset, st.mapped};
      }
    }
    const std::size_t span = len + kHugePageBytes;
    void* m = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    char* const base = static_cast<char*>(m);
    char* const p = reinterpret_cast<char*>(round_up(reinterpret_cast<std::uintptr_t>(base), kHugePageBytes));
    const std::size_t head = static_cast<std::size_t>(p - base);
    if (head > 0) munmap(base, head);
    if (span - head > len) munmap(p + len, span - head - len);
    madvise(p, len, MADV_HUGEPAGE);
    return {p + offset, len};
  }
#endif
  return {::operator new(bytes, std::align_val_t(kAlignment)), 0};
}

void free_storage(void* p, std::size_t mapped) noexcept {
  if (!p) return;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (mapped > 0) {
    p = mapping_start(p);
    // Kept for reuse while the kept mappings stay within kStorageCacheBytes and kStorageCacheMappings (the
    // oldest unmapped to make room); a longer one is unmapped at once.
    if (held(mapped) <= kStorageCacheBytes) {
      MappingCache& c = mapping_cache();
      const std::lock_guard<std::mutex> lock(c.mu);
      while (!c.kept.empty() &&
             (c.bytes + held(mapped) > kStorageCacheBytes || c.kept.size() >= kStorageCacheMappings)) {
        munmap(c.kept.front().p, c.kept.front().mapped);
        c.bytes -= held(c.kept.front().mapped);
        c.kept.erase(c.kept.begin());
      }
      c.kept.push_back({p, mapped});  // within the capacity reserved: never allocates
      c.bytes += held(mapped);
      return;
    }
    munmap(p, mapped);
    return;
  }
#endif
  ::operator delete(p, std::align_val_t(kAlignment));
}

}  // namespace detail

}  // namespace normlab
