// Streaming sharded checkpoint writer: plan -> shard headers -> tensor data -> index -> rename.
#include "checkpoint/writer.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>
#include <unordered_set>
#include <utility>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/json_text.h"
#include "checkpoint/safetensors.h"

namespace fp4moe::checkpoint {
namespace fs = std::filesystem;

namespace {

std::string in_quotes(std::string_view s) { return "'" + std::string(s) + "'"; }
std::string errno_text() { return std::strerror(errno); }

Status write_all(int fd, const void* data, size_t n, const std::string& what) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t put = ::write(fd, p, n);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) return Error{what + ": write failed: " + errno_text(), ErrorKind::kFailed};
    p += put;
    n -= static_cast<size_t>(put);
  }
  return Status::Ok();
}

// Files are created 0666 and directories 0777, less the umask (the kernel applies it to open();
// mkdtemp's 0700 is widened explicitly), as cp, tar and Python's writers do.
constexpr mode_t kFileMode = 0666;
constexpr mode_t kDirMode = 0777;

Status write_file(const fs::path& path, std::string_view content) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, kFileMode);
  if (fd < 0) return Error{path.string() + ": cannot create: " + errno_text(), ErrorKind::kFailed};
  Status st = write_all(fd, content.data(), content.size(), path.string());
  if (st.ok() && ::fsync(fd) != 0) {
    st = Error{path.string() + ": fsync failed: " + errno_text(), ErrorKind::kFailed};
  }
  ::close(fd);
  return st;
}

Status fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return Error{dir.string() + ": cannot open directory: " + errno_text(), ErrorKind::kFailed};
  }
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Error{dir.string() + ": fsync failed: " + errno_text(), ErrorKind::kFailed};
  return Status::Ok();
}

constexpr std::string_view kPartialInfix = ".partial-";
constexpr std::string_view kOldInfix = ".old-";

// `.<name>.partial-XXXXXX`: the temporary directory of a writer (mkdtemp's six characters).
bool is_partial_name(const std::string& name) {
  const auto pos = name.rfind(kPartialInfix);
  return name.size() > 1 && name[0] == '.' && pos != std::string::npos && pos > 1 &&
         name.size() == pos + kPartialInfix.size() + 6;
}

// `.<name>.old-XXXXXX`: a destination moved aside by a replacement on a file system without
// renameat2 flags, left only if that replacement was killed midway.
bool is_old_name(const std::string& name) {
  const auto pos = name.rfind(kOldInfix);
  return name.size() > 1 && name[0] == '.' && pos != std::string::npos && pos > 1 &&
         name.size() == pos + kOldInfix.size() + 6;
}

// Locks a writer's temporary directory for the writer's lifetime (flock on the directory): a
// killed writer's lock goes with its process, which is how find_stale_partials tells a stale
// directory from one being written by another process. Returns the descriptor, or -1.
int lock_directory(const fs::path& dir, bool wait) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return -1;
  if (::flock(fd, LOCK_EX | (wait ? 0 : LOCK_NB)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Bytes a tree takes on disk (allocated blocks; a sparse file counts what it really uses).
uint64_t allocated_tree_bytes(const fs::path& root) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) == 0) total += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  return total;
}

struct Shard {
  std::string name;
  std::vector<size_t> tensors;  // plan indices, in write order
  uint64_t data_bytes = 0;
};

}  // namespace

struct CheckpointWriter::Impl {
  fs::path dest;
  fs::path tmp;
  std::vector<TensorSpec> plan;
  std::vector<uint64_t> sizes;   // bytes per planned tensor
  std::vector<size_t> shard_of;  // shard per planned tensor
  std::vector<Shard> shards;
  std::vector<std::string> shard_names;
  WriterOptions options;
  size_t next = 0;  // next plan index to write
  int fd = -1;      // the open shard
  size_t open_shard = SIZE_MAX;
  uint64_t shard_end = 0;  // final size of the open shard file
  int lock_fd = -1;        // flock on tmp while this writer lives
  bool finished = false;
  bool failed = false;  // a write failed: the output is unusable

  ~Impl() { (void)discard(); }

  void unlock() {
    if (lock_fd >= 0) ::close(lock_fd);
    lock_fd = -1;
  }

  Status discard() {
    if (fd >= 0) ::close(fd);
    fd = -1;
    failed = true;  // nothing may be written or published after this
    Status st;
    if (!finished && !tmp.empty()) {
      st = remove_tree(tmp, options.on_remove_progress);
      tmp.clear();
    }
    unlock();
    return st;
  }

