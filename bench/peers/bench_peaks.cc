// bench_peaks: this machine's DRAM read bandwidth, FP32 FMA peak and int8 dot-product peak with
// all threads of the pool, measured now, for the peer benchmark's ratios (bench/peers/peers.py);
// on AVX2 also the int8 block dot the W4A8 kernels are built from (peaks.h), beside the peak; with
// AVX-512 VBMI the one-token decode loops' bodies in registers, in GB/s of codes; and the
// round trip of a cache line between two threads, which says how the CPUs they run on share a
// cache (on the 2-core Zen 4 VM: ~55 ns, or ~300 ns while its DRAM read ~60 GB/s instead of
// ~35: two CPUs on two dies, each with its own link to memory).
//   bench_peaks [--json] [--min-gib G] [--seconds S]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/thread_pool.h"
#include "dispatch/cpu_features.h"
#include "dispatch/measure.h"
#include "peaks.h"

namespace fp4moe::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Peak {
  std::string name;  // the instruction and vector width measured
  double gops = 0;   // 1e9 operations per second, all threads (a multiply-add counts 2)
};

// Every thread runs `loop` for the same number of iterations; the best of 3 wall-clock rounds of
// about `seconds` / 3 each. Iterations are calibrated on one thread first.
template <class Loop>
Peak measure_peak(const char* name, double ops_per_iter, Loop loop, double seconds,
                  ThreadPool& pool) {
  int64_t iters = 1 << 16;
  for (;;) {
    const auto t0 = Clock::now();
    volatile auto sink = loop(iters);
    (void)sink;
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > 0.02) {
      iters = static_cast<int64_t>(static_cast<double>(iters) * (seconds / 3) / s) + 1;
      break;
    }
    iters *= 4;
  }
  const int threads = pool.size();
  std::vector<double> sink(threads);
  Peak p{name, 0};
  for (int round = 0; round < 3; ++round) {
    const auto t0 = Clock::now();
    pool.run(threads, [&](int64_t task, int) { sink[task] = static_cast<double>(loop(iters)); });
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    p.gops = std::max(p.gops, ops_per_iter * static_cast<double>(iters) * threads / s / 1e9);
  }
  return p;
}

