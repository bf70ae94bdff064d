// SPDX-License-Identifier: Apache-2.0
#pragma once
// Dropout<T, Exec, Placement>: y = x * mask / (1 - p) with mask(r, c) = [u(r, c) >= p], where
// u is drawn from the counter-based RNG (Philox) keyed by the seed, the layer's stream, the
// global step and the GLOBAL element index (global row r, global column c). The mask therefore
// does not depend on the layout: a dp rank's rows, a tp rank's columns of a sharded tensor, a
// pipeline stage and a microbatch all see the bits the one-rank run sees for the same element.
// The step and the microbatch's first global row come from the step context's random keys
// (core/step_context.hpp): the Trainer sets both for every step and microbatch, from the global
// step and the rows of the dp ranks before this one; a training forward without keys (layers run
// by hand outside a pmt::RandomScope) raises pmt::ConfigError rather than guess. The
// placement is part of the type and checked by Chain: Dropout<T, Exec, Sharded> after a Col
// layer (columns offset by tp rank x local width), Replicated (the default) elsewhere.
// Backward recomputes the mask from the saved (step, row0) instead of keeping it. Under
// pmt::NoGrad and in evaluation (Trainer::evaluate), and with p = 0, it is the identity.
// Communication: none.

#include "pmt/comm/backend.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/core/activation_slot.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/instrument.hpp"
#include "pmt/core/random.hpp"
#include "pmt/core/step_context.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/core/workspace.hpp"
#include "pmt/nn/module.hpp"
#include "pmt/policy/placement.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace pmt::nn {

namespace detail {
/// y(n, j) = x(n, j) * [u >= p] * scale, u keyed by the global index (row0 + n, col0 + j). A
/// free function: CUDA's extended lambdas may not sit in a class's private member functions.
template <class Exec, class XV, class YV>
void apply(const Exec& exec, const XV& x, const YV& y, RngKey key, double p, std::uint64_t row0, std::uint64_t col0,
           std::uint64_t cols_global, const char* label) {
  using T         = typename YV::non_const_value_type;
  const auto cols = static_cast<std::int64_t>(x.extent(1));
  const T scale   = static_cast<T>(1.0 / (1.0 - p));
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<Exec>(exec, 0, static_cast<std::int64_t>(x.extent(0))), KOKKOS_LAMBDA(std::int64_t n) {
        const std::uint64_t base = (row0 + static_cast<std::uint64_t>(n)) * cols_global + col0;
        for (std::int64_t j = 0; j < cols; ++j)
          y(n, j) = random_uniform(key, base + static_cast<std::uint64_t>(j)) >= p ? x(n, j) * scale : T(0);
      });
}
}  // namespace detail

/// \brief Dropout with a layout-independent mask (see the file comment).
/// \throws pmt::ConfigError for p outside [0, 1).
template <class T, class Exec = Kokkos::DefaultExecutionSpace, class Placement = Replicated,
          class Backend = comm::default_backend_t<Exec>>
class Dropout {
  static_assert(is_placement_v<Placement>, "pmt::nn::Dropout: Placement must be Replicated, Sharded or Partial");

 public:
  using value_type                = T;
  using execution_space           = Exec;
  using input_placement           = Placement;
  using output_placement          = Placement;
  static constexpr bool nonlinear = false;  // a fixed mask: partial sums stay partial sums

  Dropout(const Mesh<Backend>& mesh, double p, RngKey key)
      : m_p(p), m_key(key), m_tp_rank(mesh.coord(Axis::tp)), m_tp(mesh.degree(Axis::tp)) {
    pmt::detail::require<ConfigError>(p >= 0 && p < 1, "pmt::nn::Dropout", [&] {
      return pmt::detail::str("p = ", p, "; expected a drop probability in [0, 1)");
    });
  }

  Tensor<T, 2, Exec> forward(const Exec& exec, const Tensor<T, 2, Exec>& x) {
    const Instrument instrument("pmt::nn::Dropout::forward");
    const StepContext& context = step_context();
    if (context.mode == StepMode::eval || m_p == 0) return x;  // evaluation: the identity
    const RandomContext ctx = context.random;
    pmt::detail::require<ConfigError>(ctx.keyed, "pmt::nn::Dropout::forward", [] {
      return std::string(
          "a training forward without random keys: run it inside Trainer::step (which keys the masks by the "
          "global step and each row's global index), open a pmt::RandomScope(step, first_global_row) around "
          "it, or evaluate under pmt::NoGrad (Dropout is then the identity)");
    });
    if (context.grad) *m_saved = {ctx.step, ctx.row0, x.extent(0), x.extent(1)};
    auto y = workspace_view<Tensor<T, 2, Exec>>("pmt::nn::Dropout::y", x.extent(0), x.extent(1));
    run(exec, x, y, ctx.step, ctx.row0, "pmt::nn::Dropout::forward");
    return y;
  }
  Tensor<T, 2, Exec> backward(const Exec& exec, const Tensor<T, 2, Exec>& dy) {
    const Instrument instrument("pmt::nn::Dropout::backward");
    if (m_p == 0) return dy;
    const Cache c = m_saved.take();
    pmt::detail::require(
        c.rows == dy.extent(0) && c.cols == dy.extent(1) && c.rows > 0, "pmt::nn::Dropout::backward", [&] {
          return pmt::detail::str("dy is ", shape_str(dy), " but the forward saw (", c.rows, ", ", c.cols,
                                  "); call forward first, with gradients on (not under pmt::NoGrad)");
        });
    auto dx = workspace_view<Tensor<T, 2, Exec>>("pmt::nn::Dropout::dx", dy.extent(0), dy.extent(1));
    run(exec, dy, dx, c.step, c.row0, "pmt::nn::Dropout::backward");  // the same mask and scale
    return dx;
  }
  std::vector<Parameter<T, Exec>*> parameters() { return {}; }
  std::size_t output_width(std::size_t in) const noexcept { return in; }
  double p() const noexcept { return m_p; }

 private:
  struct Cache {
    std::uint64_t step = 0, row0 = 0;
    std::size_t rows = 0, cols = 0;
  };
  void run(const Exec& exec, const Tensor<T, 2, Exec>& in, const Tensor<T, 2, Exec>& out, std::uint64_t step,
           std::uint64_t row0, const char* label) const {
    const std::uint64_t local = in.extent(1);
    const bool sharded        = std::is_same_v<Placement, Sharded>;
    const std::uint64_t col0  = sharded ? static_cast<std::uint64_t>(m_tp_rank) * local : 0;
    const std::uint64_t cols  = sharded ? local * static_cast<std::uint64_t>(m_tp) : local;
    // the step enters the seed: every step draws new bits for the same element
    const RngKey key{m_key.seed ^ (0x9E3779B97F4A7C15ull * (step + 1)), m_key.stream};
    detail::apply(exec, in, out, key, m_p, row0, col0, cols, label);
  }

  double m_p;
  RngKey m_key;
  int m_tp_rank, m_tp;
  Saved<Cache> m_saved;  // the step and first row of the forward, per activation slot
};

}  // namespace pmt::nn
