// allocate_streamed and huge_page_fraction (core/streamed_memory.h).
#include "core/streamed_memory.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <vector>

namespace fp4moe {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(StreamedMemory, LargeBuffersAre2MiBAlignedSmallOnes64Bytes) {
  for (size_t bytes : {size_t{1}, size_t{64}, size_t{4096}, 2 * kMiB - 1, 2 * kMiB, 5 * kMiB + 3}) {
    const StreamedBuffer b = allocate_streamed(bytes);
    ASSERT_NE(b, nullptr) << bytes;
    const size_t align = bytes >= 2 * kMiB ? 2 * kMiB : 64;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.get()) % align, 0u) << bytes;
    std::memset(b.get(), 0xA5, bytes);  // the whole size is usable (ASan checks the bound)
  }
}

// The smaps reader finds the mapping of memory this process owns: a fraction in [0, 1], not -1.
// (Whether the host grants huge pages is not the reader's to promise, so the value is not.)
TEST(StreamedMemory, HugePageFractionFindsTheBufferMapping) {
  if (!std::ifstream("/proc/self/smaps")) GTEST_SKIP() << "no /proc/self/smaps";
  const size_t bytes = 8 * kMiB;
  const StreamedBuffer b = allocate_streamed(bytes);
  ASSERT_NE(b, nullptr);
  std::memset(b.get(), 1, bytes);
  const double f = huge_page_fraction(b.get(), bytes);
  EXPECT_GE(f, 0.0);
  EXPECT_LE(f, 1.0);
  std::vector<uint8_t> small(4096, 1);
  const double g = huge_page_fraction(small.data(), small.size());
  EXPECT_GE(g, 0.0);
  EXPECT_LE(g, 1.0);
}

TEST(StreamedMemory, HugePageFractionOfNoMappingIsUnknown) {
  EXPECT_EQ(huge_page_fraction(nullptr, 0), -1);
  // The first page is never mapped: no mapping holds it.
  EXPECT_EQ(huge_page_fraction(reinterpret_cast<const void*>(uintptr_t{4096}), 4096), -1);
}

}  // namespace
}  // namespace fp4moe
