// st_tool: a small command-line bridge for the Python round-trip tests.
//   st_tool dump FILE        the validated header and every tensor's bytes (hex) as JSON
//   st_tool dumpdir DIR      the same for a checkpoint directory, with each tensor's shard
//   st_tool check FILE       "ok", or the error message and exit status 1
//   st_tool write DEST SPEC  writes a checkpoint from a JSON spec:
//       {"tensors": [{"name", "dtype", "shape", "hex"}], "max_shard_bytes", "metadata",
//        "source_dir", "files": {name: content}}
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/writer.h"

namespace {

using namespace fp4moe::checkpoint;
using nlohmann::json;

std::string to_hex(std::span<const std::byte> bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const std::byte b : bytes) {
    out.push_back(kHex[static_cast<unsigned>(b) >> 4]);
    out.push_back(kHex[static_cast<unsigned>(b) & 0xF]);
  }
  return out;
}

bool from_hex(const std::string& hex, std::vector<std::byte>& out) {
  if (hex.size() % 2 != 0) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  out.resize(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<std::byte>(hi * 16 + lo);
  }
  return true;
}

json tensor_json(const TensorInfo& t, std::span<const std::byte> bytes) {
  return {{"name", t.name},
          {"dtype", std::string(dtype_name(t.dtype))},
          {"shape", t.shape},
          {"data_offsets", {t.data_begin, t.data_end}},
          {"hex", to_hex(bytes)}};
}

int fail(const std::string& message) {
  std::cerr << message << "\n";
  return 1;
}

int dump(const std::string& path) {
  auto file = SafetensorsFile::open(path);
  if (!file.ok()) return fail(file.error().message);
  json out = {{"metadata", file->metadata()}, {"tensors", json::array()}};
  for (const TensorInfo& t : file->tensors())
    out["tensors"].push_back(tensor_json(t, file->data(t)));
  std::cout << out.dump() << "\n";
  return 0;
}

int dumpdir(const std::string& path) {
  auto ckpt = CheckpointDir::open(path);
  if (!ckpt.ok()) return fail(ckpt.error().message);
  json out = {{"config", ckpt->config()}, {"tensors", json::array()}, {"shards", json::array()}};
  for (size_t s = 0; s < ckpt->shard_count(); ++s) {
    out["shards"].push_back(ckpt->shard_path(s).filename().string());
  }
  for (const CheckpointTensor& t : ckpt->tensors()) {
    auto bytes = ckpt->data(t);
    if (!bytes.ok()) return fail(bytes.error().message);
    json j = tensor_json(*t.info, *bytes);
    j["shard"] = ckpt->shard_path(t.shard).filename().string();
    out["tensors"].push_back(std::move(j));
  }
  std::cout << out.dump() << "\n";
  return 0;
}

int check(const std::string& path) {
  auto file = SafetensorsFile::open(path);
  if (!file.ok()) return fail(file.error().message);
  std::cout << "ok\n";
  return 0;
}

int write(const std::string& dest, const std::string& spec_path) {
  auto spec = read_json_file(spec_path);
  if (!spec.ok()) return fail(spec.error().message);
  if (spec->is_null()) return fail(spec_path + ": no such file");
  try {
    std::vector<TensorSpec> plan;
    std::vector<std::vector<std::byte>> data;
    for (const json& t : spec->at("tensors")) {
      const auto dtype = parse_dtype(t.at("dtype").get<std::string>());
      if (!dtype) return fail(spec_path + ": unknown dtype " + t.at("dtype").dump());
      plan.push_back(
          {t.at("name").get<std::string>(), *dtype, t.at("shape").get<std::vector<int64_t>>()});
      if (!from_hex(t.at("hex").get<std::string>(), data.emplace_back())) {
        return fail(spec_path + ": bad hex for " + plan.back().name);
      }
    }
    WriterOptions options;
    if (spec->contains("max_shard_bytes")) options.max_shard_bytes = spec->at("max_shard_bytes");
    if (spec->contains("metadata")) options.metadata = spec->at("metadata");
    if (spec->contains("source_dir"))
      options.source_dir = spec->at("source_dir").get<std::string>();
    if (spec->contains("files")) options.files = spec->at("files");
    auto writer = CheckpointWriter::create(dest, plan, options);
    if (!writer.ok()) return fail(writer.error().message);
    for (size_t i = 0; i < plan.size(); ++i) {
      auto st = writer->write(plan[i].name, data[i]);
      if (!st.ok()) return fail(st.error().message);
    }
    auto st = writer->finish();
    if (!st.ok()) return fail(st.error().message);
  } catch (const json::exception& e) {
    return fail(spec_path + ": bad spec: " + e.what());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage = "usage: st_tool dump FILE | dumpdir DIR | check FILE | write DEST SPEC";
  if (argc < 3) return fail(usage);
  const std::string cmd = argv[1];
  if (cmd == "dump" && argc == 3) return dump(argv[2]);
  if (cmd == "dumpdir" && argc == 3) return dumpdir(argv[2]);
  if (cmd == "check" && argc == 3) return check(argv[2]);
  if (cmd == "write" && argc == 4) return write(argv[2], argv[3]);
  return fail(usage);
}
