// libFuzzer target: a whole safetensors file image through the strict header parser.
// Every input must give either an error naming the input, or a header whose tensors tile the
// data section exactly (the invariant that makes zero-copy views safe); anything else aborts.
#include <cstddef>
#include <cstdint>
#include <span>

#include "checkpoint/safetensors.h"
#include "core/check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using fp4moe::checkpoint::SafetensorsHeader;
  using fp4moe::checkpoint::TensorInfo;
  const auto image = std::as_bytes(std::span<const uint8_t>(data, size));
  auto parsed = SafetensorsHeader::parse_image(image, "fuzz");
  if (!parsed.ok()) {
    FP4MOE_CHECK(parsed.error().message.rfind("fuzz: ", 0) == 0);
    return 0;
  }
  uint64_t end = 0;
  for (const TensorInfo& t : parsed->tensors()) {
    FP4MOE_CHECK(t.data_begin == end);
    FP4MOE_CHECK(t.data_end >= t.data_begin);
    FP4MOE_CHECK(parsed->find(t.name) == &t);
    end = t.data_end;
  }
  FP4MOE_CHECK(end == parsed->data_size());
  FP4MOE_CHECK(parsed->file_size() == size);
  return 0;
}
