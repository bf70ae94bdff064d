// SPDX-License-Identifier: Apache-2.0
#pragma once
// The shape of a Gpt (nn/gpt.hpp) and its per-block costs, without the layers: what the model, its
// pipeline stage balancing and the planner (plan/) share. C width, T context, V vocabulary.
//   block: 12 C^2 + 12 C parameters (the key projection has no bias); forward 24 C^2 + 2 T C FLOPs
//   per token (the four matmuls'
//          multiply-adds, attention's scores and weighted sum, each counted once; x2 for FLOPs)
//   first stage (head): (V + T) C parameters (token and position embeddings), no FLOPs counted
//   last stage (tail): 2 C parameters (final LayerNorm), 2 V C FLOPs per token (LM head)

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pmt/parallel/stages.hpp"

namespace pmt::nn {

/// \brief The shape of a Gpt and its initialisation seed.
struct GptConfig {
  std::size_t vocab = 256, context = 64, layers = 2, width = 64, heads = 4;
  std::uint64_t seed = 1234;
};

/// \brief The per-block costs (parameters, forward FLOPs per token), for stage balancing.
inline std::vector<parallel::LayerCost> gpt_block_costs(const GptConfig& c) {
  const double C = static_cast<double>(c.width), Tn = static_cast<double>(c.context);
  return std::vector<parallel::LayerCost>(c.layers, {12 * C * C + 12 * C, 24 * C * C + 2 * Tn * C});
}
/// \brief The first stage's extra cost: the token and position embeddings.
inline parallel::LayerCost gpt_head_cost(const GptConfig& c) {
  return {static_cast<double>((c.vocab + c.context) * c.width), 0.0};
}
/// \brief The last stage's extra cost: the final LayerNorm and the LM head.
inline parallel::LayerCost gpt_tail_cost(const GptConfig& c) {
  return {2.0 * static_cast<double>(c.width), 2.0 * static_cast<double>(c.vocab * c.width)};
}
/// \brief Blocks on `stages` stages balanced by forward FLOPs (the LM head counts on the last).
/// \throws pmt::ConfigError when there are fewer layers than stages.
inline parallel::StagePlan gpt_balanced_plan(const GptConfig& c, int stages) {
  return parallel::balanced_stages(gpt_block_costs(c), stages, gpt_head_cost(c), gpt_tail_cost(c));
}

}  // namespace pmt::nn