  std::string shard_label(size_t s) const { return (tmp / shards[s].name).string(); }

  std::string header_json(const Shard& shard) const {
    std::string json = "{";
    bool first = true;
    if (!options.metadata.empty()) {
      json += "\"__metadata__\":{";
      for (const auto& [k, v] : options.metadata) {
        if (!first) json += ',';
        first = false;
        append_json_string(json, k);
        json += ':';
        append_json_string(json, v);
      }
      json += '}';
      first = false;
    }
    uint64_t offset = 0;
    for (const size_t i : shard.tensors) {
      const TensorSpec& t = plan[i];
      if (!first) json += ',';
      first = false;
      append_json_string(json, t.name);
      json += ":{\"dtype\":\"";
      json += dtype_name(t.dtype);
      json += "\",\"shape\":[";
      for (size_t d = 0; d < t.shape.size(); ++d) {
        if (d) json += ',';
        json += std::to_string(t.shape[d]);
      }
      json += "],\"data_offsets\":[" + std::to_string(offset) + ',' +
              std::to_string(offset + sizes[i]) + "]}";
      offset += sizes[i];
    }
    json += '}';
    // Pad with spaces (legal trailing JSON whitespace) so the data section starts 8-byte aligned,
    // as the reference writer does: 8-byte dtypes at the start of the data are then aligned.
    while ((8 + json.size()) % 8 != 0) json += ' ';
    return json;
  }

  Status close_shard() {
    if (fd < 0) return Status::Ok();
    const std::string label = shard_label(open_shard);
    // Holes left by write_hole at the end of the shard exist only once the size is set.
    Status st;
    if (::ftruncate(fd, static_cast<off_t>(shard_end)) != 0) {
      st = Error{label + ": ftruncate failed: " + errno_text(), ErrorKind::kFailed};
    } else if (::fsync(fd) != 0) {
      st = Error{label + ": fsync failed: " + errno_text(), ErrorKind::kFailed};
    }
    ::close(fd);
    fd = -1;
    return st;
  }

  Status start_shard(size_t s) {
    FP4MOE_RETURN_IF_ERROR(close_shard());
    const fs::path path = tmp / shards[s].name;
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, kFileMode);
    if (fd < 0) {
      return Error{path.string() + ": cannot create: " + errno_text(), ErrorKind::kFailed};
    }
    open_shard = s;
    const std::string json = header_json(shards[s]);
    unsigned char prefix[8];
    uint64_t n = json.size();
    for (int b = 0; b < 8; ++b) prefix[b] = static_cast<unsigned char>(n >> (8 * b));
    FP4MOE_RETURN_IF_ERROR(write_all(fd, prefix, 8, path.string()));
    FP4MOE_RETURN_IF_ERROR(write_all(fd, json.data(), json.size(), path.string()));
    shard_end = 8 + json.size() + shards[s].data_bytes;
    return Status::Ok();
  }

  // Checks that `name` is the next planned tensor and opens its shard.
  Result<size_t> begin_tensor(std::string_view name) {
    if (finished)
      return Error{dest.string() + ": tensor " + in_quotes(name) + ": writer is finished"};
    if (failed) {
      return Error{dest.string() + ": tensor " + in_quotes(name) + ": an earlier write failed"};
    }
    if (next >= plan.size()) {
      return Error{dest.string() + ": tensor " + in_quotes(name) + ": not in the plan (all " +
                   std::to_string(plan.size()) + " planned tensors are written)"};
    }
    if (plan[next].name != name) {
      return Error{dest.string() + ": tensor " + in_quotes(name) +
                   ": out of plan order, expected " + in_quotes(plan[next].name) + " next"};
    }
    if (open_shard != shard_of[next] || fd < 0) {
      Status st = start_shard(shard_of[next]);
      if (!st.ok()) {
        failed = true;
        return st.error();
      }
    }
    return next;
  }

  Status fail(Status st) {
    if (!st.ok()) failed = true;
    return st;
  }
};

CheckpointWriter::CheckpointWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointWriter::CheckpointWriter(CheckpointWriter&&) noexcept = default;
CheckpointWriter& CheckpointWriter::operator=(CheckpointWriter&&) noexcept = default;
CheckpointWriter::~CheckpointWriter() = default;

