// Tests of CheckpointWriter and the sparse fixtures: round trips, sharding, safety, scale.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/sparse_fixture.h"
#include "checkpoint/writer.h"
#include "test_util.h"

namespace fp4moe::checkpoint {
namespace {

using testing::random_bytes;
using testing::read_bytes;
using testing::ScratchDir;
using testing::write_bytes;

std::string str(std::span<const std::byte> b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

TEST(CheckpointWriter, RoundTripsShardsAndIndex) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ScratchDir dir;
  // Every dtype, awkward shapes; shards of 100 data bytes force several shards.
  std::vector<TensorSpec> plan;
  std::vector<std::vector<std::byte>> data;
  int i = 0;
  for (const DType d : all_dtypes()) {
    const int64_t n = (dtype_bits(d) == 6) ? 4 * (1 + i % 3) : 2 * (1 + i % 5);
    plan.push_back({"layers." + std::to_string(i) + ".w", d, {n, 3}});
    data.push_back(
        random_bytes(rng, static_cast<size_t>(*tensor_byte_size(d, plan.back().shape, ""))));
    ++i;
  }
  plan.push_back({"scalar", DType::F32, {}});
  data.push_back(random_bytes(rng, 4));
  plan.push_back({"empty", DType::BF16, {0, 4}});
  data.emplace_back();

  ScratchDir source;
  write_bytes(source / "tokenizer.json", "{\"tok\": 1}");
  write_bytes(source / "chat_template.jinja", "{{ messages }}");
  write_bytes(source / "config.json", "{\"old\": true}");
  write_bytes(source / "model.safetensors", "not copied");
  WriterOptions options;
  options.max_shard_bytes = 100;
  options.source_dir = source.path();
  options.files["config.json"] = "{\"new\": true}";
  options.metadata["producer"] = "test";
  auto writer = CheckpointWriter::create(dir / "out", plan, options);
  ASSERT_TRUE(writer.ok()) << writer.error().message;
  for (size_t t = 0; t < plan.size(); ++t) {
    if (t % 2 == 0) {
      ASSERT_TRUE(writer->write(plan[t].name, data[t]).ok());
    } else {  // through the chunked callback, 3 bytes at a time
      const auto& src = data[t];
      auto st = writer->write(plan[t].name, [&](uint64_t offset, std::span<std::byte> chunk) {
        std::copy_n(src.begin() + static_cast<ptrdiff_t>(offset), chunk.size(), chunk.begin());
        return Status::Ok();
      });
      ASSERT_TRUE(st.ok()) << st.error().message;
    }
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));  // nothing visible before finish()
  auto finished = writer->finish();
  ASSERT_TRUE(finished.ok()) << finished.error().message;
  EXPECT_GT(writer->shard_names().size(), 2u);

