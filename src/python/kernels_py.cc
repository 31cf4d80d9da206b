// The CPU kernels from Python: fp4moe.Weights (a matrix in kernel layout, pack/), fp4moe.Linear
// (dispatch::LinearPlan), fp4moe.MoELayer (moe::MoeLayer, from a checkpoint's layer through
// model/ or from arrays) with the FP64 reference of model/, and fp4moe.linear. Inputs and outputs
// are read and written in place (numpy arrays, CPU torch tensors through DLPack).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_dir.h"
#include "core/thread_pool.h"
#include "dispatch/cpu_features.h"
#include "dispatch/linear.h"
#include "kernels/types.h"
#include "model/moe_checkpoint.h"
#include "moe/moe_layer.h"
#include "pack/pack.h"
#include "python/py_util.h"

namespace fp4moe::python {

namespace {

using nb::arg;

std::optional<kernels::Isa> parse_isa(const std::optional<std::string>& name) {
  if (!name.has_value()) return std::nullopt;
  return unwrap(dispatch::parse_isa(*name));
}

// A weight matrix W [n, k] in kernel layout, packed once from checkpoint-layout arrays.
class Weights {
 public:
  // "nvfp4": packed uint8 [n, k/2] + UE4M3 uint8 (n * k/16) + tensor_scale; "mxfp4": packed +
  // E8M0 uint8 (n * k/32); "fp8_block": E4M3 uint8 [n, k] + scales [ceil(n/128), ceil(k/128)],
  // float32 multipliers or uint8 E8M0 codes.
  Weights(const std::string& format, nb::handle packed_obj, nb::handle scales_obj,
          float tensor_scale) {
    std::optional<kernels::WeightFormat> parsed;
    for (kernels::WeightFormat f : kernels::kAllWeightFormats) {
      if (kernels::weight_format_name(f) == format) parsed = f;
    }
    if (!parsed.has_value()) {
      raise_bad_input("unknown format '" + format + "' (expected nvfp4, mxfp4 or fp8_block)");
    }
    const auto packed = typed<uint8_t>(read_array(packed_obj, "packed", DType::kUint8, 2));
    const auto n = static_cast<int64_t>(packed.shape[0]);
    Result<pack::PackedWeights> result = Error{""};
    if (*parsed == kernels::WeightFormat::kFp8Block128) {
      const int64_t k = static_cast<int64_t>(packed.shape[1]);
      nb::ndarray<nb::ro> probe;
      const bool e8m0 =
          nb::try_cast(scales_obj, probe, false) && probe.dtype() == nb::dtype<uint8_t>();
      const DType dtype = e8m0 ? DType::kUint8 : DType::kFloat32;
      const auto scales = read_array(scales_obj, "scales", dtype);
      check_size("scales", scales.size, dtype,
                 static_cast<size_t>(((n + 127) / 128) * ((k + 127) / 128)), {n, k});
      nb::gil_scoped_release release;
      result =
          e8m0 ? pack::pack_fp8_block128_ue8m0("w", span_of(packed),
                                               span_of(typed<uint8_t>(scales)), n, k)
               : pack::pack_fp8_block128("w", span_of(packed), span_of(typed<float>(scales)), n, k);
    } else {
      const int64_t k = static_cast<int64_t>(packed.shape[1]) * 2;
      const int block = kernels::weight_format_k_block(*parsed);
      const auto scales = typed<uint8_t>(read_array(scales_obj, "scales", DType::kUint8));
      if (k % block == 0) {
        check_size("scales", scales.size, DType::kUint8, static_cast<size_t>(n * (k / block)),
                   {n, k});
      }
      nb::gil_scoped_release release;
      result = *parsed == kernels::WeightFormat::kNvfp4
                   ? pack::pack_nvfp4("w", span_of(packed), span_of(scales), tensor_scale, n, k)
                   : pack::pack_mxfp4("w", span_of(packed), span_of(scales), n, k);
    }
    packed_ = std::make_shared<pack::PackedWeights>(unwrap(std::move(result)));
  }