Result<CheckpointWriter> CheckpointWriter::create(const fs::path& dest_in,
                                                  std::vector<TensorSpec> plan,
                                                  WriterOptions options) {
  auto impl = std::make_unique<Impl>();
  std::error_code ec;
  const fs::path dest = resolve_destination(dest_in);
  const std::string label = dest.string();
  if (options.max_shard_bytes == 0) return Error{label + ": max_shard_bytes must be positive"};
  if (options.chunk_bytes == 0) return Error{label + ": chunk_bytes must be positive"};

  // The plan.
  std::unordered_set<std::string_view> names;
  impl->sizes.reserve(plan.size());
  for (const TensorSpec& t : plan) {
    const std::string what = label + ": tensor " + in_quotes(t.name);
    if (t.name.empty()) return Error{label + ": empty tensor name in the plan"};
    if (t.name == "__metadata__") return Error{what + ": reserved name"};
    if (find_invalid_utf8(t.name)) return Error{what + ": name is not valid UTF-8"};
    if (!names.insert(t.name).second) return Error{what + ": planned twice"};
    auto size = tensor_byte_size(t.dtype, t.shape, what);
    if (!size.ok()) return size.error();
    impl->sizes.push_back(*size);
  }
  for (const auto& [k, v] : options.metadata) {
    if (find_invalid_utf8(k) || find_invalid_utf8(v)) {
      return Error{label + ": metadata " + in_quotes(k) + " is not valid UTF-8"};
    }
  }
  for (const auto& [name, content] : options.files) {
    const fs::path p(name);
    if (name.empty() || p.has_parent_path() || name == "." || name == ".." ||
        name.find('/') != std::string::npos) {
      return Error{label + ": side file " + in_quotes(name) + " must be a plain file name"};
    }
    if (name.ends_with(".safetensors") || name == "model.safetensors.index.json") {
      return Error{label + ": side file " + in_quotes(name) + " would clash with the weights"};
    }
  }

  // The destination.
  if (!options.replace_existing &&
      fs::symlink_status(dest, ec).type() != fs::file_type::not_found) {
    return Error{label + ": destination already exists"};
  }
  const fs::path parent = dest.parent_path();
  if (!fs::is_directory(parent, ec)) {
    return Error{label + ": parent directory " + parent.string() + " does not exist"};
  }
  if (options.source_dir) {
    const fs::path source = fs::canonical(*options.source_dir, ec);
    if (ec) return Error{options.source_dir->string() + ": cannot resolve source: " + ec.message()};
    const fs::path real_dest = fs::weakly_canonical(dest, ec);
    if (ec) return Error{label + ": cannot resolve: " + ec.message()};
    if (path_is_inside(real_dest, source)) {
      return Error{label + ": destination lies inside the source checkpoint " + source.string()};
    }
  }

  // Greedy shards in plan order, by data bytes as Hugging Face counts them.
  impl->shard_of.resize(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    if (impl->shards.empty() ||
        (!impl->shards.back().tensors.empty() &&
         impl->shards.back().data_bytes + impl->sizes[i] > options.max_shard_bytes)) {
      impl->shards.emplace_back();
    }
    impl->shards.back().tensors.push_back(i);
    impl->shards.back().data_bytes += impl->sizes[i];
    impl->shard_of[i] = impl->shards.size() - 1;
  }
  if (impl->shards.empty()) impl->shards.emplace_back();  // an empty checkpoint: one empty file
  const size_t n = impl->shards.size();
  for (size_t s = 0; s < n; ++s) {
    if (n == 1) {
      impl->shards[s].name = "model.safetensors";
    } else {
      char buf[64];
      std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", s + 1, n);
      impl->shards[s].name = buf;
    }
    impl->shard_names.push_back(impl->shards[s].name);
  }
  impl->plan = std::move(plan);
  impl->options = std::move(options);
  impl->dest = dest;
  for (size_t s = 0; s < n; ++s) {
    const size_t header_bytes = impl->header_json(impl->shards[s]).size();
    if (header_bytes > kMaxHeaderBytes) {
      return Error{label + ": shard " + in_quotes(impl->shards[s].name) + ": header of " +
                   std::to_string(header_bytes) + " bytes exceeds the reader's cap"};
    }
  }

  // Same directory as the destination, so the final rename is atomic and never crosses devices.
  std::string templ = (parent / ("." + dest.filename().string() + ".partial-XXXXXX")).string();
  if (::mkdtemp(templ.data()) == nullptr) {
    return Error{
        label + ": cannot create a temporary directory in " + parent.string() + ": " + errno_text(),
        ErrorKind::kFailed};
  }
  impl->tmp = templ;
  impl->lock_fd = lock_directory(impl->tmp, /*wait=*/false);
  if (impl->lock_fd < 0 || ::chmod(templ.c_str(), kDirMode & ~process_umask()) != 0) {
    return Error{
        templ + ": cannot lock or set the mode of the temporary directory: " + errno_text(),
        ErrorKind::kFailed};
  }
  return CheckpointWriter(std::move(impl));
}

