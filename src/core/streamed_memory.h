// Memory that kernels read as a stream (packed weights) and the bandwidth probe that figures are
// compared with: one allocation rule for both, so a fraction of "the bandwidth" compares reads
// made under the same page conditions.
//
// From 2 MiB up: 2 MiB aligned, with a transparent-huge-page hint (madvise; Linux's default THP
// mode honours only hinted ranges). Streaming a set larger than the TLB's reach from 4 KiB pages
// pays a page walk every 4 KiB, and a walk costs more under a hypervisor: on one 2-core Zen 4 VM
// the 1 GiB read probe measured 32-37 GB/s in 4 KiB pages and 56-67 GB/s in 2 MiB pages, while
// the packed weights were already in 2 MiB pages (so the kernels' fractions of "the bandwidth"
// were of a figure the kernels themselves did not face).
#pragma once

#include <cstddef>
#include <cstdint>

namespace fp4moe {

// `bytes` rounded up to the allocation's alignment; freed with std::free. nullptr when out of
// memory.
uint8_t* allocate_streamed(size_t bytes);

// The fraction of [p, p + bytes) the kernel backs with huge pages (AnonHugePages of the mappings
// it lies in, /proc/self/smaps), or -1 where that cannot be read. The hint is only a hint: a
// fragmented host falls back to 4 KiB pages, and benchmarks print this beside their figures.
double huge_page_fraction(const void* p, size_t bytes);

}  // namespace fp4moe
