// SPDX-License-Identifier: Apache-2.0
#pragma once
// The optimizer state a checkpoint holds, seen alike for every optimizer (io/checkpoint.hpp):
// AdamW's moments, Sgd's momentum, the weights only, ZeRO-1/2's sharded moments seen as plain
// AdamW's, ZeRO-3's parts of every parameter seen as AdamW parameters of their own (row slices),
// and the named per-parameter states of a Trainer's strategy appended (WithStates).

#include "pmt/comm/collectives.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/parameter.hpp"
#include "pmt/io/checkpoint_files.hpp"
#include "pmt/optim/optimizers.hpp"
#include "pmt/optim/zero.hpp"
#include "pmt/optim/zero2.hpp"
#include "pmt/optim/zero3.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace pmt::io {

namespace detail {

/// ZeroAdamW's state seen as plain AdamW's: per-parameter moments, views into full flat moments.
/// For saving they are all-gathered over dp (every dp rank then writes what plain AdamW would);
/// for loading they are filled per parameter, and store() keeps the rank's part.
/// The optimizer state a checkpoint holds, seen alike for every optimizer: its kind (the
/// manifest's "optimizer" line), the names of its per-parameter tensors, those tensors, and a
/// step count.
template <class T, class Exec>
class AdamWState {
 public:
  using value_type      = T;
  using execution_space = Exec;
  explicit AdamWState(const optim::AdamW<T, Exec>& opt) : m_opt(&opt) {}            // for saving
  explicit AdamWState(optim::AdamW<T, Exec>& opt) : m_opt(&opt), m_target(&opt) {}  // for loading
  const std::vector<Parameter<T, Exec>*>& parameters() const noexcept { return m_opt->parameters(); }
  static const char* kind() noexcept { return "adamw"; }
  static std::vector<std::string> states() { return {"exp_avg", "exp_avg_sq"}; }
  Tensor<T, 1, Exec> state(std::size_t i, std::size_t k) const {
    return k == 0 ? m_opt->exp_avg(i) : m_opt->exp_avg_sq(i);
  }
  std::int64_t steps() const noexcept { return m_opt->steps(); }
  void set_steps(std::int64_t n) noexcept { m_target->set_steps(n); }

 private:
  const optim::AdamW<T, Exec>* m_opt;
  optim::AdamW<T, Exec>* m_target = nullptr;  // loading only
};
template <class T, class Exec>
class SgdState {
 public:
  using value_type      = T;
  using execution_space = Exec;
  explicit SgdState(const optim::Sgd<T, Exec>& opt) : m_opt(&opt) {}
  const std::vector<Parameter<T, Exec>*>& parameters() const noexcept { return m_opt->parameters(); }
  static const char* kind() noexcept { return "sgd"; }
  static std::vector<std::string> states() { return {"velocity"}; }
  Tensor<T, 1, Exec> state(std::size_t i, std::size_t) const { return m_opt->velocity(i); }
  std::int64_t steps() const noexcept { return 0; }
  void set_steps(std::int64_t) noexcept {}

 private:
  const optim::Sgd<T, Exec>* m_opt;
};
template <class T, class Exec>
class WeightsOnly {
 public:
  using value_type      = T;
  using execution_space = Exec;
  explicit WeightsOnly(std::vector<Parameter<T, Exec>*> params) : m_params(std::move(params)) {}
  const std::vector<Parameter<T, Exec>*>& parameters() const noexcept { return m_params; }
  static const char* kind() noexcept { return "none"; }
  static std::vector<std::string> states() { return {}; }
  Tensor<T, 1, Exec> state(std::size_t, std::size_t) const { return {}; }
  std::int64_t steps() const noexcept { return 0; }
  void set_steps(std::int64_t) noexcept {}