  auto ckpt = CheckpointDir::open(dir / "out");
  ASSERT_TRUE(ckpt.ok()) << ckpt.error().message;
  EXPECT_TRUE(ckpt->has_index());
  EXPECT_EQ(ckpt->shard_count(), writer->shard_names().size());
  ASSERT_EQ(ckpt->tensors().size(), plan.size());
  for (size_t t = 0; t < plan.size(); ++t) {
    const CheckpointTensor* ct = ckpt->find(plan[t].name);
    ASSERT_NE(ct, nullptr) << plan[t].name;
    EXPECT_EQ(ct->info->dtype, plan[t].dtype);
    EXPECT_EQ(ct->info->shape, plan[t].shape);
    EXPECT_EQ(ckpt->shard_path(ct->shard).filename(), writer->shard_names()[writer->shard_of(t)]);
    auto bytes = ckpt->data(*ct);
    ASSERT_TRUE(bytes.ok());
    EXPECT_EQ(str(*bytes),
              std::string(reinterpret_cast<const char*>(data[t].data()), data[t].size()))
        << plan[t].name;
    EXPECT_EQ(ckpt->shard_header(ct->shard).metadata().at("producer"), "test");
    EXPECT_EQ(ckpt->shard_header(ct->shard).data_offset() % 8, 0u);  // aligned data section
  }
  EXPECT_EQ(ckpt->config(), nlohmann::json({{"new", true}}));
  EXPECT_EQ(read_bytes(dir / "out" / "tokenizer.json"), "{\"tok\": 1}");
  EXPECT_EQ(read_bytes(dir / "out" / "chat_template.jinja"), "{{ messages }}");
  const auto index =
      nlohmann::json::parse(read_bytes(dir / "out" / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), ckpt->total_tensor_bytes());
  // No temporary directory left behind.
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++entries;
  EXPECT_EQ(entries, 1);
}

TEST(CheckpointWriter, OneShardIsModelSafetensorsWithoutIndex) {
  ScratchDir dir;
  auto writer = CheckpointWriter::create(dir / "out", {{"a", DType::U8, {3}}}, {});
  ASSERT_TRUE(writer.ok());
  const std::string abc = "abc";
  ASSERT_TRUE(writer->write("a", testing::as_bytes(abc)).ok());
  ASSERT_TRUE(writer->finish().ok());
  EXPECT_TRUE(std::filesystem::exists(dir / "out" / "model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir / "out" / "model.safetensors.index.json"));
  auto file = SafetensorsFile::open(dir / "out" / "model.safetensors");
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(str(*file->data("a")), "abc");
  EXPECT_EQ(file->metadata().at("format"), "pt");
}

TEST(CheckpointWriter, EmptyPlanWritesAnEmptyCheckpoint) {
  ScratchDir dir;
  auto writer = CheckpointWriter::create(dir / "out", {}, {});
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE(writer->finish().ok());
  auto ckpt = CheckpointDir::open(dir / "out");
  ASSERT_TRUE(ckpt.ok()) << ckpt.error().message;
  EXPECT_TRUE(ckpt->tensors().empty());
}

TEST(CheckpointWriter, RefusesBadPlansAndDestinations) {
  ScratchDir dir;
  auto expect_error = [](const Result<CheckpointWriter>& r, std::string_view reason) {
    ASSERT_FALSE(r.ok()) << reason;
    EXPECT_NE(r.error().message.find(reason), std::string::npos) << r.error().message;
  };
  expect_error(
      CheckpointWriter::create(dir / "o", {{"a", DType::U8, {1}}, {"a", DType::U8, {1}}}, {}),
      "tensor 'a': planned twice");
  expect_error(CheckpointWriter::create(dir / "o", {{"", DType::U8, {1}}}, {}),
               "empty tensor name");
  expect_error(CheckpointWriter::create(dir / "o", {{"__metadata__", DType::U8, {1}}}, {}),
               "reserved name");
  expect_error(CheckpointWriter::create(dir / "o", {{"a\xff", DType::U8, {1}}}, {}),
               "not valid UTF-8");
  expect_error(CheckpointWriter::create(dir / "o", {{"f4", DType::F4, {3}}}, {}), "mid-byte");
  expect_error(CheckpointWriter::create(dir / "o", {{"x", DType::F32, {-1}}}, {}),
               "negative dimension");
  WriterOptions bad_file;
  bad_file.files["../escape.json"] = "{}";
  expect_error(CheckpointWriter::create(dir / "o", {}, bad_file), "must be a plain file name");
  std::filesystem::create_directory(dir / "exists");
  expect_error(CheckpointWriter::create(dir / "exists", {}, {}), "destination already exists");
  expect_error(CheckpointWriter::create(dir / "no" / "parent", {}, {}), "does not exist");
  // A destination inside the source, directly or through "..", is refused.
  std::filesystem::create_directory(dir / "src");
  WriterOptions from_src;
  from_src.source_dir = dir / "src";
  expect_error(CheckpointWriter::create(dir / "src" / "out", {}, from_src),
               "destination lies inside the source");
  expect_error(CheckpointWriter::create(dir / "src" / "x" / ".." / "out2", {}, from_src),
               "inside the source");
  EXPECT_TRUE(CheckpointWriter::create(dir / "src2", {}, from_src).ok());  // a sibling is fine
}

TEST(CheckpointWriter, EnforcesPlanOrderSizesAndCleansUp) {
  ScratchDir dir;
  {
    auto writer =
        CheckpointWriter::create(dir / "out", {{"a", DType::U8, {2}}, {"b", DType::U8, {2}}}, {});
    ASSERT_TRUE(writer.ok());
    const std::string two = "xy", three = "xyz";
    auto wrong_order = writer->write("b", testing::as_bytes(two));
    ASSERT_FALSE(wrong_order.ok());
    EXPECT_NE(wrong_order.error().message.find("expected 'a' next"), std::string::npos);
    auto wrong_size = writer->write("a", testing::as_bytes(three));
    ASSERT_FALSE(wrong_size.ok());
    EXPECT_NE(wrong_size.error().message.find("got 3 bytes, the plan needs 2"), std::string::npos);
    ASSERT_TRUE(writer->write("a", testing::as_bytes(two)).ok());
    auto early = writer->finish();
    ASSERT_FALSE(early.ok());
    EXPECT_NE(early.error().message.find("tensor 'b' and 0 more"), std::string::npos);
    auto fill_fails = writer->write("b", [](uint64_t, std::span<std::byte>) -> Status {
      return Error{"source shard unreadable"};
    });
    ASSERT_FALSE(fill_fails.ok());
    EXPECT_NE(fill_fails.error().message.find("tensor 'b': source shard unreadable"),
              std::string::npos);
    EXPECT_FALSE(writer->finish().ok());  // a failed write poisons the output
  }
  // The abandoned writer removed its temporary directory and published nothing.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

// A one-tensor checkpoint whose single byte is `value`, written with `options`.
Status write_one(const std::filesystem::path& dest, char value, WriterOptions options) {
  auto writer = CheckpointWriter::create(dest, {{"t", DType::U8, {1}}}, std::move(options));
  if (!writer.ok()) return writer.error();
  const std::string byte(1, value);
  FP4MOE_RETURN_IF_ERROR(writer->write("t", testing::as_bytes(byte)));
  return writer->finish();
}

std::string tensor_byte(const std::filesystem::path& dir) {
  auto ckpt = CheckpointDir::open(dir);
  if (!ckpt.ok()) return "error: " + ckpt.error().message;
  auto data = ckpt->data(*ckpt->find("t"));
  return data.ok() ? str(*data) : "error: " + data.error().message;
}

TEST(CheckpointWriter, ReplaceExistingSwapsOnlyWhenEverythingSucceeded) {
  ScratchDir dir;
  ASSERT_TRUE(write_one(dir / "out", 'a', {}).ok());
  EXPECT_FALSE(write_one(dir / "out", 'b', {}).ok());  // not without replace_existing
  EXPECT_EQ(tensor_byte(dir / "out"), "a");

  // The pre-publish check fails: the old checkpoint stays, nothing else is left.
  WriterOptions refused;
  refused.replace_existing = true;
  bool saw_staged = false;
  refused.check_before_publish = [&](const std::filesystem::path& staged) -> Status {
    saw_staged = tensor_byte(staged) == "c";
    return Error{"output check says no", ErrorKind::kFailed};
  };
  const Status st = write_one(dir / "out", 'c', refused);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().kind, ErrorKind::kFailed);
  EXPECT_TRUE(saw_staged) << "the check ran on the complete new checkpoint";
  EXPECT_EQ(tensor_byte(dir / "out"), "a");

  // An abandoned replacing writer leaves the old checkpoint too.
  {
    WriterOptions replace;
    replace.replace_existing = true;
    auto writer = CheckpointWriter::create(dir / "out", {{"t", DType::U8, {1}}}, replace);
    ASSERT_TRUE(writer.ok());
    EXPECT_EQ(find_stale_partials(dir.path()).size(), 0u) << "a live writer's directory is locked";
  }
  EXPECT_EQ(tensor_byte(dir / "out"), "a");

  // Success swaps: the new checkpoint is in place and the old one is gone, with progress.
  WriterOptions replace;
  replace.replace_existing = true;
  uint64_t last_removed = 0, last_total = 0;
  int calls = 0;
  replace.on_remove_progress = [&](uint64_t removed, uint64_t total) {
    EXPECT_GE(removed, last_removed);
    last_removed = removed;
    last_total = total;
    ++calls;
  };
  ASSERT_TRUE(write_one(dir / "out", 'd', replace).ok());
  EXPECT_EQ(tensor_byte(dir / "out"), "d");
  EXPECT_GT(calls, 0);
  EXPECT_EQ(last_removed, last_total);
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    left.push_back(e.path().filename().string());
  }
  EXPECT_EQ(left, std::vector<std::string>{"out"});
}

TEST(CheckpointWriter, ModesFollowTheUmaskLikeMkdir) {
  for (const mode_t mask : {mode_t{022}, mode_t{002}, mode_t{077}}) {
    SCOPED_TRACE("umask " + std::to_string(mask));
    ScratchDir dir;
    ScratchDir source;
    write_bytes(source / "tokenizer.json", "{}");
    std::filesystem::permissions(source / "tokenizer.json", std::filesystem::perms::owner_read);
    const mode_t previous = ::umask(mask);
    EXPECT_EQ(process_umask(), mask);
    WriterOptions options;
    options.source_dir = source.path();
    options.files["config.json"] = "{}";
    options.max_shard_bytes = 1;
    auto writer = CheckpointWriter::create(dir / "out",
                                           {{"a", DType::U8, {1}}, {"b", DType::U8, {1}}}, options);
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE(writer->write("a", testing::as_bytes("x")).ok());
    ASSERT_TRUE(writer->write("b", testing::as_bytes("y")).ok());
    ASSERT_TRUE(writer->finish().ok());
    ::umask(previous);
    const auto mode = [](const std::filesystem::path& p) {
      struct stat st {};
      EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
      return st.st_mode & 07777;
    };
    EXPECT_EQ(mode(dir / "out"), 0777u & ~mask);
    int files = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir / "out")) {
      EXPECT_EQ(mode(e.path()), 0666u & ~mask) << e.path();  // shards, index, copied and new files
      ++files;
    }
    EXPECT_EQ(files, 5);  // 2 shards, the index, tokenizer.json, config.json
  }
}

