// Strict safetensors header parser and validator, and the mmap'd file reader.
//
// Why a purpose-built parser instead of nlohmann::json: a safetensors header has one fixed, flat
// shape (object -> {metadata object of strings | tensor object -> string / integer arrays}), so a
// parser for exactly that shape
//  - cannot recurse: nesting deeper than the shape allows is rejected at the first unexpected '['
//    or '{', so a nesting bomb costs one byte of scanning, not stack or heap;
//  - sees duplicate keys (nlohmann keeps the last one silently, and so does serde in the reference
//    implementation), both for tensors and inside a tensor entry;
//  - keeps integers exact: offsets and dimensions are parsed as u64 with overflow checks, and
//    negative, fractional and exponent forms are rejected with their own reason instead of being
//    silently converted to double;
//  - keeps every tensor name as parsed, and parses a 50,000-tensor header in milliseconds.
//
// Checks, in the order a file meets them (each failure an Error naming file, tensor and reason):
//  file shorter than 8 bytes; header length over kMaxHeaderBytes; header length past the end of the
//  file; header not UTF-8; header not starting with '{'; JSON syntax (with byte position); nested
//  values where the shape has none; unknown keys; duplicate tensor names, metadata keys or entry
//  fields; missing fields; unknown dtype; negative / fractional / too large integers; element count
//  and bit count overflow; sub-byte tensors ending mid-byte; data_offsets begin > end; span not
//  equal to the dtype/shape size; tensors past the end of the data section; overlaps; holes;
//  trailing bytes of the data section not covered by any tensor.
#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <utility>

#include "checkpoint/json_text.h"

namespace fp4moe::checkpoint {
namespace {

std::string in_quotes(std::string_view s) { return "'" + std::string(s) + "'"; }

Error file_error(std::string_view label, const std::string& reason) {
  return Error{std::string(label) + ": " + reason};
}

Error tensor_error(std::string_view label, std::string_view tensor, const std::string& reason) {
  return Error{std::string(label) + ": tensor " + in_quotes(tensor) + ": " + reason};
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// A tensor entry as parsed, before cross-tensor validation.
struct RawTensor {
  std::string name;
  std::optional<DType> dtype;
  std::optional<std::vector<int64_t>> shape;
  std::optional<std::pair<uint64_t, uint64_t>> offsets;
};

// Recursive descent over the one shape a header may have; every level is a separate function, so
// the call depth is bounded by the shape (3), never by the input.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, std::string_view label) : text_(text), label_(label) {}

  Status parse(std::vector<RawTensor>& tensors, std::map<std::string, std::string>& metadata) {
    if (text_.empty() || text_[0] != '{') {
      return file_error(label_, "header must start with '{' (a JSON object)");
    }
    ++pos_;
    bool have_metadata = false;
    skip_ws();
    if (peek() == '}') {
      ++pos_;
    } else {
      while (true) {
        std::string key;
        FP4MOE_RETURN_IF_ERROR(parse_string(key, "a tensor name"));
        FP4MOE_RETURN_IF_ERROR(expect(':'));
        if (key == "__metadata__") {
          if (have_metadata) return syntax("duplicate key '__metadata__'");
          have_metadata = true;
          FP4MOE_RETURN_IF_ERROR(parse_metadata(metadata));
        } else {
          RawTensor& t = tensors.emplace_back();
          t.name = std::move(key);
          FP4MOE_RETURN_IF_ERROR(parse_tensor(t));
        }
        skip_ws();
        const char c = peek();
        ++pos_;
        if (c == '}') break;
        if (c != ',') return syntax_at(pos_ - 1, "expected ',' or '}' after a header entry");
      }
    }
    skip_ws();
    if (pos_ != text_.size()) {
      return syntax("unexpected bytes after the header object (only whitespace may follow)");
    }
    return Status::Ok();
  }

 private:
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }

  void skip_ws() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }

  Error syntax_at(size_t at, const std::string& reason) const {
    return file_error(label_, "header byte " + std::to_string(at) + ": " + reason);
  }
  Error syntax(const std::string& reason) const { return syntax_at(pos_, reason); }

