// Every row of the family table: the names it generates are recognized back as that family's roles
// by detect/'s role classification, and as its naming by model/'s find_moe_naming where it runs.
#include "families/families.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/sparse_fixture.h"
#include "detect/arch.h"
#include "model/moe_checkpoint.h"

namespace fp4moe {
namespace {

using families::FamilyNaming;
using Role = detect::Role;

constexpr int kLayers = 4;

std::vector<std::string> members(const FamilyNaming& row) {
  std::vector<std::string> out;
  for (std::string_view m : {row.gate, row.up, row.down}) {
    if (!m.empty()) out.emplace_back(m);
  }
  return out;
}

detect::ArchInfo arch_of(const FamilyNaming& row) {
  detect::ArchInfo a;
  a.family = row.family;
  a.num_layers = kLayers;
  a.layer_prefix = std::string(row.layer_prefix);
  a.lm_head_name = std::string(row.lm_head);
  a.embed_name = std::string(row.embed);
  a.mtp_appended = row.mtp == families::MtpPlacement::kAppended;
  return a;
}

std::string row_name(const FamilyNaming& row) {
  return std::string(row.key) + " (" + std::string(row.layer_prefix) + std::string(row.experts) +
         std::string(row.gate) + ")";
}

TEST(FamilyTable, EveryFamilyHasRowsAndUniqueModelTypes) {
  std::set<std::string_view> types;
  for (const auto& row : families::table()) {
    for (std::string_view t : row.model_types) {
      EXPECT_TRUE(types.insert(t).second) << t << " in two rows";
      EXPECT_EQ(families::family_of(t), row.family) << t;
    }
    EXPECT_GE(families::convention_count(row.family), 1);
    EXPECT_FALSE(row.layer_prefix.empty()) << row_name(row);
    EXPECT_FALSE(row.experts.empty()) << row_name(row);
    EXPECT_FALSE(row.router.empty()) << row_name(row);
    EXPECT_FALSE(row.down.empty()) << row_name(row);
    EXPECT_EQ(row.routing != families::Routing::kNone, (row.runs & families::kVerify) != 0)
        << row_name(row);
    if (row.layout == families::ExpertLayout::kPerExpert) {
      EXPECT_NE(row.experts.find("{E}"), std::string_view::npos) << row_name(row);
    } else {
      EXPECT_EQ(row.experts.find("{E}"), std::string_view::npos) << row_name(row);
    }
  }
  EXPECT_EQ(families::family_of("no_such_model"), families::Family::kGeneric);
}

TEST(FamilyTable, DetectClassifiesEveryRowsNames) {
  for (const auto& row : families::table()) {
    SCOPED_TRACE(row_name(row));
    const detect::ArchInfo arch = arch_of(row);
    for (const auto& m : members(row)) {
      EXPECT_EQ(detect::classify_module(families::layer_name(row, row.experts, 1, 7) + m, arch),
                Role::kRoutedExperts)
          << m;
      if (!row.shared.empty()) {
        EXPECT_EQ(detect::classify_module(families::layer_name(row, row.shared, 1) + m, arch),
                  Role::kSharedExperts)
            << m;
      }
    }
    EXPECT_EQ(detect::classify_module(families::layer_name(row, row.router, 1), arch),
              Role::kRouter);
    if (!row.shared_gate.empty()) {
      EXPECT_EQ(detect::classify_module(families::layer_name(row, row.shared_gate, 1), arch),
                Role::kRouter);
    }
    for (std::string_view m : {row.dense_gate, row.dense_up, row.dense_down}) {
      if (m.empty()) continue;
      EXPECT_EQ(detect::classify_module(
                    families::layer_name(row, row.dense_mlp, 0) + std::string(m), arch),
                Role::kDenseMlp)
          << m;
    }
    if (row.mtp != families::MtpPlacement::kUnknown) {
      const std::string p =
          families::mtp_layer_prefix(row, row.layer_prefix, 0, kLayers) + std::string(row.experts);
      const std::string e0 =
          p.substr(0, p.find("{E}")) +
          (p.find("{E}") == std::string::npos ? "" : "0" + p.substr(p.find("{E}") + 3));
      EXPECT_EQ(detect::classify_module(e0 + std::string(row.down), arch), Role::kMtpExperts);
    }
  }
}

TEST(FamilyTable, ModelFindsEveryRowItRuns) {
  const auto root = std::filesystem::temp_directory_path() /
                    ("fp4moe_families_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  int n = 0;
  for (const auto& row : families::table()) {
    if ((row.runs & families::kVerify) == 0) continue;
    for (const auto& vlm : {std::string(), std::string(families::vlm_prefixes()[0].prefix)}) {
      SCOPED_TRACE(row_name(row) + " prefix '" + vlm + "'");
      const auto dir_path = root / std::to_string(n++);
      checkpoint::SparseFixtureOptions options;
      options.config = {{"model_type", row.model_types.empty() ? "x" : row.model_types[0]},
                        {"num_hidden_layers", kLayers}};
      const bool fused = row.layout == families::ExpertLayout::kFusedGateUp;
      const std::string name = vlm + families::layer_name(row, row.experts, 2, 0) +
                               std::string(row.gate) + (fused ? "_blocks" : ".weight");
      ASSERT_TRUE(checkpoint::write_sparse_checkpoint(
                      dir_path, {{{name, checkpoint::DType::U8, {4, 4}}, {}}}, options)
                      .ok());
      auto dir = checkpoint::CheckpointDir::open(dir_path);
      ASSERT_TRUE(dir.ok()) << dir.error().message;
      auto naming = model::find_moe_naming(*dir, "the test runs");
      ASSERT_TRUE(naming.ok()) << naming.error().message;
      // The first row with these names is the one model/ reports (Qwen3-MoE: DeepSeek-V3's).
      EXPECT_EQ(naming->expert_prefix, vlm + families::layer_template(row, row.experts));
      EXPECT_EQ(naming->gate, row.gate);
      EXPECT_EQ(naming->fused, fused);
      const FamilyNaming* first = nullptr;
      for (const auto& r : families::table()) {
        if ((r.runs & families::kVerify) != 0 && r.layer_prefix == row.layer_prefix &&
            r.experts == row.experts && r.gate == row.gate) {
          first = &r;
          break;
        }
      }
      ASSERT_NE(first, nullptr);
      EXPECT_EQ(naming->family, first->key);
      EXPECT_EQ(naming->routing, first->routing);
    }
  }
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace fp4moe