Status CheckpointWriter::write(std::string_view name, std::span<const std::byte> bytes) {
  auto index = impl_->begin_tensor(name);
  if (!index.ok()) return index.error();
  const std::string label = impl_->shard_label(impl_->open_shard) + ": tensor " + in_quotes(name);
  if (bytes.size() != impl_->sizes[*index]) {
    return Error{label + ": got " + std::to_string(bytes.size()) + " bytes, the plan needs " +
                 std::to_string(impl_->sizes[*index])};
  }
  FP4MOE_RETURN_IF_ERROR(impl_->fail(write_all(impl_->fd, bytes.data(), bytes.size(), label)));
  ++impl_->next;
  return Status::Ok();
}

Status CheckpointWriter::write(std::string_view name, const FillFn& fill) {
  auto index = impl_->begin_tensor(name);
  if (!index.ok()) return index.error();
  const std::string label = impl_->shard_label(impl_->open_shard) + ": tensor " + in_quotes(name);
  const uint64_t size = impl_->sizes[*index];
  std::vector<std::byte> buffer(
      static_cast<size_t>(std::min<uint64_t>(size, impl_->options.chunk_bytes)));
  for (uint64_t offset = 0; offset < size;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(size - offset, buffer.size()));
    const std::span<std::byte> chunk(buffer.data(), n);
    Status st = fill(offset, chunk);
    if (!st.ok()) {
      impl_->failed = true;
      return Error{label + ": " + st.error().message};
    }
    FP4MOE_RETURN_IF_ERROR(impl_->fail(write_all(impl_->fd, chunk.data(), n, label)));
    offset += n;
  }
  ++impl_->next;
  return Status::Ok();
}

Status CheckpointWriter::write_hole(std::string_view name) {
  auto index = impl_->begin_tensor(name);
  if (!index.ok()) return index.error();
  const uint64_t size = impl_->sizes[*index];
  if (::lseek(impl_->fd, static_cast<off_t>(size), SEEK_CUR) < 0) {
    impl_->failed = true;
    return Error{impl_->shard_label(impl_->open_shard) + ": tensor " + in_quotes(name) +
                     ": seek failed: " + errno_text(),
                 ErrorKind::kFailed};
  }
  ++impl_->next;
  return Status::Ok();
}