  const std::shared_ptr<pack::PackedWeights>& packed() const { return packed_; }
  std::string format() const { return std::string(kernels::weight_format_name(packed_->format())); }
  int64_t n() const { return packed_->n(); }
  int64_t k() const { return packed_->k(); }
  size_t nbytes() const { return packed_->streamed_bytes(); }

 private:
  std::shared_ptr<pack::PackedWeights> packed_;  // shared: plans and layers point into it
};

// The output of a product: `out` when given (checked, written in place and returned), else a
// new array in the framework of `x`.
struct Output {
  nb::object array;
  float* data;
};
Output output_for(nb::handle out_obj, nb::handle x_obj, size_t rows, size_t cols) {
  if (out_obj.is_none()) {
    NewArray a = new_array({rows, cols}, DType::kFloat32, is_torch(x_obj));
    return {a.array, static_cast<float*>(a.data)};
  }
  auto out = typed<float>(write_array(out_obj, "out", DType::kFloat32, 2));
  if (out.shape[0] != rows || out.shape[1] != cols) {
    raise_bad_input("argument 'out': shape " + shape_string(out.shape) + ", expected " +
                    shape_string({rows, cols}));
  }
  return {nb::borrow(out_obj), out.data};
}

// One linear layer y = x W^T: the kernel is chosen once, here (dispatch::LinearPlan).
class Linear {
 public:
  Linear(const Weights& weights, const std::string& precision,
         const std::optional<std::string>& isa)
      : packed_(weights.packed()),
        plan_(unwrap(dispatch::LinearPlan::create(packed_->view(), parse_isa(isa),
                                                  unwrap(dispatch::parse_precision(precision))))) {}

  // x float32 [m, k] -> y float32 [m, n] (into `out` when given).
  nb::object call(nb::handle x_obj, nb::handle out_obj) const {
    const auto x = typed<float>(read_array(x_obj, "x", DType::kFloat32, 2));
    const auto m = static_cast<int64_t>(x.shape[0]);
    if (static_cast<int64_t>(x.shape[1]) != plan_.weights().k) {
      raise_bad_input("argument 'x': shape " + shape_string(x.shape) + ", the weights [" +
                      std::to_string(plan_.weights().n) + ", " + std::to_string(plan_.weights().k) +
                      "] want [m, " + std::to_string(plan_.weights().k) + "]");
    }
    const int64_t n = plan_.weights().n, k = plan_.weights().k;
    Output y = output_for(out_obj, x_obj, x.shape[0], static_cast<size_t>(n));
    if (m == 0) return y.array;
    nb::gil_scoped_release release;
    if (plan_.precision() == dispatch::Precision::kW4A8) {
      dispatch::QuantizedActivationBuffer buffer(m, k, plan_.activation_block());
      plan_.run_quantizing(x.data, k, m, y.data, n, buffer, ThreadPool::global());
    } else {
      plan_.run(x.data, k, m, y.data, n, ThreadPool::global());
    }
    return y.array;
  }

  const dispatch::LinearPlan& plan() const { return plan_; }

