// SPDX-License-Identifier: Apache-2.0
#pragma once
// Linear<T, Policy, Exec>: y = x W + b with W (in, out) of the global model, spread over the tp
// axis by the layer policy. Legend: N rows (tokens), in/out features, tp the tp degree.
//   Replicate         W (in, out), b (out)        x (N, in)    -> y (N, out)      no communication
//   TensorSplit<Col>  W (in, out/tp), b (out/tp)  x (N, in)    -> y (N, out/tp)   forward: none;
//                                                                                 backward: all_reduce(tp) of dx
//   TensorSplit<Row>  W (in/tp, out), b (out)     x (N, in/tp) -> y (N, out)      forward: all_reduce(tp) of
//                                                                                 x W, then + b; backward: none
// W is initialised from N(0, std^2) keyed by (seed, stream, global index): any tp holds exactly
// the slice of the one-rank W. b starts at zero. Gradients accumulate (+=) over backward calls.
// Sequence parallelism (LinearOptions::sequence_parallel; parallel/regions.hpp): the rows outside
// the Col -> Row region are split over tp, N/tp per rank.
//   TensorSplit<Col>  x (N/tp, in) -> y (N, out/tp)   forward: gather_rows(tp) of x; backward:
//                                                     gather_rows of the saved x again (only N/tp
//                                                     rows are kept), reduce_scatter_rows of dx
//   TensorSplit<Row>  x (N, in/tp) -> y (N/tp, out)   forward: reduce_scatter_rows(tp) of x W, then
//                                                     + b; backward: gather_rows of dy. b's grad
//                                                     is this rank's rows' part (Parameter::tp_partial)

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
#include "pmt/ops/elementwise.hpp"
#include "pmt/ops/matmul.hpp"
#include "pmt/ops/reduction.hpp"
#include "pmt/parallel/regions.hpp"
#include "pmt/policy/placement.hpp"
#include "pmt/policy/policy_traits.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace pmt::detail {

/// y(n, j) = b(j) for every row n (a free function: CUDA's device lambdas may not sit in a
/// private member).
template <class Exec, class YV, class BV>
void fill_rows(const Exec& exec, const YV& y, const BV& b) {
  const std::int64_t cols = static_cast<std::int64_t>(y.extent(1));
  Kokkos::parallel_for(
      "pmt::nn::Linear::fill_bias", Kokkos::RangePolicy<Exec>(exec, 0, static_cast<std::int64_t>(y.extent(0))),
      KOKKOS_LAMBDA(std::int64_t n) {
        for (std::int64_t j = 0; j < cols; ++j) y(n, j) = b(j);
      });
}

template <class P>
std::string policy_name() {
  if constexpr (std::is_same_v<P, Replicate>)
    return "Replicate";
  else if constexpr (std::is_same_v<P, TensorSplit<Col>>)
    return "TensorSplit<Col>";
  else if constexpr (std::is_same_v<P, TensorSplit<Row>>)
    return "TensorSplit<Row>";
  else
    return "user policy";
}

}  // namespace pmt::detail

namespace pmt::nn {

/// \brief How a Linear layer is built.
struct LinearOptions {
  bool bias       = true;  ///< add a bias b (out); it starts at zero
  double init_std = 0.02;  ///< W ~ N(0, init_std^2), keyed by the global index
  /// Sequence parallelism (see the file comment): a Col layer takes and a Row layer gives this
  /// rank's N/tp rows; not for Replicate.
  bool sequence_parallel = false;
};

// ---------------------------------------------------------------------------------------------

/// \brief Linear layer spread over tp by its policy (see the file comment for shapes and
/// communication).
/// \tparam Policy Replicate, TensorSplit<Col>, TensorSplit<Row> (or a user layer policy).
/// \tparam Exec the Kokkos execution space; \tparam Backend the communicator backend of the mesh.
/// \throws pmt::ShapeError when a split extent is not divisible by tp or an input has the wrong width.
template <class T, class Policy, class Exec = Kokkos::DefaultExecutionSpace,
          class Backend = comm::default_backend_t<Exec>>
class Linear {
  static_assert(pmt::detail::check_layer_policy<void, Policy>());
  static_assert(std::is_floating_point_v<T>, "pmt::nn::Linear: T must be float or double");

 public:
  using value_type                = T;
  using execution_space           = Exec;
  using traits                    = policy_traits<Policy>;
  using split                     = typename traits::split;
  using input_placement           = typename traits::input_placement;
  using output_placement          = typename traits::output_placement;
  static constexpr bool nonlinear = false;

