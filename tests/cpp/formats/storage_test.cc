// The stored-form table, row by row: a module built from a row's own suffixes, dtypes and shapes
// classifies back to that row; a wrong dtype or shape is refused with a reason naming the tensor.
#include "formats/storage.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace fp4moe::formats {
namespace {

constexpr int64_t kE = 3, kN = 64, kK = 256;
constexpr int kAnyGroup = 32;  // the group a row with block 0 (INT4) is built with

struct Tensor {
  std::string dtype;
  std::vector<int64_t> shape;
};
using Module = std::map<std::string, Tensor>;

TensorLookup lookup(const Module& m) {
  return [&m](const std::string& name) -> std::optional<TensorDesc> {
    auto it = m.find(name);
    if (it == m.end()) return std::nullopt;
    return TensorDesc{it->second.dtype, it->second.shape};
  };
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::vector<int64_t> shape_of(ShapeRule rule, int block) {
  const int64_t g = block == 0 ? kAnyGroup : block;
  switch (rule) {
    case ShapeRule::kDense:
    case ShapeRule::kDenseAnyRank:
      return {kN, kK};
    case ShapeRule::kPacked2:
      return {kN, kK / 2};
    case ShapeRule::kPacked8:
      return {kN, kK / 8};
    case ShapeRule::kStackedPacked2:
      return {kE, kN, kK / 2};
    case ShapeRule::kGptOssBlocks:
      return {kE, kN, kK / 32, 16};
    case ShapeRule::kPerGroup:
      return {kN, kK / g};
    case ShapeRule::kStackedPerGroup:
      return {kE, kN, kK / g};
    case ShapeRule::kGrid:
      return {ceil_div(kN, g), ceil_div(kK, g)};
    case ShapeRule::kPerChannel:
      return {kN};
    case ShapeRule::kScalar:
      return {};
    case ShapeRule::kNone:
      break;
  }
  return {};
}

// The module "m" as the row writes it, input scale included.
Module build(const StoredFormInfo& row) {
  Module m;
  for (const StoredTensorInfo* t : {&row.weight, &row.scale, &row.tensor_scale, &row.input_scale}) {
    if (t->present()) {
      m["m" + std::string(t->suffix)] = {std::string(dtype_of(*t)), shape_of(t->shape, row.block)};
    }
  }
  return m;
}

TEST(StoredForms, EveryRowClassifiesBackToItself) {
  for (const StoredFormInfo& row : stored_forms()) {
    SCOPED_TRACE(std::string(row.name));
    const Module m = build(row);
    auto r = classify_stored("m", lookup(m));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->row, &row);
    EXPECT_EQ(r->n, kN);
    EXPECT_EQ(r->k, kK);
    const bool stacked = row.weight.shape == ShapeRule::kStackedPacked2 ||
                         row.weight.shape == ShapeRule::kGptOssBlocks;
    EXPECT_EQ(r->experts, stacked ? kE : 0);
    EXPECT_EQ(r->group,
              row.block == 0 && row.scale.shape == ShapeRule::kPerGroup ? kAnyGroup : row.block);
    EXPECT_EQ(r->weight, "m" + std::string(row.weight.suffix));
    EXPECT_EQ(r->scale, row.scale.present() ? "m" + std::string(row.scale.suffix) : "");
    EXPECT_EQ(r->input_scale,
              row.input_scale.present() ? "m" + std::string(row.input_scale.suffix) : "");
    // Every dtype the row allows for each tensor is accepted.
    for (StoredTensorInfo const* t : {&row.weight, &row.scale}) {
      for (std::string_view d : t->dtypes) {
        if (d.empty() || !t->present()) continue;
        Module other = m;
        other["m" + std::string(t->suffix)].dtype = d;
        auto o = classify_stored("m", lookup(other));
        ASSERT_TRUE(o.ok()) << d << ": " << o.error().message;
        EXPECT_EQ(o->row, &row) << d;
      }
    }
  }
}

TEST(StoredForms, AWrongDtypeIsRefusedNamingTheTensor) {
  for (const StoredFormInfo& row : stored_forms()) {
    for (const StoredTensorInfo* t : {&row.weight, &row.scale, &row.tensor_scale}) {
      if (!t->present()) continue;
      const std::string name = "m" + std::string(t->suffix);
      SCOPED_TRACE(std::string(row.name) + " " + name);
      Module m = build(row);
      m[name].dtype = "F8_E5M2";  // no row stores any tensor in it
      auto r = classify_stored("m", lookup(m));
      ASSERT_FALSE(r.ok()) << "accepted as " << r->row->name;
      EXPECT_NE(r.error().message.find("'" + name + "'"), std::string::npos) << r.error().message;
      EXPECT_NE(r.error().message.find("F8_E5M2"), std::string::npos) << r.error().message;
    }
  }
}

TEST(StoredForms, AWrongShapeRelationIsRefusedNamingTheTensor) {
  for (const StoredFormInfo& row : stored_forms()) {
    for (const StoredTensorInfo* t : {&row.weight, &row.scale, &row.tensor_scale}) {
      // A dense weight has no shape relation to break: any rank is a dense tensor.
      if (!t->present() || t->shape == ShapeRule::kDenseAnyRank) continue;
      const std::string name = "m" + std::string(t->suffix);
      SCOPED_TRACE(std::string(row.name) + " " + name);
      Module m = build(row);
      auto& shape = m[name].shape;
      if (t == &row.weight) {
        shape.push_back(1);  // a rank no weight rule has
      } else if (shape.empty()) {
        shape = {2};  // a "scalar" of two elements
      } else {
        shape.back() += 1;
      }
      auto r = classify_stored("m", lookup(m));
      ASSERT_FALSE(r.ok()) << "accepted as " << r->row->name;
      EXPECT_NE(r.error().message.find("'" + name + "'"), std::string::npos) << r.error().message;
    }
  }
}

TEST(StoredForms, AMissingScaleIsRefusedNamingIt) {
  const auto& row = stored_form_info(StoredForm::kNvfp4ModelOpt);
  Module m = build(row);
  m.erase("m.weight_scale_2");
  auto r = classify_stored("m", lookup(m));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("'m.weight_scale_2'"), std::string::npos) << r.error().message;
  EXPECT_FALSE(classify_stored("x", lookup(m)).ok());  // no weight at all
}