Status CheckpointWriter::finish() {
  Impl& w = *impl_;
  const std::string label = w.dest.string();
  if (w.finished) return Error{label + ": finish() called twice"};
  if (w.failed) return Error{label + ": an earlier write failed; nothing was renamed into place"};
  if (w.next < w.plan.size()) {
    return Error{label + ": tensor " + in_quotes(w.plan[w.next].name) + " and " +
                 std::to_string(w.plan.size() - w.next - 1) + " more planned tensors not written"};
  }
  if (w.plan.empty()) FP4MOE_RETURN_IF_ERROR(w.start_shard(0));
  FP4MOE_RETURN_IF_ERROR(w.close_shard());

  if (w.shards.size() > 1) {
    uint64_t total = 0;
    for (const uint64_t s : w.sizes) total += s;
    nlohmann::json index;
    index["metadata"]["total_size"] = total;
    nlohmann::json& map = index["weight_map"];
    map = nlohmann::json::object();
    for (size_t i = 0; i < w.plan.size(); ++i) map[w.plan[i].name] = w.shards[w.shard_of[i]].name;
    FP4MOE_RETURN_IF_ERROR(
        write_file(w.tmp / "model.safetensors.index.json", index.dump(2) + "\n"));
  }

  if (w.options.source_dir) {
    for (const fs::path& file : list_side_files(*w.options.source_dir)) {
      const std::string name = file.filename().string();
      if (w.options.files.count(name)) continue;  // replaced below
      // Read and written, not fs::copy_file: the copy gets the output's mode (0666 less the
      // umask, not the source file's) and is synced like every other output file.
      std::ifstream in(file, std::ios::binary);
      std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (!in.good() && !in.eof()) {
        return Error{file.string() + ": cannot read to copy it", ErrorKind::kFailed};
      }
      FP4MOE_RETURN_IF_ERROR(write_file(w.tmp / name, content));
    }
  }
  for (const auto& [name, content] : w.options.files) {
    FP4MOE_RETURN_IF_ERROR(write_file(w.tmp / name, content));
  }
  FP4MOE_RETURN_IF_ERROR(fsync_dir(w.tmp));
  if (w.options.check_before_publish) FP4MOE_RETURN_IF_ERROR(w.options.check_before_publish(w.tmp));

  // Publish. RENAME_NOREPLACE: a destination that appeared meanwhile (an empty directory would
  // otherwise be silently replaced by rename(2)) is never overwritten. With replace_existing, one
  // RENAME_EXCHANGE swaps old and new; the old checkpoint then sits at the temporary path and is
  // removed after the swap is durable. Only a real directory is ever replaced.
  std::error_code ec;
  const fs::file_type existing = fs::symlink_status(w.dest, ec).type();
  const bool exists = existing != fs::file_type::not_found;
  if (exists && !w.options.replace_existing) {
    return Error{label + ": destination appeared while writing; nothing was renamed into place",
                 ErrorKind::kFailed};
  }
  if (exists && existing != fs::file_type::directory) {
    return Error{label + ": refusing to replace it: not a directory (a file or a symlink)"};
  }
  if (w.options.cancel != nullptr && w.options.cancel->load()) {
    return Error{label + ": interrupted before the new checkpoint was renamed into place",
                 ErrorKind::kInterrupted};
  }
  const unsigned flags = exists ? RENAME_EXCHANGE : RENAME_NOREPLACE;
  if (::renameat2(AT_FDCWD, w.tmp.c_str(), AT_FDCWD, w.dest.c_str(), flags) != 0) {
    if (errno != EINVAL && errno != ENOSYS) {
      return Error{label + ": cannot rename " + w.tmp.string() + " into place: " + errno_text(),
                   ErrorKind::kFailed};
    }
    // A file system without renameat2 flags: move the old destination aside under a name that
    // --clean-partial never removes (`.<name>.old-XXXXXX`; the next convert into this parent
    // reports it), rename the new one in, and move the old one back if that fails.
    fs::path aside;
    if (exists) {
      std::string templ = (w.dest.parent_path() /
                           ("." + w.dest.filename().string() + std::string(kOldInfix) + "XXXXXX"))
                              .string();
      if (::mkdtemp(templ.data()) == nullptr || ::rename(w.dest.c_str(), templ.c_str()) != 0) {
        const std::string why = errno_text();
        (void)::rmdir(templ.c_str());
        return Error{label + ": cannot move the old destination aside: " + why, ErrorKind::kFailed};
      }
      aside = templ;
    }
    if (::rename(w.tmp.c_str(), w.dest.c_str()) != 0) {
      const std::string why = errno_text();
      if (!aside.empty() && ::rename(aside.c_str(), w.dest.c_str()) != 0) {
        return Error{label + ": cannot rename the new checkpoint into place (" + why +
                         ") nor the old one back: the old checkpoint is " + aside.string() +
                         " and the new one " + w.tmp.string(),
                     ErrorKind::kFailed};
      }
      return Error{label + ": cannot rename " + w.tmp.string() + " into place: " + why,
                   ErrorKind::kFailed};
    }
    if (!aside.empty()) w.tmp = aside;
  } else if (!exists) {
    w.tmp.clear();
  }
  w.finished = true;
  w.unlock();
  // The new checkpoint is in place: from here on nothing is an error of the conversion. A failed
  // directory sync or removal of the old checkpoint leaves a directory the next convert reports.
  (void)fsync_dir(w.dest.parent_path());
  if (exists && !w.tmp.empty()) (void)remove_tree(w.tmp, w.options.on_remove_progress);
  w.tmp.clear();
  return Status::Ok();
}

Status CheckpointWriter::discard() { return impl_->discard(); }

fs::path resolve_destination(const fs::path& destination) {
  std::error_code ec;
  // No lexical normalization before resolving: "link/.." is the parent of the link's target, not
  // the directory holding the link.
  fs::path dest = fs::absolute(destination, ec);
  while (!dest.has_filename() && dest.has_relative_path()) dest = dest.parent_path();  // "out/"
  const fs::path name = dest.filename();
  if (name == "." || name == "..") {
    const fs::path resolved = fs::weakly_canonical(dest, ec);
    return ec ? dest.lexically_normal() : resolved;
  }
  // The parent through its symlinks, the last component as it is (a symlink there is not
  // followed: it is what a rename would replace).
  const fs::path parent = fs::weakly_canonical(dest.parent_path(), ec);
  return ec ? dest.lexically_normal() : parent / name;
}

