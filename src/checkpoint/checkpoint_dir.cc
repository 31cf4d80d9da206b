// Checkpoint directory: JSON side files, shard discovery and containment, cross-shard lookup.
#include "checkpoint/checkpoint_dir.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <unordered_map>

#include "checkpoint/hf_cache.h"

namespace fp4moe::checkpoint {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kIndexName = kIndexFileName;
constexpr std::string_view kSingleName = "model.safetensors";

std::string in_quotes(std::string_view s) { return "'" + std::string(s) + "'"; }

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Deepest [ / { nesting of a JSON text, ignoring brackets inside strings; stops counting once the
// limit is passed. nlohmann's parser is iterative, but its DOM and destructor still cost memory per
// level, so hostile depth is refused before parsing.
int json_depth_exceeding(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return 0;
}

// Files that hold weights and are never copied as "side files".
bool is_weight_file(std::string_view name) {
  static constexpr std::string_view kWeightSuffixes[] = {
      ".safetensors", ".index.json", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack"};
  for (std::string_view s : kWeightSuffixes) {
    if (ends_with(name, s)) return true;
  }
  return false;
}

}  // namespace

bool path_is_inside(const fs::path& child, const fs::path& parent) {
  auto c = child.begin();
  for (auto p = parent.begin(); p != parent.end(); ++p, ++c) {
    if (c == child.end() || *c != *p) return false;
  }
  return true;
}

Result<nlohmann::json> read_json_file(const fs::path& path) {
  const std::string label = path.string();
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || st.type() == fs::file_type::not_found) {
    if (st.type() == fs::file_type::not_found) return nlohmann::json();
    return Error{label + ": cannot stat: " + ec.message()};
  }
  if (st.type() != fs::file_type::regular) return Error{label + ": not a regular file"};
  const uint64_t size = fs::file_size(path, ec);
  if (ec) return Error{label + ": cannot stat: " + ec.message()};
  if (size > kMaxJsonFileBytes) {
    return Error{label + ": " + std::to_string(size) + " bytes is over the " +
                 std::to_string(kMaxJsonFileBytes) + "-byte limit for a JSON side file"};
  }
  std::ifstream in(path, std::ios::binary);
  std::string text;
  text.resize(size);
  if (!in.read(text.data(), static_cast<std::streamsize>(size))) {
    return Error{label + ": cannot read"};
  }
  return parse_json_text(text, label);
}

// Python's json module writes the non-standard literals NaN, Infinity and -Infinity (real
// configs hold them, e.g. Nemotron's); outside strings they become null, so every reader of a
// config sees the same document whether or not the directory also has weights.
std::string without_python_literals(std::string_view text) {
  std::string clean;
  clean.reserve(text.size());
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      clean += c;
      if (c == '\\' && i + 1 < text.size()) {
        clean += text[++i];
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
      clean += c;
      continue;
    }
    bool replaced = false;
    for (const std::string_view token : {"-Infinity", "Infinity", "NaN"}) {
      if (text.substr(i, token.size()) == token) {
        clean += "null";
        i += token.size() - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) clean += c;
  }
  return clean;
}

Result<nlohmann::json> parse_json_text(std::string_view raw, std::string_view label) {
  const std::string text = without_python_literals(raw);
  if (json_depth_exceeding(text, kMaxJsonDepth) != 0) {
    return Error{std::string(label) + ": JSON nesting deeper than " +
                 std::to_string(kMaxJsonDepth) + " levels"};
  }
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return Error{std::string(label) + ": invalid JSON: " + e.what()};
  }
}

namespace {

// Why a shard name from an index or a listing cannot be a file of the directory, or nullopt.
std::optional<std::string> shard_name_problem(std::string_view name) {
  if (name.empty()) return "empty shard name";
  const fs::path rel(name);
  if (rel.is_absolute()) return "absolute path leaves the checkpoint directory";
  for (const fs::path& part : rel) {
    if (part == "..") return "'..' leaves the checkpoint directory";
  }
  return std::nullopt;
}

}  // namespace

Status check_contained(const fs::path& dir, const fs::path& file, std::string_view what) {
  std::error_code ec;
  const fs::path real = fs::canonical(file, ec);
  if (ec) return Error{std::string(what) + ": cannot resolve: " + ec.message()};
  if (path_is_inside(real, dir)) return Status::Ok();
  const std::optional<fs::path> blobs = hf_snapshot_blobs(dir);
  if (blobs && path_is_inside(real, *blobs)) return Status::Ok();
  return Error{std::string(what) + ": resolves to " + real.string() +
               ", outside the checkpoint directory (symlink)" +
               (blobs ? " and outside its Hugging Face cache repo's " + blobs->string() : "")};
}

Result<nlohmann::json> read_checkpoint_json(const fs::path& dir, std::string_view name) {
  const fs::path file = dir / std::string(name);
  std::error_code ec;
  const fs::file_status link = fs::symlink_status(file, ec);
  if (link.type() == fs::file_type::not_found) return nlohmann::json();
  if (link.type() == fs::file_type::symlink && !fs::exists(file, ec)) {
    return Error{file.string() + ": dangling symlink to " + fs::read_symlink(file, ec).string() +
                 " (a file whose download did not finish?)"};
  }
  FP4MOE_RETURN_IF_ERROR(check_contained(dir, file, file.string()));
  return read_json_file(file);
}

Result<std::optional<SafetensorsIndex>> read_safetensors_index(const fs::path& dir) {
  std::error_code ec;
  const fs::path root = fs::canonical(dir, ec);
  if (ec) return Error{dir.string() + ": cannot resolve: " + ec.message()};
  auto json = read_checkpoint_json(root, kIndexName);
  if (!json.ok()) return json.error();
  if (json->is_null()) return std::optional<SafetensorsIndex>{};
  SafetensorsIndex idx;
  idx.file = root / kIndexName;
  const std::string label = idx.file.string();
  const auto wm = json->is_object() ? json->find("weight_map") : json->end();
  if (!json->is_object() || wm == json->end() || !wm->is_object()) {
    return Error{label + ": missing 'weight_map' object"};
  }
  if (const auto meta = json->find("metadata"); meta != json->end() && !meta->is_null()) {
    if (!meta->is_object()) return Error{label + ": 'metadata' is not an object"};
    if (const auto total = meta->find("total_size"); total != meta->end() && !total->is_null()) {
      // Writers store it as an integer; some as a float with an integral value.
      if (total->is_number_unsigned() || (total->is_number_integer() && *total >= 0)) {
        idx.total_size = total->get<uint64_t>();
      } else if (total->is_number_float() && total->get<double>() >= 0 &&
                 total->get<double>() < 1.8e19 &&
                 total->get<double>() == static_cast<double>(total->get<uint64_t>())) {
        idx.total_size = total->get<uint64_t>();
      } else {
        return Error{label +
                     ": 'metadata.total_size' is not a non-negative integer: " + total->dump()};
      }
    }
  }
  std::map<std::string, bool> shards;
  for (const auto& [tensor, shard] : wm->items()) {
    if (!shard.is_string()) {
      return Error{label + ": weight_map entry of tensor " + in_quotes(tensor) +
                   " is not a string"};
    }
    const std::string& name = shard.get_ref<const std::string&>();
    if (auto bad = shard_name_problem(name)) {
      return Error{label + ": index maps tensor " + in_quotes(tensor) + " to shard " +
                   in_quotes(name) + ": " + *bad};
    }
    shards.emplace(name, true);
    idx.weight_map.emplace_back(tensor, name);
  }
  for (const auto& [name, unused] : shards) idx.shards.push_back(name);
  return std::optional<SafetensorsIndex>{std::move(idx)};
}

struct CheckpointDir::Impl {
  fs::path path;
  nlohmann::json config;
  nlohmann::json hf_quant_config;
  bool has_index = false;
  std::vector<fs::path> shard_paths;
  std::vector<SafetensorsHeader> headers;
  std::vector<CheckpointTensor> tensors;
  std::vector<uint32_t> by_name;  // indices into tensors, sorted by name
  uint64_t total_bytes = 0;

