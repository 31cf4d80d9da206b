// A strict, zero-copy reader for one .safetensors file: header parsing and validation, mmap'd
// views.
//
// Layout of a file: u64 little-endian N, then N bytes of JSON (the header), then the data section.
// The header is a flat object: an optional "__metadata__" object of string values, and one object
// per tensor with "dtype", "shape" (non-negative integers) and "data_offsets" [begin, end) relative
// to the data section. Every file is treated as hostile; validation is at least as strict as
// huggingface/safetensors (see safetensors.cc for the list). Every error names the file, the
// tensor where there is one, and the reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/dtype.h"
#include "core/status.h"

namespace fp4moe::checkpoint {

// Largest header accepted, as in huggingface/safetensors: a 50,000-tensor header is about 5 MB.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct TensorInfo {
  std::string name;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;  // logical elements per axis; [] is a scalar (one element)
  uint64_t element_count = 0;  // product of shape, checked for overflow
  uint64_t data_begin = 0;     // byte offsets into the data section, [data_begin, data_end)
  uint64_t data_end = 0;
  uint64_t byte_size() const { return data_end - data_begin; }
};

// Checked size of a tensor in bytes; an error (naming `what`) on overflow or a sub-byte tensor
// that ends mid-byte.
Result<uint64_t> tensor_byte_size(DType dtype, std::span<const int64_t> shape,
                                  std::string_view what);

// A parsed, validated header: everything a file says about its tensors, without their data.
class SafetensorsHeader {
 public:
  // Validates `header_json` (the N bytes after the length prefix) for a file whose data section is
  // `data_size` bytes. `label` names the file in error messages.
  static Result<SafetensorsHeader> parse(std::span<const std::byte> header_json, uint64_t data_size,
                                         std::string_view label);
  // Parses a complete file image held in memory (length prefix, header, data).
  static Result<SafetensorsHeader> parse_image(std::span<const std::byte> image,
                                               std::string_view label);
  // Reads the length prefix and header from disk with pread, never touching the data section.
  static Result<SafetensorsHeader> read(const std::filesystem::path& path);

  // Tensors in the order of their data in the file.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // The tensor named `name`, or nullptr. O(log n).
  const TensorInfo* find(std::string_view name) const;
  // "__metadata__", empty when the file has none.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  uint64_t header_size() const { return header_size_; }      // N, the JSON byte count
  uint64_t data_offset() const { return 8 + header_size_; }  // where the data section starts
  uint64_t data_size() const { return data_size_; }
  uint64_t file_size() const { return data_offset() + data_size_; }

 private:
  std::vector<TensorInfo> tensors_;
  std::vector<uint32_t> by_name_;  // indices into tensors_, sorted by name
  std::map<std::string, std::string> metadata_;
  uint64_t header_size_ = 0;
  uint64_t data_size_ = 0;
};

// A read-only memory mapping of a whole file. Move-only.
class MappedFile {
 public:
  static Result<MappedFile> open(const std::filesystem::path& path);
  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const std::byte> bytes() const { return {data_, size_}; }

 private:
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// One .safetensors file, mmap'd read-only: the validated header plus zero-copy views of tensor
// data. Pages are read from disk only when a view is touched. Views stay valid while the file
// object lives. Note for hostile environments: a file truncated by someone else after open makes
// a later access to a vanished page fault (SIGBUS); that is the price of zero copy.
class SafetensorsFile {
 public:
  static Result<SafetensorsFile> open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors(); }
  const TensorInfo* find(std::string_view name) const { return header_.find(name); }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata(); }

  // The bytes of a tensor of this file (`tensor` must come from tensors() or find()).
  std::span<const std::byte> data(const TensorInfo& tensor) const;
  // The bytes of the tensor named `name`; an error naming the file and tensor if there is none.
  Result<std::span<const std::byte>> data(std::string_view name) const;

 private:
  std::filesystem::path path_;
  SafetensorsHeader header_;
  MappedFile map_;
};

}  // namespace fp4moe::checkpoint
