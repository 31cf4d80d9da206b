// Tests of the Hugging Face cache: a faithful cache tree (relative symlinks into ../../blobs),
// which symlinks are followed and which refused, repo ids and revisions resolved through refs/.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <map>
#include <optional>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/hf_cache.h"
#include "test_util.h"

namespace fp4moe::checkpoint {
namespace {

namespace fs = std::filesystem;
using testing::file_image;
using testing::ScratchDir;
using testing::write_bytes;

constexpr std::string_view kCommit = "0123456789abcdef0123456789abcdef01234567";
constexpr std::string_view kOldCommit = "fedcba9876543210fedcba9876543210fedcba98";

// Sets environment variables for one test and restores them after.
class EnvGuard {
 public:
  void set(const char* name, std::optional<std::string> value) {
    if (!saved_.count(name)) {
      const char* old = std::getenv(name);
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
    }
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~EnvGuard() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

// Writes `bytes` as a blob of `repo` and links snapshots/<commit>/<file> to it the way
// huggingface_hub does: a relative symlink "../../blobs/<etag>" (one more "../" per subfolder).
void add_cached_file(const fs::path& repo, std::string_view commit, const std::string& file,
                     std::string_view bytes, const std::string& etag) {
  fs::create_directories(repo / "blobs");
  write_bytes(repo / "blobs" / etag, bytes);
  const fs::path pointer = repo / "snapshots" / std::string(commit) / file;
  fs::create_directories(pointer.parent_path());
  fs::create_symlink(fs::relative(repo / "blobs" / etag, pointer.parent_path()), pointer);
}

void write_ref(const fs::path& repo, const std::string& ref, std::string_view commit) {
  fs::create_directories((repo / "refs" / ref).parent_path());
  write_bytes(repo / "refs" / ref, commit);
}

const std::string kShard =
    file_image(R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", "ab");

// <cache>/models--org--tiny at kCommit (main) and kOldCommit (branch "v1"), each a config and one
// shard, every file a symlink into blobs/.
fs::path make_cache_repo(const fs::path& cache) {
  const fs::path repo = cache / "models--org--tiny";
  add_cached_file(repo, kCommit, "config.json", R"({"model_type": "qwen3"})", "c0nf1g");
  add_cached_file(repo, kCommit, "model.safetensors", kShard, "5ha2");
  add_cached_file(repo, kOldCommit, "config.json", R"({"model_type": "old"})", "01dc0nf");
  write_ref(repo, "main", kCommit);
  write_ref(repo, "v1", kOldCommit);
  return repo;
}

TEST(HfCache, SnapshotSymlinksIntoItsOwnBlobsAreFollowed) {
  ScratchDir cache;
  const fs::path repo = make_cache_repo(cache.path());
  const fs::path snapshot = repo / "snapshots" / std::string(kCommit);
  ASSERT_TRUE(fs::is_symlink(snapshot / "model.safetensors"));
  auto ckpt = CheckpointDir::open(snapshot);
  ASSERT_TRUE(ckpt.ok()) << ckpt.error().message;
  EXPECT_EQ(ckpt->config()["model_type"], "qwen3");
  auto bytes = ckpt->data("x");
  ASSERT_TRUE(bytes.ok()) << bytes.error().message;
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size()), "ab");
  // Side files (tokenizer, ...) in blobs are the checkpoint's too.
  add_cached_file(repo, kCommit, "tokenizer.json", "{}", "t0k");
  EXPECT_EQ(list_side_files(snapshot).size(), 2u);  // config.json, tokenizer.json
}

TEST(HfCache, SubfolderOfASnapshotFollowsThreeLevelsUp) {
  ScratchDir cache;
  const fs::path repo = cache.path() / "models--org--sub";
  add_cached_file(repo, kCommit, "transformer/config.json", R"({"model_type": "x"})", "c");
  add_cached_file(repo, kCommit, "transformer/model.safetensors", kShard, "s");
  auto ckpt = CheckpointDir::open(repo / "snapshots" / std::string(kCommit) / "transformer");
  ASSERT_TRUE(ckpt.ok()) << ckpt.error().message;
  EXPECT_EQ(ckpt->tensors().size(), 1u);
}

// Every other escape stays refused, with its reason.
TEST(HfCache, EscapesFromASnapshotAreRefused) {
  ScratchDir cache;
  ScratchDir outside;
  const fs::path repo = make_cache_repo(cache.path());
  const fs::path snapshot = repo / "snapshots" / std::string(kCommit);
  write_bytes(outside / "evil.safetensors", kShard);
  auto refused = [&](const std::string& what) {
    auto ckpt = CheckpointDir::open(snapshot);
    ASSERT_FALSE(ckpt.ok()) << what;
    const std::string& m = ckpt.error().message;
    EXPECT_NE(m.find("outside the checkpoint directory (symlink)"), std::string::npos) << m;
    EXPECT_NE(m.find("blobs"), std::string::npos) << m;  // says where it may go
  };
  // A shard symlink to an absolute path outside the cache.
  fs::remove(snapshot / "model.safetensors");
  fs::create_symlink(outside / "evil.safetensors", snapshot / "model.safetensors");
  refused("absolute symlink outside");
  // Into another repo's blobs of the same cache.
  const fs::path other = cache.path() / "models--evil--repo";
  fs::create_directories(other / "blobs");
  write_bytes(other / "blobs" / "b", kShard);
  fs::remove(snapshot / "model.safetensors");
  fs::create_symlink("../../../models--evil--repo/blobs/b", snapshot / "model.safetensors");
  refused("another repo's blobs");
  // Through blobs/ and back out with "..".
  fs::remove(snapshot / "model.safetensors");
  fs::create_symlink("../../blobs/../../models--evil--repo/blobs/b",
                     snapshot / "model.safetensors");
  refused("blobs/.. escape");
  // Into the repo but not into blobs/ (refs/main, a text file).
  fs::remove(snapshot / "model.safetensors");
  write_bytes(repo / "refs" / "evil.safetensors", kShard);
  fs::create_symlink("../../refs/evil.safetensors", snapshot / "model.safetensors");
  refused("refs/");
  // A config symlink leaving the cache is refused too (configs were followed blindly before).
  fs::remove(snapshot / "model.safetensors");
  add_cached_file(repo, kCommit, "model.safetensors", kShard, "5ha2b");
  write_bytes(outside / "config.json", "{}");
  fs::remove(snapshot / "config.json");
  fs::create_symlink(outside / "config.json", snapshot / "config.json");
  refused("config.json outside");
}

TEST(HfCache, BlobsThatAreASymlinkGrantNothing) {
  ScratchDir cache;
  ScratchDir outside;
  const fs::path repo = cache.path() / "models--org--linked";
  write_bytes(outside / "b", kShard);
  fs::create_directories(repo / "snapshots" / std::string(kCommit));
  fs::create_directory_symlink(outside.path(), repo / "blobs");
  fs::create_symlink("../../blobs/b",
                     repo / "snapshots" / std::string(kCommit) / "model.safetensors");
  auto ckpt = CheckpointDir::open(repo / "snapshots" / std::string(kCommit));
  ASSERT_FALSE(ckpt.ok());
  EXPECT_NE(ckpt.error().message.find("outside the checkpoint directory (symlink)"),
            std::string::npos);
}

TEST(HfCache, DanglingConfigSymlinkIsAnError) {
  ScratchDir cache;
  const fs::path repo = make_cache_repo(cache.path());
  const fs::path snapshot = repo / "snapshots" / std::string(kCommit);
  fs::remove(repo / "blobs" / "c0nf1g");
  auto ckpt = CheckpointDir::open(snapshot);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_NE(ckpt.error().message.find("dangling symlink"), std::string::npos)
      << ckpt.error().message;
}

TEST(HfCache, LocationFollowsHuggingfaceHubPrecedence) {
  EnvGuard env;
  for (const char* v : {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"}) {
    env.set(v, std::nullopt);
  }
  env.set("HOME", "/home/u");
  EXPECT_EQ(hf_cache_location().dir, fs::path("/home/u/.cache/huggingface/hub"));
  env.set("XDG_CACHE_HOME", "/x");
  EXPECT_EQ(hf_cache_location().dir, fs::path("/x/huggingface/hub"));
  env.set("HF_HOME", "~/hf");
  EXPECT_EQ(hf_cache_location().dir, fs::path("/home/u/hf/hub"));
  EXPECT_EQ(hf_cache_location().source, "HF_HOME/hub");
  env.set("HUGGINGFACE_HUB_CACHE", "/legacy");
  EXPECT_EQ(hf_cache_location().dir, fs::path("/legacy"));
  env.set("HF_HUB_CACHE", "/hub");
  EXPECT_EQ(hf_cache_location().dir, fs::path("/hub"));
  EXPECT_EQ(hf_cache_location().source, "HF_HUB_CACHE");
}

TEST(HfCache, RepoIds) {
  for (const char* ok : {"deepseek-ai/DeepSeek-V4-Flash", "gpt2", "org/name.v1_2", "a/b"}) {
    EXPECT_TRUE(is_hf_repo_id(ok)) << ok;
  }
  for (const char* bad : {"", "/abs/path", "a/b/c", "./x", "../x", "a--b/c", "a/..", "-a/b",
                          "a/b c", "org/", "/name"}) {
    EXPECT_FALSE(is_hf_repo_id(bad)) << bad;
  }
  EXPECT_EQ(hf_repo_folder_name("deepseek-ai/DeepSeek-V4-Flash"),
            "models--deepseek-ai--DeepSeek-V4-Flash");
}

TEST(HfCache, ResolvesRepoIdsThroughRefs) {
  ScratchDir cache;
  EnvGuard env;
  env.set("HF_HUB_CACHE", cache.path().string());
  const fs::path repo = make_cache_repo(cache.path());
  auto main = resolve_checkpoint("org/tiny", "");
  ASSERT_TRUE(main.ok()) << main.error().message;
  EXPECT_EQ(main->path, repo / "snapshots" / std::string(kCommit));
  EXPECT_EQ(main->repo_id, "org/tiny");
  EXPECT_EQ(main->revision, "main");
  EXPECT_EQ(main->commit, kCommit);
  auto branch = resolve_checkpoint("org/tiny", "v1");
  ASSERT_TRUE(branch.ok()) << branch.error().message;
  EXPECT_EQ(branch->commit, kOldCommit);
  auto hash = resolve_checkpoint("org/tiny", kOldCommit);
  ASSERT_TRUE(hash.ok()) << hash.error().message;
  EXPECT_EQ(hash->path, repo / "snapshots" / std::string(kOldCommit));
  // The cache repo folder itself names the repo.
  auto folder = resolve_checkpoint(repo.string(), "v1");
  ASSERT_TRUE(folder.ok()) << folder.error().message;
  EXPECT_EQ(folder->repo_id, "org/tiny");
  EXPECT_EQ(folder->commit, kOldCommit);
  // A plain directory is itself.
  auto plain = resolve_checkpoint(main->path.string(), "");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->path, main->path);
  EXPECT_TRUE(plain->repo_id.empty());
}

TEST(HfCache, ClearErrors) {
  ScratchDir cache;
  EnvGuard env;
  env.set("HF_HUB_CACHE", cache.path().string());
  const fs::path repo = make_cache_repo(cache.path());
  auto has = [](const Result<ResolvedCheckpoint>& r, std::initializer_list<std::string> parts) {
    ASSERT_FALSE(r.ok());
    for (const auto& p : parts) {
      EXPECT_NE(r.error().message.find(p), std::string::npos) << p << " in " << r.error().message;
    }
    EXPECT_EQ(r.error().kind, ErrorKind::kBadInput);
  };
  // Not in the cache: says where it looked and why there.
  has(resolve_checkpoint("org/absent", ""),
      {"not in the Hugging Face cache", (cache.path() / "models--org--absent").string(),
       "HF_HUB_CACHE"});
  // A revision the cache does not have: lists what it has.
  has(resolve_checkpoint("org/tiny", "v2"),
      {"revision 'v2' is not in the cache", "refs: main -> 0123456789ab", "v1 -> fedcba987654"});
  has(resolve_checkpoint("org/tiny", std::string(40, 'e')), {"no snapshots/eeee"});
  has(resolve_checkpoint("org/tiny", "../../etc"), {"not a branch, tag or commit hash"});
  // A ref naming a snapshot that was never written.
  write_ref(repo, "broken", std::string(40, 'a'));
  has(resolve_checkpoint("org/tiny", "broken"), {"snapshots/aaaa", "is missing"});
  // Neither a directory nor a repo id.
  has(resolve_checkpoint((cache.path() / "no" / "such").string(), ""),
      {"not a checkpoint directory (no such directory), nor a Hugging Face repo id"});
  // A file.
  write_bytes(cache / "file", "x");
  has(resolve_checkpoint((cache / "file").string(), ""), {"not a directory"});
  // --revision on a plain checkpoint directory.
  has(resolve_checkpoint((repo / "snapshots" / std::string(kCommit)).string(), "main"),
      {"applies to a repo id"});
}

TEST(SafetensorsIndex, NamesAndTotalSizeWithoutShards) {
  ScratchDir dir;
  write_bytes(dir / "model.safetensors.index.json",
              R"({"metadata": {"total_size": 1234}, "weight_map": {"b": "s2.safetensors",
                  "a": "s1.safetensors", "c": "s1.safetensors"}})");
  auto idx = read_safetensors_index(dir.path());
  ASSERT_TRUE(idx.ok()) << idx.error().message;
  ASSERT_TRUE(idx->has_value());
  EXPECT_EQ((*idx)->total_size, 1234u);
  EXPECT_EQ((*idx)->shards, (std::vector<std::string>{"s1.safetensors", "s2.safetensors"}));
  EXPECT_EQ((*idx)->weight_map.size(), 3u);
  ScratchDir none;
  auto absent = read_safetensors_index(none.path());
  ASSERT_TRUE(absent.ok());
  EXPECT_FALSE(absent->has_value());
}

TEST(SafetensorsIndex, ErrorsNameTheFileAndTheEntry) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"weight_map": {"t": "../x.safetensors"}})",
       "index maps tensor 't' to shard '../x.safetensors': '..' leaves the checkpoint directory"},
      {R"({"weight_map": {"t": "/abs.safetensors"}})",
       "index maps tensor 't' to shard '/abs.safetensors': absolute path"},
      {R"({"weight_map": {"t": ""}})", "empty shard name"},
      {R"({"weight_map": {"t": 3}})", "weight_map entry of tensor 't' is not a string"},
      {R"({"metadata": {"total_size": "big"}, "weight_map": {}})", "'metadata.total_size'"},
      {R"({"metadata": {"total_size": -1}, "weight_map": {}})", "'metadata.total_size'"},
      {R"({"weight_map": [1]})", "missing 'weight_map' object"},
      {R"({"weight_map": {)", "invalid JSON"},
  };
  for (const auto& [text, reason] : cases) {
    ScratchDir dir;
    write_bytes(dir / "model.safetensors.index.json", text);
    auto idx = read_safetensors_index(dir.path());
    ASSERT_FALSE(idx.ok()) << text;
    const std::string& m = idx.error().message;
    EXPECT_NE(m.find("model.safetensors.index.json"), std::string::npos) << m;
    EXPECT_NE(m.find(reason), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace fp4moe::checkpoint