  // A found character, described for error messages; nesting gets its own words because a nesting
  // bomb is the attack it stops.
  std::string found() const {
    if (pos_ >= text_.size()) return "end of header";
    const char c = text_[pos_];
    if (c == '[' || c == '{') {
      return std::string("'") + c + "' (a nested value where the flat safetensors header has none)";
    }
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7F) {
      return "byte " + std::to_string(static_cast<unsigned char>(c));
    }
    return std::string("'") + c + "'";
  }

  Status expect(char c) {
    skip_ws();
    if (peek() != c) return syntax(std::string("expected '") + c + "', found " + found());
    ++pos_;
    return Status::Ok();
  }

  Status parse_string(std::string& out, std::string_view what) {
    skip_ws();
    if (peek() != '"')
      return syntax("expected " + std::string(what) + " (a string), found " + found());
    ++pos_;
    const size_t start = pos_;
    // Fast path: no escapes. The header is already known to be valid UTF-8.
    while (pos_ < text_.size()) {
      const unsigned char c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        out.assign(text_.substr(start, pos_ - start));
        ++pos_;
        return Status::Ok();
      }
      if (c == '\\') break;
      if (c < 0x20) return syntax("control character in a string (must be escaped)");
      ++pos_;
    }
    out.assign(text_.substr(start, pos_ - start));
    while (pos_ < text_.size()) {
      const unsigned char c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        ++pos_;
        return Status::Ok();
      }
      if (c < 0x20) return syntax("control character in a string (must be escaped)");
      if (c != '\\') {
        out.push_back(static_cast<char>(c));
        ++pos_;
        continue;
      }
      ++pos_;
      const char e = peek();
      ++pos_;
      switch (e) {
        case '"':
          out.push_back('"');
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '/':
          out.push_back('/');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u': {
          uint32_t cp = 0;
          FP4MOE_RETURN_IF_ERROR(parse_hex4(cp));
          if (cp >= 0xD800 && cp <= 0xDBFF) {  // high surrogate: a low one must follow
            if (text_.substr(pos_, 2) != "\\u") return syntax("unpaired UTF-16 surrogate escape");
            pos_ += 2;
            uint32_t low = 0;
            FP4MOE_RETURN_IF_ERROR(parse_hex4(low));
            if (low < 0xDC00 || low > 0xDFFF) return syntax("unpaired UTF-16 surrogate escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return syntax("unpaired UTF-16 surrogate escape");
          }
          append_utf8(out, cp);
          break;
        }
        default:
          return syntax_at(pos_ - 1, "invalid escape in a string");
      }
    }
    return syntax("unterminated string");
  }

  Status parse_hex4(uint32_t& out) {
    if (text_.size() - pos_ < 4) return syntax("truncated \\u escape");
    out = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_++];
      uint32_t d;
      if (c >= '0' && c <= '9') {
        d = static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        d = static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        d = static_cast<uint32_t>(c - 'A' + 10);
      } else {
        return syntax_at(pos_ - 1, "invalid hex digit in a \\u escape");
      }
      out = out * 16 + d;
    }
    return Status::Ok();
  }

  // A JSON number that must be a non-negative integer no larger than `max`.
  Status parse_uint(uint64_t& out, uint64_t max, const std::string& where) {
    skip_ws();
    const size_t start = pos_;
    if (peek() == '-') {
      return tensor_error(label_, current_,
                          where + ": negative number at header byte " + std::to_string(start));
    }
    if (peek() < '0' || peek() > '9') {
      return tensor_error(label_, current_,
                          where + ": expected a non-negative integer, found " + found() +
                              " at header byte " + std::to_string(start));
    }
    if (peek() == '0' && pos_ + 1 < text_.size() && text_[pos_ + 1] >= '0' &&
        text_[pos_ + 1] <= '9') {
      return syntax("leading zero in a number");
    }
    uint64_t value = 0;
    bool overflow = false;
    while (peek() >= '0' && peek() <= '9') {
      const uint64_t d = static_cast<uint64_t>(peek() - '0');
      if (value > (max - d) / 10) overflow = true;
      if (!overflow) value = value * 10 + d;
      ++pos_;
    }
    if (peek() == '.' || peek() == 'e' || peek() == 'E') {
      return tensor_error(label_, current_,
                          where +
                              ": not an integer (fraction or exponent) at "
                              "header byte " +
                              std::to_string(start));
    }
    if (overflow) {
      return tensor_error(label_, current_,
                          where + ": integer " + std::string(text_.substr(start, pos_ - start)) +
                              " is too large (limit " + std::to_string(max) + ")");
    }
    out = value;
    return Status::Ok();
  }

  Status parse_metadata(std::map<std::string, std::string>& metadata) {
    skip_ws();
    if (peek() != '{')
      return syntax("'__metadata__' must be an object of strings, found " + found());
    ++pos_;
    skip_ws();
    if (peek() == '}') {
      ++pos_;
      return Status::Ok();
    }
    while (true) {
      std::string key, value;
      FP4MOE_RETURN_IF_ERROR(parse_string(key, "a metadata key"));
      FP4MOE_RETURN_IF_ERROR(expect(':'));
      skip_ws();
      if (peek() != '"') {
        return syntax("'__metadata__' value of " + in_quotes(key) + " must be a string, found " +
                      found());
      }
      FP4MOE_RETURN_IF_ERROR(parse_string(value, "a metadata value"));
      if (!metadata.emplace(std::move(key), std::move(value)).second) {
        return syntax("duplicate key in '__metadata__'");
      }
      skip_ws();
      const char c = peek();
      ++pos_;
      if (c == '}') return Status::Ok();
      if (c != ',') return syntax_at(pos_ - 1, "expected ',' or '}' in '__metadata__'");
    }
  }

  Status parse_tensor(RawTensor& t) {
    current_ = t.name;
    skip_ws();
    if (peek() != '{') {
      return tensor_error(label_, t.name,
                          "entry must be an object {dtype, shape, data_offsets}, "
                          "found " +
                              found() + " at header byte " + std::to_string(pos_));
    }
    ++pos_;
    skip_ws();
    if (peek() != '}') {
      while (true) {
        std::string field;
        FP4MOE_RETURN_IF_ERROR(parse_string(field, "a field name"));
        FP4MOE_RETURN_IF_ERROR(expect(':'));
        if (field == "dtype") {
          if (t.dtype) return tensor_error(label_, t.name, "duplicate field 'dtype'");
          std::string name;
          FP4MOE_RETURN_IF_ERROR(parse_string(name, "the dtype"));
          t.dtype = parse_dtype(name);
          if (!t.dtype) return tensor_error(label_, t.name, "unknown dtype " + in_quotes(name));
        } else if (field == "shape") {
          if (t.shape) return tensor_error(label_, t.name, "duplicate field 'shape'");
          t.shape.emplace();
          FP4MOE_RETURN_IF_ERROR(parse_shape(*t.shape));
        } else if (field == "data_offsets") {
          if (t.offsets) return tensor_error(label_, t.name, "duplicate field 'data_offsets'");
          FP4MOE_RETURN_IF_ERROR(parse_offsets(t.offsets.emplace()));
        } else {
          return tensor_error(label_, t.name, "unknown field " + in_quotes(field));
        }
        skip_ws();
        const char c = peek();
        ++pos_;
        if (c == '}') break;
        if (c != ',')
          return syntax_at(pos_ - 1,
                           "expected ',' or '}' in the entry of tensor " + in_quotes(t.name));
      }
    } else {
      ++pos_;
    }
    if (!t.dtype) return tensor_error(label_, t.name, "missing field 'dtype'");
    if (!t.shape) return tensor_error(label_, t.name, "missing field 'shape'");
    if (!t.offsets) return tensor_error(label_, t.name, "missing field 'data_offsets'");
    return Status::Ok();
  }

  Status parse_shape(std::vector<int64_t>& shape) {
    FP4MOE_RETURN_IF_ERROR(expect_array("shape"));
    skip_ws();
    if (peek() == ']') {
      ++pos_;
      return Status::Ok();
    }
    while (true) {
      uint64_t dim = 0;
      FP4MOE_RETURN_IF_ERROR(
          parse_uint(dim, static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), "shape"));
      shape.push_back(static_cast<int64_t>(dim));
      skip_ws();
      const char c = peek();
      ++pos_;
      if (c == ']') return Status::Ok();
      if (c != ',')
        return syntax_at(pos_ - 1, "expected ',' or ']' in shape of " + in_quotes(current_));
    }
  }

  Status parse_offsets(std::pair<uint64_t, uint64_t>& offsets) {
    FP4MOE_RETURN_IF_ERROR(expect_array("data_offsets"));
    const uint64_t kMax = std::numeric_limits<uint64_t>::max();
    FP4MOE_RETURN_IF_ERROR(parse_uint(offsets.first, kMax, "data_offsets"));
    FP4MOE_RETURN_IF_ERROR(expect(','));
    FP4MOE_RETURN_IF_ERROR(parse_uint(offsets.second, kMax, "data_offsets"));
    skip_ws();
    if (peek() != ']') {
      return tensor_error(label_, current_, "data_offsets must be exactly [begin, end]");
    }
    ++pos_;
    return Status::Ok();
  }

  Status expect_array(std::string_view what) {
    skip_ws();
    if (peek() != '[') {
      return tensor_error(label_, current_,
                          std::string(what) + " must be an array, found " + found() +
                              " at header byte " + std::to_string(pos_));
    }
    ++pos_;
    return Status::Ok();
  }

  std::string_view text_;
  std::string_view label_;
  size_t pos_ = 0;
  std::string current_;  // the tensor being parsed, for error messages
};

