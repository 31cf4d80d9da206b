// fp4moe.encode/decode and the block formats on arrays (formats/): element codecs, NVFP4, MXFP4,
// FP8 block-128, and the lossless MXFP4 -> NVFP4 transcode. Tensors are [..., K]: rows is the
// product of the outer extents, blocks run along the last one (formats/block.h).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cmath>
#include <string>
#include <vector>

#include "formats/block.h"
#include "formats/scalar.h"
#include "formats/transcode.h"
#include "python/py_util.h"

namespace fp4moe::python {

namespace {

namespace f = formats;
using nb::arg;

// One row per element codec: its name, code dtype and the scalar encoder/decoder (scalar.h).
struct Codec {
  std::string_view name;
  DType codes;
  uint8_t (*encode8)(float);
  float (*decode8)(uint8_t);
  uint16_t (*encode16)(float);
  float (*decode16)(uint16_t);
};

const Codec kCodecs[] = {
    {"e2m1", DType::kUint8, f::encode_e2m1, f::decode_e2m1, nullptr, nullptr},
    {"e4m3", DType::kUint8, f::encode_e4m3, f::decode_e4m3, nullptr, nullptr},
    {"ue4m3", DType::kUint8, f::encode_ue4m3, f::decode_ue4m3, nullptr, nullptr},
    {"e8m0", DType::kUint8, f::encode_e8m0, f::decode_e8m0, nullptr, nullptr},
    {"bf16", DType::kUint16, nullptr, nullptr, f::encode_bf16, f::decode_bf16},
    {"fp16", DType::kUint16, nullptr, nullptr, f::encode_fp16, f::decode_fp16},
};

const Codec& parse_codec(const std::string& kind) {
  std::string names;
  for (const Codec& codec : kCodecs) {
    if (codec.name == kind) return codec;
    names += (names.empty() ? "" : ", ") + std::string(codec.name);
  }
  raise_bad_input("unknown kind '" + kind + "' (expected one of " + names + ")");
}

nb::object encode(const std::string& kind, nb::handle x_obj) {
  const Codec& codec = parse_codec(kind);
  const auto x = typed<float>(read_array(x_obj, "x", DType::kFloat32));
  NewArray out = new_array(x.shape, codec.codes, is_torch(x_obj));
  {
    nb::gil_scoped_release release;
    for (size_t i = 0; i < x.size; ++i) {
      if (codec.encode16 != nullptr) {
        static_cast<uint16_t*>(out.data)[i] = codec.encode16(x.data[i]);
      } else {
        static_cast<uint8_t*>(out.data)[i] = codec.encode8(x.data[i]);
      }
    }
  }
  return out.array;
}

nb::object decode(const std::string& kind, nb::handle codes_obj) {
  const Codec& codec = parse_codec(kind);
  const auto codes = read_array(codes_obj, "codes", codec.codes);
  NewArray out = new_array(codes.shape, DType::kFloat32, is_torch(codes_obj));
  auto* y = static_cast<float*>(out.data);
  {
    nb::gil_scoped_release release;
    for (size_t i = 0; i < codes.size; ++i) {
      y[i] = codec.decode16 != nullptr ? codec.decode16(static_cast<const uint16_t*>(codes.data)[i])
                                       : codec.decode8(static_cast<const uint8_t*>(codes.data)[i]);
    }
  }
  return out.array;
}

// [..., K] as [rows, K].
struct Rows {
  int64_t rows = 1, cols = 0;
};
Rows rows_cols(const std::vector<size_t>& shape) {
  Rows r;
  for (size_t i = 0; i + 1 < shape.size(); ++i) r.rows *= static_cast<int64_t>(shape[i]);
  r.cols = static_cast<int64_t>(shape.back());
  return r;
}
std::vector<size_t> with_last(std::vector<size_t> shape, int64_t last) {
  shape.back() = static_cast<size_t>(last);
  return shape;
}

template <class T>
std::span<T> out_span(const NewArray& a, size_t n) {
  return {static_cast<T*>(a.data), n};
}

// FP4 block scales: any shape holding rows * K / block codes (checked when K fits the block;
// otherwise formats/ reports K).
ArrayArg<const uint8_t> fp4_scales(nb::handle obj, const char* name, Rows r, int block) {
  auto scales = typed<uint8_t>(read_array(obj, name, DType::kUint8));
  if (r.cols % block == 0) {
    check_size(name, scales.size, DType::kUint8, static_cast<size_t>(r.rows * (r.cols / block)),
               {r.rows, r.cols});
  }
  return scales;
}

nb::tuple quantize_nvfp4(nb::handle x_obj, std::optional<float> tensor_scale) {
  const auto x = typed<float>(read_array(x_obj, "x", DType::kFloat32));
  const Rows r = rows_cols(x.shape);
  const bool torch = is_torch(x_obj);
  NewArray packed = new_array(with_last(x.shape, r.cols / 2), DType::kUint8, torch);
  NewArray scales = new_array(with_last(x.shape, r.cols / 16), DType::kUint8, torch);
  const auto n = static_cast<size_t>(r.rows * r.cols);
  Status status;
  float ts = 0;
  {
    nb::gil_scoped_release release;
    if (tensor_scale.has_value()) {
      ts = *tensor_scale;
    } else {
      auto computed = f::nvfp4_tensor_scale("x", span_of(x));
      if (computed.ok()) {
        ts = *computed;
      } else {
        status = computed.error();
      }
    }
    if (status.ok()) {
      status =
          f::quantize_nvfp4("x", span_of(x), r.rows, r.cols, ts, out_span<uint8_t>(packed, n / 2),
                            out_span<uint8_t>(scales, static_cast<size_t>(r.rows * (r.cols / 16))));
    }
  }
  unwrap(status);
  return nb::make_tuple(packed.array, scales.array, numpy_float32(ts));
}

nb::object dequantize_nvfp4(nb::handle packed_obj, nb::handle scales_obj, float tensor_scale) {
  const auto packed = typed<uint8_t>(read_array(packed_obj, "packed", DType::kUint8));
  const Rows r = {rows_cols(packed.shape).rows, rows_cols(packed.shape).cols * 2};
  const auto scales = fp4_scales(scales_obj, "scales", r, 16);
  NewArray out = new_array(with_last(packed.shape, r.cols), DType::kFloat32, is_torch(packed_obj));
  Status status;
  {
    nb::gil_scoped_release release;
    status =
        f::dequantize_nvfp4("packed", span_of(packed), span_of(scales), tensor_scale, r.rows,
                            r.cols, out_span<float>(out, static_cast<size_t>(r.rows * r.cols)));
  }
  unwrap(status);
  return out.array;
}

f::MxScaleRule parse_rule(const std::string& rule) {
  for (f::MxScaleRule r : {f::MxScaleRule::kOcpFloor, f::MxScaleRule::kRoundUp}) {
    if (f::mx_scale_rule_name(r) == rule) return r;
  }
  raise_bad_input("argument 'rule': '" + rule + "', expected 'ocp_floor' or 'round_up'");
}

nb::tuple quantize_mxfp4(nb::handle x_obj, const std::string& rule) {
  const f::MxScaleRule scale_rule = parse_rule(rule);
  const auto x = typed<float>(read_array(x_obj, "x", DType::kFloat32));
  const Rows r = rows_cols(x.shape);
  const bool torch = is_torch(x_obj);
  NewArray packed = new_array(with_last(x.shape, r.cols / 2), DType::kUint8, torch);
  NewArray scales = new_array(with_last(x.shape, r.cols / 32), DType::kUint8, torch);
  Status status;
  {
    nb::gil_scoped_release release;
    status =
        f::quantize_mxfp4("x", span_of(x), r.rows, r.cols, scale_rule,
                          out_span<uint8_t>(packed, static_cast<size_t>(r.rows * r.cols / 2)),
                          out_span<uint8_t>(scales, static_cast<size_t>(r.rows * (r.cols / 32))));
  }
  unwrap(status);
  return nb::make_tuple(packed.array, scales.array);
}

nb::object dequantize_mxfp4(nb::handle packed_obj, nb::handle scales_obj) {
  const auto packed = typed<uint8_t>(read_array(packed_obj, "packed", DType::kUint8));
  const Rows r = {rows_cols(packed.shape).rows, rows_cols(packed.shape).cols * 2};
  const auto scales = fp4_scales(scales_obj, "scales", r, 32);
  NewArray out = new_array(with_last(packed.shape, r.cols), DType::kFloat32, is_torch(packed_obj));
  Status status;
  {
    nb::gil_scoped_release release;
    status = f::dequantize_mxfp4("packed", span_of(packed), span_of(scales), r.rows, r.cols,
                                 out_span<float>(out, static_cast<size_t>(r.rows * r.cols)));
  }
  unwrap(status);
  return out.array;
}

std::vector<size_t> fp8_grid(int64_t rows, int64_t cols) {
  return {static_cast<size_t>((rows + 127) / 128), static_cast<size_t>((cols + 127) / 128)};
}

nb::tuple quantize_fp8_block128(nb::handle x_obj, bool ue8m0) {
  const auto x = typed<float>(read_array(x_obj, "x", DType::kFloat32, 2));
  const auto rows = static_cast<int64_t>(x.shape[0]), cols = static_cast<int64_t>(x.shape[1]);
  const bool torch = is_torch(x_obj);
  NewArray q = new_array(x.shape, DType::kUint8, torch);
  const std::vector<size_t> grid = fp8_grid(rows, cols);
  NewArray scales = new_array(grid, ue8m0 ? DType::kUint8 : DType::kFloat32, torch);
  Status status;
  {
    nb::gil_scoped_release release;
    if (ue8m0) {
      status =
          f::quantize_fp8_block128_ue8m0("x", span_of(x), rows, cols, out_span<uint8_t>(q, x.size),
                                         out_span<uint8_t>(scales, grid[0] * grid[1]));
    } else {
      status = f::quantize_fp8_block128("x", span_of(x), rows, cols, out_span<uint8_t>(q, x.size),
                                        out_span<float>(scales, grid[0] * grid[1]));
    }
  }
  unwrap(status);
  return nb::make_tuple(q.array, scales.array);
}

// The scales' dtype picks the variant: float32 multipliers, or uint8 E8M0 codes.
nb::object dequantize_fp8_block128(nb::handle q_obj, nb::handle scales_obj) {
  const auto q = typed<uint8_t>(read_array(q_obj, "q", DType::kUint8, 2));
  const auto rows = static_cast<int64_t>(q.shape[0]), cols = static_cast<int64_t>(q.shape[1]);
  nb::ndarray<nb::ro> probe;
  const bool ue8m0 =
      nb::try_cast(scales_obj, probe, false) && probe.dtype() == nb::dtype<uint8_t>();
  const auto scales = read_array(scales_obj, "scales", ue8m0 ? DType::kUint8 : DType::kFloat32);
  if (rows > 0 && cols > 0) {
    const std::vector<size_t> grid = fp8_grid(rows, cols);
    check_size("scales", scales.size, ue8m0 ? DType::kUint8 : DType::kFloat32, grid[0] * grid[1],
               {rows, cols});
  }
  NewArray out = new_array(q.shape, DType::kFloat32, is_torch(q_obj));
  Status status;
  {
    nb::gil_scoped_release release;
    if (ue8m0) {
      status = f::dequantize_fp8_block128_ue8m0("q", span_of(q), span_of(typed<uint8_t>(scales)),
                                                rows, cols, out_span<float>(out, q.size));
    } else {
      status = f::dequantize_fp8_block128("q", span_of(q), span_of(typed<float>(scales)), rows,
                                          cols, out_span<float>(out, q.size));
    }
  }
  unwrap(status);
  return out.array;
}

nb::tuple transcode_mxfp4_to_nvfp4(nb::sequence tensors) {
  std::vector<f::Mxfp4Source> sources;
  std::vector<f::Nvfp4Destination> destinations;
  nb::list outs;
  size_t i = 0;
  for (nb::handle item : tensors) {
    const std::string prefix = "tensors[" + std::to_string(i) + "]";
    if (!nb::isinstance<nb::tuple>(item) || nb::len(item) != 2) {
      raise_type_error("argument '" + prefix + "': expected a (packed, scales) pair");
    }
    const std::string packed_name = prefix + ".packed", scales_name = prefix + ".scales";
    const auto packed = typed<uint8_t>(read_array(item[0], packed_name.c_str(), DType::kUint8));
    const Rows r = {rows_cols(packed.shape).rows, rows_cols(packed.shape).cols * 2};
    const auto scales = fp4_scales(item[1], scales_name.c_str(), r, 32);
    sources.push_back({prefix, span_of(packed), span_of(scales), r.rows, r.cols});
    const bool torch = is_torch(item[0]);
    NewArray nv_packed = new_array(packed.shape, DType::kUint8, torch);
    NewArray nv_scales = new_array(with_last(packed.shape, r.cols / 16), DType::kUint8, torch);
    destinations.push_back(
        {out_span<uint8_t>(nv_packed, packed.size),
         out_span<uint8_t>(nv_scales, static_cast<size_t>(r.rows * (r.cols / 16)))});
    outs.append(nb::make_tuple(nv_packed.array, nv_scales.array));
    ++i;
  }
  Result<f::TranscodeReport> report = Error{""};
  {
    nb::gil_scoped_release release;
    report = f::transcode_mxfp4_to_nvfp4(sources, destinations);
  }
  const f::TranscodeReport r = unwrap(std::move(report));
  nb::dict d;
  d["blocks_total"] = r.blocks_total;
  d["blocks_lossless"] = r.blocks_lossless;
  d["blocks_requantized"] = r.blocks_requantized;
  d["blocks_all_zero"] = r.blocks_all_zero;
  d["max_abs_error"] = r.max_abs_error;
  d["max_rel_error"] = r.max_rel_error;
  return nb::make_tuple(outs, numpy_float32(r.tensor_scale), d);
}

}  // namespace

void register_formats(nb::module_& m) {
  m.def("encode", &encode, arg("kind"), arg("x"),
        "float32 x (any shape) -> codes of the same shape: uint8, or uint16 for bf16 / fp16.\n"
        "kind: e2m1, e4m3, ue4m3, e8m0, bf16 or fp16 (rounding and saturation: formats/scalar.h).");
  m.def("decode", &decode, arg("kind"), arg("codes"),
        "codes (uint8, or uint16 for bf16 / fp16; any shape) -> float32 of the same shape.");
  m.def("quantize_nvfp4", &quantize_nvfp4, arg("x"), arg("tensor_scale") = nb::none(),
        "float32 x [..., K] -> (packed uint8 [..., K/2], UE4M3 block scales uint8 [..., K/16],\n"
        "tensor scale float32), by NVIDIA ModelOpt's recipe; pass tensor_scale to share one.");
  m.def("dequantize_nvfp4", &dequantize_nvfp4, arg("packed"), arg("scales"), arg("tensor_scale"),
        "packed uint8 [..., K/2], UE4M3 scales uint8 (rows * K/16 of them, any shape) -> float32\n"
        "[..., K].");
  m.def("quantize_mxfp4", &quantize_mxfp4, arg("x"), arg("rule") = "ocp_floor",
        "float32 x [..., K] -> (packed uint8 [..., K/2], E8M0 scales uint8 [..., K/32]).\n"
        "rule: 'ocp_floor' (OCP v1.0, may clip) or 'round_up' (never clips).");
  m.def("dequantize_mxfp4", &dequantize_mxfp4, arg("packed"), arg("scales"),
        "packed uint8 [..., K/2], E8M0 scales uint8 (rows * K/32 of them) -> float32 [..., K].");
  m.def("quantize_fp8_block128", &quantize_fp8_block128, arg("x"), arg("ue8m0") = false,
        "2-D float32 x [N, K] -> (E4M3 codes uint8 [N, K], scales [ceil(N/128), ceil(K/128)]:\n"
        "float32 multipliers, or E8M0 uint8 codes when ue8m0).");
  m.def(
      "dequantize_fp8_block128", &dequantize_fp8_block128, arg("q"), arg("scales"),
      "E4M3 codes uint8 [N, K] and scales [ceil(N/128), ceil(K/128)] (any shape of that size):\n"
      "float32 multipliers, or uint8 E8M0 codes (the dtype picks the variant) -> float32 [N, K].");
  m.def("transcode_mxfp4_to_nvfp4", &transcode_mxfp4_to_nvfp4, arg("tensors"),
        "tensors: (packed uint8 [..., K/2], E8M0 scales uint8) pairs sharing one tensor scale\n"
        "(w1 and w3 of an expert). Returns ([(packed, block_scales), ...], tensor_scale, report)\n"
        "with the report's block counts and the worst error of requantized blocks.");
}

}  // namespace fp4moe::python
