// Read bandwidth: a streaming sum over a buffer that is first written (so its pages exist), timed
// with a steady clock; the sum is kept so the compiler cannot drop the loop.
#include "core/memory_bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace fp4moe {
namespace {

// Eight independent accumulators keep several loads in flight; the compiler vectorizes the adds.
uint64_t sum_words(const uint64_t* data, size_t count) {
  uint64_t acc[8] = {};
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += data[i + j];
  }
  for (; i < count; ++i) acc[0] += data[i];
  uint64_t total = 0;
  for (uint64_t a : acc) total += a;
  return total;
}

}  // namespace

BandwidthMeasurement measure_read_bandwidth(size_t bytes, int threads, int repetitions) {
  bytes = std::max<size_t>(bytes / 4096 * 4096, 4096);
  threads = std::max(threads, 1);
  const size_t words = bytes / sizeof(uint64_t);
  std::unique_ptr<uint64_t[]> buffer(new uint64_t[words]);
  for (size_t i = 0; i < words; ++i) buffer[i] = i;
  volatile uint64_t sink = 0;
  double best_seconds = 1e30;
  for (int rep = 0; rep < repetitions; ++rep) {
    std::vector<uint64_t> partial(static_cast<size_t>(threads), 0);
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> workers;
    const size_t chunk = words / static_cast<size_t>(threads);
    for (int t = 0; t < threads; ++t) {
      const size_t begin = chunk * static_cast<size_t>(t);
      const size_t count = t == threads - 1 ? words - begin : chunk;
      workers.emplace_back([&, t, begin, count] {
        partial[static_cast<size_t>(t)] = sum_words(buffer.get() + begin, count);
      });
    }
    for (auto& w : workers) w.join();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best_seconds = std::min(best_seconds, seconds);
    for (uint64_t p : partial) sink = sink + p;
  }
  (void)sink;
  return {static_cast<double>(bytes) / best_seconds / 1e9, bytes, threads};
}

}  // namespace fp4moe