// Overflow-checked a * b.
bool mul_overflows(uint64_t a, uint64_t b, uint64_t& out) {
  return __builtin_mul_overflow(a, b, &out);
}

std::string errno_text() { return std::strerror(errno); }

// Reads exactly `n` bytes at `offset`; false on error or early end of file.
bool pread_exact(int fd, void* buf, size_t n, uint64_t offset) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return true;
}

uint64_t load_le64(const unsigned char* b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | b[i];
  return v;
}

// Checks the length prefix against the cap and the file size; returns N.
Result<uint64_t> check_header_length(uint64_t n, uint64_t file_size, std::string_view label) {
  if (n > kMaxHeaderBytes) {
    return file_error(label, "header length " + std::to_string(n) + " exceeds the cap of " +
                                 std::to_string(kMaxHeaderBytes) + " bytes");
  }
  if (n > file_size - 8) {
    return file_error(label, "header length " + std::to_string(n) +
                                 " runs past the end of the file (file is " +
                                 std::to_string(file_size) + " bytes)");
  }
  return n;
}

Error too_short(std::string_view label, uint64_t size) {
  return file_error(
      label, "file is " + std::to_string(size) + " bytes, too short for the 8-byte header length");
}

}  // namespace

Result<uint64_t> tensor_byte_size(DType dtype, std::span<const int64_t> shape,
                                  std::string_view what) {
  uint64_t count = 1;
  for (const int64_t dim : shape) {
    if (dim < 0) return Error{std::string(what) + ": negative dimension " + std::to_string(dim)};
    if (mul_overflows(count, static_cast<uint64_t>(dim), count)) {
      return Error{std::string(what) + ": element count of the shape overflows 64 bits"};
    }
  }
  uint64_t bits = 0;
  if (mul_overflows(count, dtype_bits(dtype), bits)) {
    return Error{std::string(what) + ": byte size of " + std::to_string(count) + " " +
                 std::string(dtype_name(dtype)) + " elements overflows 64 bits"};
  }
  if (bits % 8 != 0) {
    return Error{std::string(what) + ": " + std::to_string(count) + " " +
                 std::string(dtype_name(dtype)) + " elements end mid-byte (" +
                 std::to_string(bits) + " bits)"};
  }
  return bits / 8;
}

