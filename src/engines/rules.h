// What SGLang, vLLM and TensorRT-LLM (on GPUs) and llama.cpp and kt-kernel (on the CPU) detect in a
// checkpoint and which kernel they run, by version:
// the rules are data (src/engines/rules/*.json, embedded at build time, each row with its source);
// this is the small evaluator every consumer (plan, doctor, docs/ENGINES.md) reads them through.
#pragma once

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "detect/directory.h"
#include "detect/manifest.h"

namespace fp4moe::engines {

struct Source {
  std::string file, function, version, pr, commit, evidence, also;
  int line = 0;  // 0: not recorded
  std::string cite()
      const;  // "sglang/srt/configs/model_config.py:775 @0.5.23, PR #25820 (ran ...)"
};

// What the engine concludes for one module group.
struct Conclusion {
  std::string quant_config;  // e.g. HybridFp8NvFp4Config
  std::string method;        // quant method class, e.g. ModelOptNvFp4FusedMoEMethod
  std::string reads;         // the format the method reads the bytes as (detect::Scheme names)
  std::string activation;    // detect::Activation names: what the method expects of activations
  std::string fails;         // non-empty: the engine refuses the checkpoint with this error
  std::string not_run;       // non-empty: the engine leaves this module to another (kt-kernel:
                             // everything but the routed experts runs in the GPU engine)
};

struct FlagNote {
  std::string flag, first, last, effect, evidence;
};

struct Rule {
  std::string id, engine, first, last;  // versions; empty = open
  std::string pr, pr_absent;  // the rule applies when this PR is in (pr) or not (pr_absent)
  std::string condition;      // the engine's comparison, in words
  nlohmann::json when;
  std::map<std::string, Conclusion> modules;  // role name or "*"
  std::string wrong_consequence;
  std::vector<std::string> fixes;
  std::vector<FlagNote> ignored_flags;
  Source source;
};

// kCpu: a CPU engine's SIMD kernel (its precision says what the activations are).
enum class Path { kNativeFp4, kW4A16, kFp8, kW8A16, kBf16, kCpu, kUnknown };
std::string_view path_name(Path path);

struct Backend {
  std::string id, engine, method, reads, first, last, flags, kernel, precision;
  std::string builds;  // the method class the engine builds with this kernel, when it differs
  std::vector<std::string> archs, runs_on;  // runs_on empty: runs on every arch in archs
  // Rule ids this kernel row is for (the engine picks the kernel from what that rule's dialect
  // sets, e.g. DeepSeek-V4's nvfp4_moe_meta); empty: every rule that concludes `method`.
  std::vector<std::string> rules;
  Path path = Path::kUnknown;
  std::vector<std::string> fixes;
  Source source;
};

struct Marker {
  std::string id, file, text, first, last, means;
};

struct Pr {
  std::string id, title, merged, commit, first_release;
  std::vector<std::string> markers;
};

struct Engine {
  std::string id, name, package, repo, package_dir_in_checkout, releases_source;
  std::string device = "gpu";  // "gpu", or "cpu": its backends name the architecture "cpu"
  std::vector<std::string> releases, ran;
  std::vector<Pr> prs;
  std::vector<Marker> markers;
  std::vector<Rule> rules;
  std::vector<Backend> backends;
  const std::string& newest() const { return releases.back(); }
  const Pr* find_pr(std::string_view id) const;
  const Marker* find_marker(std::string_view id) const;
};

// SGLang, vLLM, TensorRT-LLM, in that order (the format-level fallback is not among them).
const std::vector<Engine>& all_engines();
// llama.cpp and kt-kernel: the engines `plan --target cpu` shows beside fp4moe's own kernels.
const std::vector<Engine>& cpu_engines();
const Engine& format_fallback();
const Engine* find_engine(std::string_view id);  // GPU or CPU engine
const Rule* find_rule(std::string_view id);      // in any engine, the fallback included
// Parses rules JSON; the embedded files go through it once. Errors name the file and the key.
Result<Engine> parse_engine(std::string_view text, std::string_view label);

// PEP 440 enough for the release lists: numeric components, then .postN; "main" is newest.
int compare_versions(std::string_view a, std::string_view b);
bool version_in(std::string_view version, std::string_view first, std::string_view last);

// One engine at one version, with the PRs it contains: from the version (plan) or from the
// engine's own source (doctor, which sees backports).
struct EngineAt {
  const Engine* engine = nullptr;
  std::string version;
  std::set<std::string> prs;
  std::string label() const;  // "SGLang 0.5.23"
};
EngineAt at_version(const Engine& engine, std::string_view version);
// "sglang", "sglang@0.5.14", "vllm@0.22.0"; an unknown release is bad input.
Result<EngineAt> parse_engine_spec(std::string_view spec);

// What a rule condition reads: config.json and hf_quant_config.json (as "config.*",
// "hf_quant_config.*"), the routed-expert dtype the engines probe ("tensor.routed_expert_dtype")
// and the module group at hand ("module.scheme", "module.role").
struct Facts {
  nlohmann::json root;  // {"config": ..., "hf_quant_config": ..., "tensor": {...}}
};
Facts make_facts(const detect::InspectedDirectory& inspected, const std::filesystem::path& dir);

// kNotRun: the engine does not run this module itself (Conclusion::not_run says who does).
enum class Outcome { kOk, kWrong, kFails, kUnknown, kNotRun };
std::string_view outcome_name(Outcome outcome);

struct Verdict {
  const Rule* rule = nullptr;  // nullptr: no rule covers this module group
  Conclusion conclusion;
  const Backend* backend = nullptr;          // the default (no flags) backend for the arch
  std::vector<const Backend*> alternatives;  // flag-selected backends for the arch
  Outcome outcome = Outcome::kUnknown;
  std::string why;                 // one line: what disagrees, or why unknown
  std::vector<std::string> fixes;  // launch flags, versions, PRs, convert commands
};

// `arch` is "sm_80" ... "sm_121", or "cpu" for a CPU engine; empty = none chosen (no backend
// looked up).
Verdict evaluate(const EngineAt& engine, const Facts& facts, const detect::ModuleGroup& group,
                 std::string_view arch);

// docs/ENGINES.md, generated from the rules (`fp4moe plan --engines-md`).
std::string contract_markdown();

}  // namespace fp4moe::engines
