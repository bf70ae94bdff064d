// SPDX-License-Identifier: Apache-2.0
#pragma once
// StagePlan: which consecutive layers (blocks) each pipeline stage holds. Built either from
// explicit per-stage counts or balanced by a cost estimate; both are checked to cover every layer
// exactly once with at least one layer per stage. A plan says whether it is even and describes
// itself (layers, parameters and FLOPs per stage) so an uneven split is reported, never silent.
//   explicit_stages(5, {3, 2})             -> stage 0: layers [0, 3), stage 1: [3, 5)
//   balanced_stages(costs, 2, head, tail)  -> minimises the largest stage cost (first stage adds
//                                             `head`, e.g. the embeddings; the last adds `tail`,
//                                             e.g. the final norm and LM head)

#include "pmt/core/error.hpp"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

namespace pmt::parallel {

/// \brief The cost of one layer (or of the extra work on the first or last stage).
struct LayerCost {
  double params = 0;  ///< parameters
  double flops  = 0;  ///< forward FLOPs per token (the balance uses these)
};

/// \brief Stage s holds layers [begin(s), end(s)).
class StagePlan {
 public:
  StagePlan() = default;
  /// \brief From the boundaries b (b[0] = 0, b[p] = layers, increasing).
  /// \throws pmt::ConfigError unless the stages cover every layer exactly once, each non-empty.
  StagePlan(std::vector<std::size_t> bounds, std::size_t layers) : m_bounds(std::move(bounds)) {
    const char* op = "pmt::parallel::StagePlan";
    pmt::detail::require<ConfigError>(m_bounds.size() >= 2, op,
                                      [&] { return std::string("a plan needs at least one stage"); });
    pmt::detail::require<ConfigError>(m_bounds.front() == 0 && m_bounds.back() == layers, op, [&] {
      return pmt::detail::str("the stages cover layers [", m_bounds.front(), ", ", m_bounds.back(),
                              ") but the model has ", layers, "; every layer must belong to exactly one stage");
    });
    for (std::size_t s = 0; s + 1 < m_bounds.size(); ++s)
      pmt::detail::require<ConfigError>(m_bounds[s] < m_bounds[s + 1], op, [&] {
        return pmt::detail::str("stage ", s, " would hold layers [", m_bounds[s], ", ", m_bounds[s + 1],
                                "): every stage needs at least one layer, in order (", layers, " layers on ",
                                m_bounds.size() - 1, " stages)");
      });
  }

  int stages() const noexcept { return static_cast<int>(m_bounds.size()) - 1; }
  std::size_t layers() const noexcept { return m_bounds.empty() ? 0 : m_bounds.back(); }
  std::size_t begin(int s) const { return m_bounds.at(static_cast<std::size_t>(s)); }
  std::size_t end(int s) const { return m_bounds.at(static_cast<std::size_t>(s) + 1); }
  std::size_t count(int s) const { return end(s) - begin(s); }
  bool empty() const noexcept { return m_bounds.empty(); }
  /// \brief True when every stage holds the same number of layers.
  bool even() const {
    for (int s = 1; s < stages(); ++s)
      if (count(s) != count(0)) return false;
    return true;
  }
  /// \brief "layers [0,3) [3,5) (uneven)".
  std::string describe() const {
    std::string out = "layers";
    for (int s = 0; s < stages(); ++s) out += pmt::detail::str(" [", begin(s), ",", end(s), ")");
    return out + (even() ? "" : " (uneven)");
  }
  /// \brief Per stage: "stage s: layers [a,b), P params, F flop/token", one line each.
  std::string describe(const std::vector<LayerCost>& costs, const LayerCost& head, const LayerCost& tail) const {
    std::string out;
    for (int s = 0; s < stages(); ++s) {
      LayerCost c = cost(s, costs, head, tail);
      out += pmt::detail::str(s ? "\n" : "", "stage ", s, ": layers [", begin(s), ",", end(s), "), ", c.params,
                              " params, ", c.flops, " flop/token");
    }
    return out;
  }
  /// \brief The cost of stage s.
  LayerCost cost(int s, const std::vector<LayerCost>& costs, const LayerCost& head, const LayerCost& tail) const {
    LayerCost c;
    for (std::size_t l = begin(s); l < end(s); ++l) c.params += costs.at(l).params, c.flops += costs.at(l).flops;
    if (s == 0) c.params += head.params, c.flops += head.flops;
    if (s + 1 == stages()) c.params += tail.params, c.flops += tail.flops;
    return c;
  }
  const std::vector<std::size_t>& bounds() const noexcept { return m_bounds; }

