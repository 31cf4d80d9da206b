// The architecture reader on real config shapes: per-layer MoE lists beside the integer form.
#include "detect/arch.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace fp4moe::detect {
namespace {

std::vector<bool> moe_layers(const nlohmann::json& config) {
  auto arch = read_arch(config);
  EXPECT_TRUE(arch.ok()) << arch.error().message;
  std::vector<bool> out;
  if (arch.ok()) {
    for (const auto& l : arch->layers) out.push_back(l.moe);
  }
  return out;
}

TEST(Arch, MoeLayerFreqAsAnIntegerOrAPerLayerList) {
  nlohmann::json config = {{"model_type", "deepseek_v3"},
                           {"num_hidden_layers", 5},
                           {"n_routed_experts", 8},
                           {"first_k_dense_replace", 1},
                           {"moe_layer_freq", 2}};
  EXPECT_EQ(moe_layers(config), (std::vector<bool>{false, false, true, false, true}));
  // A real config shape that used to abort inspect ("'moe_layer_freq' must be an integer").
  config["moe_layer_freq"] = {0, 1, 1, 0, true};
  EXPECT_EQ(moe_layers(config), (std::vector<bool>{false, true, true, false, true}));
  // A list shorter than the layers leaves the rest dense.
  config["moe_layer_freq"] = {1, 1};
  EXPECT_EQ(moe_layers(config), (std::vector<bool>{true, true, false, false, false}));
}

}  // namespace
}  // namespace fp4moe::detect
