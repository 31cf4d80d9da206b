// Checkpoint I/O benchmarks, each against a reference measured in the same run:
//  - parsing a 50,000-tensor safetensors header, against nlohmann::json's DOM parse of the same
//    bytes (which validates far less);
//  - zero-copy reads of tensor data through the mmap'd SafetensorsFile, against the page-cache read
//    bandwidth of pread() into a buffer; both consume every byte with the same checksum loop.
// Environment: FP4MOE_BENCH_DIR (default: the temp dir) holds the data file;
// FP4MOE_BENCH_MIB (default 1024) is its size.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "checkpoint/writer.h"

namespace fp4moe::checkpoint {
namespace {

constexpr int kHeaderTensors = 50'000;

// A realistic MoE header: names like model.layers.17.mlp.experts.93.down_proj.weight_scale.
const std::string& big_header() {
  static const std::string header = [] {
    std::string h = "{\"__metadata__\":{\"format\":\"pt\"}";
    uint64_t offset = 0;
    const char* kinds[] = {"weight", "weight_scale"};
    const char* projs[] = {"gate_proj", "up_proj", "down_proj"};
    for (int i = 0; i < kHeaderTensors; ++i) {
      const int layer = i / 768, expert = (i / 6) % 128;
      const bool scale = i % 2;
      const uint64_t bytes = scale ? 2048 * 448 : 2048 * 3584;
      h += ",\"model.layers." + std::to_string(layer) + ".mlp.experts." + std::to_string(expert) +
           "." + projs[(i / 2) % 3] + "." + kinds[i % 2] + "\":{\"dtype\":\"" +
           (scale ? "F8_E4M3" : "U8") + "\",\"shape\":[2048," + (scale ? "448" : "3584") +
           "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + bytes) +
           "]}";
      offset += bytes;
    }
    return h + "}";
  }();
  return header;
}

// The data section size the big header describes: the sum of its tensor sizes.
uint64_t big_header_data_size() {
  uint64_t total = 0;
  for (int i = 0; i < kHeaderTensors; ++i) total += (i % 2) ? 2048 * 448 : 2048 * 3584;
  return total;
}

void BM_ParseHeader50k(benchmark::State& state) {
  const std::string& h = big_header();
  const auto bytes = std::as_bytes(std::span<const char>(h.data(), h.size()));
  const uint64_t data_size = big_header_data_size();
  for (auto _ : state) {
    auto parsed = SafetensorsHeader::parse(bytes, data_size, "bench");
    if (!parsed.ok()) state.SkipWithError(parsed.error().message.c_str());
    benchmark::DoNotOptimize(parsed);
  }
  state.SetItemsProcessed(state.iterations() * kHeaderTensors);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(h.size()));
}
BENCHMARK(BM_ParseHeader50k)->Unit(benchmark::kMillisecond);

void BM_NlohmannParseHeader50k(benchmark::State& state) {
  const std::string& h = big_header();
  for (auto _ : state) {
    auto j = nlohmann::json::parse(h);
    benchmark::DoNotOptimize(j);
  }
  state.SetItemsProcessed(state.iterations() * kHeaderTensors);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(h.size()));
}
BENCHMARK(BM_NlohmannParseHeader50k)->Unit(benchmark::kMillisecond);

// The data file: 16 tensors of real (non-hole) bytes, so reads come from the page cache.
const std::filesystem::path& data_file() {
  static const std::filesystem::path path = [] {
    const char* dir_env = std::getenv("FP4MOE_BENCH_DIR");
    const std::filesystem::path dir = dir_env ? dir_env : std::filesystem::temp_directory_path();
    const char* mib_env = std::getenv("FP4MOE_BENCH_MIB");
    const uint64_t total = (mib_env ? std::stoull(mib_env) : 1024) << 20;
    const std::filesystem::path out = dir / ("fp4moe-bench-" + std::to_string(::getpid()));
    constexpr int kTensors = 16;
    std::vector<TensorSpec> plan;
    for (int i = 0; i < kTensors; ++i) {
      plan.push_back(
          {"t" + std::to_string(i), DType::U8, {static_cast<int64_t>(total / kTensors)}});
    }
    auto writer = CheckpointWriter::create(out, plan, {});
    if (!writer.ok()) {
      std::cerr << writer.error().message << "\n";
      std::exit(1);
    }
    for (const TensorSpec& t : plan) {
      auto st = writer->write(t.name, [](uint64_t offset, std::span<std::byte> chunk) {
        for (size_t i = 0; i < chunk.size(); ++i)
          chunk[i] = static_cast<std::byte>((offset + i) * 131);
        return Status::Ok();
      });
      if (!st.ok()) std::exit(1);
    }
    if (!writer->finish().ok()) std::exit(1);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(data_file().parent_path(), ec);
    });
    return out / "model.safetensors";
  }();
  return path;
}

