// Helpers shared by the detect tests: reading corpus configs and building tensor records.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_dir.h"
#include "detect/detect.h"
#include "detect/json_util.h"

namespace fp4moe::detect::testing {

inline std::string corpus_path(const std::string& dir, const std::string& file) {
  return std::string(FP4MOE_TEST_DATA_DIR) + "/corpus/" + dir + "/" + file;
}

// The JSON file, or null when it does not exist.
inline nlohmann::json load_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) return nullptr;
  std::stringstream ss;
  ss << in.rdbuf();
  auto r = checkpoint::parse_json_text(ss.str(), path);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? r.value() : nlohmann::json();
}

inline DetectInput corpus_input(const std::string& dir) {
  DetectInput in;
  in.config = load_json(corpus_path(dir, "config.json"));
  in.hf_quant_config = load_json(corpus_path(dir, "hf_quant_config.json"));
  return in;
}

inline Manifest must_detect(const DetectInput& in) {
  auto r = detect(in);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? r.value() : Manifest{};
}

inline std::string findings_text(const Manifest& m) {
  std::string out;
  for (const auto& f : m.findings) {
    out += std::string(to_string(f.severity)) + " " + f.code + ": " + f.message + "\n";
  }
  return out;
}

}  // namespace fp4moe::detect::testing
