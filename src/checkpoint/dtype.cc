// The safetensors dtype table.
#include "checkpoint/dtype.h"

#include <array>

namespace fp4moe::checkpoint {
namespace {

struct DTypeRow {
  DType dtype;
  std::string_view name;
  uint32_t bits;
};

// One row per dtype, in enum order (checked by tests via all_dtypes()).
constexpr std::array<DTypeRow, 20> kTable = {{
    {DType::BOOL, "BOOL", 8},       {DType::U8, "U8", 8},           {DType::I8, "I8", 8},
    {DType::F8_E5M2, "F8_E5M2", 8}, {DType::F8_E4M3, "F8_E4M3", 8}, {DType::F8_E8M0, "F8_E8M0", 8},
    {DType::I16, "I16", 16},        {DType::U16, "U16", 16},        {DType::F16, "F16", 16},
    {DType::BF16, "BF16", 16},      {DType::I32, "I32", 32},        {DType::U32, "U32", 32},
    {DType::F32, "F32", 32},        {DType::F64, "F64", 64},        {DType::I64, "I64", 64},
    {DType::U64, "U64", 64},        {DType::C64, "C64", 64},        {DType::F4, "F4", 4},
    {DType::F6_E2M3, "F6_E2M3", 6}, {DType::F6_E3M2, "F6_E3M2", 6},
}};

constexpr bool table_in_enum_order() {
  for (size_t i = 0; i < kTable.size(); ++i) {
    if (static_cast<size_t>(kTable[i].dtype) != i) return false;
  }
  return true;
}
static_assert(table_in_enum_order(), "kTable rows must follow the DType enum order");

constexpr std::array<DType, kTable.size()> make_all() {
  std::array<DType, kTable.size()> all{};
  for (size_t i = 0; i < kTable.size(); ++i) all[i] = kTable[i].dtype;
  return all;
}
constexpr std::array<DType, kTable.size()> kAll = make_all();

}  // namespace

std::span<const DType> all_dtypes() { return kAll; }

std::string_view dtype_name(DType dtype) { return kTable[static_cast<size_t>(dtype)].name; }

uint32_t dtype_bits(DType dtype) { return kTable[static_cast<size_t>(dtype)].bits; }

std::optional<DType> parse_dtype(std::string_view name) {
  for (const DTypeRow& row : kTable) {
    if (row.name == name) return row.dtype;
  }
  return std::nullopt;
}

}  // namespace fp4moe::checkpoint