Result<SafetensorsHeader> SafetensorsHeader::parse(std::span<const std::byte> header_json,
                                                   uint64_t data_size, std::string_view label) {
  if (header_json.size() > kMaxHeaderBytes) {
    return file_error(label, "header length " + std::to_string(header_json.size()) +
                                 " exceeds the cap of " + std::to_string(kMaxHeaderBytes) +
                                 " bytes");
  }
  if (const auto bad = find_invalid_utf8(header_json)) {
    return file_error(label, "header is not valid UTF-8 (byte " + std::to_string(*bad) + ")");
  }
  const std::string_view text(reinterpret_cast<const char*>(header_json.data()),
                              header_json.size());
  std::vector<RawTensor> raw;
  SafetensorsHeader header;
  FP4MOE_RETURN_IF_ERROR(HeaderParser(text, label).parse(raw, header.metadata_));
  if (raw.size() > std::numeric_limits<uint32_t>::max()) {
    return file_error(label, "too many tensors");
  }

  header.header_size_ = header_json.size();
  header.data_size_ = data_size;
  header.tensors_.reserve(raw.size());
  for (RawTensor& r : raw) {
    if (r.name.empty()) return tensor_error(label, r.name, "empty tensor name");
    TensorInfo& t = header.tensors_.emplace_back();
    t.name = std::move(r.name);
    t.dtype = *r.dtype;
    t.shape = std::move(*r.shape);
    t.data_begin = r.offsets->first;
    t.data_end = r.offsets->second;
    auto size =
        tensor_byte_size(t.dtype, t.shape, std::string(label) + ": tensor " + in_quotes(t.name));
    if (!size.ok()) return size.error();
    t.element_count = 1;
    for (const int64_t d : t.shape) t.element_count *= static_cast<uint64_t>(d);  // checked above
    if (t.data_begin > t.data_end) {
      return tensor_error(label, t.name,
                          "data_offsets begin " + std::to_string(t.data_begin) + " is after end " +
                              std::to_string(t.data_end));
    }
    if (t.data_end - t.data_begin != *size) {
      return tensor_error(label, t.name,
                          "data_offsets span " + std::to_string(t.data_end - t.data_begin) +
                              " bytes but " + std::string(dtype_name(t.dtype)) + " shape needs " +
                              std::to_string(*size));
    }
    if (t.data_end > data_size) {
      return tensor_error(label, t.name,
                          "data_offsets end " + std::to_string(t.data_end) +
                              " is past the end of the data section (" + std::to_string(data_size) +
                              " bytes): the file is shorter than its header claims");
    }
  }

  // Data order first (a stable sort keeps zero-size tensors at one offset in header order), then
  // an index by name over that final order: it finds duplicates and serves find().
  const auto by_offset = [](const TensorInfo& a, const TensorInfo& b) {
    return a.data_begin != b.data_begin ? a.data_begin < b.data_begin : a.data_end < b.data_end;
  };
  // Writers emit headers in data order, so the sort is usually skipped.
  if (!std::is_sorted(header.tensors_.begin(), header.tensors_.end(), by_offset)) {
    std::stable_sort(header.tensors_.begin(), header.tensors_.end(), by_offset);
  }
  auto& by_name = header.by_name_;
  by_name.resize(header.tensors_.size());
  std::iota(by_name.begin(), by_name.end(), 0u);
  const auto& ts = header.tensors_;
  std::sort(by_name.begin(), by_name.end(),
            [&](uint32_t a, uint32_t b) { return ts[a].name < ts[b].name; });
  for (size_t i = 1; i < by_name.size(); ++i) {
    if (ts[by_name[i]].name == ts[by_name[i - 1]].name) {
      return tensor_error(label, ts[by_name[i]].name, "duplicate tensor name");
    }
  }

  // The offsets must tile [0, data_size) exactly: no overlap, no hole, nothing left over.
  uint64_t expected = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& t : header.tensors_) {
    if (t.data_begin < expected) {
      return tensor_error(label, t.name,
                          "data_offsets [" + std::to_string(t.data_begin) + ", " +
                              std::to_string(t.data_end) + ") overlap tensor " +
                              in_quotes(previous->name));
    }
    if (t.data_begin > expected) {
      return tensor_error(label, t.name,
                          "hole of " + std::to_string(t.data_begin - expected) +
                              " bytes in the data section before this tensor");
    }
    expected = t.data_end;
    previous = &t;
  }
  if (expected != data_size) {
    return file_error(label, "data section has " + std::to_string(data_size - expected) +
                                 " trailing bytes not covered by any tensor");
  }
  return header;
}

