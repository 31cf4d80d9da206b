// Typed access to a tensor's bytes for the layers that compute with them (convert/, model/).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "checkpoint/checkpoint_dir.h"
#include "core/status.h"

namespace fp4moe::checkpoint {

// The tensor's bytes as uint8_t, the form formats/ and pack/ take (zero-copy).
Result<std::span<const uint8_t>> tensor_bytes(const CheckpointDir& dir, const CheckpointTensor& t);

// An F32, BF16 or F16 tensor widened exactly to float32. Copied, because safetensors data offsets
// need not be aligned for float loads. Any other dtype is an error naming the tensor.
Result<std::vector<float>> read_f32(const CheckpointDir& dir, const CheckpointTensor& t);

}  // namespace fp4moe::checkpoint