TEST(CheckpointWriter, StalePartialsAreFoundAndRemoved) {
  ScratchDir dir;
  // What a killed writer leaves: its directory, unlocked, with data in it.
  std::filesystem::create_directory(dir / ".out.partial-AbC123");
  write_bytes(dir / ".out.partial-AbC123" / "model-00001-of-00002.safetensors",
              std::string(70000, 'x'));
  std::filesystem::create_directory(dir / "out.partial-AbC123");     // not hidden: not ours
  std::filesystem::create_directory(dir / ".out.partial-toolong1");  // not mkdtemp's 6 chars
  write_bytes(dir / ".x.partial-ZZZZZZ", "a file, not a directory");
  auto live = CheckpointWriter::create(dir / "other", {{"t", DType::U8, {1}}}, {});
  ASSERT_TRUE(live.ok());
  const auto stale = find_stale_partials(dir.path());
  ASSERT_EQ(stale.size(), 1u);
  EXPECT_EQ(stale[0].path.filename(), ".out.partial-AbC123");
  EXPECT_GE(stale[0].bytes, 70000u);
  uint64_t removed = 0, total = 0;
  ASSERT_TRUE(remove_tree(stale[0].path, [&](uint64_t r, uint64_t t) {
                removed = r;
                total = t;
              }).ok());
  EXPECT_FALSE(std::filesystem::exists(stale[0].path));
  EXPECT_EQ(removed, total);
  EXPECT_GE(total, 70000u);
  EXPECT_TRUE(find_stale_partials(dir.path()).empty());
  ASSERT_TRUE(live->discard().ok());
  EXPECT_FALSE(std::filesystem::exists(dir / "other"));
}

