// Tests of the safetensors reader: dtype table, valid headers, the adversarial corpus, mutations.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/dtype.h"
#include "checkpoint/safetensors.h"
#include "test_util.h"

namespace fp4moe::checkpoint {
namespace {

using testing::as_bytes;
using testing::file_image;
using testing::read_bytes;
using testing::ScratchDir;
using testing::write_bytes;

const std::filesystem::path kAdversarial =
    std::filesystem::path(FP4MOE_TEST_DATA_DIR) / "adversarial";

nlohmann::json expected_manifest() {
  return nlohmann::json::parse(read_bytes(kAdversarial / "expected.json"));
}

TEST(DType, TableMatchesSafetensorsSpec) {
  // The spec's names and widths, written out independently of the table in dtype.cc.
  const std::vector<std::pair<std::string, uint32_t>> spec = {
      {"BOOL", 8},    {"U8", 8},   {"I8", 8},   {"F8_E5M2", 8}, {"F8_E4M3", 8},
      {"F8_E8M0", 8}, {"I16", 16}, {"U16", 16}, {"F16", 16},    {"BF16", 16},
      {"I32", 32},    {"U32", 32}, {"F32", 32}, {"F64", 64},    {"I64", 64},
      {"U64", 64},    {"C64", 64}, {"F4", 4},   {"F6_E2M3", 6}, {"F6_E3M2", 6}};
  ASSERT_EQ(all_dtypes().size(), spec.size());
  std::set<std::string> seen;
  for (const auto& [name, bits] : spec) {
    const auto dtype = parse_dtype(name);
    ASSERT_TRUE(dtype.has_value()) << name;
    EXPECT_EQ(dtype_name(*dtype), name);
    EXPECT_EQ(dtype_bits(*dtype), bits) << name;
    seen.insert(name);
  }
  for (const DType d : all_dtypes()) EXPECT_TRUE(seen.count(std::string(dtype_name(d))));
  for (const char* bad : {"", "f32", "F8", "FP4", "F8_E4M3FN", "float32", "F32 "}) {
    EXPECT_FALSE(parse_dtype(bad).has_value()) << bad;
  }
}

TEST(TensorByteSize, CheckedArithmetic) {
  EXPECT_EQ(*tensor_byte_size(DType::F32, std::vector<int64_t>{}, "t"), 4u);  // scalar
  EXPECT_EQ(*tensor_byte_size(DType::F4, std::vector<int64_t>{3, 2}, "t"), 3u);
  EXPECT_EQ(*tensor_byte_size(DType::F6_E3M2, std::vector<int64_t>{4}, "t"), 3u);
  EXPECT_EQ(*tensor_byte_size(DType::BF16, std::vector<int64_t>{0, 5}, "t"), 0u);
  EXPECT_FALSE(tensor_byte_size(DType::F4, std::vector<int64_t>{3}, "t").ok());
  EXPECT_FALSE(tensor_byte_size(DType::F6_E2M3, std::vector<int64_t>{2}, "t").ok());
  EXPECT_FALSE(tensor_byte_size(DType::U8, std::vector<int64_t>{-1}, "t").ok());
  EXPECT_FALSE(tensor_byte_size(DType::U8, std::vector<int64_t>{1ll << 32, 1ll << 32}, "t").ok());
  // 2^61 elements fit, 2^61 * 64 bits do not.
  EXPECT_FALSE(tensor_byte_size(DType::F64, std::vector<int64_t>{1ll << 61}, "t").ok());
}

TEST(SafetensorsHeader, ParsesAValidHeader) {
  const std::string header =
      R"({"__metadata__":{"format":"pt","k":"v\"\n"},)"
      R"("w":{"dtype":"F8_E4M3","shape":[2,3],"data_offsets":[4,10]},)"
      R"("s":{"data_offsets":[0,4],"shape":[],"dtype":"F32"},)"
      R"("e\u00e9\ud83d\ude00":{"dtype":"F4","shape":[4],"data_offsets":[10,12]}}   )";
  const std::string image = file_image(header, "0123456789ab");
  auto parsed = SafetensorsHeader::parse_image(as_bytes(image), "mem");
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  const auto& ts = parsed->tensors();
  ASSERT_EQ(ts.size(), 3u);
  // Data order, not header order.
  EXPECT_EQ(ts[0].name, "s");
  EXPECT_EQ(ts[0].shape, std::vector<int64_t>{});
  EXPECT_EQ(ts[0].element_count, 1u);
  EXPECT_EQ(ts[1].name, "w");
  EXPECT_EQ(ts[1].dtype, DType::F8_E4M3);
  EXPECT_EQ(ts[1].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ts[1].data_begin, 4u);
  EXPECT_EQ(ts[1].byte_size(), 6u);
  EXPECT_EQ(ts[2].name, "e\xC3\xA9\xF0\x9F\x98\x80");
  EXPECT_EQ(ts[2].element_count, 4u);
  EXPECT_EQ(parsed->metadata().at("k"), "v\"\n");
  EXPECT_EQ(parsed->header_size(), header.size());
  EXPECT_EQ(parsed->data_size(), 12u);
  EXPECT_EQ(parsed->find("w"), &ts[1]);
  EXPECT_EQ(parsed->find("x"), nullptr);
  EXPECT_EQ(parsed->find(""), nullptr);
}