// Where the classifiers of detect/, model/ and convert/ disagreed, the table keeps the stricter
// rule; one case each.
TEST(StoredForms, TheStricterRuleWhereTheOldClassifiersDisagreed) {
  // model/ read MXFP4 with any number of scale rows; detect/ and convert/ asked for N.
  Module mx = {{"m.weight", {"I8", {64, 128}}}, {"m.scale", {"F8_E8M0", {32, 8}}}};
  EXPECT_FALSE(classify_stored("m", lookup(mx)).ok());
  // model/ read a ModelOpt NVFP4 block scale of any shape.
  Module nv = {{"m.weight", {"U8", {64, 128}}},
               {"m.weight_scale", {"F8_E4M3", {64, 8}}},
               {"m.weight_scale_2", {"F32", {}}}};
  EXPECT_FALSE(classify_stored("m", lookup(nv)).ok());
  nv["m.weight_scale"].shape = {64, 16};
  EXPECT_TRUE(classify_stored("m", lookup(nv)).ok());
  // detect/ read I8 codes with an E4M3 scale as NVFP4; every NVFP4 writer stores U8.
  nv["m.weight"].dtype = "I8";
  EXPECT_FALSE(classify_stored("m", lookup(nv)).ok());
  // detect/ read NVFP4 without weight_scale_2; model/ needs it to dequantize.
  nv["m.weight"].dtype = "U8";
  nv.erase("m.weight_scale_2");
  EXPECT_FALSE(classify_stored("m", lookup(nv)).ok());
  // convert/ counted FP8 block scales ([1, 3] has the 3 of a [3, 1] grid); model/ did not look.
  Module fp8 = {{"m.weight", {"F8_E4M3", {300, 100}}}, {"m.weight_scale_inv", {"F32", {1, 3}}}};
  EXPECT_FALSE(classify_stored("m", lookup(fp8)).ok());
  fp8["m.weight_scale_inv"].shape = {3, 1};
  auto ok = classify_stored("m", lookup(fp8));
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->row->form, StoredForm::kFp8Block128);
  // detect/ read UE8M0 block scales stored as U8; DeepSeek-V3.2/V4 store F8_E8M0.
  Module ue = {{"m.weight", {"F8_E4M3", {300, 100}}}, {"m.scale", {"U8", {3, 1}}}};
  EXPECT_FALSE(classify_stored("m", lookup(ue)).ok());
  // convert/ read a BF16 weight beside a scale as dense; detect/ as unknown.
  Module bf = {{"m.weight", {"BF16", {64, 64}}}, {"m.weight_scale", {"F32", {}}}};
  auto r = classify_stored("m", lookup(bf));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("'m.weight_scale'"), std::string::npos) << r.error().message;
}

TEST(StoredForms, RowsAgreeWithTheCodecTable) {
  for (const StoredFormInfo& row : stored_forms()) {
    SCOPED_TRACE(std::string(row.name));
    EXPECT_EQ(&stored_form_info(row.form), &row);
    if (!row.codec) continue;
    const BlockFormatInfo& codec = block_format_info(*row.codec);
    EXPECT_EQ(row.block, codec.block_cols);
    EXPECT_DOUBLE_EQ(row.bytes_per_param,
                     static_cast<double>(codec.bytes_per_block) /
                         (static_cast<double>(codec.block_rows) * codec.block_cols));
    EXPECT_EQ(row.tensor_scale.present(), codec.has_tensor_scale);
  }
}

}  // namespace
}  // namespace fp4moe::formats
