// Stored forms: how a checkpoint keeps one quantized (or dense) matrix, one table row per form
// (ggml's type_traits), and the one classifier (module's tensors -> row) that detect/, model/,
// convert/ and synth/ read. Adding a stored form = one row here plus its fixtures.
//
// A row names each tensor of the module by the suffix appended to the module name (".weight",
// "_blocks", "" for ModelOpt's fused export whose packed weight is the bare module name), the
// safetensors dtypes it may have (spelled as safetensors spells them, "U8", "F8_E4M3": this layer
// depends on core/ only) and its shape relation to the logical matrix [N, K] (with E experts
// stacked in front for the fused forms). The codec is the `BlockFormat` row of block.h.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/status.h"
#include "formats/block.h"

namespace fp4moe::formats {

// One enumerator per row of storage.cc's table (N = out features, K = in features, E = experts).
enum class StoredForm : uint8_t {
  kNvfp4ModelOpt,                 // .weight U8 [N,K/2], .weight_scale E4M3, .weight_scale_2
  kNvfp4ModelOptFused,            // ModelOpt's fused-expert export: <m> U8 [E,N,K/2], ...
  kNvfp4CompressedTensors,        // .weight_packed, .weight_scale, .weight_global_scale
  kMxfp4,                         // DeepSeek-V4: .weight I8 [N,K/2], .scale E8M0 [N,K/32]
  kMxfp4CompressedTensors,        // .weight_packed U8, .weight_scale U8 (E8M0)
  kMxfp4GptOssFused,              // gpt-oss: _blocks U8 [E,N,K/32,16], _scales U8
  kFp8Block128,                   // DeepSeek-V3: .weight E4M3, .weight_scale_inv F32 grid
  kFp8Block128Ue8m0,              // DeepSeek-V3.2/V4: .weight E4M3, .scale E8M0 grid
  kFp8Block128CompressedTensors,  // float-quantized block: .weight E4M3, .weight_scale F32 grid
  kFp8Tensor,                     // ModelOpt FP8: .weight E4M3, .weight_scale scalar
  kFp8Channel,                    // .weight E4M3, .weight_scale [N] or [N,1]
  kMxfp8,                         // .weight E4M3 [N,K], .weight_scale E8M0 [N,K/32]
  kInt4CompressedTensors,         // .weight_packed I32 [N,K/8], .weight_scale [N,K/group]
  kDense,                         // .weight BF16/F16/F32/F64 of any rank, no scale tensor
};

// How a tensor's shape relates to the logical matrix. The weight's rule defines [E,] N and K; the
// other tensors' rules are checked against them.
enum class ShapeRule : uint8_t {
  kNone,             // the tensor is not part of the row
  kDense,            // [N, K]
  kDenseAnyRank,     // [..., K]: a dense weight may also be a norm's [H] or a stacked [E, N, K]
  kPacked2,          // [N, K/2]: two E2M1 codes per byte
  kPacked8,          // [N, K/8]: eight INT4 codes per I32
  kStackedPacked2,   // [E, N, K/2]
  kGptOssBlocks,     // [E, N, K/32, 16]
  kPerGroup,         // [N, K/block] (block from the row; 0: any group that divides K)
  kStackedPerGroup,  // [E, N, K/block]
  kGrid,             // [ceil(N/block), ceil(K/block)]
  kPerChannel,       // [N] or [N, 1]
  kScalar,           // one element (shape [] or [1])
};

struct StoredTensorInfo {
  std::string_view suffix;                 // appended to the module name; "" for the bare name
  std::array<std::string_view, 4> dtypes;  // safetensors spellings allowed, "" = unused slot
  ShapeRule shape = ShapeRule::kNone;
  bool present() const { return shape != ShapeRule::kNone; }
};

struct StoredFormInfo {
  StoredForm form;
  std::string_view name;    // "nvfp4_modelopt", ...
  std::string_view scheme;  // what model/ and verify call it: "nvfp4", "mxfp4", "fp8_block", ...
  // The codec (block.h: quantize/dequantize) and the CPU kernel family that runs it; nullopt where
  // no codec of this project reads the form (detected only).
  std::optional<BlockFormat> codec;
  int block;  // elements per scale along K (128: 128x128 blocks); 0 per tensor/channel/any group
  StoredTensorInfo weight, scale, tensor_scale, input_scale;
  bool reciprocal_tensor_scale;  // compressed-tensors' global scales: 1 / ModelOpt's scale_2
  double bytes_per_param;        // stored bytes per weight element (tensor scale not counted)
};

// The table, in classification order.
std::span<const StoredFormInfo> stored_forms();
const StoredFormInfo& stored_form_info(StoredForm form);

// The abstract view of a checkpoint the classifier reads: a tensor name -> its dtype spelling and
// shape, or nullopt when there is no such tensor. detect/'s header records and the CheckpointDir
// of model/ and convert/ both provide one.
struct TensorDesc {
  std::string_view dtype;
  std::span<const int64_t> shape;
};
using TensorLookup = std::function<std::optional<TensorDesc>(const std::string& name)>;

struct StoredMatrix {
  const StoredFormInfo* row = nullptr;
  // Full tensor names ("" where the row has none or, for input_scale, the checkpoint has none).
  std::string weight, scale, tensor_scale, input_scale;
  int64_t experts = 0;  // E of a stacked (fused) form; 0 for one matrix
  int64_t n = 0, k = 0;
  int group = 0;  // elements per scale along K (the row's block, or the group an INT4 scale gives)
};

// The row whose tensors `module` has, with the tensors it uses; or an error whose message names
// the tensor and the reason ("'m.weight_scale' is F8_E4M3 [64, 3], not [N, K/16] = [64, 4] of
// nvfp4_modelopt") when the module's weight exists but no row fits, or "no weight tensor" when
// none of the rows' weight tensors exists.
Result<StoredMatrix> classify_stored(std::string_view module, const TensorLookup& find);

// The dtype a writer (synth/) gives the tensor: the first the row allows.
inline std::string_view dtype_of(const StoredTensorInfo& t) { return t.dtypes[0]; }

}  // namespace fp4moe::formats
