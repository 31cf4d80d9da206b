// MXFP4 -> NVFP4 checkpoint conversion: find the MXFP4 modules, transcode each gate/up group with a
// shared tensor scale, stream every tensor to the writer in source order, rewrite the configs.
#include "convert/convert.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/writer.h"
#include "detect/directory.h"

namespace fp4moe::convert {
namespace {

namespace fs = std::filesystem;
using checkpoint::CheckpointDir;
using checkpoint::CheckpointTensor;
using checkpoint::DType;
using checkpoint::TensorSpec;

constexpr const char* kVersion = "0.1.0";

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool matches_any(const std::string& name, const std::vector<std::string>& patterns) {
  for (const auto& p : patterns) {
    if (fnmatch(p.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

// w1 and w3 (gate and up) of one expert feed one fused GEMM, so they share one tensor scale.
std::string group_key(const std::string& module) {
  for (const auto& [a, b] : {std::pair{".w1", ".w3"}, std::pair{".gate_proj", ".up_proj"}}) {
    for (const char* suffix : {a, b}) {
      if (ends_with(module, suffix)) {
        return module.substr(0, module.size() - std::strlen(suffix)) + "." + a + "+" + b;
      }
    }
  }
  return module;
}

// The container a module belongs to in ModelOpt's quantized_layers ("layers.3.ffn.experts").
std::string container_of(const std::string& module) {
  const auto pos = module.rfind(".experts.");
  return pos == std::string::npos ? module : module.substr(0, pos + 8);
}

// Whether a tensor's bytes read as zeros because they are a file hole of its shard. SEEK_DATA works
// in file-system blocks, so the hole is checked between the block boundaries inside the tensor and
// the partial blocks at its two ends are read and must be zero. Such tensors are written as holes,
// which keeps sparse checkpoints (the full-size test layouts) sparse. A file system without
// SEEK_DATA reports everything as data: we then copy.
bool is_file_hole(const CheckpointDir& dir, const CheckpointTensor& t) {
  constexpr uint64_t kBlock = 4096;
  const uint64_t size = t.info->byte_size();
  if (size < 2 * kBlock) return false;  // small tensors are just copied
  const int fd = ::open(dir.shard_path(t.shard).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const uint64_t begin = dir.shard_header(t.shard).data_offset() + t.info->data_begin;
  const uint64_t end = begin + size;
  const uint64_t inner_begin = (begin + kBlock - 1) / kBlock * kBlock;
  const uint64_t inner_end = end / kBlock * kBlock;
  bool hole = false;
  const off_t next_data = ::lseek(fd, static_cast<off_t>(inner_begin), SEEK_DATA);
  if ((next_data < 0 && errno == ENXIO) ||
      (next_data >= 0 && static_cast<uint64_t>(next_data) >= inner_end)) {
    std::vector<char> edge(kBlock);
    hole = true;
    for (const auto& [from, to] : {std::pair{begin, inner_begin}, std::pair{inner_end, end}}) {
      const auto n = static_cast<size_t>(to - from);
      if (n == 0) continue;
      hole = hole &&
             ::pread(fd, edge.data(), n, static_cast<off_t>(from)) == static_cast<ssize_t>(n) &&
             std::all_of(edge.begin(), edge.begin() + static_cast<std::ptrdiff_t>(n),
                         [](char c) { return c == 0; });
    }
  }
  ::close(fd);
  return hole;
}

struct Mxfp4Module {
  std::string name;
  const CheckpointTensor* weight = nullptr;
  const CheckpointTensor* scale = nullptr;
  int64_t rows = 0, cols = 0;  // logical [N, K]
  size_t group = 0;
  std::vector<uint8_t> packed, block_scales;  // NVFP4 output, alive until written
  float tensor_scale = 0.0f;
  bool hole = false;  // weight and scale are file holes: all zeros, written as holes
};

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A module is MXFP4 in the DeepSeek-V4 layout: weight I8/U8 [N, K/2] + scale E8M0/U8 [N, K/32].
Result<std::vector<Mxfp4Module>> find_mxfp4_modules(const CheckpointDir& dir,
                                                    const std::vector<std::string>& patterns) {
  std::vector<Mxfp4Module> modules;
  std::map<std::string, size_t> groups;
  for (const auto& t : dir.tensors()) {
    const std::string& name = t.info->name;
    if (!ends_with(name, ".weight")) continue;
    const std::string module = name.substr(0, name.size() - 7);
    if (!matches_any(module, patterns)) continue;
    const CheckpointTensor* scale = dir.find(module + ".scale");
    const auto& w = *t.info;
    const bool weight_ok = (w.dtype == DType::I8 || w.dtype == DType::U8) && w.shape.size() == 2;
    const bool scale_ok =
        scale != nullptr &&
        (scale->info->dtype == DType::F8_E8M0 || scale->info->dtype == DType::U8) &&
        scale->info->shape.size() == 2 && weight_ok && scale->info->shape[0] == w.shape[0] &&
        scale->info->shape[1] * 16 == w.shape[1];
    if (!scale_ok) {
      return Error{dir.path().string() + ": module '" + module + "' matches --modules but is not " +
                   "MXFP4 (weight " + std::string(checkpoint::dtype_name(w.dtype)) + " " +
                   shape_text(w.shape) +
                   (scale ? ", scale " + std::string(checkpoint::dtype_name(scale->info->dtype)) +
                                " " + shape_text(scale->info->shape)
                          : ", no .scale tensor") +
                   "); this converter reads MXFP4 (packed weight + E8M0 scale per 32)"};
    }
    Mxfp4Module m;
    m.name = module;
    m.weight = &t;
    m.scale = scale;
    m.rows = w.shape[0];
    m.cols = w.shape[1] * 2;
    m.group = groups.emplace(group_key(module), groups.size()).first->second;
    modules.push_back(std::move(m));
  }
  if (modules.empty()) {
    std::string list;
    for (const auto& p : patterns) list += (list.empty() ? "" : ", ") + p;
    return Error{dir.path().string() + ": no tensor matches the module patterns (" + list + ")"};
  }
  return modules;
}

Status transcode_group(const CheckpointDir& dir, std::vector<Mxfp4Module*>& members,
                       formats::TranscodeReport& total) {
  // A group stored as file holes is all zeros: its NVFP4 form is zero nibbles, and zero block
  // scales dequantize those to the same zeros, so it stays a hole (tensor scale 1).
  const bool all_holes = std::all_of(members.begin(), members.end(), [&](const Mxfp4Module* m) {
    return is_file_hole(dir, *m->weight) && is_file_hole(dir, *m->scale);
  });
  if (all_holes) {
    for (Mxfp4Module* m : members) {
      m->hole = true;
      m->tensor_scale = 1.0f;
      const auto blocks = static_cast<int64_t>(m->weight->info->byte_size() / 8);
      total.blocks_total += blocks;
      total.blocks_all_zero += blocks;
    }
    return Status::Ok();
  }
  std::vector<formats::Mxfp4Source> sources;
  std::vector<formats::Nvfp4Destination> destinations;
  for (Mxfp4Module* m : members) {
    auto packed = dir.data(*m->weight);
    if (!packed.ok()) return packed.error();
    auto scales = dir.data(*m->scale);
    if (!scales.ok()) return scales.error();
    m->packed.resize(packed->size());
    m->block_scales.resize(packed->size() / 8);
    sources.push_back({m->weight->info->name,
                       {reinterpret_cast<const uint8_t*>(packed->data()), packed->size()},
                       {reinterpret_cast<const uint8_t*>(scales->data()), scales->size()},
                       m->rows,
                       m->cols});
    destinations.push_back({m->packed, m->block_scales});
  }
  auto report = formats::transcode_mxfp4_to_nvfp4(sources, destinations);
  if (!report.ok()) return Error{dir.path().string() + ": " + report.error().message};
  for (Mxfp4Module* m : members) m->tensor_scale = report->tensor_scale;
  total.merge(*report);
  return Status::Ok();
}

std::pair<nlohmann::json, nlohmann::json> rewrite_configs(const CheckpointDir& dir,
                                                          const std::vector<Mxfp4Module>& modules) {
  nlohmann::json layers = nlohmann::json::object();
  for (const auto& m : modules) {
    layers[container_of(m.name)] = {{"quant_algo", "W4A16_NVFP4"}, {"group_size", 16}};
  }
  const nlohmann::json producer = {
      {"name", "fp4moe"},
      {"version", kVersion},
      {"note",
       "weight-only NVFP4 (ModelOpt W4A16_NVFP4): converted without calibration data, so "
       "there are no input_scale tensors; activations stay in BF16"}};
  nlohmann::json config = dir.config().is_object() ? dir.config() : nlohmann::json::object();
  nlohmann::json qc =
      config.contains("quantization_config") && config["quantization_config"].is_object()
          ? config["quantization_config"]
          : nlohmann::json::object();
  const bool deepseek_v4 = config.value("model_type", "") == "deepseek_v4";
  // NVIDIA's DeepSeek-V4-Flash-NVFP4 form (FORMATS.md §3): the FP8 base stays (`quant_method:
  // fp8`, 128x128 UE8M0 blocks for attention and shared experts) and the routed experts are named
  // by `moe_quant_algo` and `quantized_layers`; SGLang keys its NVFP4 MoE path on `moe_quant_algo`,
  // TensorRT-LLM reads hf_quant_config.json, vLLM reads quantized_layers per module.
  if (!qc.contains("quant_method")) qc["quant_method"] = "modelopt";
  qc["quant_algo"] = "MIXED_PRECISION";
  // Weight-only: ModelOpt's name for NVFP4 weights with BF16 activations. An engine that only
  // knows "NVFP4" (W4A4) would look for input_scale tensors that do not exist.
  qc["moe_quant_algo"] = "W4A16_NVFP4";
  qc["group_size"] = 16;
  qc["kv_cache_quant_algo"] = nullptr;
  qc["producer"] = producer;
  qc["quantized_layers"] = layers;
  qc["config_groups"] = {
      {"group_0",
       {{"targets", {"Linear"}},
        {"weights", {{"num_bits", 4}, {"type", "float"}, {"group_size", 16}, {"dynamic", false}}},
        {"input_activations", nullptr}}}};
  nlohmann::json ignore = nlohmann::json::array();
  if (deepseek_v4) ignore = {"*.attn.*", "*.ffn.shared_experts.*", "head", "mtp.*"};
  qc["ignore"] = ignore;
  config["quantization_config"] = qc;
  nlohmann::json hf_quant = {{"producer", producer},
                             {"quantization",
                              {{"quant_algo", "MIXED_PRECISION"},
                               {"kv_cache_quant_algo", nullptr},
                               {"group_size", 16},
                               {"exclude_modules", ignore},
                               {"quantized_layers", layers}}}};
  return {config, hf_quant};
}

template <class T>
std::span<const std::byte> as_bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

}  // namespace

Result<ConvertSummary> convert_mxfp4_to_nvfp4(const fs::path& source, const fs::path& destination,
                                              const ConvertOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  std::error_code ec;
  if (!fs::is_directory(source, ec)) {
    return Error{source.string() + ": not a checkpoint directory (missing or not a directory)"};
  }
  if (fs::exists(destination, ec)) {
    if (!options.force) {
      return Error{destination.string() + ": destination exists; pass --force to replace it"};
    }
    const auto src = fs::canonical(source, ec);
    const auto dst = fs::canonical(destination, ec);
    if (checkpoint::path_is_inside(src, dst) || checkpoint::path_is_inside(dst, src)) {
      return Error{destination.string() +
                   ": refusing to replace a destination that is or holds "
                   "the source " +
                   source.string()};
    }
  }
  // Conversion rewrites the configs from what they claim: a source whose configs contradict its
  // tensors (an error finding of inspect) would produce a checkpoint that lies, so it is refused.
  auto inspected = detect::detect_directory(source);
  if (!inspected.ok()) return inspected.error();
  for (const auto& f : inspected->manifest.findings) {
    if (f.severity == detect::Severity::kError) {
      return Error{source.string() + ": refusing to convert: fp4moe inspect reports [" + f.code +
                   "] " + f.message};
    }
  }
  auto dir = CheckpointDir::open(source);
  if (!dir.ok()) return dir.error();
  auto found = find_mxfp4_modules(*dir, options.module_patterns);
  if (!found.ok()) return found.error();
  std::vector<Mxfp4Module> modules = std::move(*found);

  std::map<std::string, size_t> module_of_weight, module_of_scale;
  for (size_t i = 0; i < modules.size(); ++i) {
    module_of_weight[modules[i].weight->info->name] = i;
    module_of_scale[modules[i].scale->info->name] = i;
  }
  // The plan: source order; a converted weight becomes its three ModelOpt tensors.
  std::vector<TensorSpec> plan;
  for (const auto& t : dir->tensors()) {
    const std::string& name = t.info->name;
    if (module_of_scale.count(name)) continue;
    if (auto it = module_of_weight.find(name); it != module_of_weight.end()) {
      const auto& m = modules[it->second];
      plan.push_back({m.name + ".weight", DType::U8, {m.rows, m.cols / 2}});
      plan.push_back({m.name + ".weight_scale", DType::F8_E4M3, {m.rows, m.cols / 16}});
      plan.push_back({m.name + ".weight_scale_2", DType::F32, {}});
    } else {
      plan.push_back({name, t.info->dtype, t.info->shape});
    }
  }
  ConvertSummary summary;
  std::tie(summary.config, summary.hf_quant_config) = rewrite_configs(*dir, modules);

  checkpoint::WriterOptions writer_options;
  writer_options.max_shard_bytes = options.max_shard_bytes;
  writer_options.source_dir = source;
  writer_options.files = {{"config.json", summary.config.dump(2) + "\n"},
                          {"hf_quant_config.json", summary.hf_quant_config.dump(2) + "\n"}};
  if (options.force && fs::exists(destination, ec)) fs::remove_all(destination, ec);
  auto writer = checkpoint::CheckpointWriter::create(destination, plan, writer_options);
  if (!writer.ok()) return writer.error();

  std::vector<std::vector<Mxfp4Module*>> groups;
  for (auto& m : modules) {
    if (groups.size() <= m.group) groups.resize(m.group + 1);
    groups[m.group].push_back(&m);
  }
  std::vector<bool> group_done(groups.size(), false);
  ConvertProgress progress{0, dir->total_tensor_bytes(), 0, dir->tensors().size()};
  for (const auto& t : dir->tensors()) {
    if (options.cancel != nullptr && options.cancel->load()) {
      return Error{destination.string() + ": interrupted; nothing was written"};
    }
    const std::string& name = t.info->name;
    if (auto it = module_of_weight.find(name); it != module_of_weight.end()) {
      Mxfp4Module& m = modules[it->second];
      if (!group_done[m.group]) {
        FP4MOE_RETURN_IF_ERROR(transcode_group(*dir, groups[m.group], summary.report));
        group_done[m.group] = true;
      }
      if (m.hole) {
        FP4MOE_RETURN_IF_ERROR(writer->write_hole(m.name + ".weight"));
        FP4MOE_RETURN_IF_ERROR(writer->write_hole(m.name + ".weight_scale"));
      } else {
        FP4MOE_RETURN_IF_ERROR(writer->write(m.name + ".weight", as_bytes_of(m.packed)));
        FP4MOE_RETURN_IF_ERROR(
            writer->write(m.name + ".weight_scale", as_bytes_of(m.block_scales)));
      }
      FP4MOE_RETURN_IF_ERROR(
          writer->write(m.name + ".weight_scale_2", std::as_bytes(std::span(&m.tensor_scale, 1))));
      summary.bytes_written +=
          m.weight->info->byte_size() + m.weight->info->byte_size() / 8 + sizeof(float);
      std::vector<uint8_t>().swap(m.packed);  // keep memory to the groups in flight
      std::vector<uint8_t>().swap(m.block_scales);
      ++summary.modules_converted;
    } else if (!module_of_scale.count(name)) {
      if (is_file_hole(*dir, t)) {
        FP4MOE_RETURN_IF_ERROR(writer->write_hole(name));
      } else {
        auto bytes = dir->data(t);
        if (!bytes.ok()) return bytes.error();
        FP4MOE_RETURN_IF_ERROR(writer->write(name, *bytes));
      }
      summary.bytes_written += t.info->byte_size();
      ++summary.tensors_copied;
    }
    progress.bytes_done += t.info->byte_size();
    summary.bytes_read += t.info->byte_size();
    ++progress.tensors_done;
    if (options.on_progress) options.on_progress(progress);
  }
  FP4MOE_RETURN_IF_ERROR(writer->finish());
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace fp4moe::convert