Result<SafetensorsHeader> SafetensorsHeader::parse_image(std::span<const std::byte> image,
                                                         std::string_view label) {
  if (image.size() < 8) return too_short(label, image.size());
  auto n = check_header_length(load_le64(reinterpret_cast<const unsigned char*>(image.data())),
                               image.size(), label);
  if (!n.ok()) return n.error();
  return parse(image.subspan(8, *n), image.size() - 8 - *n, label);
}

Result<SafetensorsHeader> SafetensorsHeader::read(const std::filesystem::path& path) {
  const std::string label = path.string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return file_error(label, "cannot open: " + errno_text());
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return file_error(label, "cannot stat: " + errno_text());
  if (!S_ISREG(st.st_mode)) return file_error(label, "not a regular file");
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < 8) return too_short(label, size);
  unsigned char prefix[8];
  if (!pread_exact(fd, prefix, 8, 0)) return file_error(label, "cannot read header length");
  auto n = check_header_length(load_le64(prefix), size, label);
  if (!n.ok()) return n.error();
  std::vector<std::byte> json(*n);
  if (!pread_exact(fd, json.data(), json.size(), 8)) {
    return file_error(label, "cannot read the " + std::to_string(*n) + "-byte header");
  }
  return parse(json, size - 8 - *n, label);
}