  /// \param key RNG seed and stream (the parameter id) of W.
  Linear(const Mesh<Backend>& mesh, std::size_t in_features, std::size_t out_features, RngKey key,
         LinearOptions options = {})
      : m_tp(mesh.comm(Axis::tp)),
        m_in(in_features),
        m_out(out_features),
        m_bias(options.bias),
        m_seq(options.sequence_parallel) {
    const double init_std = options.init_std;
    const auto tp = static_cast<std::size_t>(m_tp.size()), tp_i = static_cast<std::size_t>(m_tp.rank());
    const std::string op = name();
    pmt::detail::require<ConfigError>(!m_seq || !std::is_void_v<split>, op, [] {
      return std::string(
          "sequence parallelism splits the rows around a Col -> Row region; a replicated layer has none");
    });
    if constexpr (std::is_same_v<split, Col>)
      pmt::detail::require(m_out % tp == 0, op,
                           [&] { return pmt::detail::str("out_features ", m_out, " is not divisible by tp = ", tp); });
    if constexpr (std::is_same_v<split, Row>)
      pmt::detail::require(m_in % tp == 0, op,
                           [&] { return pmt::detail::str("in_features ", m_in, " is not divisible by tp = ", tp); });
    const std::size_t in_l  = std::is_same_v<split, Row> ? m_in / tp : m_in;
    const std::size_t out_l = std::is_same_v<split, Col> ? m_out / tp : m_out;
    GlobalSlice ws;
    ws.extent[0] = m_in, ws.extent[1] = m_out;
    ws.offset[0] = std::is_same_v<split, Row> ? tp_i * in_l : 0;
    ws.offset[1] = std::is_same_v<split, Col> ? tp_i * out_l : 0;
    m_w          = Parameter<T, Exec>(op + "::weight", {in_l, out_l}, ws, std::is_void_v<split>);
    fill_normal(Exec(), m_w.value2d(), key, 0.0, init_std, ws);
    if (m_bias) {
      GlobalSlice bs;
      bs.extent[0]   = m_out;
      bs.offset[0]   = std::is_same_v<split, Col> ? tp_i * out_l : 0;
      m_b            = Parameter<T, Exec>(op + "::bias", {out_l}, bs, !std::is_same_v<split, Col>);
      m_b.tp_partial = m_seq && std::is_same_v<split, Row>;  // each rank adds only its rows' dy
    }
    Exec().fence();  // initialised for any instance, like a freshly allocated View
  }

  /// \brief y = x W (+ b); keeps x for backward. x: (N, in) or (N, in/tp) for Row; with
  /// sequence parallelism a Col layer takes (N/tp, in) and a Row layer returns (N/tp, out).
  Tensor<T, 2, Exec> forward(const Exec& exec, const Tensor<T, 2, Exec>& x_in) {
    pmt::detail::require(x_in.extent(1) == in_local(), name() + "::forward", [&] {
      return pmt::detail::str("x is ", shape_str(x_in), " but this layer takes (N, ", in_local(), ") (in_features ",
                              m_in, std::is_same_v<split, Row> ? " / tp " + std::to_string(m_tp.size()) : std::string(),
                              ")");
    });
    const Instrument instrument("pmt::nn::Linear::forward");
    if (step_context().grad) *m_x = x_in;  // pmt::NoGrad: nothing kept; sequence-parallel Col: N/tp rows
    const bool seq             = m_seq && m_tp.size() > 1;
    const Tensor<T, 2, Exec> x = seq && std::is_same_v<split, Col> ? parallel::gather_rows(m_tp, exec, x_in) : x_in;
    auto y                     = workspace_view<Tensor<T, 2, Exec>>("pmt::nn::Linear::y", x.extent(0), out_local());
    if (std::is_same_v<split, Row> && seq) {
      ops::matmul(exec, ops::Trans::N, ops::Trans::N, T(1), x, m_w.value2d(), T(0), y);  // (N, out) partial
      auto mine = parallel::reduce_scatter_rows(m_tp, exec, y);                          // (N/tp, out) whole
      if (m_bias) ops::bias_add(exec, mine, m_b.value);
      return mine;
    }
    if (std::is_same_v<split, Row> && m_tp.size() > 1) {
      ops::matmul(exec, ops::Trans::N, ops::Trans::N, T(1), x, m_w.value2d(), T(0), y);  // (N, out_l)
      parallel::reduce_from(m_tp, exec, y);                                              // partial sums -> whole
      if (m_bias) ops::bias_add(exec, y, m_b.value);                                     // once, after the sum
    } else if (m_bias) {
      // y = b broadcast, then y += x W: the product adds onto the bias (beta 1), one pass over y
      // fewer than a product into zeros (BLAS clears C for beta 0) followed by a bias pass.
      pmt::detail::fill_rows(exec, y, m_b.value);
      ops::matmul(exec, ops::Trans::N, ops::Trans::N, T(1), x, m_w.value2d(), T(1), y);
    } else {
      ops::matmul(exec, ops::Trans::N, ops::Trans::N, T(1), x, m_w.value2d(), T(0), y);
    }
    return y;
  }

