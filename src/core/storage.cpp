// The storage of BasicTensor (tensor.h, "storage"): 2 MiB and more in a mapping of its own on transparent
// huge pages. Kept apart from tensor.cpp so that scripts/ab-rows can compile it into its standalone program.
#include <normlab/tensor.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

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
}  // namespace

// The huge-page path maps bytes rounded up to 4 KiB plus 2 MiB of slack, unmaps the slack before the first
// 2 MiB boundary and after the end, and advises what is left. Only the whole 2 MiB pieces can become huge
// pages; the kernel leaves a shorter tail in 4 KiB pages. A refused madvise (a kernel without THP) is not
// an error: the memory is still there, in 4 KiB pages.
Storage allocate_storage(std::size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (huge_page_storage(bytes)) {
    const std::size_t len = round_up(bytes, 4096);
    const std::size_t span = len + kHugePageBytes;
    void* m = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    char* const base = static_cast<char*>(m);
    char* const p = reinterpret_cast<char*>(round_up(reinterpret_cast<std::uintptr_t>(base), kHugePageBytes));
    const std::size_t head = static_cast<std::size_t>(p - base);
    if (head > 0) munmap(base, head);
    if (span - head > len) munmap(p + len, span - head - len);
    madvise(p, len, MADV_HUGEPAGE);
    return {p, len};
  }
#endif
  return {::operator new(bytes, std::align_val_t(kAlignment)), 0};
}

void free_storage(void* p, std::size_t mapped) noexcept {
  if (!p) return;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (mapped > 0) {
    munmap(p, mapped);
    return;
  }
#endif
  ::operator delete(p, std::align_val_t(kAlignment));
}

}  // namespace detail

}  // namespace normlab
