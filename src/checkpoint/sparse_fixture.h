// Test fixtures: full-size checkpoints whose headers are real and whose data are file holes.
//
// A 160 GB, 48-shard checkpoint costs a few megabytes of disk: every tensor not given explicit
// bytes is left a hole (reads as zeros). Used by checkpoint, detect, demo and convert tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "checkpoint/writer.h"
#include "core/status.h"

namespace fp4moe::checkpoint {

struct FixtureTensor {
  TensorSpec spec;
  std::vector<std::byte> bytes;  // empty: a hole of the tensor's size; else exactly its size
};

struct SparseFixtureOptions {
  uint64_t max_shard_bytes = 5'000'000'000;
  nlohmann::json config;           // written as config.json unless null
  nlohmann::json hf_quant_config;  // written as hf_quant_config.json unless null
};

// Writes a checkpoint directory at `dest` (which must not exist) through CheckpointWriter.
Status write_sparse_checkpoint(const std::filesystem::path& dest,
                               const std::vector<FixtureTensor>& tensors,
                               const SparseFixtureOptions& options);

// Bytes a file actually occupies on disk (st_blocks * 512); small for a sparse fixture.
Result<uint64_t> allocated_bytes(const std::filesystem::path& path);

}  // namespace fp4moe::checkpoint