// The consumer both readers share: a 64-bit add over every word (vectorised by the compiler).
uint64_t checksum(const std::byte* p, size_t n) {
  uint64_t sum = 0;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    sum += w;
  }
  return sum;
}

uint64_t data_bytes() {
  static const uint64_t n = SafetensorsHeader::read(data_file())->data_size();
  return n;
}

void BM_PageCacheRead(benchmark::State& state) {
  const int fd = ::open(data_file().c_str(), O_RDONLY | O_CLOEXEC);
  std::vector<std::byte> buffer(4u << 20);  // large enough to amortise syscalls, L2-friendly
  const uint64_t begin = SafetensorsHeader::read(data_file())->data_offset();
  const uint64_t end = begin + data_bytes();
  for (auto _ : state) {
    uint64_t sum = 0;
    for (uint64_t off = begin; off < end;) {
      const ssize_t got = ::pread(fd, buffer.data(), std::min<uint64_t>(buffer.size(), end - off),
                                  static_cast<off_t>(off));
      if (got <= 0) {
        state.SkipWithError("pread failed");
        break;
      }
      sum += checksum(buffer.data(), static_cast<size_t>(got));
      off += static_cast<uint64_t>(got);
    }
    benchmark::DoNotOptimize(sum);
  }
  ::close(fd);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(data_bytes()));
}
BENCHMARK(BM_PageCacheRead)->Unit(benchmark::kMillisecond)->UseRealTime();

// Zero copy, one mapping for the whole run: after the first pass, pure memory reads.
void BM_ZeroCopyRead(benchmark::State& state) {
  auto file = SafetensorsFile::open(data_file());
  for (auto _ : state) {
    uint64_t sum = 0;
    for (const TensorInfo& t : file->tensors()) {
      const auto view = file->data(t);
      sum += checksum(view.data(), view.size());
    }
    benchmark::DoNotOptimize(sum);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(data_bytes()));
}
BENCHMARK(BM_ZeroCopyRead)->Unit(benchmark::kMillisecond)->UseRealTime();

// Zero copy from a fresh open each time: includes the page faults that map the page cache in,
// which is what a one-pass converter pays.
void BM_ZeroCopyReadFreshMap(benchmark::State& state) {
  for (auto _ : state) {
    auto file = SafetensorsFile::open(data_file());
    uint64_t sum = 0;
    for (const TensorInfo& t : file->tensors()) {
      const auto view = file->data(t);
      sum += checksum(view.data(), view.size());
    }
    benchmark::DoNotOptimize(sum);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(data_bytes()));
}
BENCHMARK(BM_ZeroCopyReadFreshMap)->Unit(benchmark::kMillisecond)->UseRealTime();

// Prints the usual table, then the ratios the benchmarks exist for.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.run_type != Run::RT_Iteration || run.error_occurred) continue;
      std::string name = run.benchmark_name();
      name = name.substr(0, name.find('/'));             // drop "/real_time"
      seconds_[name] = run.GetAdjustedRealTime() / 1e3;  // kMillisecond unit
      const auto it = run.counters.find("bytes_per_second");
      if (it != run.counters.end()) gbps_[name] = it->second.value / 1e9;
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    auto has = [&](const char* n) { return gbps_.count(n) != 0; };
    std::printf("\n");
    if (has("BM_ParseHeader50k") && has("BM_NlohmannParseHeader50k")) {
      std::printf(
          "header parse, %d tensors (%.1f MB): %.2f ms; nlohmann DOM parse of the same "
          "bytes: %.2f ms; ratio %.2fx faster\n",
          kHeaderTensors, big_header().size() / 1e6, seconds_["BM_ParseHeader50k"] * 1e3,
          seconds_["BM_NlohmannParseHeader50k"] * 1e3,
          seconds_["BM_NlohmannParseHeader50k"] / seconds_["BM_ParseHeader50k"]);
    }
    if (has("BM_PageCacheRead")) {
      const double ref = gbps_["BM_PageCacheRead"];
      std::printf("page-cache read bandwidth (pread + checksum): %.2f GB/s\n", ref);
      for (const char* n : {"BM_ZeroCopyRead", "BM_ZeroCopyReadFreshMap"}) {
        if (has(n)) {
          std::printf("%s: %.2f GB/s = %.2fx the page-cache read bandwidth\n", n, gbps_[n],
                      gbps_[n] / ref);
        }
      }
    }
  }

 private:
  std::map<std::string, double> gbps_, seconds_;
};

}  // namespace
}  // namespace fp4moe::checkpoint

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  fp4moe::checkpoint::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