 private:
  std::shared_ptr<pack::PackedWeights> packed_;  // before plan_: the plan points into it
  dispatch::LinearPlan plan_;
};

nb::object linear(const std::string& format, const std::string& precision, nb::handle packed,
                  nb::handle scales, nb::handle x, float tensor_scale,
                  const std::optional<std::string>& isa) {
  unwrap(dispatch::parse_precision(precision));  // names a bad precision before any array
  parse_isa(isa);
  Weights weights(format, packed, scales, tensor_scale);
  return Linear(weights, precision, isa).call(x, nb::none());
}

// Router and activation vocabulary (moe/router.h, moe/moe_layer.h).
moe::ScoringFunc parse_scoring(const std::string& name) {
  if (name == "softmax") return moe::ScoringFunc::kSoftmax;
  if (name == "sigmoid") return moe::ScoringFunc::kSigmoid;
  if (name == "sqrtsoftplus") return moe::ScoringFunc::kSqrtSoftplus;
  raise_bad_input("argument 'scoring': '" + name +
                  "', expected 'softmax', 'sigmoid' or 'sqrtsoftplus'");
}
moe::WeightRule parse_weight_rule(const std::string& name) {
  if (name == "scores_at_selected") return moe::WeightRule::kScoresAtSelected;
  if (name == "softmax_of_top_k") return moe::WeightRule::kSoftmaxOfTopK;
  raise_bad_input("argument 'weight_rule': '" + name +
                  "', expected 'scores_at_selected' or 'softmax_of_top_k'");
}

std::vector<float> copy_floats(nb::handle obj, const char* name, size_t needed,
                               const std::vector<int64_t>& shape) {
  if (obj.is_none()) return {};
  const auto a = typed<float>(read_array(obj, name, DType::kFloat32));
  check_size(name, a.size, DType::kFloat32, needed, shape);
  return {a.data, a.data + a.size};
}

// One MoE layer on the CPU kernels. From a checkpoint (model/: the family's names and routing
// semantics from config.json) it also has the FP64 reference forward (model::reference_forward).
class MoELayer {
 public:
  static std::unique_ptr<MoELayer> from_checkpoint(const std::string& path, int layer,
                                                   int64_t max_tokens, const std::string& precision,
                                                   const std::optional<std::string>& isa) {
    const dispatch::Precision p = unwrap(dispatch::parse_precision(precision));
    const std::optional<kernels::Isa> chosen = parse_isa(isa);
    auto self = std::unique_ptr<MoELayer>(new MoELayer());
    self->max_tokens_ = max_tokens;
    Status status;
    {
      nb::gil_scoped_release release;
      status = self->load(path, layer, max_tokens, p, chosen);
    }
    unwrap(status);
    return self;
  }

  static std::unique_ptr<MoELayer> from_arrays(
      nb::handle router_weight, const std::vector<std::vector<const Weights*>>& experts, int top_k,
      const std::string& scoring, const std::string& weight_rule, bool renormalize,
      float routed_scaling_factor, int n_group, int topk_group, nb::handle correction_bias,
      nb::handle logit_bias, const std::vector<std::vector<const Weights*>>& shared_experts,
      float swiglu_limit, int64_t max_tokens, const std::string& precision,
      const std::optional<std::string>& isa) {
    auto self = std::unique_ptr<MoELayer>(new MoELayer());
    self->max_tokens_ = max_tokens;
    const auto w = typed<float>(read_array(router_weight, "router_weight", DType::kFloat32, 2));
    const auto e = static_cast<int64_t>(w.shape[0]), h = static_cast<int64_t>(w.shape[1]);
    moe::MoeConfig config;
    config.hidden = h;
    config.router.num_experts = static_cast<int>(e);
    config.router.top_k = top_k;
    config.router.scoring = parse_scoring(scoring);
    config.router.weight_rule = parse_weight_rule(weight_rule);
    config.router.renormalize = renormalize;
    config.router.routed_scaling_factor = routed_scaling_factor;
    config.router.n_group = n_group;
    config.router.topk_group = topk_group;
    config.routed_activation.limit = swiglu_limit;
    config.shared_activation.limit = swiglu_limit;
    self->router_weight_.assign(w.data, w.data + w.size);
    self->correction_bias_ =
        copy_floats(correction_bias, "correction_bias", static_cast<size_t>(e), {e});
    self->logit_bias_ = copy_floats(logit_bias, "logit_bias", static_cast<size_t>(e), {e});
    auto to_experts = [&](const std::vector<std::vector<const Weights*>>& list, const char* name) {
      std::vector<moe::ExpertWeights> out;
      for (size_t i = 0; i < list.size(); ++i) {
        if (list[i].size() != 3) {
          raise_bad_input("argument '" + std::string(name) + "[" + std::to_string(i) +
                          "]': expected (gate, up, down) Weights, got " +
                          std::to_string(list[i].size()));
        }
        for (const Weights* m : list[i]) self->held_.push_back(m->packed());
        out.push_back({list[i][0]->packed().get(),
                       list[i][1]->packed().get(),
                       list[i][2]->packed().get(),
                       {},
                       {},
                       {}});
      }
      return out;
    };
    std::vector<moe::ExpertWeights> routed = to_experts(experts, "experts");
    std::vector<moe::ExpertWeights> shared = to_experts(shared_experts, "shared_experts");
    const moe::RouterWeights router{self->router_weight_, self->logit_bias_,
                                    self->correction_bias_};
    const dispatch::Precision p = unwrap(dispatch::parse_precision(precision));
    const std::optional<kernels::Isa> chosen = parse_isa(isa);
    Result<moe::MoeLayer> created = Error{""};
    {
      nb::gil_scoped_release release;
      created = moe::MoeLayer::create(config, router, std::move(routed), std::move(shared),
                                      max_tokens, chosen, p);
    }
    self->layer_.emplace(unwrap(std::move(created)));
    self->config_ = config;
    return self;
  }