TEST(CheckpointWriter, ACancelBeforePublishKeepsTheOldCheckpoint) {
  ScratchDir dir;
  ASSERT_TRUE(write_one(dir / "out", 'a', {}).ok());
  std::atomic<bool> cancel{true};
  WriterOptions options;
  options.replace_existing = true;
  options.cancel = &cancel;
  const Status st = write_one(dir / "out", 'b', options);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().kind, ErrorKind::kInterrupted);
  EXPECT_EQ(tensor_byte(dir / "out"), "a");
  EXPECT_TRUE(find_stale_partials(dir.path()).empty());
}

TEST(CheckpointWriter, OnlyADirectoryIsReplacedAndPathsAreResolvedOnce) {
  ScratchDir dir;
  write_bytes(dir / "file", "precious");
  WriterOptions replace;
  replace.replace_existing = true;
  // "file/" names the file (not a missing directory): refused, the file intact.
  EXPECT_FALSE(write_one(dir.path().string() + "/file/", 'x', replace).ok());
  EXPECT_EQ(read_bytes(dir / "file"), "precious");
  // A symlink in the destination's place is not followed or replaced.
  std::filesystem::create_directory(dir / "real");
  ASSERT_TRUE(write_one(dir / "real" / "ckpt", 'a', {}).ok());
  std::filesystem::create_directory_symlink(dir / "real" / "ckpt", dir / "link");
  EXPECT_FALSE(write_one(dir / "link", 'b', replace).ok());
  EXPECT_EQ(tensor_byte(dir / "real" / "ckpt"), "a");
  EXPECT_TRUE(std::filesystem::is_symlink(dir / "link"));
  // "sub/../x" with sub a symlink names x beside the symlink's target, as the kernel resolves it.
  std::filesystem::create_directories(dir / "deep" / "a");
  std::filesystem::create_directory_symlink(dir / "deep" / "a", dir / "sub");
  EXPECT_EQ(resolve_destination(dir / "sub" / ".." / "x"),
            std::filesystem::canonical(dir / "deep") / "x");
  EXPECT_EQ(resolve_destination(dir.path().string() + "/out/"),
            std::filesystem::canonical(dir.path()) / "out");
}

