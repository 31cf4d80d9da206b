// Byte views and exact float32 widening of checkpoint tensors.
#include "checkpoint/tensor_values.h"

#include <cstring>
#include <string>

#include "formats/scalar.h"

namespace fp4moe::checkpoint {

Result<std::span<const uint8_t>> tensor_bytes(const CheckpointDir& dir, const CheckpointTensor& t) {
  auto data = dir.data(t);
  if (!data.ok()) return data.error();
  return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(data->data()), data->size());
}

Result<std::vector<float>> read_f32(const CheckpointDir& dir, const CheckpointTensor& t) {
  const DType dtype = t.info->dtype;
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16) {
    return Error{dir.path().string() + ": tensor '" + t.info->name +
                 "': expected F32, BF16 or F16, found " + std::string(dtype_name(dtype))};
  }
  auto bytes = tensor_bytes(dir, t);
  if (!bytes.ok()) return bytes.error();
  std::vector<float> out(t.info->element_count);
  const uint8_t* p = bytes->data();
  if (dtype == DType::F32) {
    std::memcpy(out.data(), p, out.size() * sizeof(float));
    return out;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t h = 0;
    std::memcpy(&h, p + 2 * i, 2);
    out[i] = dtype == DType::BF16 ? formats::decode_bf16(h) : formats::decode_fp16(h);
  }
  return out;
}

}  // namespace fp4moe::checkpoint