  mutable std::mutex map_mutex;
  mutable std::vector<std::optional<MappedFile>> maps;

  // Resolves a shard name from the index or a directory listing; `tensor` names the index entry
  // that referred to it ("" for a listing).
  Result<fs::path> resolve_shard(std::string_view name, std::string_view tensor) const {
    const std::string where =
        tensor.empty() ? "shard " + in_quotes(name)
                       : "index maps tensor " + in_quotes(tensor) + " to shard " + in_quotes(name);
    const std::string index_label = (path / kIndexName).string();
    const std::string& label = tensor.empty() ? path.string() : index_label;
    if (auto bad = shard_name_problem(name)) return Error{label + ": " + where + ": " + *bad};
    const fs::path full = path / fs::path(name);
    std::error_code ec;
    const fs::file_status st = fs::status(full, ec);
    if (st.type() == fs::file_type::not_found) {
      return Error{label + ": " + where + ": missing shard (no such file)"};
    }
    if (ec) return Error{label + ": " + where + ": cannot stat: " + ec.message()};
    if (st.type() != fs::file_type::regular) {
      return Error{label + ": " + where + ": not a regular file"};
    }
    FP4MOE_RETURN_IF_ERROR(check_contained(path, full, label + ": " + where));
    return full;
  }
};

CheckpointDir::CheckpointDir(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointDir::CheckpointDir(CheckpointDir&&) noexcept = default;
CheckpointDir& CheckpointDir::operator=(CheckpointDir&&) noexcept = default;
CheckpointDir::~CheckpointDir() = default;

Result<CheckpointDir> CheckpointDir::open(const fs::path& dir) {
  auto impl = std::make_unique<Impl>();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Error{dir.string() + ": not a directory"};
  impl->path = fs::canonical(dir, ec);
  if (ec) return Error{dir.string() + ": cannot resolve: " + ec.message()};
  const fs::path& root = impl->path;

  auto config = read_checkpoint_json(root, "config.json");
  if (!config.ok()) return config.error();
  impl->config = std::move(config).value();
  auto quant = read_checkpoint_json(root, "hf_quant_config.json");
  if (!quant.ok()) return quant.error();
  impl->hf_quant_config = std::move(quant).value();

  // Shard names, and for an index the tensor -> shard map it promises.
  std::vector<std::string> shard_names;
  std::vector<std::pair<std::string, uint32_t>> promised;  // tensor -> shard index
  auto index = read_safetensors_index(root);
  if (!index.ok()) return index.error();
  if (index->has_value()) {
    impl->has_index = true;
    const SafetensorsIndex& idx = **index;
    std::map<std::string, uint32_t> shard_ids;
    for (uint32_t i = 0; i < idx.shards.size(); ++i) shard_ids[idx.shards[i]] = i;
    // Each shard is resolved once, under the first index entry that names it.
    std::vector<bool> resolved(idx.shards.size(), false);
    for (const auto& [tensor, shard] : idx.weight_map) {
      const uint32_t id = shard_ids.at(shard);
      promised.emplace_back(tensor, id);
      if (resolved[id]) continue;
      resolved[id] = true;
      auto full = impl->resolve_shard(shard, tensor);
      if (!full.ok()) return full.error();
    }
    shard_names = idx.shards;
  } else if (fs::exists(root / kSingleName, ec)) {
    shard_names.emplace_back(kSingleName);
  } else {
    for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
      const std::string name = e.path().filename().string();
      if (ends_with(name, ".safetensors")) shard_names.push_back(name);
    }
    if (ec) return Error{root.string() + ": cannot list: " + ec.message()};
    std::sort(shard_names.begin(), shard_names.end());
    if (shard_names.empty()) {
      return Error{root.string() + ": no " + std::string(kIndexName) + ", no " +
                   std::string(kSingleName) + " and no *.safetensors files"};
    }
  }

  for (const std::string& name : shard_names) {
    auto full = impl->resolve_shard(name, "");
    if (!full.ok()) return full.error();
    auto header = SafetensorsHeader::read(*full);
    if (!header.ok()) return header.error();
    impl->shard_paths.push_back(std::move(full).value());
    impl->headers.push_back(std::move(header).value());
  }
  impl->maps.resize(shard_names.size());

  for (uint32_t s = 0; s < impl->headers.size(); ++s) {
    for (const TensorInfo& t : impl->headers[s].tensors()) {
      impl->tensors.push_back({&t, s});
      impl->total_bytes += t.byte_size();
    }
  }
  const auto& ts = impl->tensors;
  impl->by_name.resize(ts.size());
  for (uint32_t i = 0; i < ts.size(); ++i) impl->by_name[i] = i;
  std::sort(impl->by_name.begin(), impl->by_name.end(),
            [&](uint32_t a, uint32_t b) { return ts[a].info->name < ts[b].info->name; });
  for (size_t i = 1; i < impl->by_name.size(); ++i) {
    const CheckpointTensor& a = ts[impl->by_name[i - 1]];
    const CheckpointTensor& b = ts[impl->by_name[i]];
    if (a.info->name == b.info->name) {
      return Error{root.string() + ": tensor " + in_quotes(a.info->name) + " is in two shards: " +
                   in_quotes(shard_names[a.shard]) + " and " + in_quotes(shard_names[b.shard])};
    }
  }

  CheckpointDir result(std::move(impl));
  if (result.impl_->has_index) {
    const std::string label = (root / kIndexName).string();
    for (const auto& [tensor, shard] : promised) {
      const CheckpointTensor* found = result.find(tensor);
      if (found == nullptr || found->shard != shard) {
        return Error{label + ": index maps tensor " + in_quotes(tensor) + " to shard " +
                     in_quotes(shard_names[shard]) + ", which does not contain it"};
      }
    }
    if (promised.size() != ts.size()) {
      // Every promise was kept and names are unique, so some shard tensor is not in the index.
      std::map<std::string_view, bool> listed;
      for (const auto& p : promised) listed.emplace(p.first, true);
      for (const CheckpointTensor& t : ts) {
        if (!listed.count(t.info->name)) {
          return Error{label + ": tensor " + in_quotes(t.info->name) + " of shard " +
                       in_quotes(shard_names[t.shard]) + " is missing from the weight_map"};
        }
      }
    }
  }
  return result;
}

const fs::path& CheckpointDir::path() const { return impl_->path; }
const nlohmann::json& CheckpointDir::config() const { return impl_->config; }
const nlohmann::json& CheckpointDir::hf_quant_config() const { return impl_->hf_quant_config; }
bool CheckpointDir::has_index() const { return impl_->has_index; }
size_t CheckpointDir::shard_count() const { return impl_->shard_paths.size(); }
const fs::path& CheckpointDir::shard_path(size_t shard) const {
  return impl_->shard_paths.at(shard);
}
const SafetensorsHeader& CheckpointDir::shard_header(size_t shard) const {
  return impl_->headers.at(shard);
}
const std::vector<CheckpointTensor>& CheckpointDir::tensors() const { return impl_->tensors; }
uint64_t CheckpointDir::total_tensor_bytes() const { return impl_->total_bytes; }

const CheckpointTensor* CheckpointDir::find(std::string_view name) const {
  const auto& ts = impl_->tensors;
  const auto it =
      std::lower_bound(impl_->by_name.begin(), impl_->by_name.end(), name,
                       [&](uint32_t i, std::string_view n) { return ts[i].info->name < n; });
  if (it == impl_->by_name.end() || ts[*it].info->name != name) return nullptr;
  return &ts[*it];
}

Result<std::span<const std::byte>> CheckpointDir::data(const CheckpointTensor& tensor) const {
  FP4MOE_CHECK(tensor.shard < impl_->headers.size());
  const SafetensorsHeader& header = impl_->headers[tensor.shard];
  const fs::path& shard = impl_->shard_paths[tensor.shard];
  std::lock_guard<std::mutex> lock(impl_->map_mutex);
  std::optional<MappedFile>& map = impl_->maps[tensor.shard];
  if (!map) {
    auto opened = MappedFile::open(shard);
    if (!opened.ok()) return opened.error();
    if (opened->bytes().size() != header.file_size()) {
      return Error{shard.string() + ": tensor " + in_quotes(tensor.info->name) + ": file is " +
                   std::to_string(opened->bytes().size()) + " bytes, header said " +
                   std::to_string(header.file_size()) + ": it changed on disk since it was opened"};
    }
    map = std::move(opened).value();
  }
  return map->bytes().subspan(header.data_offset() + tensor.info->data_begin,
                              tensor.info->byte_size());
}

Result<std::span<const std::byte>> CheckpointDir::data(std::string_view name) const {
  const CheckpointTensor* t = find(name);
  if (t == nullptr)
    return Error{impl_->path.string() + ": tensor " + in_quotes(name) + ": no such tensor"};
  return data(*t);
}

std::vector<fs::path> list_side_files(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  const fs::path root = fs::canonical(dir, ec);
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name[0] == '.' || is_weight_file(name)) continue;
    // A side file that resolves outside the checkpoint (and outside a cache snapshot's blobs/)
    // is never copied: it is not part of this checkpoint.
    if (fs::is_regular_file(e.path(), ec) && check_contained(root, e.path(), name).ok()) {
      files.push_back(e.path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<fs::path> CheckpointDir::non_weight_files() const {
  return list_side_files(impl_->path);
}

}  // namespace fp4moe::checkpoint
