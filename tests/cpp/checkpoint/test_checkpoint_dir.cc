// Tests of CheckpointDir: shard discovery, containment, index consistency, JSON side files.
#include <gtest/gtest.h>

#include "checkpoint/checkpoint_dir.h"
#include "test_util.h"

namespace fp4moe::checkpoint {
namespace {

using testing::file_image;
using testing::read_bytes;
using testing::ScratchDir;
using testing::write_bytes;

const std::filesystem::path kAdversarial =
    std::filesystem::path(FP4MOE_TEST_DATA_DIR) / "adversarial";

TEST(CheckpointDir, OpensAnIndexedCheckpoint) {
  auto ckpt = CheckpointDir::open(kAdversarial / "dirs" / "valid_sharded");
  ASSERT_TRUE(ckpt.ok()) << ckpt.error().message;
  EXPECT_TRUE(ckpt->has_index());
  EXPECT_EQ(ckpt->shard_count(), 2u);
  EXPECT_EQ(ckpt->config()["model_type"], "test");
  EXPECT_TRUE(ckpt->hf_quant_config().is_null());
  ASSERT_EQ(ckpt->tensors().size(), 3u);
  EXPECT_EQ(ckpt->total_tensor_bytes(), 24u);
  const CheckpointTensor* z = ckpt->find("z");
  ASSERT_NE(z, nullptr);
  EXPECT_EQ(ckpt->shard_path(z->shard).filename(), "model-00002-of-00002.safetensors");
  auto bytes = ckpt->data(*z);
  ASSERT_TRUE(bytes.ok()) << bytes.error().message;
  ASSERT_EQ(bytes->size(), 8u);
  EXPECT_EQ(static_cast<int>((*bytes)[0]), 8);  // the generator fills shard data with 0, 1, 2, ...
  EXPECT_EQ(ckpt->find("nope"), nullptr);
  EXPECT_FALSE(ckpt->data("nope").ok());
  const auto side = ckpt->non_weight_files();
  ASSERT_EQ(side.size(), 2u);
  EXPECT_EQ(side[0].filename(), "config.json");
  EXPECT_EQ(side[1].filename(), "tokenizer.json");
}

TEST(CheckpointDir, OpensUnindexedShards) {
  auto ckpt = CheckpointDir::open(kAdversarial / "dirs" / "valid_unindexed");
  ASSERT_TRUE(ckpt.ok()) << ckpt.error().message;
  EXPECT_FALSE(ckpt->has_index());
  EXPECT_EQ(ckpt->shard_count(), 2u);
  EXPECT_NE(ckpt->find("x"), nullptr);
  EXPECT_NE(ckpt->find("y"), nullptr);
  EXPECT_TRUE(ckpt->config().is_null());
}

TEST(Adversarial, EveryHostileDirectoryIsRejectedWithItsReason) {
  const nlohmann::json manifest = nlohmann::json::parse(read_bytes(kAdversarial / "expected.json"));
  ASSERT_GE(manifest["dirs"].size(), 10u);
  int checked = 0;
  for (const auto& [name, expect] : manifest["dirs"].items()) {
    SCOPED_TRACE(name);
    auto ckpt = CheckpointDir::open(kAdversarial / "dirs" / name);
    ASSERT_FALSE(ckpt.ok());
    const std::string& message = ckpt.error().message;
    EXPECT_NE(message.find(name), std::string::npos) << message;  // names the file or directory
    EXPECT_NE(message.find(expect["reason"].get<std::string>()), std::string::npos) << message;
    if (!expect["tensor"].is_null()) {
      EXPECT_NE(message.find("tensor '" + expect["tensor"].get<std::string>() + "'"),
                std::string::npos)
          << message;
    }
    ++checked;
  }
  std::cout << "adversarial directories rejected: " << checked << "\n";
}

TEST(CheckpointDir, ShardSymlinkOutsideIsRejected) {
  ScratchDir outside;
  ScratchDir dir;
  const std::string shard =
      file_image(R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "a");
  write_bytes(outside / "real.safetensors", shard);
  std::filesystem::create_symlink(outside / "real.safetensors", dir / "model.safetensors");
  auto ckpt = CheckpointDir::open(dir.path());
  ASSERT_FALSE(ckpt.ok());
  EXPECT_NE(ckpt.error().message.find("outside the checkpoint directory (symlink)"),
            std::string::npos)
      << ckpt.error().message;
  // (Symlinks of a Hugging Face cache snapshot into its own blobs/: test_hf_cache.cc.)
  // A symlink that stays inside is fine without the option.
  ScratchDir inside;
  write_bytes(inside / "real.bin.safetensors", shard);
  std::filesystem::create_symlink("real.bin.safetensors", inside / "model.safetensors");
  EXPECT_TRUE(CheckpointDir::open(inside.path()).ok());
}

TEST(CheckpointDir, SiblingWithSharedPrefixIsOutside) {
  EXPECT_TRUE(path_is_inside("/a/b/c", "/a/b"));
  EXPECT_TRUE(path_is_inside("/a/b", "/a/b"));
  EXPECT_FALSE(path_is_inside("/a/bc", "/a/b"));
  EXPECT_FALSE(path_is_inside("/a", "/a/b"));
}

TEST(ReadJsonFile, AbsentIsNullInvalidNamesTheFile) {
  ScratchDir dir;
  auto absent = read_json_file(dir / "config.json");
  ASSERT_TRUE(absent.ok());
  EXPECT_TRUE(absent->is_null());
  write_bytes(dir / "config.json", "{\"a\": [1, 2,]}");
  auto bad = read_json_file(dir / "config.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find((dir / "config.json").string() + ": invalid JSON"),
            std::string::npos);
  // Brackets inside strings do not count towards the depth.
  write_bytes(dir / "ok.json", "{\"s\": \"" + std::string(1000, '[') + "\\\"\"}");
  EXPECT_TRUE(read_json_file(dir / "ok.json").ok());
  write_bytes(dir / "deep.json",
              std::string(kMaxJsonDepth + 1, '[') + std::string(kMaxJsonDepth + 1, ']'));
  EXPECT_FALSE(read_json_file(dir / "deep.json").ok());
  write_bytes(dir / "limit.json",
              std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']'));
  EXPECT_TRUE(read_json_file(dir / "limit.json").ok());
}

TEST(CheckpointDir, ShardChangedOnDiskIsAnErrorNotACrash) {
  ScratchDir dir;
  write_bytes(dir / "model.safetensors",
              file_image(R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", "abcd"));
  auto ckpt = CheckpointDir::open(dir.path());
  ASSERT_TRUE(ckpt.ok());
  std::filesystem::resize_file(dir / "model.safetensors", 20);  // truncated behind our back
  auto data = ckpt->data("x");
  ASSERT_FALSE(data.ok());
  EXPECT_NE(data.error().message.find("changed on disk"), std::string::npos);
}

}  // namespace
}  // namespace fp4moe::checkpoint
