// `fp4moe check` against the disk: the scale tensors of a DeepSeek-V4-Flash NVFP4 layout (256
// experts per layer, w1/w3 [2048, 4096] and w2 [4096, 2048], real UE4M3 block scales and F32
// tensor scales, weights as file holes) checked at >= 0.8 of the sequential read rate of the same
// bytes, measured in the same run, with the page cache cold (posix_fadvise DONTNEED on every shard
// before each run) and warm. Scaled down by layers: FP4MOE_BENCH_LAYERS (default 4, ~1.5 GB of
// scales; the real model has 43, ~17 GB). FP4MOE_BENCH_DIR (default: the temp dir) holds the
// checkpoint; FP4MOE_BENCH_SMOKE=1 writes one layer of 16 experts and runs one round.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "check/check.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/writer.h"

namespace fp4moe {
namespace {

namespace fs = std::filesystem;
using checkpoint::DType;

constexpr double kTargetRatio = 0.8;

struct Setup {
  int layers = 4;
  int experts = 256;
  int rounds = 3;
};

Status write_layout(const fs::path& dir, const Setup& setup) {
  std::vector<checkpoint::TensorSpec> plan;
  const struct {
    const char* name;
    int64_t n, k;
  } projections[] = {{"w1", 2048, 4096}, {"w3", 2048, 4096}, {"w2", 4096, 2048}};
  for (int l = 0; l < setup.layers; ++l) {
    for (int e = 0; e < setup.experts; ++e) {
      for (const auto& p : projections) {
        const std::string m =
            "layers." + std::to_string(l) + ".ffn.experts." + std::to_string(e) + "." + p.name;
        plan.push_back({m + ".weight", DType::U8, {p.n, p.k / 2}});
        plan.push_back({m + ".weight_scale", DType::F8_E4M3, {p.n, p.k / 16}});
        plan.push_back({m + ".weight_scale_2", DType::F32, {}});
      }
    }
  }
  checkpoint::WriterOptions options;
  options.max_shard_bytes = 4'000'000'000;
  auto writer = checkpoint::CheckpointWriter::create(dir, plan, options);
  if (!writer.ok()) return writer.error();
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (const auto& t : plan) {
    if (t.name.ends_with(".weight")) {
      FP4MOE_RETURN_IF_ERROR(writer->write_hole(t.name));
    } else if (t.name.ends_with(".weight_scale")) {
      // Valid UE4M3 codes 0x30..0x6F (2^-2 .. 2^5 range), varying along both axes.
      FP4MOE_RETURN_IF_ERROR(writer->write(t.name, [&](uint64_t, std::span<std::byte> chunk) {
        for (auto& b : chunk) {
          state = state * 6364136223846793005ull + 1442695040888963407ull;
          b = static_cast<std::byte>(0x30 + ((state >> 33) & 0x3F));
        }
        return Status::Ok();
      }));
    } else {
      const float scale = 1.0f / (6 * 448);
      FP4MOE_RETURN_IF_ERROR(writer->write(t.name, std::as_bytes(std::span(&scale, 1))));
    }
  }
  return writer->finish();
}

void drop_cache(const std::vector<fs::path>& shards) {
  for (const auto& s : shards) {
    const int fd = ::open(s.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// The sequential read rate of the scale tensors' bytes, in file order, with pread (GB/s).
double read_rate(const std::vector<fs::path>& shards, uint64_t* bytes_out) {
  std::vector<char> buffer(8u << 20);
  uint64_t bytes = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& s : shards) {
    auto header = checkpoint::SafetensorsHeader::read(s);
    if (!header.ok()) continue;
    const int fd = ::open(s.c_str(), O_RDONLY | O_CLOEXEC);
    for (const auto& t : header->tensors()) {
      if (t.name.ends_with(".weight")) continue;  // holes: no bytes to read
      for (uint64_t off = 0; off < t.byte_size(); off += buffer.size()) {
        const auto n = static_cast<size_t>(std::min<uint64_t>(buffer.size(), t.byte_size() - off));
        const ssize_t got = ::pread(fd, buffer.data(), n,
                                    static_cast<off_t>(header->data_offset() + t.data_begin + off));
        if (got > 0) bytes += static_cast<uint64_t>(got);
      }
    }
    ::close(fd);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  *bytes_out = bytes;
  return bytes / s / 1e9;
}

int run() {
  Setup setup;
  if (const char* env = std::getenv("FP4MOE_BENCH_LAYERS"))
    setup.layers = std::max(1, std::atoi(env));
  const bool smoke = std::getenv("FP4MOE_BENCH_SMOKE") != nullptr;
  if (smoke) {
    setup.layers = 1;
    setup.experts = 16;
    setup.rounds = 1;
  }
  const char* env_dir = std::getenv("FP4MOE_BENCH_DIR");
  const fs::path root = fs::path(env_dir ? env_dir : fs::temp_directory_path().string()) /
                        ("fp4moe_bench_check_" + std::to_string(::getpid()));
  fs::create_directories(root);
  const fs::path dir = root / "DeepSeek-V4-Flash-NVFP4-scales";
  std::printf("writing %d layers x %d experts (NVFP4 scales with data, weights as holes)...\n",
              setup.layers, setup.experts);
  if (Status st = write_layout(dir, setup); !st.ok()) {
    std::fprintf(stderr, "bench_check: %s\n", st.error().message.c_str());
    fs::remove_all(root);
    return 2;
  }
  std::vector<fs::path> shards;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") shards.push_back(e.path());
  }
  std::sort(shards.begin(), shards.end());

  std::printf("%-5s %-6s %12s %12s %12s %12s %8s\n", "round", "cache", "scale MB", "read GB/s",
              "check s", "check GB/s", "ratio");
  std::vector<double> ratios[2];
  int status = 0;
  for (int round = 0; round < setup.rounds; ++round) {
    for (const bool cold : {true, false}) {
      // Read rate, then check, on the same cache state (warm: the previous pass left it warm).
      if (cold) drop_cache(shards);
      uint64_t bytes = 0;
      const double read_gbps = read_rate(shards, &bytes);
      if (cold) drop_cache(shards);
      check::CheckOptions options;
      auto report = check::check_checkpoint(dir, options);
      if (!report.ok()) {
        std::fprintf(stderr, "bench_check: %s\n", report.error().message.c_str());
        status = 2;
        break;
      }
      const double check_gbps = report->scale_bytes_read / report->seconds / 1e9;
      const double ratio = check_gbps / read_gbps;
      ratios[cold ? 0 : 1].push_back(ratio);
      std::printf("%-5d %-6s %12.1f %12.2f %12.3f %12.2f %8.2f\n", round, cold ? "cold" : "warm",
                  report->scale_bytes_read / 1e6, read_gbps, report->seconds, check_gbps, ratio);
      if (report->tensors_never_written == 0 || report->scale_bytes_read < bytes) {
        std::fprintf(stderr,
                     "bench_check: check must report the weights as never written and read "
                     "every scale byte (%llu of %llu)\n",
                     static_cast<unsigned long long>(report->scale_bytes_read),
                     static_cast<unsigned long long>(bytes));
        status = 1;
      }
    }
  }
  for (int c = 0; c < 2; ++c) {
    if (ratios[c].empty()) continue;
    std::sort(ratios[c].begin(), ratios[c].end());
    const double median = ratios[c][ratios[c].size() / 2];
    std::printf("%s cache: median ratio to the sequential read rate %.2f (target >= %.1f)%s\n",
                c == 0 ? "cold" : "warm", median, kTargetRatio,
                median >= kTargetRatio ? "" : "  BELOW TARGET");
  }
  std::error_code ec;
  fs::remove_all(root, ec);
  return status;
}

}  // namespace
}  // namespace fp4moe

int main() { return fp4moe::run(); }