  // x float32 [tokens, hidden], tokens <= max_tokens -> y float32 [tokens, hidden].
  nb::object call(nb::handle x_obj, nb::handle out_obj) {
    const auto x = read_tokens(x_obj);
    Output y = output_for(out_obj, x_obj, x.shape[0], x.shape[1]);
    Status status;
    {
      nb::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mutex_);  // the layer's workspace serves one call at a time
      status =
          layer_->forward(x.data, static_cast<int64_t>(x.shape[0]), y.data, ThreadPool::global());
      last_tokens_ = static_cast<int64_t>(x.shape[0]);
    }
    unwrap(status);
    return y.array;
  }

  // The FP64 reference of model/ (weights dequantized by formats/, routing and products in
  // double) for the same x; routing ties follow the kernel path's choice, so the kernel forward
  // runs first. Checkpoint layers only.
  nb::object reference(nb::handle x_obj) {
    if (!checkpoint_layer_.has_value()) {
      raise_bad_input(
          "reference(): only a layer loaded by MoELayer.from_checkpoint has the FP64 "
          "reference (model/)");
    }
    const auto x = read_tokens(x_obj);
    const auto tokens = static_cast<int64_t>(x.shape[0]);
    std::vector<float> y(x.size);
    Result<model::ReferenceOutput> ref = Error{""};
    {
      nb::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mutex_);
      Status forward = layer_->forward(x.data, tokens, y.data(), ThreadPool::global());
      last_tokens_ = tokens;
      ref = forward.ok() ? model::reference_forward(*checkpoint_layer_, x.data, tokens,
                                                    layer_->ids().subspan(0, tokens * top_k()))
                         : Result<model::ReferenceOutput>(forward.error());
    }
    model::ReferenceOutput out = unwrap(std::move(ref));
    if (out.routing_mismatches > 0) {
      raise_error({std::to_string(out.routing_mismatches) +
                       " token(s) routed to another expert set by the kernel path than by the "
                       "reference, beyond the tie tolerance",
                   ErrorKind::kFailed});
    }
    NewArray a = new_array(x.shape, DType::kFloat64, is_torch(x_obj));
    std::copy(out.y.begin(), out.y.end(), static_cast<double*>(a.data));
    return a.array;
  }

  // The experts the last call chose per token (best first) and their weights.
  nb::object ids() const {
    NewArray a =
        new_array({static_cast<size_t>(last_tokens_), static_cast<size_t>(top_k())}, DType::kInt32);
    std::copy_n(layer_->ids().data(), last_tokens_ * top_k(), static_cast<int32_t*>(a.data));
    return a.array;
  }
  nb::object route_weights() const {
    NewArray a = new_array({static_cast<size_t>(last_tokens_), static_cast<size_t>(top_k())},
                           DType::kFloat32);
    std::copy_n(layer_->route_weights().data(), last_tokens_ * top_k(),
                static_cast<float*>(a.data));
    return a.array;
  }

  int64_t hidden() const { return config_.hidden; }
  int num_experts() const { return config_.router.num_experts; }
  int top_k() const { return config_.router.top_k; }
  int64_t max_tokens() const { return max_tokens_; }
  std::optional<int> layer() const {
    return checkpoint_layer_ ? std::optional<int>(checkpoint_layer_->layer()) : std::nullopt;
  }
  std::optional<std::string> expert_scheme() const {
    return checkpoint_layer_ ? std::optional(checkpoint_layer_->expert_scheme()) : std::nullopt;
  }
  std::string describe() const { return layer_->describe(); }
  size_t last_bytes_read() const { return layer_->last_bytes_read(); }

 private:
  MoELayer() = default;