  /// \brief dW += x^T dy, db += sum_n dy, returns dx = dy W^T (all-reduced over tp for Col;
  /// reduce-scattered to this rank's rows with sequence parallelism).
  Tensor<T, 2, Exec> backward(const Exec& exec, const Tensor<T, 2, Exec>& dy_in) {
    const Instrument instrument("pmt::nn::Linear::backward");
    const bool seq                 = m_seq && m_tp.size() > 1;
    const Tensor<T, 2, Exec> saved = m_x.take();
    const std::size_t p            = seq ? static_cast<std::size_t>(m_tp.size()) : 1;
    const std::size_t rows         = std::is_same_v<split, Col> ? saved.extent(0) * p : saved.extent(0);  // N
    const std::size_t dy_rows      = std::is_same_v<split, Row> ? rows / p : rows;
    pmt::detail::require(
        saved.data() != nullptr && dy_in.extent(0) == dy_rows && dy_in.extent(1) == out_local(), name() + "::backward",
        [&] {
          return pmt::detail::str(
              "dy is ", shape_str(dy_in), " but forward saw x ", shape_str(saved), " and produced (", dy_rows, ", ",
              out_local(),
              "); call forward first, with the same batch (each backward consumes its forward's saved input)");
        });
    const Tensor<T, 2, Exec> x  = seq && std::is_same_v<split, Col> ? parallel::gather_rows(m_tp, exec, saved) : saved;
    const Tensor<T, 2, Exec> dy = seq && std::is_same_v<split, Row> ? parallel::gather_rows(m_tp, exec, dy_in) : dy_in;
    ops::matmul(exec, ops::Trans::T, ops::Trans::N, T(1), x, dy, T(1), m_w.grad2d());  // (in_l, out_l)
    if (m_bias) ops::column_sum(exec, dy_in, m_b.grad, T(1));  // a sequence-parallel Row: this rank's rows
    auto dx = workspace_view<Tensor<T, 2, Exec>>("pmt::nn::Linear::dx", dy.extent(0), in_local());
    ops::matmul(exec, ops::Trans::N, ops::Trans::T, T(1), dy, m_w.value2d(), T(0), dx);  // (N, in_l)
    if constexpr (std::is_same_v<split, Col>) {
      if (seq) return parallel::reduce_scatter_rows(m_tp, exec, dx);  // conjugate of gather_rows
      parallel::copy_to_backward(m_tp, exec, dx);                     // conjugate of the identity forward
    }
    return dx;
  }

  std::vector<Parameter<T, Exec>*> parameters() {
    std::vector<Parameter<T, Exec>*> out{&m_w};
    if (m_bias) out.push_back(&m_b);
    return out;
  }
  Parameter<T, Exec>& weight() { return m_w; }
  Parameter<T, Exec>& bias() { return m_b; }

  /// \brief The local widths of input and output (chain stages size their buffers with them).
  std::size_t input_width() const noexcept { return in_local(); }
  std::size_t output_width(std::size_t) const noexcept { return out_local(); }
  std::size_t in_local() const noexcept { return std::is_same_v<split, Row> ? m_in / m_tp.size() : m_in; }
  std::size_t out_local() const noexcept { return std::is_same_v<split, Col> ? m_out / m_tp.size() : m_out; }
  std::string name() const { return "pmt::nn::Linear<" + pmt::detail::policy_name<Policy>() + ">"; }
  /// \brief Whether the layer runs sequence-parallel (LinearOptions::sequence_parallel).
  bool sequence_parallel() const noexcept { return m_seq; }
  /// \brief Sequence parallelism on or off from the next forward on (the same parameters; a
  /// model switches it off for inference of any token count). Not between a forward and its
  /// backward. \throws pmt::ConfigError for Replicate.
  void sequence_parallel(bool on) {
    pmt::detail::require<ConfigError>(!on || !std::is_void_v<split>, name(), [] {
      return std::string(
          "sequence parallelism splits the rows around a Col -> Row region; a replicated layer has none");
    });
    m_seq = on;
  }

 private:
  comm::Communicator<Backend> m_tp;
  std::size_t m_in, m_out;
  bool m_bias, m_seq;
  Parameter<T, Exec> m_w, m_b;
  Saved<Tensor<T, 2, Exec>> m_x;  // the input, per activation slot
};

}  // namespace pmt::nn
