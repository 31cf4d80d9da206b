// docs/JSON.md lists every value of the enums the JSON carries: compared here with the C++ enums
// (the Python test compares the same table with docs/schema/*.schema.json).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "detect/manifest.h"
#include "plan/plan.h"

namespace fp4moe {
namespace {

// "| scheme | `nvfp4` `mxfp4` ... |" -> {"scheme": ["nvfp4", "mxfp4", ...]}
std::map<std::string, std::vector<std::string>> documented_enums() {
  const std::string path = std::string(FP4MOE_TEST_DATA_DIR) + "/../../docs/JSON.md";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::map<std::string, std::vector<std::string>> out;
  std::string line;
  bool in_table = false;
  const std::regex row(R"(^\| ([a-z_]+) \| (`.*`) \|$)");
  const std::regex value("`([^`]+)`");
  while (std::getline(in, line)) {
    if (line == "## Enumerations") in_table = true;
    if (in_table && line.starts_with("## ") && line != "## Enumerations") break;
    std::smatch m;
    if (!in_table || !std::regex_match(line, m, row)) continue;
    const std::string cells = m[2];
    for (auto it = std::sregex_iterator(cells.begin(), cells.end(), value);
         it != std::sregex_iterator(); ++it) {
      out[m[1]].push_back((*it)[1]);
    }
  }
  return out;
}

template <class E, size_t N>
std::vector<std::string> names(const E (&all)[N]) {
  std::vector<std::string> out;
  for (E e : all) out.emplace_back(detect::to_string(e));
  return out;
}

TEST(JsonDoc, EnumsMatchTheCode) {
  const auto doc = documented_enums();
  EXPECT_EQ(doc.at("scheme"), names(detect::kAllSchemes));
  EXPECT_EQ(doc.at("kv_cache"), names(detect::kAllSchemes));
  EXPECT_EQ(doc.at("role"), names(detect::kAllRoles));
  EXPECT_EQ(doc.at("activation"), names(detect::kAllActivations));
  EXPECT_EQ(doc.at("scale_type"), names(detect::kAllScaleTypes));
  EXPECT_EQ(doc.at("severity"), names(detect::kAllSeverities));
  EXPECT_EQ(doc.at("tensor_evidence"), names(detect::kAllTensorEvidenceKinds));
  // HardwarePath has no list of its own (plan/): its enumerators are contiguous up to kNoKernel,
  // the last one.
  std::vector<std::string> paths;
  for (int i = 0; i <= static_cast<int>(plan::HardwarePath::kNoKernel); ++i) {
    paths.emplace_back(plan::path_name(static_cast<plan::HardwarePath>(i)));
  }
  EXPECT_EQ(doc.at("path"), paths);
  EXPECT_EQ(doc.at("error_kind"), (std::vector<std::string>{"bad_input", "failed", "interrupted"}));
}

TEST(JsonDoc, ManifestCarriesTheSchemaVersion) {
  EXPECT_EQ(detect::to_json(detect::Manifest{})["schema_version"], detect::kJsonSchemaVersion);
}

}  // namespace
}  // namespace fp4moe
