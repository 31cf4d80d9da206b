// Synthetic layouts: each one written small is detected as the real layout it copies, with valid
// data; the full-size DeepSeek-V4-Flash layout is sparse and detected at its real size.
#include "synth/synth.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/sparse_fixture.h"
#include "detect/directory.h"
#include "formats/block.h"

namespace fp4moe::synth {
namespace {

namespace fs = std::filesystem;
using detect::Scheme;

// A fresh path under the temp dir, removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    root_ = fs::temp_directory_path() /
            ("fp4moe_synth_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(root_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  fs::path path(const std::string& name) const { return root_ / name; }

 private:
  fs::path root_;
};

std::string findings_text(const detect::Manifest& m) {
  std::string s;
  for (const auto& f : m.findings) {
    s += std::string(detect::to_string(f.severity)) + " " + f.code + ": " + f.message + "\n";
  }
  return s;
}

struct Expected {
  Scheme routed, shared, attention, dense_mlp, lm_head, mtp, kv_cache;
};

// What each real layout is, per the corpus configs and SOURCES.md (tests/data/corpus/).
const std::map<Layout, Expected>& expected_summaries() {
  static const std::map<Layout, Expected> kExpected = {
      {Layout::kDsv4Mxfp4,
       {Scheme::kMxfp4, Scheme::kFp8Block, Scheme::kFp8Block, Scheme::kAbsent, Scheme::kBf16,
        Scheme::kMxfp4, Scheme::kBf16}},
      {Layout::kDsv4Nvfp4,
       {Scheme::kNvfp4, Scheme::kFp8Block, Scheme::kFp8Block, Scheme::kAbsent, Scheme::kBf16,
        Scheme::kMxfp4, Scheme::kBf16}},
      {Layout::kGptOssMxfp4,
       {Scheme::kMxfp4, Scheme::kAbsent, Scheme::kBf16, Scheme::kAbsent, Scheme::kBf16,
        Scheme::kAbsent, Scheme::kBf16}},
      {Layout::kDsv3Fp8,
       {Scheme::kFp8Block, Scheme::kFp8Block, Scheme::kFp8Block, Scheme::kFp8Block, Scheme::kBf16,
        Scheme::kFp8Block, Scheme::kBf16}},
      {Layout::kCtNvfp4,
       {Scheme::kNvfp4, Scheme::kNvfp4, Scheme::kFp8Block, Scheme::kAbsent, Scheme::kBf16,
        Scheme::kAbsent, Scheme::kBf16}},
      {Layout::kModeloptNvfp4,
       {Scheme::kNvfp4, Scheme::kAbsent, Scheme::kNvfp4, Scheme::kAbsent, Scheme::kBf16,
        Scheme::kAbsent, Scheme::kFp8Tensor}},
      {Layout::kBf16,
       {Scheme::kBf16, Scheme::kAbsent, Scheme::kBf16, Scheme::kAbsent, Scheme::kBf16,
        Scheme::kAbsent, Scheme::kBf16}},
      // NVIDIA's export excludes self_attn* (BF16) and declares an FP8 KV cache; the FP8 release
      // quantizes attention too. No shared expert, no dense layer; the MTP modules the configs
      // declare are not in the released weights.
      {Layout::kMiniMaxNvfp4,
       {Scheme::kNvfp4, Scheme::kAbsent, Scheme::kBf16, Scheme::kAbsent, Scheme::kBf16,
        Scheme::kAbsent, Scheme::kFp8Tensor}},
      {Layout::kMiniMaxFp8,
       {Scheme::kFp8Block, Scheme::kAbsent, Scheme::kFp8Block, Scheme::kAbsent, Scheme::kBf16,
        Scheme::kAbsent, Scheme::kBf16}},
  };
  return kExpected;
}

TEST(SynthLayouts, NamesRoundTripAndUnknownIsAnError) {
  ASSERT_EQ(layouts().size(), expected_summaries().size());
  for (const LayoutInfo& info : layouts()) {
    auto parsed = parse_layout(info.name);
    ASSERT_TRUE(parsed.ok()) << info.name;
    EXPECT_EQ(*parsed, info.layout);
    EXPECT_FALSE(info.description.empty());
  }
  auto bad = parse_layout("dsv4-int3");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("dsv4-mxfp4"), std::string::npos) << bad.error().message;
}

// Every layout, written small, is detected as the real layout, without error findings.
TEST(SynthLayouts, EverySmallLayoutIsDetectedAsTheRealOne) {
  TempDir tmp;
  constexpr int kLayers = 1, kExperts = 3;
  for (const LayoutInfo& info : layouts()) {
    SCOPED_TRACE(std::string(info.name));
    const fs::path dir = tmp.path(std::string(info.name));
    SynthOptions opt;
    opt.layers = kLayers;
    opt.experts = kExperts;
    const Status written = write_synthetic(info.layout, dir, opt);
    ASSERT_TRUE(written.ok()) << written.error().message;
    auto inspected = detect::detect_directory(dir);
    ASSERT_TRUE(inspected.ok()) << inspected.error().message;
    const detect::Manifest& m = inspected->manifest;
    const Expected& want = expected_summaries().at(info.layout);
    EXPECT_TRUE(m.tensors_checked);
    EXPECT_EQ(m.summary.routed_experts, want.routed) << findings_text(m);
    EXPECT_EQ(m.summary.shared_experts, want.shared) << findings_text(m);
    EXPECT_EQ(m.summary.attention, want.attention) << findings_text(m);
    EXPECT_EQ(m.summary.dense_mlp, want.dense_mlp) << findings_text(m);
    EXPECT_EQ(m.summary.lm_head, want.lm_head) << findings_text(m);
    EXPECT_EQ(m.summary.mtp_experts, want.mtp) << findings_text(m);
    EXPECT_EQ(m.summary.kv_cache, want.kv_cache) << findings_text(m);
    for (const auto& f : m.findings) {
      EXPECT_NE(f.severity, detect::Severity::kError) << f.code << ": " << f.message;
    }
    // The routed experts of the decoder layers: kLayers x kExperts modules per projection group
    // (gpt-oss fuses all experts of a layer into one tensor, one module per layer).
    int64_t routed_modules = 0;
    for (const auto& g : m.modules) {
      if (g.role == detect::Role::kRoutedExperts) routed_modules += g.module_count;
    }
    const int64_t per_layer = info.layout == Layout::kGptOssMxfp4 ? 2 : 3 * kExperts;
    EXPECT_EQ(routed_modules, kLayers * per_layer);
  }
}

// Reads a tensor's bytes from a written checkpoint.
std::span<const std::byte> tensor_bytes(const checkpoint::CheckpointDir& ckpt,
                                        const std::string& name) {
  auto data = ckpt.data(name);
  EXPECT_TRUE(data.ok()) << name << ": " << (data.ok() ? "" : data.error().message);
  return data.ok() ? *data : std::span<const std::byte>();
}

template <class T>
std::span<const T> as(std::span<const std::byte> b) {
  return {reinterpret_cast<const T*>(b.data()), b.size() / sizeof(T)};
}

// Dequantized synthetic weights look like the Gaussian they came from: finite, mean ~0, std ~0.02.
void expect_gaussian_like(const std::vector<float>& w, const std::string& what) {
  // FP4 keeps ~3 bits, so the measured std differs from 0.02 by up to ~25%; the tolerance still
  // fails on zeros (holes), a scale of the wrong format or bias, or bytes from the wrong pool.
  constexpr double kStd = 0.02, kStdTolerance = 0.35;
  constexpr double kMeanTolerance = 0.002;  // 0.1 std: the mean of >= 1M samples is ~0
  double sum = 0, sq = 0;
  for (float v : w) {
    ASSERT_TRUE(std::isfinite(v)) << what;
    sum += v;
    sq += double{v} * v;
  }
  const double mean = sum / w.size(), stddev = std::sqrt(sq / w.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, kMeanTolerance) << what;
  EXPECT_NEAR(stddev, kStd, kStd * kStdTolerance) << what;
}

TEST(SynthData, DeepseekV4ExpertsDequantizeToRealisticWeights) {
  TempDir tmp;
  for (Layout layout : {Layout::kDsv4Mxfp4, Layout::kDsv4Nvfp4}) {
    const fs::path dir = tmp.path(layout == Layout::kDsv4Mxfp4 ? "mx" : "nv");
    SynthOptions opt;
    opt.layers = 1;
    opt.experts = 2;
    opt.seed = 7;
    ASSERT_TRUE(write_synthetic(layout, dir, opt).ok());
    auto ckpt = checkpoint::CheckpointDir::open(dir);
    ASSERT_TRUE(ckpt.ok()) << ckpt.error().message;
    constexpr int64_t kN = 4096, kK = 2048;  // w2: [hidden, moe_intermediate]
    std::vector<float> w(kN * kK);
    const std::string m = "layers.0.ffn.experts.1.w2";
    if (layout == Layout::kDsv4Mxfp4) {
      const auto* t = ckpt->find(m + ".weight");
      ASSERT_NE(t, nullptr);
      EXPECT_EQ(t->info->dtype, checkpoint::DType::I8);
      EXPECT_EQ(t->info->shape, (std::vector<int64_t>{kN, kK / 2}));
      ASSERT_TRUE(formats::dequantize_mxfp4(m, as<uint8_t>(tensor_bytes(*ckpt, m + ".weight")),
                                            as<uint8_t>(tensor_bytes(*ckpt, m + ".scale")), kN, kK,
                                            w)
                      .ok());
    } else {
      float scale_2 = 0;
      const auto s2 = tensor_bytes(*ckpt, m + ".weight_scale_2");
      ASSERT_EQ(s2.size(), sizeof scale_2);
      std::memcpy(&scale_2, s2.data(), sizeof scale_2);
      ASSERT_TRUE(formats::dequantize_nvfp4(m, as<uint8_t>(tensor_bytes(*ckpt, m + ".weight")),
                                            as<uint8_t>(tensor_bytes(*ckpt, m + ".weight_scale")),
                                            scale_2, kN, kK, w)
                      .ok());
      // MTP experts stay MXFP4 in NVIDIA's layout.
      const auto* mtp = ckpt->find("mtp.0.ffn.experts.0.w1.weight");
      ASSERT_NE(mtp, nullptr);
      EXPECT_EQ(mtp->info->dtype, checkpoint::DType::I8);
    }
    expect_gaussian_like(w, m);

    // The shared expert: FP8 E4M3 with a UE8M0 scale per 128x128 block.
    const std::string s = "layers.0.ffn.shared_experts.w1";
    constexpr int64_t kSn = 2048, kSk = 4096;
    std::vector<float> sw(kSn * kSk);
    ASSERT_TRUE(formats::dequantize_fp8_block128_ue8m0(
                    s, as<uint8_t>(tensor_bytes(*ckpt, s + ".weight")),
                    as<uint8_t>(tensor_bytes(*ckpt, s + ".scale")), kSn, kSk, sw)
                    .ok());
    expect_gaussian_like(sw, s);

    // Router: BF16 gate [E, hidden] and the F32 score-correction bias [E].
    const auto* gate = ckpt->find("layers.0.ffn.gate.weight");
    const auto* bias = ckpt->find("layers.0.ffn.gate.bias");
    ASSERT_NE(gate, nullptr);
    ASSERT_NE(bias, nullptr);
    EXPECT_EQ(gate->info->shape, (std::vector<int64_t>{2, 4096}));
    EXPECT_EQ(bias->info->dtype, checkpoint::DType::F32);
    EXPECT_EQ(bias->info->shape, (std::vector<int64_t>{2}));
    // Small layouts route every layer by score (see synth.cc).
    EXPECT_EQ(ckpt->config().at("num_hash_layers"), 0);
    EXPECT_EQ(ckpt->config().at("n_routed_experts"), 2);
  }
}

TEST(SynthData, SeedDecidesTheBytes) {
  TempDir tmp;
  auto expert_bytes = [&](const std::string& name, uint32_t seed) {
    SynthOptions opt;
    opt.layers = 1;
    opt.experts = 1;
    opt.seed = seed;
    const fs::path dir = tmp.path(name);
    EXPECT_TRUE(write_synthetic(Layout::kBf16, dir, opt).ok());
    auto ckpt = checkpoint::CheckpointDir::open(dir);
    EXPECT_TRUE(ckpt.ok());
    auto b = tensor_bytes(*ckpt, "model.layers.0.mlp.experts.0.down_proj.weight");
    return std::vector<std::byte>(b.begin(), b.end());
  };
  const auto a = expert_bytes("a", 3), a_again = expert_bytes("a2", 3), b = expert_bytes("b", 4);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, a_again) << "seed 3 twice";
  EXPECT_NE(a, b) << "seeds 3 and 4";
}

