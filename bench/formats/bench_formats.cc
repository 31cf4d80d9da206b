// Throughput of the format layer per core on 64 MiB float32 tensors (16 Mi elements), beside this
// machine's single-core memory read bandwidth measured in the same run.
//   bench_formats                      full run
//   FP4MOE_BENCH_SMOKE=1 bench_formats a 4 MiB smoke run (CI)
// Counters: *_GBps are 1e9 bytes/s; traffic = bytes read + bytes written; ratio = traffic GB/s over
// the measured one-core read bandwidth.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "dispatch/measure.h"
#include "formats/block.h"
#include "formats/transcode.h"

namespace {

using namespace fp4moe::formats;

double g_read_bandwidth_gbps = 0.0;

int64_t element_count() {
  const bool smoke = std::getenv("FP4MOE_BENCH_SMOKE") != nullptr;
  return (smoke ? 4ll : 64ll) * 1024 * 1024 / static_cast<int64_t>(sizeof(float));
}

struct Tensors {
  int64_t cols = 4096;
  int64_t rows;
  std::vector<float> x;
  std::vector<uint8_t> packed, nv_scales, mx_scales;
  std::vector<float> y;
  float tensor_scale = 0.0f;

  Tensors()
      : rows(element_count() / 4096),
        x(element_count()),
        packed(x.size() / 2),
        nv_scales(x.size() / 16),
        mx_scales(x.size() / 32),
        y(x.size()) {
    std::mt19937 gen(7);
    std::normal_distribution<float> dist;
    for (float& v : x) v = dist(gen);
    tensor_scale = *nvfp4_tensor_scale("x", x);
    FP4MOE_CHECK(quantize_nvfp4("x", x, rows, cols, tensor_scale, packed, nv_scales).ok());
    std::vector<uint8_t> mx_packed(packed.size());
    FP4MOE_CHECK(
        quantize_mxfp4("x", x, rows, cols, MxScaleRule::kOcpFloor, mx_packed, mx_scales).ok());
  }
};

Tensors& tensors() {
  static Tensors t;
  return t;
}

void set_counters(benchmark::State& state, double bytes_in, double bytes_out) {
  const double n = static_cast<double>(state.iterations());
  state.counters["in_GBps"] = benchmark::Counter(bytes_in * n / 1e9, benchmark::Counter::kIsRate);
  state.counters["traffic_GBps"] =
      benchmark::Counter((bytes_in + bytes_out) * n / 1e9, benchmark::Counter::kIsRate);
  state.counters["read_bw_GBps"] = g_read_bandwidth_gbps;
}

void BM_QuantizeNvfp4(benchmark::State& state) {
  auto& t = tensors();
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        quantize_nvfp4("x", t.x, t.rows, t.cols, t.tensor_scale, t.packed, t.nv_scales));
  }
  set_counters(state, 4.0 * t.x.size(), t.packed.size() + t.nv_scales.size());
}

void BM_QuantizeMxfp4(benchmark::State& state) {
  auto& t = tensors();
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        quantize_mxfp4("x", t.x, t.rows, t.cols, MxScaleRule::kOcpFloor, t.packed, t.mx_scales));
  }
  set_counters(state, 4.0 * t.x.size(), t.packed.size() + t.mx_scales.size());
}

void BM_DequantizeNvfp4(benchmark::State& state) {
  auto& t = tensors();
  FP4MOE_CHECK(
      quantize_nvfp4("x", t.x, t.rows, t.cols, t.tensor_scale, t.packed, t.nv_scales).ok());
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        dequantize_nvfp4("x", t.packed, t.nv_scales, t.tensor_scale, t.rows, t.cols, t.y));
  }
  set_counters(state, t.packed.size() + t.nv_scales.size(), 4.0 * t.y.size());
}

void BM_DequantizeMxfp4(benchmark::State& state) {
  auto& t = tensors();
  for (auto _ : state) {
    benchmark::DoNotOptimize(dequantize_mxfp4("x", t.packed, t.mx_scales, t.rows, t.cols, t.y));
  }
  set_counters(state, t.packed.size() + t.mx_scales.size(), 4.0 * t.y.size());
}

void BM_TranscodeMxfp4ToNvfp4(benchmark::State& state) {
  auto& t = tensors();
  std::vector<uint8_t> out_packed(t.packed.size()), out_scales(t.nv_scales.size());
  const Mxfp4Source src{"x", t.packed, t.mx_scales, t.rows, t.cols};
  const Nvfp4Destination dst{out_packed, out_scales};
  for (auto _ : state) {
    benchmark::DoNotOptimize(transcode_mxfp4_to_nvfp4({&src, 1}, {&dst, 1}));
  }
  set_counters(state, t.packed.size() + t.mx_scales.size(), out_packed.size() + out_scales.size());
}

BENCHMARK(BM_QuantizeNvfp4)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_QuantizeMxfp4)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DequantizeNvfp4)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DequantizeMxfp4)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_TranscodeMxfp4ToNvfp4)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  const bool smoke = std::getenv("FP4MOE_BENCH_SMOKE") != nullptr;
  // One core, a buffer well past the last-level cache: the DRAM read limit of one core.
  fp4moe::ThreadPool one_core(1);  // the calling thread only
  const size_t bytes = smoke ? (size_t{64} << 20) : (size_t{512} << 20);
  g_read_bandwidth_gbps = fp4moe::dispatch::measure_read_bandwidth_gbps(one_core, bytes, 5);
  std::printf("one-core memory read bandwidth: %.1f GB/s (%zu MiB streamed)\n",
              g_read_bandwidth_gbps, bytes >> 20);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
