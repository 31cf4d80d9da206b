// The stored-form table and its classifier (storage.h).
#include "formats/storage.h"

#include <algorithm>

namespace fp4moe::formats {
namespace {

using R = ShapeRule;
constexpr StoredTensorInfo kNoTensor{};
constexpr double kFp8Block128Bytes = 128.0 * 128.0;

// One row per stored form (FORMATS.md section 3). Rows are tried in order; no two rows accept the
// same tensors, except where noted.
constexpr StoredFormInfo kStoredForms[] = {
    {StoredForm::kNvfp4ModelOpt,
     "nvfp4_modelopt",
     "nvfp4",
     BlockFormat::kNvfp4,
     16,
     {".weight", {"U8"}, R::kPacked2},
     {".weight_scale", {"F8_E4M3"}, R::kPerGroup},
     {".weight_scale_2", {"F32"}, R::kScalar},
     {".input_scale", {"F32"}, R::kScalar},
     false,
     9.0 / 16},
    {StoredForm::kNvfp4ModelOptFused,
     "nvfp4_modelopt_fused",
     "nvfp4",
     BlockFormat::kNvfp4,
     16,
     {"", {"U8"}, R::kStackedPacked2},
     {"_weight_scale", {"F8_E4M3"}, R::kStackedPerGroup},
     {"_weight_scale_2", {"F32"}, R::kScalar},
     {"_input_scale", {"F32"}, R::kScalar},
     false,
     9.0 / 16},
    {StoredForm::kNvfp4CompressedTensors,
     "nvfp4_compressed_tensors",
     "nvfp4",
     BlockFormat::kNvfp4,
     16,
     {".weight_packed", {"U8"}, R::kPacked2},
     {".weight_scale", {"F8_E4M3"}, R::kPerGroup},
     {".weight_global_scale", {"F32"}, R::kScalar},
     {".input_global_scale", {"F32"}, R::kScalar},
     true,
     9.0 / 16},
    {StoredForm::kMxfp4,
     "mxfp4",
     "mxfp4",
     BlockFormat::kMxfp4,
     32,
     {".weight", {"I8", "U8"}, R::kPacked2},
     {".scale", {"F8_E8M0", "U8"}, R::kPerGroup},
     kNoTensor,
     kNoTensor,
     false,
     17.0 / 32},
    {StoredForm::kMxfp4CompressedTensors,
     "mxfp4_compressed_tensors",
     "mxfp4",
     BlockFormat::kMxfp4,
     32,
     {".weight_packed", {"U8"}, R::kPacked2},
     {".weight_scale", {"U8", "F8_E8M0"}, R::kPerGroup},
     kNoTensor,
     kNoTensor,
     false,
     17.0 / 32},
    {StoredForm::kMxfp4GptOssFused,
     "mxfp4_gpt_oss_fused",
     "mxfp4",
     BlockFormat::kMxfp4,
     32,
     {"_blocks", {"U8"}, R::kGptOssBlocks},
     {"_scales", {"U8", "F8_E8M0"}, R::kStackedPerGroup},
     kNoTensor,
     kNoTensor,
     false,
     17.0 / 32},
    {StoredForm::kFp8Block128,
     "fp8_block128",
     "fp8_block",
     BlockFormat::kFp8Block128,
     128,
     {".weight", {"F8_E4M3"}, R::kDense},
     {".weight_scale_inv", {"F32"}, R::kGrid},
     kNoTensor,
     kNoTensor,
     false,
     (kFp8Block128Bytes + 4) / kFp8Block128Bytes},
    {StoredForm::kFp8Block128Ue8m0,
     "fp8_block128_ue8m0",
     "fp8_block",
     BlockFormat::kFp8Block128Ue8m0,
     128,
     {".weight", {"F8_E4M3"}, R::kDense},
     {".scale", {"F8_E8M0"}, R::kGrid},
     kNoTensor,
     kNoTensor,
     false,
     (kFp8Block128Bytes + 1) / kFp8Block128Bytes},
    {StoredForm::kFp8Block128CompressedTensors,
     "fp8_block128_compressed_tensors",
     "fp8_block",
     BlockFormat::kFp8Block128,
     128,
     {".weight", {"F8_E4M3"}, R::kDense},
     {".weight_scale", {"F32"}, R::kGrid},
     kNoTensor,
     kNoTensor,
     false,
     (kFp8Block128Bytes + 4) / kFp8Block128Bytes},
    {StoredForm::kMxfp8,
     "mxfp8",
     "mxfp8",
     std::nullopt,
     32,
     {".weight", {"F8_E4M3"}, R::kDense},
     {".weight_scale", {"F8_E8M0", "U8"}, R::kPerGroup},
     kNoTensor,
     kNoTensor,
     false,
     33.0 / 32},
    // A [1, 1] scale of a matrix within one 128x128 block is the block row's (kGrid) and is tried
    // first; kScalar is [] or [1].
    {StoredForm::kFp8Tensor,
     "fp8_tensor",
     "fp8_tensor",
     std::nullopt,
     0,
     {".weight", {"F8_E4M3"}, R::kDense},
     {".weight_scale", {"F32", "BF16", "F16"}, R::kScalar},
     kNoTensor,
     {".input_scale", {"F32", "BF16", "F16"}, R::kScalar},
     false,
     1.0},
    {StoredForm::kFp8Channel,
     "fp8_channel",
     "fp8_channel",
     std::nullopt,
     0,
     {".weight", {"F8_E4M3"}, R::kDense},
     {".weight_scale", {"F32", "BF16", "F16"}, R::kPerChannel},
     kNoTensor,
     kNoTensor,
     false,
     1.0},
    // Any group that divides K: the scale's last dimension says which.
    {StoredForm::kInt4CompressedTensors,
     "int4_compressed_tensors",
     "int4",
     std::nullopt,
     0,
     {".weight_packed", {"I32"}, R::kPacked8},
     {".weight_scale", {"BF16", "F16", "F32"}, R::kPerGroup},
     kNoTensor,
     kNoTensor,
     false,
     0.5},
    // Dense: no tensor any other `.weight` row scales it with may exist (classify_stored).
    {StoredForm::kDense,
     "dense",
     "bf16",
     std::nullopt,
     0,
     {".weight", {"BF16", "F16", "F32", "F64"}, R::kDenseAnyRank},
     kNoTensor,
     kNoTensor,
     kNoTensor,
     false,
     2.0},
};

std::string shape_text(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string describe(const std::string& name, const TensorDesc& t) {
  return "'" + name + "' is " + std::string(t.dtype) + " " + shape_text(t.shape);
}

bool dtype_allowed(const StoredTensorInfo& info, std::string_view dtype) {
  return std::find(info.dtypes.begin(), info.dtypes.end(), dtype) != info.dtypes.end() &&
         !dtype.empty();
}

std::string dtype_list(const StoredTensorInfo& info) {
  std::string s;
  for (std::string_view d : info.dtypes) {
    if (!d.empty()) s += (s.empty() ? "" : " or ") + std::string(d);
  }
  return s;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The weight's shape -> E, N, K; false when the shape does not have the rule's form.
bool weight_dims(ShapeRule rule, std::span<const int64_t> s, StoredMatrix& m) {
  switch (rule) {
    case R::kDense:
      if (s.size() != 2) return false;
      m.n = s[0], m.k = s[1];
      return true;
    case R::kDenseAnyRank:
      m.n = 1;
      for (size_t i = 0; i + 1 < s.size(); ++i) m.n *= s[i];
      m.k = s.empty() ? 1 : s.back();
      return true;
    case R::kPacked2:
      if (s.size() != 2) return false;
      m.n = s[0], m.k = s[1] * 2;
      return true;
    case R::kPacked8:
      if (s.size() != 2) return false;
      m.n = s[0], m.k = s[1] * 8;
      return true;
    case R::kStackedPacked2:
      if (s.size() != 3) return false;
      m.experts = s[0], m.n = s[1], m.k = s[2] * 2;
      return true;
    case R::kGptOssBlocks:
      if (s.size() != 4 || s[3] != 16) return false;
      m.experts = s[0], m.n = s[1], m.k = s[2] * 32;
      return true;
    case R::kNone:
    case R::kPerGroup:
    case R::kStackedPerGroup:
    case R::kGrid:
    case R::kPerChannel:
    case R::kScalar:
      return false;
  }
  return false;
}

std::string_view weight_rule_text(ShapeRule rule) {
  switch (rule) {
    case R::kDense:
      return "[N, K]";
    case R::kDenseAnyRank:
      return "[..., K]";
    case R::kPacked2:
      return "[N, K/2]";
    case R::kPacked8:
      return "[N, K/8]";
    case R::kStackedPacked2:
      return "[E, N, K/2]";
    case R::kGptOssBlocks:
      return "[E, N, K/32, 16]";
    case R::kNone:
    case R::kPerGroup:
    case R::kStackedPerGroup:
    case R::kGrid:
    case R::kPerChannel:
    case R::kScalar:
      break;
  }
  return "?";
}

// Whether a scale-like tensor's shape fits `rule` for the matrix `m` of a row with `block`; sets
// m.group for kPerGroup with block 0. `expected` says what it should have been.
bool scale_shape_fits(ShapeRule rule, int block, std::span<const int64_t> s, StoredMatrix& m,
                      std::string& expected) {
  const auto dims = [](std::initializer_list<int64_t> d) {
    return shape_text(std::span<const int64_t>(d.begin(), d.size()));
  };
  switch (rule) {
    case R::kPerGroup:
    case R::kStackedPerGroup: {
      const bool stacked = rule == R::kStackedPerGroup;
      const size_t rank = stacked ? 3 : 2;
      if (block == 0) {  // any group dividing K
        expected = "[N, K/group] with N = " + std::to_string(m.n) + ", K = " + std::to_string(m.k);
        if (s.size() != rank || s[rank - 2] != m.n || s[rank - 1] <= 0 || m.k % s[rank - 1] != 0 ||
            (stacked && s[0] != m.experts)) {
          return false;
        }
        m.group = static_cast<int>(m.k / s[rank - 1]);
        return true;
      }
      m.group = block;
      const std::string what = "K/" + std::to_string(block);
      if (m.k % block != 0) {
        expected = (stacked ? "[E, N, " : "[N, ") + what + "] with K = " + std::to_string(m.k) +
                   " a multiple of " + std::to_string(block);
        return false;
      }
      expected = (stacked ? "[E, N, " : "[N, ") + what + "] = " +
                 (stacked ? dims({m.experts, m.n, m.k / block}) : dims({m.n, m.k / block}));
      return stacked ? s.size() == 3 && s[0] == m.experts && s[1] == m.n && s[2] == m.k / block
                     : s.size() == 2 && s[0] == m.n && s[1] == m.k / block;
    }
    case R::kGrid:
      m.group = block;
      expected = "[ceil(N/" + std::to_string(block) + "), ceil(K/" + std::to_string(block) +
                 ")] = " + dims({ceil_div(m.n, block), ceil_div(m.k, block)});
      return s.size() == 2 && s[0] == ceil_div(m.n, block) && s[1] == ceil_div(m.k, block);
    case R::kPerChannel:
      expected = "[N] or [N, 1] with N = " + std::to_string(m.n);
      return (s.size() == 1 && s[0] == m.n) || (s.size() == 2 && s[0] == m.n && s[1] == 1);
    case R::kScalar:
      expected = "one element ([] or [1])";
      return s.empty() || (s.size() == 1 && s[0] == 1);
    case R::kNone:
    case R::kDense:
    case R::kDenseAnyRank:
    case R::kPacked2:
    case R::kPacked8:
    case R::kStackedPacked2:
    case R::kGptOssBlocks:
      break;
  }
  expected = "?";
  return false;
}

// One row against the module's tensors: the match, or how far it got (`stage`: 2 for the weight,
// then one each for a tensor found, its dtype and its shape) and why it stopped.
struct Attempt {
  StoredMatrix match;
  int stage = 0;
  std::string reason;
  bool ok = false;
};

Attempt try_row(const StoredFormInfo& row, std::string_view module, const TensorLookup& find,
                const TensorDesc& w) {
  Attempt a;
  StoredMatrix& m = a.match;
  m.row = &row;
  m.weight = std::string(module) + std::string(row.weight.suffix);
  const std::string of = " of " + std::string(row.name);
  if (!dtype_allowed(row.weight, w.dtype) || !weight_dims(row.weight.shape, w.shape, m)) {
    a.reason = describe(m.weight, w) + ", not " + dtype_list(row.weight) + " " +
               std::string(weight_rule_text(row.weight.shape)) + of;
    return a;
  }
  a.stage = 2;  // a scale that is missing ranks below one that is present but wrong
  if (row.form == StoredForm::kDense) {
    for (const StoredFormInfo& other : kStoredForms) {
      if (other.weight.suffix != row.weight.suffix || !other.scale.present()) continue;
      const std::string name = std::string(module) + std::string(other.scale.suffix);
      if (find(name)) {
        a.reason = "'" + m.weight + "' is " + std::string(w.dtype) + " beside the scale '" + name +
                   "': not a dense matrix, and no quantized form has a " + std::string(w.dtype) +
                   " weight";
        return a;
      }
    }
  }
  const std::pair<const StoredTensorInfo*, std::string*> parts[] = {
      {&row.scale, &m.scale}, {&row.tensor_scale, &m.tensor_scale}};
  for (const auto& [info, out] : parts) {
    if (!info->present()) continue;
    const std::string name = std::string(module) + std::string(info->suffix);
    const auto t = find(name);
    if (!t) {
      a.reason = "no '" + name + "' beside '" + m.weight + "'" + of;
      return a;
    }
    ++a.stage;
    if (!dtype_allowed(*info, t->dtype)) {
      a.reason = describe(name, *t) + ", not " + dtype_list(*info) + of;
      return a;
    }
    ++a.stage;
    std::string expected;
    if (!scale_shape_fits(info->shape, row.block, t->shape, m, expected)) {
      a.reason = describe(name, *t) + ", not " + expected + of;
      return a;
    }
    ++a.stage;
    *out = name;
  }
  if (row.input_scale.present()) {
    const std::string name = std::string(module) + std::string(row.input_scale.suffix);
    if (const auto t = find(name)) {
      std::string expected;
      if (!dtype_allowed(row.input_scale, t->dtype) ||
          !scale_shape_fits(row.input_scale.shape, row.block, t->shape, m, expected)) {
        a.reason =
            describe(name, *t) + ", not " + dtype_list(row.input_scale) + " " + expected + of;
        return a;
      }
      m.input_scale = name;
    }
  }
  if (m.group == 0) m.group = row.block;
  a.ok = true;
  return a;
}

}  // namespace

std::span<const StoredFormInfo> stored_forms() { return kStoredForms; }

const StoredFormInfo& stored_form_info(StoredForm form) {
  for (const auto& row : kStoredForms) {
    if (row.form == form) return row;
  }
  FP4MOE_CHECK(false && "a StoredForm without a row");
  return kStoredForms[0];
}

Result<StoredMatrix> classify_stored(std::string_view module, const TensorLookup& find) {
  std::optional<Attempt> best;
  for (const StoredFormInfo& row : kStoredForms) {
    const auto w = find(std::string(module) + std::string(row.weight.suffix));
    if (!w) continue;
    Attempt a = try_row(row, module, find, *w);
    if (a.ok) return a.match;
    if (!best || a.stage > best->stage) best = std::move(a);
  }
  if (!best) return Error{"no weight tensor of module '" + std::string(module) + "'"};
  if (best->stage == 0) {
    // The weight fits no row: say so once instead of one row's expectations.
    const std::string& name = best->match.weight;
    const auto w = find(name);
    std::string forms;
    for (const StoredFormInfo& row : kStoredForms) {
      if (find(std::string(module) + std::string(row.weight.suffix))) {
        forms += (forms.empty() ? "" : ", ") + std::string(row.name) + " (" +
                 dtype_list(row.weight) + " " + std::string(weight_rule_text(row.weight.shape)) +
                 ")";
      }
    }
    return Error{describe(name, *w) + ": the weight of no stored form (" + forms + ")"};
  }
  return Error{best->reason};
}

}  // namespace fp4moe::formats
