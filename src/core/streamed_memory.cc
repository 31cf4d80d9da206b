// Streamed memory (see streamed_memory.h).
#include "core/streamed_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>

namespace fp4moe {
namespace {
constexpr size_t kHugePage = size_t{2} << 20;
}  // namespace

void StreamedFree::operator()(uint8_t* p) const { std::free(p); }

StreamedBuffer allocate_streamed(size_t bytes) {
  const size_t align = bytes >= kHugePage ? kHugePage : 64;
  const size_t rounded = (std::max<size_t>(bytes, 1) + align - 1) / align * align;
  StreamedBuffer p(static_cast<uint8_t*>(std::aligned_alloc(align, rounded)));
  if (p != nullptr && align == kHugePage) ::madvise(p.get(), rounded, MADV_HUGEPAGE);
  return p;
}

double huge_page_fraction(const void* p, size_t bytes) {
  if (bytes == 0) return -1;
  std::FILE* f = std::fopen("/proc/self/smaps", "r");
  if (f == nullptr) return -1;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p), hi = lo + bytes;
  uintptr_t vma_lo = 0, vma_hi = 0;
  size_t huge = 0;
  bool seen = false;
  char line[512];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    uintptr_t a = 0, b = 0;
    unsigned long long kb = 0;
    if (std::sscanf(line, "%" SCNxPTR "-%" SCNxPTR " ", &a, &b) == 2) {
      vma_lo = a;
      vma_hi = b;
    } else if (std::sscanf(line, "AnonHugePages: %llu kB", &kb) == 1 && vma_lo < hi &&
               lo < vma_hi) {
      seen = true;
      // A mapping that reaches past the range counts at most its overlap with it.
      const size_t overlap = std::min(hi, vma_hi) - std::max(lo, vma_lo);
      huge += std::min<size_t>(static_cast<size_t>(kb) << 10, overlap);
    }
  }
  std::fclose(f);
  return seen ? std::min(1.0, static_cast<double>(huge) / static_cast<double>(bytes)) : -1;
}

}  // namespace fp4moe
