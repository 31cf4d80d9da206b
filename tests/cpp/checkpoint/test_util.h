// Shared helpers for the checkpoint tests: scratch directories and small file builders.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace fp4moe::checkpoint::testing {

// A fresh directory under the system temp dir, removed with its contents at scope exit.
class ScratchDir {
 public:
  ScratchDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "fp4moe-ckpt-XXXXXX").string();
    EXPECT_NE(::mkdtemp(templ.data()), nullptr);
    path_ = templ;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(std::string_view name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A file image: u64 little-endian length of `header`, `header`, `data`.
inline std::string file_image(std::string_view header, std::string_view data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  out += header;
  out += data;
  return out;
}

inline std::span<const std::byte> as_bytes(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

// Seeded randomness for tests: the seed is taken from FP4MOE_TEST_SEED when set, printed with
// every failure through SCOPED_TRACE at the call site.
inline uint64_t test_seed() {
  if (const char* s = std::getenv("FP4MOE_TEST_SEED")) return std::stoull(s);
  return 20240611;
}

inline std::vector<std::byte> random_bytes(std::mt19937_64& rng, size_t n) {
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng() & 0xFF);
  return out;
}

}  // namespace fp4moe::checkpoint::testing
