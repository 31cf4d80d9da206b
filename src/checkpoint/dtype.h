// The element types of the safetensors format: one table row per dtype (name, bits per element).
//
// Names and widths follow the safetensors spec (huggingface/safetensors `Dtype`). Sub-byte dtypes
// (F4 = E2M1, two per byte; F6_* = 6-bit floats, four per three bytes) are packed densely: a
// tensor's byte size is element_count * bits / 8, and a tensor whose bit count is not a multiple of
// 8 is invalid (it would end mid-byte). This layer knows widths only; what the codes mean lives in
// formats/.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace fp4moe::checkpoint {

enum class DType : uint8_t {
  BOOL,
  U8,
  I8,
  F8_E5M2,
  F8_E4M3,
  F8_E8M0,
  I16,
  U16,
  F16,
  BF16,
  I32,
  U32,
  F32,
  F64,
  I64,
  U64,
  C64,
  F4,       // E2M1, two elements per byte, element 2i in the low nibble
  F6_E2M3,  // 6-bit float, packed: 4 elements per 3 bytes
  F6_E3M2,  // 6-bit float, packed: 4 elements per 3 bytes
};

// Every dtype, in enum order; tests and tools iterate over this.
std::span<const DType> all_dtypes();

// The safetensors spelling: "F8_E4M3", "BF16", "F4", ...
std::string_view dtype_name(DType dtype);

// Storage bits per element: 1 byte for BOOL, 4 for F4, 6 for F6_*, 64 for C64 (two F32).
uint32_t dtype_bits(DType dtype);

// Parses the exact safetensors spelling (case-sensitive, as the format is); nullopt if unknown.
std::optional<DType> parse_dtype(std::string_view name);

}  // namespace fp4moe::checkpoint