const TensorInfo* SafetensorsHeader::find(std::string_view name) const {
  const auto it =
      std::lower_bound(by_name_.begin(), by_name_.end(), name,
                       [&](uint32_t i, std::string_view n) { return tensors_[i].name < n; });
  if (it == by_name_.end() || tensors_[*it].name != name) return nullptr;
  return &tensors_[*it];
}

Result<MappedFile> MappedFile::open(const std::filesystem::path& path) {
  const std::string label = path.string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return file_error(label, "cannot open: " + errno_text());
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return file_error(label, "cannot stat: " + errno_text());
  if (!S_ISREG(st.st_mode)) return file_error(label, "not a regular file");
  MappedFile file;
  file.size_ = static_cast<size_t>(st.st_size);
  if (file.size_ == 0) return file;
  void* p = ::mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) return file_error(label, "cannot mmap: " + errno_text());
  file.data_ = static_cast<const std::byte*>(p);
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

Result<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  auto map = MappedFile::open(path);
  if (!map.ok()) return map.error();
  auto header = SafetensorsHeader::parse_image(map->bytes(), path.string());
  if (!header.ok()) return header.error();
  SafetensorsFile file;
  file.path_ = path;
  file.header_ = std::move(header).value();
  file.map_ = std::move(map).value();
  return file;
}

std::span<const std::byte> SafetensorsFile::data(const TensorInfo& tensor) const {
  FP4MOE_CHECK(tensor.data_end <= header_.data_size());
  return map_.bytes().subspan(header_.data_offset() + tensor.data_begin, tensor.byte_size());
}

Result<std::span<const std::byte>> SafetensorsFile::data(std::string_view name) const {
  const TensorInfo* t = find(name);
  if (t == nullptr) return tensor_error(path_.string(), name, "no such tensor in this file");
  return data(*t);
}

}  // namespace fp4moe::checkpoint