std::vector<fs::path> find_moved_aside(const fs::path& parent) {
  std::vector<fs::path> found;
  std::error_code ec;
  for (auto it = fs::directory_iterator(parent, ec); !ec && it != fs::end(it); it.increment(ec)) {
    if (is_old_name(it->path().filename().string())) found.push_back(it->path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::vector<PartialDir> find_stale_partials(const fs::path& parent) {
  std::vector<PartialDir> stale;
  std::error_code ec;
  for (auto it = fs::directory_iterator(parent, ec); !ec && it != fs::end(it); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!is_partial_name(name)) continue;
    if (fs::symlink_status(it->path(), ec).type() != fs::file_type::directory) continue;
    const int fd = lock_directory(it->path(), /*wait=*/false);
    if (fd < 0) continue;  // a live writer holds it
    ::close(fd);
    stale.push_back({it->path(), allocated_tree_bytes(it->path())});
  }
  std::sort(stale.begin(), stale.end(),
            [](const PartialDir& a, const PartialDir& b) { return a.path < b.path; });
  return stale;
}

Status remove_tree(const fs::path& root, const RemoveProgressFn& progress) {
  constexpr uint64_t kStep = uint64_t{1} << 30;
  std::error_code ec;
  if (fs::symlink_status(root, ec).type() != fs::file_type::directory) {
    if (!fs::remove(root, ec) && ec) {
      return Error{root.string() + ": cannot remove: " + ec.message(), ErrorKind::kFailed};
    }
    return Status::Ok();
  }
  const uint64_t total = progress ? allocated_tree_bytes(root) : 0;
  uint64_t removed = 0;
  std::vector<fs::path> files;
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (it->symlink_status(ec).type() != fs::file_type::directory) files.push_back(it->path());
  }
  for (const fs::path& file : files) {
    struct stat st {};
    if (::lstat(file.c_str(), &st) != 0) continue;
    uint64_t allocated = static_cast<uint64_t>(st.st_blocks) * 512;
    if (S_ISREG(st.st_mode) && allocated > kStep) {
      // Large files shrink in steps, so a multi-GB removal reports progress as it goes.
      // Only a file whose one name is this one: truncating a hard-linked file (a destination made
      // with `cp -al` or `rsync --link-dest`) would empty the other names too.
      int fd = ::open(file.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
      struct stat opened {};
      if (fd >= 0 && (::fstat(fd, &opened) != 0 || opened.st_nlink != 1 ||
                      opened.st_dev != st.st_dev || opened.st_ino != st.st_ino)) {
        ::close(fd);
        fd = -1;
      }
      for (off_t size = st.st_size; fd >= 0 && size > 0;) {
        size = size > static_cast<off_t>(kStep) ? size - static_cast<off_t>(kStep) : 0;
        if (::ftruncate(fd, size) != 0) break;
        struct stat now {};
        if (::fstat(fd, &now) != 0) break;
        const uint64_t left = static_cast<uint64_t>(now.st_blocks) * 512;
        removed += allocated - std::min(allocated, left);
        allocated = std::min(allocated, left);
        if (progress) progress(removed, total);
      }
      if (fd >= 0) ::close(fd);
    }
    ::unlink(file.c_str());
    removed += allocated;
    if (progress) progress(removed, total);
  }
  fs::remove_all(root, ec);
  if (ec) return Error{root.string() + ": cannot remove: " + ec.message(), ErrorKind::kFailed};
  return Status::Ok();
}

unsigned process_umask() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Umask:", 0) == 0)
      return static_cast<unsigned>(std::stoul(line.substr(6), nullptr, 8));
  }
  const mode_t mask = ::umask(0);  // no /proc: read by setting and restoring (racy, rare)
  ::umask(mask);
  return static_cast<unsigned>(mask);
}

const std::vector<std::string>& CheckpointWriter::shard_names() const { return impl_->shard_names; }

size_t CheckpointWriter::shard_of(size_t plan_index) const {
  return impl_->shard_of.at(plan_index);
}

}  // namespace fp4moe::checkpoint