// Nanoseconds per round trip of one cache line between this thread and another (each waits for
// the other's store, then stores), the median of 5 rounds of up to 20000 round trips or about
// 20 ms each; -1 with one CPU (the threads would only take turns).
double core_round_trip_ns() {
  if (std::thread::hardware_concurrency() < 2) return -1;
  alignas(64) std::atomic<int64_t> line{0};
  std::atomic<bool> stop{false};
  std::thread other([&] {
    int64_t want = 1;
    while (!stop.load(std::memory_order_relaxed)) {
      if (line.load(std::memory_order_acquire) == want) {
        line.store(want + 1, std::memory_order_release);
        want += 2;
      }
    }
  });
  std::vector<double> rounds;
  int64_t next = 0;
  for (int round = 0; round < 5; ++round) {
    const auto t0 = Clock::now();
    int64_t n = 0;  // round trips completed
    while (n < 20000) {
      line.store(next + 1, std::memory_order_release);
      while (line.load(std::memory_order_acquire) != next + 2) {
      }
      next += 2;
      ++n;
      if (n % 256 == 0 && Clock::now() - t0 > std::chrono::milliseconds(20)) break;
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    rounds.push_back(s / static_cast<double>(n) * 1e9);
  }
  stop.store(true);
  other.join();
  std::sort(rounds.begin(), rounds.end());
  return rounds[rounds.size() / 2];
}

int run(int argc, char** argv) {
  bool json = false;
  double min_gib = 1.0, seconds = 0.6;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--min-gib") == 0 && i + 1 < argc) {
      min_gib = std::atof(argv[++i]);
    } else if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: bench_peaks [--json] [--min-gib G] [--seconds S]\n");
      return 2;
    }
  }
  ThreadPool& pool = ThreadPool::global();
  const auto& cpu = dispatch::cpu_features();
  const size_t bytes = static_cast<size_t>(min_gib * double(size_t{1} << 30));
  double huge = -1;
  const double bandwidth = dispatch::measure_read_bandwidth_gbps(pool, bytes, 3, &huge);
  const double round_trip = core_round_trip_ns();

  std::vector<Peak> fma, int8, mix;
  const bool avx2 = cpu.avx2 && cpu.fma && cpu.os_ymm;
  const bool avx512 = cpu.avx512f && cpu.avx512bw && cpu.os_zmm;
  if (avx2) {
    fma.push_back(measure_peak("vfmadd231ps ymm", kFmaAvx2OpsPerIter, fma_f32_avx2, seconds, pool));
    int8.push_back(
        measure_peak("vpmaddubsw ymm", kMaddubsAvx2OpsPerIter, maddubs_i8_avx2, seconds, pool));
    // Beside the int8 peak, not as it: the peer table's w4a8 fractions stay of the peak.
    mix.push_back(measure_peak("4 vpmaddubsw + 3 vpaddw + vpmaddwd + vpaddd ymm",
                               kW4a8MixAvx2OpsPerIter, w4a8_mix_avx2, seconds, pool));
  }
  if (avx512) {
    fma.push_back(
        measure_peak("vfmadd231ps zmm", kFmaAvx512OpsPerIter, fma_f32_avx512, seconds, pool));
  }
  if (avx512 && cpu.avx512vnni) {
    int8.push_back(
        measure_peak("vpdpbusd zmm", kDpbusdAvx512OpsPerIter, dpbusd_i8_avx512, seconds, pool));
  }
  // The one-token decode loops' bodies in registers, in GB/s of FP4 codes (all threads): beside
  // the DRAM figure, what each loop could read if memory kept up.
  std::vector<Peak> decode;
  const bool vbmi = __builtin_cpu_supports("avx512vbmi");
  if (avx512 && vbmi && cpu.avx512bf16) {
    decode.push_back(measure_peak("2 vpermb + 2 vpsrlw + 4 vpermw + 4 vdpbf16ps zmm / 64 B",
                                  kBf16TileMixBytesPerIter, bf16_tile_mix_avx512, seconds, pool));
  }
  if (avx512 && vbmi && cpu.avx512vnni) {
    decode.push_back(measure_peak("2 vpermb + vpsrlw + 2 vpdpbusd ymm / 32 B",
                                  kW4a8TileMixBytesPerIter, w4a8_tile_mix_avx512, seconds, pool));
  }
  // AMX tile products: reported beside the vector int8 peak, not as it (the peer table's w4a8
  // fractions are of the vector peak; these say what the tile unit could do).
  std::vector<Peak> amx;
  if (dispatch::host_supports(kernels::Isa::kAmxInt8)) {
    for (int k : {64, 16}) {
      const std::string name = "tdpbssd 16x16x" + std::to_string(k);
      amx.push_back(measure_peak(
          name.c_str(), amx_ops_per_iter(k),
          [k](int64_t iters) { return tdpbssd_i8_amx(iters, k); }, seconds, pool));
    }
  }
  auto best = [](const std::vector<Peak>& v) {
    Peak b{"none", 0};
    for (const Peak& p : v) {
      if (p.gops > b.gops) b = p;
    }
    return b;
  };
  const Peak fma_best = best(fma), int8_best = best(int8);
  if (json) {
    auto list = [](const std::vector<Peak>& v) {
      std::string s = "{";
      for (size_t i = 0; i < v.size(); ++i) {
        char buf[128];
        std::snprintf(buf, sizeof(buf), "%s\"%s\": %.2f", i ? ", " : "", v[i].name.c_str(),
                      v[i].gops);
        s += buf;
      }
      return s + "}";
    };
    std::printf(
        "{\"threads\": %d, \"cpu\": \"%s\", \"bandwidth_gbps\": %.3f, "
        "\"bandwidth_huge_page_fraction\": %.3f, \"fp32_fma_gflops\": %.2f, "
        "\"fp32_fma_instr\": \"%s\", \"int8_gops\": %.2f, \"int8_instr\": \"%s\", "
        "\"fp32_fma_all\": %s, \"int8_all\": %s, \"amx_int8_all\": %s, \"int8_mix_all\": %s, "
        "\"decode_mix_gbps\": %s, \"core_round_trip_ns\": %.1f}\n",
        pool.size(), cpu.summary().c_str(), bandwidth, huge, fma_best.gops, fma_best.name.c_str(),
        int8_best.gops, int8_best.name.c_str(), list(fma).c_str(), list(int8).c_str(),
        list(amx).c_str(), list(mix).c_str(), list(decode).c_str(), round_trip);
  } else {
    std::printf("%d threads; %s\n", pool.size(), cpu.summary().c_str());
    std::printf("DRAM read bandwidth: %.2f GB/s (%.2f GiB buffer, ", bandwidth, min_gib);
    if (huge < 0) {
      std::printf("huge pages unknown)\n");
    } else {
      std::printf("%.0f%% in 2 MiB pages)\n", huge * 100);
    }
    if (round_trip > 0) std::printf("core-to-core round trip: %.0f ns\n", round_trip);
    for (const Peak& p : fma)
      std::printf("FP32 FMA peak  %-16s %8.1f GFLOP/s\n", p.name.c_str(), p.gops);
    for (const Peak& p : int8)
      std::printf("int8 dot peak  %-16s %8.1f GOP/s\n", p.name.c_str(), p.gops);
    for (const Peak& p : amx)
      std::printf("AMX int8 peak  %-16s %8.1f GOP/s\n", p.name.c_str(), p.gops);
    for (const Peak& p : mix)
      std::printf("int8 block dot %-16s %8.1f GOP/s\n", p.name.c_str(), p.gops);
    for (const Peak& p : decode)
      std::printf("decode loop    %-16s %8.1f GB/s of codes\n", p.name.c_str(), p.gops);
  }
  return 0;
}

}  // namespace
}  // namespace fp4moe::bench

int main(int argc, char** argv) { return fp4moe::bench::run(argc, argv); }