 private:
  std::vector<Parameter<T, Exec>*> m_params;
};

template <class Zero, class T, class Exec>
class ZeroAsAdamW {
 public:
  using value_type      = T;
  using execution_space = Exec;
  /// For saving: collective over the dp axis.
  ZeroAsAdamW(const Zero& opt, const Exec& exec) : m_params(opt.parameters()), m_steps(opt.steps()) {
    std::tie(m_m, m_v) = opt.gathered_moments(exec);
    exec.fence();
    index();
  }
  /// For loading into `opt` (then store()).
  explicit ZeroAsAdamW(Zero& opt)
      : m_params(opt.parameters()),
        m_target(&opt),
        m_m("pmt::io::checkpoint::m", opt.padded_size()),
        m_v("pmt::io::checkpoint::v", opt.padded_size()) {
    index();
  }
  const std::vector<Parameter<T, Exec>*>& parameters() const noexcept { return m_params; }
  static const char* kind() noexcept { return "adamw"; }
  static std::vector<std::string> states() { return {"exp_avg", "exp_avg_sq"}; }
  Tensor<T, 1, Exec> state(std::size_t i, std::size_t k) const { return part(k == 0 ? m_m : m_v, i); }
  std::int64_t steps() const noexcept { return m_steps; }
  void set_steps(std::int64_t n) noexcept { m_steps = n; }
  void store(const Exec& exec) {
    m_target->set_moments(exec, m_m, m_v);
    m_target->set_steps(m_steps);
    exec.fence();
  }

 private:
  void index() {
    std::size_t offset = 0;
    for (auto* p : m_params) m_offset.push_back(offset), offset += p->size();
  }
  Tensor<T, 1, Exec> part(const Tensor<T, 1, Exec>& flat, std::size_t i) const {
    return Kokkos::subview(flat, std::make_pair(m_offset.at(i), m_offset[i] + m_params[i]->size()));
  }
  std::vector<Parameter<T, Exec>*> m_params;
  Zero* m_target       = nullptr;
  std::int64_t m_steps = 0;
  Tensor<T, 1, Exec> m_m, m_v;
  std::vector<std::size_t> m_offset;
};

/// Zero3AdamW's shard seen as plain AdamW's: each of this rank's parts of a parameter is a
/// parameter of its own (the same name, its rows of the slice), whose value and moments are views
/// into the shard. Saving writes each rank's parts, nothing gathered; loading (any checkpoint of
/// the model, any layout) fills the shard in place through them.
template <class T, class Exec, class Backend>
class Zero3State {
 public:
  using value_type      = T;
  using execution_space = Exec;
  explicit Zero3State(const optim::Zero3AdamW<T, Exec, Backend>& opt) : m_steps(opt.steps()) {
    for (const auto& part : opt.shard_parts()) {
      Parameter<T, Exec> p;
      p.name           = part.param->name;
      p.value          = part.value;
      p.local_shape    = part.param->local_shape;
      p.local_shape[0] = part.rows;
      p.slice          = part.param->slice;
      p.slice.offset[0] += part.first_row;
      p.tp_replicated = part.param->tp_replicated;
      p.pp_copy       = part.param->pp_copy;
      p.tp_partial    = part.param->tp_partial;
      m_parts.push_back(std::move(p));
      m_m.push_back(part.m), m_v.push_back(part.v);
    }
    for (auto& p : m_parts) m_params.push_back(&p);
  }
  /// For loading into `opt` (then store()).
  explicit Zero3State(optim::Zero3AdamW<T, Exec, Backend>& opt)
      : Zero3State(static_cast<const optim::Zero3AdamW<T, Exec, Backend>&>(opt)) {
    m_target = &opt;
  }
  Zero3State(const Zero3State&)            = delete;  // m_params points into m_parts
  Zero3State& operator=(const Zero3State&) = delete;
  const std::vector<Parameter<T, Exec>*>& parameters() const noexcept { return m_params; }
  static const char* kind() noexcept { return "adamw"; }
  static std::vector<std::string> states() { return {"exp_avg", "exp_avg_sq"}; }
  Tensor<T, 1, Exec> state(std::size_t i, std::size_t k) const { return k == 0 ? m_m.at(i) : m_v.at(i); }
  std::int64_t steps() const noexcept { return m_steps; }
  void set_steps(std::int64_t n) noexcept { m_steps = n; }
  void store(const Exec& exec) {
    m_target->set_steps(m_steps);
    m_target->loaded(exec);
    exec.fence();
  }