TEST(SafetensorsFile, ZeroCopyViewsPointIntoTheMapping) {
  ScratchDir dir;
  const std::string header = R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},)"
                             R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[3,7]}})";
  write_bytes(dir / "x.safetensors", file_image(header, "abcdefg"));
  auto file = SafetensorsFile::open(dir / "x.safetensors");
  ASSERT_TRUE(file.ok()) << file.error().message;
  auto a = file->data("a");
  auto b = file->data("b");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(a->data()), a->size()), "abc");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b->data()), b->size()), "defg");
  EXPECT_EQ(b->data(), a->data() + 3);  // one mapping, no copies
  auto missing = file->data("c");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("x.safetensors: tensor 'c'"), std::string::npos);
  // The header-only reader agrees with the mapped reader.
  auto header_only = SafetensorsHeader::read(dir / "x.safetensors");
  ASSERT_TRUE(header_only.ok());
  EXPECT_EQ(header_only->tensors().size(), 2u);
  EXPECT_EQ(header_only->data_offset(), file->header().data_offset());
}

TEST(SafetensorsFile, OpenErrorsNameTheFile) {
  ScratchDir dir;
  auto missing = SafetensorsFile::open(dir / "none.safetensors");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("none.safetensors: cannot open"), std::string::npos);
  auto not_regular = SafetensorsHeader::read(dir.path());
  ASSERT_FALSE(not_regular.ok());
  EXPECT_NE(not_regular.error().message.find("not a regular file"), std::string::npos);
}

// Every file of the adversarial corpus is rejected by both readers (mapped and header-only) with
// its own reason, naming the file and the tensor; the valid controls are accepted.
TEST(Adversarial, EveryHostileFileIsRejectedWithItsReason) {
  const nlohmann::json manifest = expected_manifest();
  ASSERT_GE(manifest["files"].size(), 40u)
      << "adversarial corpus missing; run tests/tools/make_adversarial.py";
  int checked = 0;
  for (const auto& [name, expect] : manifest["files"].items()) {
    SCOPED_TRACE(name);
    const std::filesystem::path path = kAdversarial / "files" / name;
    auto mapped = SafetensorsFile::open(path);
    auto header_only = SafetensorsHeader::read(path);
    ASSERT_FALSE(mapped.ok());
    ASSERT_FALSE(header_only.ok());
    for (const std::string& message : {mapped.error().message, header_only.error().message}) {
      EXPECT_NE(message.find(path.string() + ": "), std::string::npos) << message;
      EXPECT_NE(message.find(expect["reason"].get<std::string>()), std::string::npos) << message;
      if (!expect["tensor"].is_null()) {
        EXPECT_NE(message.find("tensor '" + expect["tensor"].get<std::string>() + "'"),
                  std::string::npos)
            << message;
      }
    }
    ++checked;
  }
  std::cout << "adversarial files rejected: " << checked << "\n";
}

TEST(Adversarial, ValidControlsAreAccepted) {
  const nlohmann::json manifest = expected_manifest();
  ASSERT_GE(manifest["valid_files"].size(), 3u);
  for (const auto& name : manifest["valid_files"]) {
    const std::filesystem::path path = kAdversarial / "files" / name.get<std::string>();
    auto file = SafetensorsFile::open(path);
    ASSERT_TRUE(file.ok()) << file.error().message;
  }
  auto all = SafetensorsFile::open(kAdversarial / "files" / "valid_all_dtypes.safetensors");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->tensors().size(), all_dtypes().size());
  for (const DType d : all_dtypes()) {
    const std::string name = "t." + std::string(dtype_name(d));
    std::string lower = name;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const TensorInfo* t = all->find(lower);
    ASSERT_NE(t, nullptr) << lower;
    EXPECT_EQ(t->dtype, d);
    EXPECT_EQ(t->byte_size() * 8, 4 * dtype_bits(d));
  }
  EXPECT_EQ(all->metadata().at("note"), "every dtype");
}

// Truncating a valid file at every length must give an error, never a crash or a read past the
// end (ASan builds check the latter).
TEST(Mutation, EveryTruncationIsAnError) {
  const std::string image = read_bytes(kAdversarial / "files" / "valid_all_dtypes.safetensors");
  ASSERT_GT(image.size(), 100u);
  for (size_t n = 0; n < image.size(); ++n) {
    const std::string cut = image.substr(0, n);  // its own allocation, so ASan sees overreads
    auto parsed = SafetensorsHeader::parse_image(as_bytes(cut), "cut");
    EXPECT_FALSE(parsed.ok()) << "length " << n;
  }
  EXPECT_TRUE(SafetensorsHeader::parse_image(as_bytes(image), "whole").ok());
}

// Random byte flips in the header: the parser either accepts or names a reason; an accepted file's
// tensors always tile the data section (the invariant zero-copy views rely on).
TEST(Mutation, RandomHeaderFlipsNeverBreakInvariants) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (set FP4MOE_TEST_SEED to replay)");
  std::mt19937_64 rng(seed);
  const std::string image = read_bytes(kAdversarial / "files" / "valid_edge_cases.safetensors");
  auto base = SafetensorsHeader::parse_image(as_bytes(image), "base");
  ASSERT_TRUE(base.ok());
  const size_t header_end = static_cast<size_t>(base->data_offset());
  constexpr int kTrials = 20000;
  int accepted = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    std::string m = image;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) m[rng() % header_end] = static_cast<char>(rng() & 0xFF);
    auto parsed = SafetensorsHeader::parse_image(as_bytes(m), "mutant");
    if (!parsed.ok()) {
      EXPECT_NE(parsed.error().message.find("mutant: "), std::string::npos);
      continue;
    }
    ++accepted;
    uint64_t end = 0;
    for (const TensorInfo& t : parsed->tensors()) {
      EXPECT_EQ(t.data_begin, end);
      end = t.data_end;
    }
    EXPECT_EQ(end, parsed->data_size());
    EXPECT_EQ(parsed->file_size(), m.size());
  }
  // Some mutants must have been rejected (else the flips missed the header), and some accepted
  // (else the invariant checks above never ran: a parser rejecting everything would pass).
  EXPECT_LT(accepted, kTrials);
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace fp4moe::checkpoint
