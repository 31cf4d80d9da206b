// `fp4moe check`: are a checkpoint's numbers right? Reads every scale tensor of every quantized
// module in full, a seeded sample of the weights (or all of them), and the configs' declarations,
// and reports findings with stable ids (check/finding_table.cc says what each means, its severity,
// its consequence in an engine and how to fix it).
//
// Streaming and bounded: modules are checked one at a time per thread (both cores) straight from
// the memory-mapped shards; what a thread holds is one module's dequantized sample rows and its
// scale statistics, so memory does not grow with the checkpoint (see kSampleRows and the bound
// printed by `check --json`). Bad input inside the checkpoint (an unreadable or truncated shard, a
// shard missing from the index, scale shapes that do not fit) is a finding, and the rest is still
// checked; only a directory that is not a checkpoint at all is an error.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "detect/manifest.h"

namespace fp4moe::check {

using detect::Severity;

// One row of the finding table: the stable id and what a user needs to know about it.
struct FindingInfo {
  std::string_view id;
  Severity severity;
  std::string_view what;         // what was found, in one sentence
  std::string_view consequence;  // what an engine does with such a checkpoint
  std::string_view fix;          // how to repair it
  std::string_view judged;       // how `check` decides it, thresholds included
};

// Every finding id `check` can report, in report order.
const std::vector<FindingInfo>& finding_table();
const FindingInfo* find_finding(std::string_view id);  // nullptr for an unknown id
// The table as the Markdown reference of docs/CHECK.md (`fp4moe check --findings-md`).
std::string findings_markdown();

// One place a finding was seen: the tensor, a block index (row and block along K) when it is about
// blocks, and the evidence in words. Row and block index the named tensor: for a scale tensor its
// grid (leading dimensions flattened, so row e * N + n of a fused [E, N, G] grid, and one row per
// 128 weight rows of an FP8 block grid); for a weight, the weight row and the block along K.
// Module-level findings name the module's weight tensor; exclude_matches_nothing names the
// pattern and shard findings the shard file.
struct Example {
  std::string tensor;
  int64_t row = -1;    // -1: the whole tensor
  int64_t block = -1;  // -1: the whole row / tensor
  std::string detail;
};

struct CheckFinding {
  std::string id;
  Severity severity = Severity::kInfo;
  int64_t count = 0;              // occurrences (tensors, blocks, pairs, entries: see detail)
  std::string summary;            // one line with the counts and the worst case
  std::vector<Example> examples;  // the worst few, by tensor name and block index
};

struct CheckOptions {
  bool full = false;       // read every weight byte, not a sample
  uint64_t seed = 0x5eed;  // the weight sample: the same seed picks the same rows
  int sample_rows = 16;    // rows sampled per weight tensor (all when full)
  int threads = 0;         // 0: the process-wide pool
  std::function<void(uint64_t bytes_done, uint64_t bytes_total)> on_progress;
  // Set (e.g. by SIGINT) to stop between groups of modules: the error is ErrorKind::kInterrupted.
  const std::atomic<bool>* cancel = nullptr;
};

struct CheckReport {
  std::filesystem::path path;
  std::vector<CheckFinding> findings;  // in finding_table() order
  int64_t modules_checked = 0;         // quantized modules whose scales were read
  int64_t tensors_never_written = 0;   // tensors that are file holes (sparse checkpoints)
  uint64_t scale_bytes_read = 0;
  uint64_t weight_bytes_read = 0;
  uint64_t bytes_total = 0;         // all tensor bytes of the checkpoint
  uint64_t memory_bound_bytes = 0;  // the most a thread holds at once (sample buffers)
  double seconds = 0.0;
  bool sampled = true;
  uint64_t seed = 0;

  bool has_error() const;
  int64_t count(std::string_view id) const;  // 0 when the finding is absent
};

Result<CheckReport> check_checkpoint(const std::filesystem::path& dir, const CheckOptions& options);

// The JSON contract of `fp4moe check --json` and the text report (verdict first, then findings by
// severity).
nlohmann::json to_json(const CheckReport& report);
std::string to_text(const CheckReport& report);

}  // namespace fp4moe::check