 private:
  std::vector<Parameter<T, Exec>> m_parts;
  std::vector<Parameter<T, Exec>*> m_params;
  std::vector<Tensor<T, 1, Exec>> m_m, m_v;
  optim::Zero3AdamW<T, Exec, Backend>* m_target = nullptr;
  std::int64_t m_steps                          = 0;
};

/// An optimizer's state with named per-parameter states appended (ParameterStates: the
/// Trainer's). Opt may be const (for saving).
template <class Opt>
class WithStates {
 public:
  using value_type      = typename std::remove_const_t<Opt>::value_type;
  using execution_space = typename std::remove_const_t<Opt>::execution_space;
  using T               = value_type;
  using Exec            = execution_space;
  /// \throws pmt::ConfigError when a state does not have one tensor of each parameter's size.
  WithStates(Opt& opt, const ParameterStates<T, Exec>& extra) : m_opt(&opt), m_extra(extra), m_base(opt.states()) {
    const auto& ps = opt.parameters();
    for (const auto& st : m_extra.states) {
      pmt::detail::require<ConfigError>(st.of.size() == ps.size(), "pmt::io::checkpoint", [&] {
        return pmt::detail::str("state \"", st.name, "\" has ", st.of.size(), " tensors for ", ps.size(),
                                " parameters");
      });
      for (std::size_t i = 0; i < ps.size(); ++i)
        pmt::detail::require<ConfigError>(
            st.of[i].size() == 0 || st.of[i].size() == ps[i]->size(), "pmt::io::checkpoint", [&] {
              return pmt::detail::str("state \"", st.name, "\" of parameter ", ps[i]->name, " has ", st.of[i].size(),
                                      " values; the parameter has ", ps[i]->size(), " (or none)");
            });
    }
  }
  const std::vector<Parameter<T, Exec>*>& parameters() const noexcept { return m_opt->parameters(); }
  const char* kind() const noexcept { return m_opt->kind(); }
  std::vector<std::string> states() const {
    auto out = m_base;
    for (const auto& st : m_extra.states) out.push_back(st.name);
    return out;
  }
  Tensor<T, 1, Exec> state(std::size_t i, std::size_t k) const {
    return k < m_base.size() ? m_opt->state(i, k) : m_extra.states[k - m_base.size()].of.at(i);
  }
  std::int64_t steps() const noexcept { return m_opt->steps(); }
  void set_steps(std::int64_t n) noexcept { m_opt->set_steps(n); }
  bool defaults_to_value(std::size_t k) const noexcept {
    return k >= m_base.size() && m_extra.states[k - m_base.size()].defaults_to_value;
  }
  bool per_rank(std::size_t k) const noexcept {
    return k >= m_base.size() && m_extra.states[k - m_base.size()].per_rank;
  }
  void mark_loaded() const noexcept {
    if (m_extra.loaded) *m_extra.loaded = true;
  }

 private:
  Opt* m_opt;
  ParameterStates<T, Exec> m_extra;
  std::vector<std::string> m_base;
};

template <class Opt, class = void>
inline constexpr bool has_state_defaults_v = false;
template <class Opt>
inline constexpr bool
    has_state_defaults_v<Opt, std::void_t<decltype(std::declval<const Opt&>().defaults_to_value(std::size_t(0)))>> =
        true;

/// Whether state k of Opt holds each rank's own values (ParameterStates::State::per_rank).
template <class Opt>
bool per_rank_state(const Opt& opt, std::size_t k) {
  if constexpr (has_state_defaults_v<Opt>)
    return opt.per_rank(k);
  else
    return (void)opt, (void)k, false;
}
/// The record kind of a pipeline copy's own value of a per-rank state ("grad_residual@copy").
inline constexpr const char* copy_suffix = "@copy";

}  // namespace detail

}  // namespace pmt::io