TEST(RemoveTree, NeverTruncatesAFileThatHasOtherNames) {
  ScratchDir dir;
  // Over 1 GiB allocated, the size remove_tree shrinks in steps before unlinking.
  constexpr off_t kSize = (off_t{1} << 30) + (off_t{64} << 20);
  const std::filesystem::path keep = dir / "keep.bin";
  const int fd = ::open(keep.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  const int rc = ::posix_fallocate(fd, 0, kSize);
  ::close(fd);
  if (rc != 0) GTEST_SKIP() << "no fallocate on this file system";
  std::filesystem::create_directory(dir / "tree");
  std::filesystem::create_hard_link(keep, dir / "tree" / "model.safetensors");
  ASSERT_TRUE(remove_tree(dir / "tree", [](uint64_t, uint64_t) {}).ok());
  EXPECT_FALSE(std::filesystem::exists(dir / "tree"));
  EXPECT_EQ(std::filesystem::file_size(keep), static_cast<uintmax_t>(kSize));
}

TEST(CheckpointWriter, MovedAsideDestinationsAreFoundAndNeverStale) {
  ScratchDir dir;
  std::filesystem::create_directory(dir / ".out.old-Ab12Cd");
  write_bytes(dir / ".out.old-Ab12Cd" / "config.json", "{}");
  EXPECT_TRUE(find_stale_partials(dir.path()).empty());
  const auto aside = find_moved_aside(dir.path());
  ASSERT_EQ(aside.size(), 1u);
  EXPECT_EQ(aside[0].filename(), ".out.old-Ab12Cd");
}

TEST(RemoveTree, DoesNotFollowSymlinks) {
  ScratchDir dir;
  ScratchDir outside;
  write_bytes(outside / "keep.txt", "keep");
  std::filesystem::create_directories(dir / "tree" / "sub");
  std::filesystem::create_directory_symlink(outside.path(), dir / "tree" / "sub" / "link");
  ASSERT_TRUE(remove_tree(dir / "tree").ok());
  EXPECT_FALSE(std::filesystem::exists(dir / "tree"));
  EXPECT_EQ(read_bytes(outside / "keep.txt"), "keep");
}

// The acceptance figure of the issue: a 48-shard, 160 GB checkpoint inspects in well under a
// second with its headers in the page cache, and costs almost no disk as a sparse fixture.
TEST(SparseFixture, FullSizeCheckpointIsCheapToWriteAndOpen) {
  ScratchDir dir;
  constexpr int kLayers = 48;
  constexpr int kExperts = 64;
  // Per layer: 64 experts x 3 projections of NVFP4 [N=4096, K=7680] (U8 [4096, 3840] + E4M3
  // scales [4096, 480] + scale_2): 3.397 GB per layer, 163 GB in all; one shard per layer at a
  // 3.4 GB shard limit.
  std::vector<FixtureTensor> tensors;
  for (int l = 0; l < kLayers; ++l) {
    for (int e = 0; e < kExperts; ++e) {
      for (const char* w : {"w1", "w2", "w3"}) {
        const std::string base =
            "layers." + std::to_string(l) + ".ffn.experts." + std::to_string(e) + "." + w;
        tensors.push_back({{base + ".weight", DType::U8, {4096, 3840}}, {}});
        tensors.push_back({{base + ".weight_scale", DType::F8_E4M3, {4096, 480}}, {}});
        tensors.push_back({{base + ".weight_scale_2", DType::F32, {}}, {}});
      }
    }
  }
  // One tensor with real bytes, to show holes and data coexist.
  tensors.back().bytes = {std::byte{0x00}, std::byte{0x00}, std::byte{0x80}, std::byte{0x3f}};
  SparseFixtureOptions options;
  options.max_shard_bytes = 3'400'000'000;
  options.config = {{"model_type", "deepseek_v4"}};
  ASSERT_TRUE(write_sparse_checkpoint(dir / "big", tensors, options).ok());

  // Warm the page cache with one open, then time the second (printed for the log).
  ASSERT_TRUE(CheckpointDir::open(dir / "big").ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto ckpt = CheckpointDir::open(dir / "big");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(ckpt.ok()) << ckpt.error().message;
  EXPECT_EQ(ckpt->shard_count(), 48u);
  EXPECT_GT(ckpt->total_tensor_bytes(), 160'000'000'000ull);
  EXPECT_EQ(ckpt->tensors().size(), tensors.size());
  // The speed of this open is a benchmark figure (bench_checkpoint, bench_inspect), not a test
  // assertion: a sanitizer build or a loaded CI machine would make a time limit flaky.
  std::cout << "inspect 48 shards, " << ckpt->total_tensor_bytes() / 1e9 << " GB, "
            << tensors.size() << " tensors: " << seconds * 1e3 << " ms\n";

  uint64_t on_disk = 0;
  for (size_t s = 0; s < ckpt->shard_count(); ++s) on_disk += *allocated_bytes(ckpt->shard_path(s));
  EXPECT_LT(on_disk, 64ull << 20) << "sparse fixture allocated " << on_disk << " bytes";

  auto hole = ckpt->data("layers.0.ffn.experts.0.w1.weight");
  ASSERT_TRUE(hole.ok());
  EXPECT_EQ((*hole)[hole->size() / 2], std::byte{0});
  auto real = ckpt->data(tensors.back().spec.name);
  ASSERT_TRUE(real.ok());
  EXPECT_EQ((*real)[3], std::byte{0x3f});
  EXPECT_EQ(ckpt->config()["model_type"], "deepseek_v4");
}

}  // namespace
}  // namespace fp4moe::checkpoint