TEST(SynthErrors, BadOptionsAndExistingDestinationAreErrors) {
  TempDir tmp;
  SynthOptions opt;
  opt.layers = 0;
  Status s = write_synthetic(Layout::kBf16, tmp.path("zero"), opt);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("layers"), std::string::npos) << s.error().message;
  opt.layers = 1;
  opt.experts = -3;
  s = write_synthetic(Layout::kBf16, tmp.path("neg"), opt);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("experts"), std::string::npos) << s.error().message;
  fs::create_directories(tmp.path("exists"));
  opt.experts = 1;
  s = write_synthetic(Layout::kBf16, tmp.path("exists"), opt);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("exists"), std::string::npos) << s.error().message;
}

// The full-size DeepSeek-V4-Flash layout: 43 layers x 256 experts, ~160 GB of tensors in holes.
TEST(SynthFullSize, DeepseekV4FlashIsSparseAndDetectedAtItsRealSize) {
  // Headers, the configs and the filesystem's per-file minimum: a few MB. A non-sparse write
  // would take ~160 GB, so the bound cannot pass by accident.
  constexpr uint64_t kMaxOnDiskBytes = 64ull << 20;
  TempDir tmp;
  const fs::path dir = tmp.path("flash");
  SynthOptions opt;
  opt.full_size = true;
  const Status written = write_synthetic(Layout::kDsv4Mxfp4, dir, opt);
  ASSERT_TRUE(written.ok()) << written.error().message;
  uint64_t on_disk = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    auto bytes = checkpoint::allocated_bytes(e.path());
    ASSERT_TRUE(bytes.ok()) << bytes.error().message;
    on_disk += *bytes;
  }
  EXPECT_LT(on_disk, kMaxOnDiskBytes);

  auto inspected = detect::detect_directory(dir);
  ASSERT_TRUE(inspected.ok()) << inspected.error().message;
  const detect::Manifest& m = inspected->manifest;
  EXPECT_EQ(m.summary.routed_experts, Scheme::kMxfp4) << findings_text(m);
  EXPECT_EQ(m.summary.mtp_experts, Scheme::kMxfp4);
  int64_t routed = 0;
  for (const auto& g : m.modules) {
    if (g.role == detect::Role::kRoutedExperts) routed += g.module_count;
  }
  EXPECT_EQ(routed, int64_t{43} * 256 * 3);
  for (const auto& f : m.findings) {
    EXPECT_NE(f.severity, detect::Severity::kError) << f.code << ": " << f.message;
  }
  // The real config is kept: hash routing in the first 3 layers, with their tid2eid tables.
  EXPECT_EQ(inspected->config.at("num_hash_layers"), 3);
  auto ckpt = checkpoint::CheckpointDir::open(dir);
  ASSERT_TRUE(ckpt.ok());
  EXPECT_NE(ckpt->find("layers.2.ffn.gate.tid2eid"), nullptr);
  EXPECT_EQ(ckpt->find("layers.2.ffn.gate.bias"), nullptr);
  EXPECT_NE(ckpt->find("layers.3.ffn.gate.bias"), nullptr);
  EXPECT_GT(ckpt->total_tensor_bytes(), 150ull * 1000 * 1000 * 1000);
}

TEST(SynthConfig, NvidiaQuantizedLayersFollowTheLayerCount) {
  TempDir tmp;
  SynthOptions opt;
  opt.layers = 3;
  opt.experts = 1;
  const fs::path dir = tmp.path("nv");
  ASSERT_TRUE(write_synthetic(Layout::kDsv4Nvfp4, dir, opt).ok());
  auto ckpt = checkpoint::CheckpointDir::open(dir);
  ASSERT_TRUE(ckpt.ok());
  const auto& q = ckpt->config().at("quantization_config");
  EXPECT_EQ(q.at("moe_quant_algo"), "NVFP4");
  EXPECT_EQ(q.at("quantized_layers").size(), 3u);
  EXPECT_TRUE(q.at("quantized_layers").contains("layers.2.ffn.experts"));
  EXPECT_EQ(ckpt->hf_quant_config().at("quantization").at("quantized_layers").size(), 3u);
  EXPECT_EQ(ckpt->config().at("num_hidden_layers"), 3);
  // compress_ratios: one per layer plus the MTP layer's.
  EXPECT_EQ(ckpt->config().at("compress_ratios").size(), 4u);
}

}  // namespace
}  // namespace fp4moe::synth