 private:
  std::vector<std::size_t> m_bounds;
};

/// \brief Stage s holds counts[s] consecutive layers.
/// \throws pmt::ConfigError when the counts do not sum to `layers` or one is 0.
inline StagePlan explicit_stages(std::size_t layers, const std::vector<std::size_t>& counts) {
  std::vector<std::size_t> b{0};
  for (std::size_t c : counts) b.push_back(b.back() + c);
  pmt::detail::require<ConfigError>(!counts.empty() && b.back() == layers, "pmt::parallel::explicit_stages", [&] {
    std::string list;
    for (std::size_t c : counts) list += (list.empty() ? "" : " + ") + std::to_string(c);
    return pmt::detail::str("stage sizes ", list.empty() ? "(none)" : list, " = ", b.back(), " but the model has ",
                            layers, " layers");
  });
  return StagePlan(std::move(b), layers);
}

/// \brief Consecutive layers on `stages` stages minimising the largest stage FLOPs (the first stage
/// also pays `head`, the last `tail`); among equal plans the earliest cuts win.
/// \throws pmt::ConfigError when there are fewer layers than stages.
inline StagePlan balanced_stages(const std::vector<LayerCost>& costs, int stages, const LayerCost& head = {},
                                 const LayerCost& tail = {}) {
  const std::size_t L = costs.size();
  pmt::detail::require<ConfigError>(
      stages >= 1 && L >= static_cast<std::size_t>(stages), "pmt::parallel::balanced_stages", [&] {
        return pmt::detail::str(L, " layers on ", stages,
                                " pipeline stages: every stage needs at least one layer (use pp <= ", L, ")");
      });
  const auto P = static_cast<std::size_t>(stages);
  std::vector<double> prefix(L + 1, 0.0);
  for (std::size_t l = 0; l < L; ++l) prefix[l + 1] = prefix[l] + costs[l].flops;
  const auto stage_cost = [&](std::size_t s, std::size_t a, std::size_t b) {
    return prefix[b] - prefix[a] + (s == 0 ? head.flops : 0.0) + (s + 1 == P ? tail.flops : 0.0);
  };
  const double inf = std::numeric_limits<double>::infinity();
  // best[s][l]: the smallest largest-stage cost of layers [0, l) on stages [0, s]; cut[s][l] its last boundary.
  std::vector<std::vector<double>> best(P, std::vector<double>(L + 1, inf));
  std::vector<std::vector<std::size_t>> cut(P, std::vector<std::size_t>(L + 1, 0));
  for (std::size_t l = 1; l <= L; ++l) best[0][l] = stage_cost(0, 0, l);
  for (std::size_t s = 1; s < P; ++s)
    for (std::size_t l = s + 1; l <= L; ++l)
      for (std::size_t a = s; a < l; ++a) {
        const double c = std::max(best[s - 1][a], stage_cost(s, a, l));
        if (c < best[s][l] * (1 - 1e-12)) best[s][l] = c, cut[s][l] = a;
      }
  std::vector<std::size_t> b(P + 1, 0);
  b[P] = L;
  for (std::size_t s = P - 1; s >= 1; --s) b[s] = cut[s][b[s + 1]];
  return StagePlan(std::move(b), L);
}

}  // namespace pmt::parallel