  Status load(const std::string& path, int layer, int64_t max_tokens, dispatch::Precision p,
              std::optional<kernels::Isa> isa) {
    auto dir = checkpoint::CheckpointDir::open(path);
    if (!dir.ok()) return dir.error();
    dir_ = std::make_unique<checkpoint::CheckpointDir>(std::move(dir).value());
    auto info = model::read_moe_model(*dir_);
    if (!info.ok()) return info.error();
    auto loaded = model::MoeCheckpointLayer::load(*dir_, *info, layer);
    if (!loaded.ok()) return loaded.error();
    checkpoint_layer_.emplace(std::move(loaded).value());
    auto created = moe::MoeLayer::create(checkpoint_layer_->config(), checkpoint_layer_->router(),
                                         checkpoint_layer_->experts(), checkpoint_layer_->shared(),
                                         max_tokens, isa, p);
    if (!created.ok()) return created.error();
    layer_.emplace(std::move(created).value());
    config_ = checkpoint_layer_->config();
    return Status::Ok();
  }

  ArrayArg<const float> read_tokens(nb::handle x_obj) const {
    const auto x = typed<float>(read_array(x_obj, "x", DType::kFloat32, 2));
    if (static_cast<int64_t>(x.shape[1]) != config_.hidden ||
        static_cast<int64_t>(x.shape[0]) > max_tokens_ || x.shape[0] == 0) {
      raise_bad_input("argument 'x': shape " + shape_string(x.shape) + ", expected [tokens, " +
                      std::to_string(config_.hidden) + "] with 1 <= tokens <= max_tokens (" +
                      std::to_string(max_tokens_) + ")");
    }
    return x;
  }

  std::unique_ptr<checkpoint::CheckpointDir> dir_;  // the checkpoint layer reads through it
  std::optional<model::MoeCheckpointLayer> checkpoint_layer_;
  std::vector<float> router_weight_, correction_bias_, logit_bias_;  // from_arrays
  std::vector<std::shared_ptr<pack::PackedWeights>> held_;           // from_arrays
  std::optional<moe::MoeLayer> layer_;
  moe::MoeConfig config_;
  int64_t max_tokens_ = 0, last_tokens_ = 0;
  std::mutex mutex_;
};

}  // namespace

