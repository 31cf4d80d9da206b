// `fp4moe verify DIR [--layers L,...]`: every MoE layer through the CPU kernels and the reference.
#include <fmt/core.h>

#include <memory>

#include "cli/cli_common.h"
#include "cli/command.h"
#include "detect/manifest.h"
#include "dispatch/cpu_features.h"
#include "model/verify.h"

namespace fp4moe::cli {
namespace {

struct VerifyArgs {
  CheckpointArg checkpoint;
  std::string isa;
  std::vector<int> layers;
  int64_t tokens = 4;
  uint32_t seed = 20261129;
  bool json = false;
};

int run_verify(const VerifyArgs& args) {
  model::VerifyOptions options;
  options.layers = args.layers;
  options.tokens = args.tokens;
  options.seed = args.seed;
  if (!args.isa.empty()) {
    auto isa = dispatch::parse_isa(args.isa);
    if (!isa.ok()) return report_error("verify", isa.error(), args.json);
    options.isa = *isa;
  }
  auto resolved = resolve_checkpoint_arg(args.checkpoint);
  if (!resolved.ok()) return report_error("verify", resolved.error(), args.json);
  auto results = model::verify_checkpoint(resolved->path, options);
  if (!results.ok()) return report_error("verify", results.error(), args.json);
  bool all_ok = true;
  nlohmann::json j = nlohmann::json::array();
  if (!args.json) {
    fmt::print("verify {}: {} tokens per layer, seed {}, tolerance rel L2 <= {:g}\n",
               resolved->path.string(), args.tokens, args.seed, model::kVerifyRelTolerance);
    fmt::print("{:>5}  {:<8} {:<10} {:>12} {:>12} {:>12} {:>6} {:>10}  {}\n", "layer", "experts",
               "shared", "rel L2 err", "max abs err", "max |ref|", "ties", "kernel us", "status");
  }
  for (const auto& v : *results) {
    all_ok = all_ok && v.ok;
    if (args.json) {
      j.push_back({{"layer", v.layer},
                   {"expert_scheme", v.expert_scheme},
                   {"shared_scheme", v.shared_scheme},
                   {"tokens", v.tokens},
                   {"rel_l2_error", v.rel_l2_error},
                   {"max_abs_error", v.max_abs_error},
                   {"max_abs_reference", v.max_abs_reference},
                   {"routing_ties", v.routing_ties},
                   {"routing_mismatches", v.routing_mismatches},
                   {"kernel_us", v.kernel_us},
                   {"kernels", v.kernels},
                   {"ok", v.ok}});
    } else {
      fmt::print("{:>5}  {:<8} {:<10} {:>12.3e} {:>12.3e} {:>12.3e} {:>6} {:>10.0f}  {}\n", v.layer,
                 v.expert_scheme, v.shared_scheme, v.rel_l2_error, v.max_abs_error,
                 v.max_abs_reference, v.routing_ties, v.kernel_us,
                 v.ok ? "ok" : (v.routing_mismatches ? "ROUTING MISMATCH" : "EXCEEDS TOLERANCE"));
    }
  }
  if (args.json) {
    fmt::print("{}\n", nlohmann::json{{"schema_version", detect::kJsonSchemaVersion},
                                      {"source", source_json(args.checkpoint, *resolved)},
                                      {"tolerance_rel_l2", model::kVerifyRelTolerance},
                                      {"layers", j},
                                      {"ok", all_ok}}
                           .dump(2));
  } else if (!results->empty()) {
    fmt::print("kernels: {}\n", results->front().kernels);
  }
  return all_ok ? kExitOk : kExitFailed;
}

const CommandRegistrar kVerify{
    {"verify",
     "Run each MoE layer through the CPU kernels and the reference; exit 1 past tolerance",
     [](CLI::App& app) {
       auto args = std::make_shared<VerifyArgs>();
       add_checkpoint_arg(app, args->checkpoint, "DIR", "checkpoint");
       app.add_option("--layers", args->layers, "layer indices (default: every MoE layer)")
           ->delimiter(',');
       app.add_option("--tokens", args->tokens, "tokens per layer")->check(CLI::Range(1, 256));
       app.add_option("--seed", args->seed, "seed of the random activations");
       app.add_option("--isa", args->isa,
                      "force an ISA (scalar, avx2, avx512, avx512_vnni, avx512_bf16, amx_int8)");
       app.add_flag("--json", args->json, "print the results as JSON");
       return [args] { return run_verify(*args); };
     },
     40}};

}  // namespace
}  // namespace fp4moe::cli
