// Memory that kernels read as a stream (packed weights) and the bandwidth probe that figures are
// compared with: one allocation rule for both, so a fraction of "the bandwidth" compares reads
// made under the same page conditions.
//
// From 2 MiB up: 2 MiB aligned, with a transparent-huge-page hint (madvise; Linux's default THP
// mode honours only hinted ranges), since streaming a set larger than the TLB's reach from 4 KiB
// pages pays a page walk every 4 KiB. The packed weights were allocated so before the probe was:
// on one 2-core Zen 4 VM the 1 GiB probe read 29-35 GB/s in 4 KiB pages, and with the hint
// either 36-37 or 56-67 GB/s from run to run (bimodal, the buffer 100% in 2 MiB pages in both
// modes: the hint is not the whole story there, the host's backing of guest memory likely is).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace fp4moe {

struct StreamedFree {
  void operator()(uint8_t* p) const;
};
using StreamedBuffer = std::unique_ptr<uint8_t, StreamedFree>;

// At least `bytes` (rounded up to the alignment); empty when out of memory.
StreamedBuffer allocate_streamed(size_t bytes);

// The fraction of [p, p + bytes) the kernel backs with huge pages (AnonHugePages of the mappings
// it lies in, /proc/self/smaps), or -1 where that cannot be read. The hint is only a hint (a
// fragmented host falls back to 4 KiB pages): bench_peaks prints this beside its bandwidth.
double huge_page_fraction(const void* p, size_t bytes);

}  // namespace fp4moe