void register_kernels(nb::module_& m) {
  m.def(
      "host_isas",
      [] {
        std::vector<std::string> names;
        for (kernels::Isa isa : dispatch::host_isas()) names.emplace_back(kernels::isa_name(isa));
        return names;
      },
      "The ISA levels this host runs, scalar first, best last (FP4MOE_ISA may force one).");

  m.def(
      "moe_layers",
      [](const std::string& path) {
        Result<std::vector<int>> layers = Error{""};
        {
          nb::gil_scoped_release release;
          auto dir = checkpoint::CheckpointDir::open(path);
          if (!dir.ok()) {
            layers = dir.error();
          } else {
            auto info = model::read_moe_model(*dir);
            layers = info.ok() ? Result<std::vector<int>>(info->moe_layers)
                               : Result<std::vector<int>>(info.error());
          }
        }
        return unwrap(std::move(layers));
      },
      arg("path"), "The layers of checkpoint `path` that MoELayer.from_checkpoint can load.");

  nb::class_<Weights>(m, "Weights", "A weight matrix W [n, k] packed once into the kernel layout.")
      .def(nb::init<const std::string&, nb::handle, nb::handle, float>(), arg("format"),
           arg("packed"), arg("scales"), arg("tensor_scale") = 1.0f,
           "format 'nvfp4': packed uint8 [n, k/2] + UE4M3 scales uint8 (n * k/16) + tensor_scale;\n"
           "'mxfp4': packed uint8 [n, k/2] + E8M0 scales uint8 (n * k/32); 'fp8_block': E4M3\n"
           "uint8 [n, k] + scales [ceil(n/128), ceil(k/128)], float32 or uint8 E8M0.")
      .def_prop_ro("format", &Weights::format)
      .def_prop_ro("n", &Weights::n)
      .def_prop_ro("k", &Weights::k)
      .def_prop_ro("nbytes", &Weights::nbytes, "Bytes a product streams (codes and scales).");

  nb::class_<Linear>(m, "Linear", "y = x W^T through the CPU kernel chosen once for W.")
      .def(nb::init<const Weights&, const std::string&, const std::optional<std::string>&>(),
           arg("weights"), arg("precision") = "w4a16", arg("isa") = nb::none(),
           "precision 'w4a16' (exact) or 'w4a8' (FP4 only; bound in kernels/types.h); isa None:\n"
           "the best the host has (or FP4MOE_ISA).")
      .def("__call__", &Linear::call, arg("x"), arg("out") = nb::none(),
           "x float32 [m, k] -> y float32 [m, n]; with out, y is written into it (zero-copy) and\n"
           "returned. numpy arrays and CPU torch tensors alike.")
      .def_prop_ro("kernel", [](const Linear& l) { return std::string(l.plan().kernel_name()); })
      .def_prop_ro("isa",
                   [](const Linear& l) { return std::string(kernels::isa_name(l.plan().isa())); })
      .def_prop_ro("precision",
                   [](const Linear& l) {
                     return std::string(dispatch::precision_name(l.plan().precision()));
                   })
      .def("describe", [](const Linear& l) { return l.plan().describe(); });

  m.def("linear", &linear, arg("format"), arg("precision"), arg("packed"), arg("scales"), arg("x"),
        arg("tensor_scale") = 1.0f, arg("isa") = nb::none(),
        "One product y [m, n] = x [m, k] . W^T: Linear(Weights(format, packed, scales,\n"
        "tensor_scale), precision, isa)(x).");

  nb::class_<MoELayer>(m, "MoELayer",
                       "One MoE layer on the CPU kernels: route, experts, combine, shared experts.")
      .def_static(
          "from_checkpoint", &MoELayer::from_checkpoint, arg("path"), arg("layer"),
          arg("max_tokens") = 64, arg("precision") = "w4a16", arg("isa") = nb::none(),
          "Layer `layer` of the checkpoint directory `path` (the family's tensor names and\n"
          "routing from config.json), for up to max_tokens tokens per call.")
      .def_static("from_arrays", &MoELayer::from_arrays, arg("router_weight"), arg("experts"),
                  arg("top_k"), arg("scoring") = "softmax",
                  arg("weight_rule") = "scores_at_selected", arg("renormalize") = false,
                  arg("routed_scaling_factor") = 1.0f, arg("n_group") = 1, arg("topk_group") = 1,
                  arg("correction_bias") = nb::none(), arg("logit_bias") = nb::none(),
                  arg("shared_experts") = std::vector<std::vector<const Weights*>>{},
                  arg("swiglu_limit") = 0.0f, arg("max_tokens") = 64, arg("precision") = "w4a16",
                  arg("isa") = nb::none(),
                  "router_weight float32 [E, H]; experts: E (gate [I, H], up [I, H], down [H, I])\n"
                  "Weights; SwiGLU (clamped at swiglu_limit when > 0). The Weights stay shared.")
      .def("__call__", &MoELayer::call, arg("x"), arg("out") = nb::none(),
           "x float32 [tokens, hidden] -> y float32 [tokens, hidden] (into out when given).")
      .def("reference", &MoELayer::reference, arg("x"),
           "The FP64 reference output (float64 [tokens, hidden]) of a checkpoint layer for x.")
      .def_prop_ro("ids", &MoELayer::ids, "int32 [tokens, top_k]: the last call's experts.")
      .def_prop_ro("route_weights", &MoELayer::route_weights,
                   "float32 [tokens, top_k]: the last call's routing weights.")
      .def_prop_ro("hidden", &MoELayer::hidden)
      .def_prop_ro("num_experts", &MoELayer::num_experts)
      .def_prop_ro("top_k", &MoELayer::top_k)
      .def_prop_ro("max_tokens", &MoELayer::max_tokens)
      .def_prop_ro("layer", &MoELayer::layer)
      .def_prop_ro("expert_scheme", &MoELayer::expert_scheme)
      .def_prop_ro("last_bytes_read", &MoELayer::last_bytes_read)
      .def("describe", &MoELayer::describe);
}

}  // namespace fp4moe::python
