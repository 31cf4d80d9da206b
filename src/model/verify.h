// `fp4moe verify`: each MoE layer of a checkpoint through the CPU kernels (the layer the planner
// selects) and through the reference, on seeded random activations; error statistics per layer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_dir.h"
#include "core/status.h"
#include "kernels/types.h"

namespace fp4moe::model {

// ||y - ref||_2 / ||ref||_2 allowed between the kernel path and the FP64 reference. Both read the
// same decoded weights exactly; the kernels accumulate in FP32 over K <= 8192 (expected relative
// error ~1e-6), so 1e-4 is a 100x margin that a wrong scale, nibble or route still blows through.
inline constexpr double kVerifyRelTolerance = 1e-4;

struct LayerVerification {
  int layer = 0;
  std::string expert_scheme, shared_scheme, kernels;
  int64_t tokens = 0;
  double rel_l2_error = 0, max_abs_error = 0, max_abs_reference = 0;
  int routing_ties = 0, routing_mismatches = 0;
  double kernel_us = 0;  // the kernel path's forward time for these tokens
  bool ok = false;
};

struct VerifyOptions {
  std::vector<int> layers;  // empty: every MoE layer
  int64_t tokens = 4;
  uint32_t seed = 20261129;
  std::optional<kernels::Isa> isa;
};

Result<std::vector<LayerVerification>> verify_checkpoint(const std::filesystem::path& dir,
                                                         const VerifyOptions& options);

}  // namespace fp4moe::model
