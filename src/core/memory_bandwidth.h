// Measures this machine's memory read bandwidth, so benchmarks can print ratios against a limit
// measured in the same run rather than bare times.
#pragma once

#include <cstddef>

namespace fp4moe {

struct BandwidthMeasurement {
  double gbps = 0.0;  // best of the repetitions, 1e9 bytes per second
  size_t bytes = 0;   // bytes read per repetition
  int threads = 1;
};

// Streams `bytes` (rounded to 4 KiB) with `threads` threads, best of `repetitions`. Use a size well
// beyond the last-level cache (>= 256 MiB) for DRAM, a small one for cache bandwidth.
BandwidthMeasurement measure_read_bandwidth(size_t bytes, int threads, int repetitions = 5);

}  // namespace fp4moe
