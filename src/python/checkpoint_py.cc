// Checkpoints from Python: fp4moe.inspect (detect/), fp4moe.plan (plan/), fp4moe.check (check/)
// and fp4moe.convert (convert/). The objects carry the fields and the vocabulary of the JSON
// contracts (`fp4moe inspect|plan|check --json`), and to_json() gives that JSON itself. check and
// convert release the GIL; Ctrl-C stops them cleanly (convert leaves the destination as it was).
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <filesystem>
#include <string>
#include <vector>

#include "check/check.h"
#include "checkpoint/hf_cache.h"
#include "convert/convert.h"
#include "core/thread_pool.h"
#include "detect/directory.h"
#include "detect/manifest.h"
#include "dispatch/measure.h"
#include "engines/rules.h"
#include "plan/plan.h"
#include "python/py_util.h"

namespace fp4moe::python {

namespace {

using nb::arg;

// What fp4moe.inspect returns: the manifest and the configs it was read from (plan needs them).
struct Manifest {
  detect::InspectedDirectory inspected;
  std::string path;
};

std::string str(std::string_view s) { return std::string(s); }

// A directory, or a Hugging Face repo id read from the local hub cache (checkpoint/hf_cache.h).
Manifest inspect(const std::string& path_or_repo_id, const std::optional<std::string>& revision) {
  Result<checkpoint::ResolvedCheckpoint> resolved = Error{""};
  Result<detect::InspectedDirectory> inspected = Error{""};
  {
    nb::gil_scoped_release release;
    resolved = checkpoint::resolve_checkpoint(path_or_repo_id, revision.value_or(""));
    if (resolved.ok()) inspected = detect::detect_directory(resolved->path);
  }
  const std::string path = unwrap(std::move(resolved)).path.string();
  return {unwrap(std::move(inspected)), path};
}

plan::Plan make_plan(const Manifest& manifest, const std::string& target,
                     const std::optional<std::string>& engine,
                     std::optional<double> cpu_bandwidth_gbps) {
  const plan::Target t = unwrap(plan::parse_target(target));
  plan::PlanOptions options;
  if (engine.has_value()) options.engine = unwrap(engines::parse_engine_spec(*engine));
  nb::gil_scoped_release release;
  if (t == plan::Target::kCpu) {
    // As `fp4moe plan --target cpu`: the roofline divides by the bandwidth measured now.
    options.cpu_bandwidth_gbps =
        cpu_bandwidth_gbps.has_value()
            ? *cpu_bandwidth_gbps
            : dispatch::measure_read_bandwidth_gbps(ThreadPool::global(), size_t{512} << 20);
  }
  return plan::make_plan(manifest.inspected.manifest, manifest.inspected.config, t, options);
}

check::CheckReport run_check(const std::string& path, bool full, uint64_t seed, int sample_rows,
                             const std::optional<nb::callable>& progress) {
  Interruptible interruptible;
  check::CheckOptions options;
  options.full = full;
  options.seed = seed;
  options.sample_rows = sample_rows;
  options.cancel = interruptible.cancel_flag();
  if (progress.has_value()) {
    options.on_progress = [&](uint64_t done, uint64_t total) {
      interruptible.call_python([&] { (*progress)(done, total); });
    };
  }
  Result<check::CheckReport> report = Error{""};
  interruptible.run([&] { report = check::check_checkpoint(path, options); });
  return unwrap(std::move(report));
}

convert::ConvertSummary run_convert(const std::string& source, const std::string& destination,
                                    const std::string& to,
                                    const std::optional<std::vector<std::string>>& modules,
                                    bool force, const std::vector<std::string>& allow_findings,
                                    uint64_t max_shard_bytes,
                                    const std::optional<nb::callable>& progress,
                                    const std::string& dialect,
                                    const std::optional<std::string>& activation_amax) {
  Interruptible interruptible;
  convert::ConvertOptions options;
  if (to == "nvfp4") {
    options.to = convert::TargetFormat::kNvfp4;
  } else if (to == "mxfp4") {
    options.to = convert::TargetFormat::kMxfp4;
  } else {
    raise_bad_input("argument 'to': '" + to + "', expected 'nvfp4' or 'mxfp4'");
  }
  if (dialect == "nvfp4") {
    options.dialect = convert::Nvfp4Dialect::kW4A4;
  } else if (dialect == "w4a16_nvfp4") {
    options.dialect = convert::Nvfp4Dialect::kW4A16;
  } else {
    raise_bad_input("argument 'dialect': '" + dialect + "', expected 'nvfp4' or 'w4a16_nvfp4'");
  }
  if (activation_amax.has_value()) {
    options.activation_amax = unwrap(convert::read_activation_amax(*activation_amax));
  }
  if (modules.has_value()) options.module_patterns = *modules;
  options.force = force;
  options.allow_findings = allow_findings;
  options.max_shard_bytes = max_shard_bytes;
  options.cancel = interruptible.cancel_flag();
  if (progress.has_value()) {
    options.on_progress = [&](const convert::ConvertProgress& p) {
      interruptible.call_python(
          [&] { (*progress)(p.bytes_done, p.bytes_total, p.tensors_done, p.tensors_total); });
    };
  }
  Result<convert::ConvertSummary> summary = Error{""};
  interruptible.run([&] { summary = convert::convert_checkpoint(source, destination, options); });
  return unwrap(std::move(summary));
}

nb::dict transcode_report(const formats::TranscodeReport& r) {
  nb::dict d;
  d["blocks_total"] = r.blocks_total;
  d["blocks_lossless"] = r.blocks_lossless;
  d["blocks_requantized"] = r.blocks_requantized;
  d["blocks_all_zero"] = r.blocks_all_zero;
  d["max_abs_error"] = r.max_abs_error;
  d["max_rel_error"] = r.max_rel_error;
  d["tensor_scale"] = r.tensor_scale;
  return d;
}

}  // namespace

void register_checkpoint(nb::module_& m) {
  using detect::Finding;
  using detect::ModuleGroup;

  nb::class_<Finding>(m, "Finding", "A finding of inspect or plan (inspect --json 'findings').")
      .def_prop_ro("severity", [](const Finding& f) { return str(detect::to_string(f.severity)); })
      .def_ro("code", &Finding::code)
      .def_ro("message", &Finding::message)
      .def("__repr__", [](const Finding& f) {
        return "Finding(" + str(detect::to_string(f.severity)) + ", " + f.code + ")";
      });

  nb::class_<ModuleGroup>(m, "ModuleGroup",
                          "One module group: one role, one name pattern, one scheme.")
      .def_prop_ro("role", [](const ModuleGroup& g) { return str(detect::to_string(g.role)); })
      .def_ro("name", &ModuleGroup::name)
      .def_prop_ro("scheme",
                   [](const ModuleGroup& g) { return str(detect::to_string(g.spec.scheme)); })
      .def_prop_ro("activation",
                   [](const ModuleGroup& g) { return str(detect::to_string(g.spec.activation)); })
      .def_prop_ro("group_size", [](const ModuleGroup& g) { return g.spec.group_size; })
      .def_prop_ro("scale_type",
                   [](const ModuleGroup& g) { return str(detect::to_string(g.spec.scale)); })
      .def_prop_ro("config_scheme",
                   [](const ModuleGroup& g) { return str(detect::to_string(g.config_scheme)); })
      .def_prop_ro("tensor_scheme",
                   [](const ModuleGroup& g) -> std::optional<std::string> {
                     if (!g.tensor_scheme.has_value()) return std::nullopt;
                     return str(detect::to_string(*g.tensor_scheme));
                   })
      .def_ro("config_source", &ModuleGroup::config_source)
      .def_ro("tensor_source", &ModuleGroup::tensor_source)
      .def_ro("module_count", &ModuleGroup::module_count)
      .def_ro("tensor_count", &ModuleGroup::tensor_count)
      .def_ro("bytes", &ModuleGroup::bytes)
      .def("__repr__", [](const ModuleGroup& g) {
        return "ModuleGroup(" + str(detect::to_string(g.role)) + ", '" + g.name + "', " +
               str(detect::to_string(g.spec.scheme)) + ")";
      });

  nb::class_<Manifest>(m, "Manifest",
                       "How every module group of a checkpoint is quantized (fp4moe inspect).")
      .def_prop_ro("path", [](const Manifest& x) { return x.path; })
      .def_prop_ro("dialect", [](const Manifest& x) { return x.inspected.manifest.dialect; })
      .def_prop_ro("tensors_checked",
                   [](const Manifest& x) { return x.inspected.manifest.tensors_checked; })
      .def_prop_ro(
          "summary",
          [](const Manifest& x) {
            return json_to_python(detect::to_json(x.inspected.manifest)["summary"].dump());
          },
          "Per role (routed_experts, shared_experts, attention, dense_mlp, lm_head,\n"
          "mtp_experts, kv_cache): the scheme its weights are stored in.")
      .def_prop_ro("modules", [](const Manifest& x) { return x.inspected.manifest.modules; })
      .def_prop_ro("findings", [](const Manifest& x) { return x.inspected.manifest.findings; })
      .def_prop_ro(
          "config", [](const Manifest& x) { return json_to_python(x.inspected.config.dump()); },
          "config.json as read (None when absent).")
      .def(
          "has_finding",
          [](const Manifest& x, const std::string& code) {
            return x.inspected.manifest.has_finding(code);
          },
          arg("code"))
      .def(
          "to_json",
          [](const Manifest& x, int indent) {
            return detect::to_json(x.inspected.manifest).dump(indent);
          },
          arg("indent") = 2, "The JSON contract of `fp4moe inspect --json`.")
      .def(
          "to_table", [](const Manifest& x) { return detect::to_table(x.inspected.manifest); },
          "The table of `fp4moe inspect`.")
      .def("__repr__", [](const Manifest& x) {
        return "Manifest('" + x.path + "', " + x.inspected.manifest.dialect + ", " +
               std::to_string(x.inspected.manifest.modules.size()) + " module groups)";
      });

  m.def("inspect", &inspect, arg("path_or_repo_id"), arg("revision") = nb::none(),
        "Detects how a checkpoint is quantized: configs and safetensors headers (configs only\n"
        "when it has no weights). A directory, or a Hugging Face repo id (org/name) read from the\n"
        "local hub cache at `revision` (None: main).");

  nb::class_<plan::ModulePlan>(m, "ModulePlan", "The kernel and hardware path of one module group.")
      .def_ro("group", &plan::ModulePlan::group)
      .def_prop_ro("role",
                   [](const plan::ModulePlan& p) { return str(detect::to_string(p.group.role)); })
      .def_prop_ro("name", [](const plan::ModulePlan& p) { return p.group.name; })
      .def_prop_ro(
          "scheme",
          [](const plan::ModulePlan& p) { return str(detect::to_string(p.group.spec.scheme)); })
      .def_ro("kernel", &plan::ModulePlan::kernel)
      .def_prop_ro("path", [](const plan::ModulePlan& p) { return str(plan::path_name(p.path)); })
      .def_ro("bytes_per_token", &plan::ModulePlan::bytes_per_token)
      .def_ro("time_us", &plan::ModulePlan::time_us)
      .def_ro("note", &plan::ModulePlan::note);

  nb::class_<plan::Plan>(m, "Plan", "fp4moe plan: kernels, hardware paths and a batch-1 roofline.")
      .def_prop_ro("target", [](const plan::Plan& p) { return str(plan::target_name(p.target)); })
      .def_prop_ro(
          "device",
          [](const plan::Plan& p) { return json_to_python(plan::to_json(p)["device"].dump()); })
      .def_ro("modules", &plan::Plan::modules)
      .def_ro("findings", &plan::Plan::findings)
      .def_ro("bytes_per_token", &plan::Plan::bytes_per_token)
      .def_prop_ro("time_us_per_token", [](const plan::Plan& p) { return p.time_us; })
      .def_prop_ro("has_error", &plan::Plan::has_error)
      .def(
          "to_json", [](const plan::Plan& p, int indent) { return plan::to_json(p).dump(indent); },
          arg("indent") = 2, "The JSON contract of `fp4moe plan --json`.")
      .def("to_table", [](const plan::Plan& p) { return plan::to_table(p); });

  m.def("plan", &make_plan, arg("manifest"), arg("target") = "cpu", arg("engine") = nb::none(),
        arg("cpu_bandwidth_gbps") = nb::none(),
        "The plan of `manifest` on `target` (cpu, or an sm_XX as `fp4moe plan --target`) as the\n"
        "engine `engine` runs it ('sglang[@VERSION]', 'vllm[@VERSION]', 'trtllm'; default: the\n"
        "library's); for cpu the memory bandwidth is measured now unless given.");

  nb::class_<check::Example>(m, "CheckExample", "One place a check finding was seen.")
      .def_ro("tensor", &check::Example::tensor)
      .def_ro("row", &check::Example::row)
      .def_ro("block", &check::Example::block)
      .def_ro("detail", &check::Example::detail);

  nb::class_<check::CheckFinding>(m, "CheckFinding", "A finding of fp4moe check (docs/CHECK.md).")
      .def_ro("id", &check::CheckFinding::id)
      .def_prop_ro("severity",
                   [](const check::CheckFinding& f) { return str(detect::to_string(f.severity)); })
      .def_ro("count", &check::CheckFinding::count)
      .def_ro("summary", &check::CheckFinding::summary)
      .def_ro("examples", &check::CheckFinding::examples)
      .def("__repr__", [](const check::CheckFinding& f) {
        return "CheckFinding(" + f.id + ", " + str(detect::to_string(f.severity)) + ", " +
               std::to_string(f.count) + ")";
      });

  nb::class_<check::CheckReport>(m, "CheckReport",
                                 "fp4moe check: are the checkpoint's numbers right.")
      .def_prop_ro("path", [](const check::CheckReport& r) { return r.path.string(); })
      .def_ro("findings", &check::CheckReport::findings)
      .def_ro("modules_checked", &check::CheckReport::modules_checked)
      .def_ro("tensors_never_written", &check::CheckReport::tensors_never_written)
      .def_ro("scale_bytes_read", &check::CheckReport::scale_bytes_read)
      .def_ro("weight_bytes_read", &check::CheckReport::weight_bytes_read)
      .def_ro("bytes_total", &check::CheckReport::bytes_total)
      .def_ro("seconds", &check::CheckReport::seconds)
      .def_ro("sampled", &check::CheckReport::sampled)
      .def_ro("seed", &check::CheckReport::seed)
      .def_prop_ro("has_error", &check::CheckReport::has_error)
      .def("count", &check::CheckReport::count, arg("id"), "Occurrences of finding `id` (0: none).")
      .def(
          "to_json",
          [](const check::CheckReport& r, int indent) { return check::to_json(r).dump(indent); },
          arg("indent") = 2, "The JSON contract of `fp4moe check --json`.")
      .def("to_text", [](const check::CheckReport& r) { return check::to_text(r); });

  m.def(
      "check", &run_check, arg("path"), arg("full") = false, arg("seed") = uint64_t{0x5eed},
      arg("sample_rows") = 16, arg("progress") = nb::none(),
      "Checks the checkpoint's numbers (every scale, a seeded sample of weight rows, or all with\n"
      "full). progress(bytes_done, bytes_total) is called as it goes; Ctrl-C stops it.");

  nb::class_<convert::ConvertSummary>(m, "ConvertSummary", "What fp4moe.convert did.")
      .def_prop_ro(
          "transcode", [](const convert::ConvertSummary& s) { return transcode_report(s.report); },
          "MXFP4 -> NVFP4 block counts and the worst error of requantized blocks.")
      .def_ro("modules_converted", &convert::ConvertSummary::modules_converted)
      .def_ro("modules_transcoded", &convert::ConvertSummary::modules_transcoded)
      .def_ro("modules_quantized", &convert::ConvertSummary::modules_quantized)
      .def_ro("modules_relabeled", &convert::ConvertSummary::modules_relabeled)
      .def_ro("max_quantize_rel_error", &convert::ConvertSummary::max_quantize_rel_error)
      .def_ro("tensors_copied", &convert::ConvertSummary::tensors_copied)
      .def_ro("bytes_read", &convert::ConvertSummary::bytes_read)
      .def_ro("bytes_written", &convert::ConvertSummary::bytes_written)
      .def_ro("seconds", &convert::ConvertSummary::seconds)
      .def_prop_ro("dialect",
                   [](const convert::ConvertSummary& s) {
                     return std::string(convert::dialect_name(s.dialect));
                   })
      .def_ro("input_scales_calibrated", &convert::ConvertSummary::input_scales_calibrated)
      .def_ro("input_scales_default", &convert::ConvertSummary::input_scales_default)
      .def_prop_ro("config",
                   [](const convert::ConvertSummary& s) { return json_to_python(s.config.dump()); })
      .def_prop_ro("hf_quant_config", [](const convert::ConvertSummary& s) {
        return json_to_python(s.hf_quant_config.dump());
      });

  m.def("convert", &run_convert, arg("source"), arg("destination"), arg("to") = "nvfp4",
        arg("modules") = nb::none(), arg("force") = false,
        arg("allow_findings") = std::vector<std::string>{},
        arg("max_shard_bytes") = uint64_t{5'000'000'000}, arg("progress") = nb::none(),
        arg("dialect") = "nvfp4", arg("activation_amax") = nb::none(),
        "Converts the modules matching the globs `modules` (default: the routed experts) of\n"
        "`source` to `to` ('nvfp4' losslessly from MXFP4, or by ModelOpt's recipe; 'mxfp4') into\n"
        "`destination`. progress(bytes_done, bytes_total, tensors_done, tensors_total) after each\n"
        "source tensor. Ctrl-C (KeyboardInterrupt) or an exception from progress stops it and\n"
        "leaves the destination as it was. dialect: 'nvfp4' (ModelOpt NVFP4 with input_scale,\n"
        "what the DeepSeek-V4 paths of SGLang >= 0.5.14 and vLLM >= 0.22 route to NVFP4) or\n"
        "'w4a16_nvfp4' (weight-only); activation_amax: the path of a calibration file\n"
        "(docs/CONVERT.md) for input_scale, else a default that check reports as\n"
        "input_scale_default.");
}

}  // namespace fp4moe::python
