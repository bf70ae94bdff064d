// SPDX-License-Identifier: Apache-2.0
#pragma once
// Multi-tensor ("foreach") forms of the ops an optimizer step runs over every parameter: set to
// zero, scale, squared norms, AdamW and SGD updates, over a list of 1-D tensors at once (a
// model's gradients, values and optimizer states).
//   On host spaces each is ONE parallel loop over fixed chunks of all the tensors, instead of one
//   loop per tensor (and, for the norms, one result allocation and one fence per tensor). A GPT
//   has a dozen or more parameter tensors per block, many of them small (biases, LayerNorm
//   weights), so these launches add up: at width 256 the step ran about 320 of them.
//   On device spaces the elementwise ones (zero, scale, AdamW, SGD) are ONE launch too: the chunk
//   table and the tensors' pointers are in device memory (copied there by the first call that
//   needs them and kept: DeviceTables), a team per chunk (for_each_chunk_table). The squared norms are one
//   launch there too (a chunk's partial per thread) and one copy of the partials to the host.
// Results are bitwise those of the one-tensor ops on any space: the updates are elementwise with
// the same arithmetic (ops/update.hpp's element functions), and each tensor's squared norm is
// summed in reduce_chunk chunks by detail::reduce_span, the chunk partials in order, as
// ops::squared_norm does.
//   ops::zero_all(exec, grads);                           // every gradient = 0
//   std::vector<double> n2 = ops::squared_norms(exec, grads);  // fences
//   ops::adamw_update_all(exec, values, grads, m, v, hyper);

#include "pmt/core/error.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/ops/elementwise.hpp"
#include "pmt/ops/reduction.hpp"
#include "pmt/ops/update.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

namespace pmt::detail {

/// Elements per chunk of the multi-tensor elementwise loops.
inline constexpr std::int64_t multi_tensor_chunk = 8192;

/// One chunk of a multi-tensor loop: elements [lo, hi) of tensor `tensor`.
struct TensorChunk {
  std::size_t tensor;
  std::int64_t lo, hi;
};

/// The chunks of `chunk` elements that cover tensors of the given sizes, in tensor order.
inline std::vector<TensorChunk> tensor_chunks(const std::vector<std::int64_t>& sizes, std::int64_t chunk) {
  std::vector<TensorChunk> out;
  for (std::size_t t = 0; t < sizes.size(); ++t)
    for (std::int64_t lo = 0; lo < sizes[t]; lo += chunk)
      out.push_back({t, lo, lo + chunk < sizes[t] ? lo + chunk : sizes[t]});
  return out;
}

/// Runs f(chunks[i]) for every chunk (f gets a reference into `chunks`), spread over the host
/// space's threads, and returns when all are done: the loops read host vectors of the caller.
template <class Exec, class F>
void for_each_chunk(const Exec& exec, const char* label, const std::vector<TensorChunk>& chunks, F f) {
  static_assert(is_host_space_v<Exec>, "pmt::detail::for_each_chunk runs on host spaces only");
  const TensorChunk* c = chunks.data();
  Kokkos::parallel_for(label, Kokkos::RangePolicy<Exec>(exec, 0, static_cast<std::int64_t>(chunks.size())),
                       [=](std::int64_t i) { f(c[i]); });
  exec.fence();  // a host space may run a parallel_for asynchronously (Kokkos does not promise otherwise)
}

/// A tensor's data pointer as a View element (a View of raw pointers would read as one more rank).
template <class T>
struct TensorPtr {
  T* p;
};

/// Test hook: while true, host spaces take the device form (the chunk table, one launch) too.
inline bool& multi_tensor_force_table() {
  static bool force = false;
  return force;
}

/// Test hook: how many tables (chunk or pointer tables) the multi-tensor ops have copied to an
/// execution space's memory; a step whose tensors did not change copies none.
inline std::uint64_t& multi_tensor_uploads() {
  static std::uint64_t n = 0;
  return n;
}

/// The tables the multi-tensor ops read on Exec (which chunk of which tensor; the tensors'
/// pointers), kept in Exec's memory from call to call, keyed by their contents: the parameters,
/// gradients and optimizer states of a run keep their memory, so after the first step no table
/// is copied again (on a GPU: no host-to-device copy per step). A table is a pure function of
/// its key, so a hit is always right. At most `capacity` tables per element type (the oldest
/// goes); Kokkos::finalize frees them (a finalize hook).
template <class Mem, class E>
class DeviceTables {
 public:
  static constexpr std::size_t capacity = 64;
  static Kokkos::View<E*, Mem> get(const char* label, const std::vector<E>& values) {
    static_assert(std::is_trivially_copyable_v<E>);
    auto& self = instance();
    const std::lock_guard<std::mutex> lock(self.m_mutex);
    std::string key(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(E));
    const auto it = self.m_tables.find(key);
    if (it != self.m_tables.end()) return it->second;
    if (!self.m_hooked) {  // the Views must go before Kokkos does
      Kokkos::push_finalize_hook([] {
        auto& s = instance();
        const std::lock_guard<std::mutex> l(s.m_mutex);
        s.m_tables.clear();
        s.m_order.clear();
        s.m_hooked = false;
      });
      self.m_hooked = true;
    }
    if (self.m_order.size() >= capacity) {
      self.m_tables.erase(self.m_order.front());
      self.m_order.pop_front();
    }
    Kokkos::View<E*, Mem> d(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), values.size());
    auto h = Kokkos::create_mirror_view(d);
    for (std::size_t i = 0; i < values.size(); ++i) h(i) = values[i];
    Kokkos::deep_copy(d, h);  // done when this returns
    ++multi_tensor_uploads();
    self.m_order.push_back(key);
    self.m_tables.emplace(std::move(key), d);
    return d;
  }

 private:
  static DeviceTables& instance() {
    static DeviceTables t;
    return t;
  }
  std::mutex m_mutex;
  std::map<std::string, Kokkos::View<E*, Mem>> m_tables;
  std::deque<std::string> m_order;  // insertion order, for eviction
  bool m_hooked = false;
};

/// `ptrs` as a View of Exec's memory space (see DeviceTables).
template <class Exec, class T>
Kokkos::View<TensorPtr<T>*, typename Exec::memory_space> pointer_table(const std::vector<T*>& ptrs) {
  std::vector<TensorPtr<T>> values(ptrs.size());
  for (std::size_t i = 0; i < ptrs.size(); ++i) values[i] = TensorPtr<T>{ptrs[i]};
  return DeviceTables<typename Exec::memory_space, TensorPtr<T>>::get("pmt::ops::multi_tensor::pointers", values);
}

/// f(tensor, i) for every element i of every chunk, as ONE launch on Exec: the chunk table is in
/// Exec's memory (DeviceTables), a team per chunk, its threads over the chunk's elements. No fence.
template <class Exec, class F>
void for_each_chunk_table(const Exec& exec, const char* label, const std::vector<TensorChunk>& chunks, const F& f) {
  if (chunks.empty()) return;
  const auto table =
      DeviceTables<typename Exec::memory_space, TensorChunk>::get("pmt::ops::multi_tensor::chunks", chunks);
  using Policy   = Kokkos::TeamPolicy<Exec>;
  const int team = is_host_space_v<Exec> ? 1 : 256;
  Kokkos::parallel_for(
      label, Policy(exec, static_cast<int>(chunks.size()), team), KOKKOS_LAMBDA(const typename Policy::member_type& m) {
        const TensorChunk c = table(m.league_rank());
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, c.lo, c.hi), [&](std::int64_t i) { f(c.tensor, i); });
      });
}

/// Whether the multi-tensor ops on Exec take the one-launch chunk-table form (device spaces).
template <class Exec>
bool multi_tensor_table() {
  return !is_host_space_v<Exec> || multi_tensor_force_table();
}

template <class V>
std::vector<std::int64_t> tensor_sizes(const std::vector<V>& xs) {
  std::vector<std::int64_t> sizes;
  sizes.reserve(xs.size());
  for (const auto& x : xs) sizes.push_back(static_cast<std::int64_t>(x.extent(0)));
  return sizes;
}

/// The tensors' data pointers (each a contiguous rank-1 View of Exec's memory space).
template <class Exec, class V>
std::vector<typename V::pointer_type> tensor_data(const std::vector<V>& xs) {
  static_check_view<Exec, V>();
  static_assert(V::rank == 1, "pmt::ops: the multi-tensor ops take lists of rank-1 tensors (Parameter::value, grad)");
  static_assert(std::is_same_v<typename V::array_layout, Kokkos::LayoutRight> ||
                    std::is_same_v<typename V::array_layout, Kokkos::LayoutLeft>,
                "pmt::ops: the multi-tensor ops take contiguous tensors (LayoutRight or LayoutLeft)");
  std::vector<typename V::pointer_type> ptrs;
  ptrs.reserve(xs.size());
  for (const auto& x : xs) ptrs.push_back(x.data());
  return ptrs;
}

/// Checks that list `name` has as many tensors as `ref` and tensor i as many elements as ref's.
template <class V, class R>
void require_same_sizes(const char* op, const char* name, const std::vector<V>& xs, const std::vector<R>& ref) {
  require(xs.size() == ref.size(), op,
          [&] { return str(name, " holds ", xs.size(), " tensors but the parameters ", ref.size()); });
  for (std::size_t i = 0; i < xs.size(); ++i)
    require(xs[i].extent(0) == ref[i].extent(0), op, [&] {
      return str(name, "[", i, "] is ", shape_str(xs[i]), " but parameter ", i, " is ", shape_str(ref[i]));
    });
}

}  // namespace pmt::detail

namespace pmt::ops {

/// \brief Sets every element of every tensor of `xs` to zero (no fence on device spaces).
template <class Exec, class V>
void zero_all(const Exec& exec, const std::vector<V>& xs) {
  using T                 = typename V::non_const_value_type;
  const std::vector<T*> p = detail::tensor_data<Exec>(xs);
  if (detail::multi_tensor_table<Exec>()) {
    const auto P = detail::pointer_table<Exec>(p);
    detail::for_each_chunk_table(
        exec, "pmt::ops::zero_all", detail::tensor_chunks(detail::tensor_sizes(xs), detail::multi_tensor_chunk),
        KOKKOS_LAMBDA(std::size_t t, std::int64_t i) { P(t).p[i] = T(0); });
    return;
  }
  if constexpr (is_host_space_v<Exec>) {
    T* const* pp = p.data();
    detail::for_each_chunk(exec, "pmt::ops::zero_all",
                           detail::tensor_chunks(detail::tensor_sizes(xs), detail::multi_tensor_chunk),
                           [=](const detail::TensorChunk& c) {
                             T* x = pp[c.tensor];
                             for (std::int64_t i = c.lo; i < c.hi; ++i) x[i] = T(0);
                           });
  }
}

/// \brief x *= s for every tensor x of `xs` (ops::scale on each).
template <class Exec, class V>
void scale_all(const Exec& exec, const std::vector<V>& xs, typename V::non_const_value_type s) {
  using T                 = typename V::non_const_value_type;
  const std::vector<T*> p = detail::tensor_data<Exec>(xs);
  if (detail::multi_tensor_table<Exec>()) {
    const auto P = detail::pointer_table<Exec>(p);
    detail::for_each_chunk_table(
        exec, "pmt::ops::scale_all", detail::tensor_chunks(detail::tensor_sizes(xs), detail::multi_tensor_chunk),
        KOKKOS_LAMBDA(std::size_t t, std::int64_t i) { P(t).p[i] *= s; });
    return;
  }
  if constexpr (is_host_space_v<Exec>) {
    T* const* pp = p.data();
    detail::for_each_chunk(exec, "pmt::ops::scale_all",
                           detail::tensor_chunks(detail::tensor_sizes(xs), detail::multi_tensor_chunk),
                           [=](const detail::TensorChunk& c) {
                             T* x = pp[c.tensor];
                             for (std::int64_t i = c.lo; i < c.hi; ++i) x[i] *= s;
                           });
  }
}

/// \brief The squared L2 norm of each tensor of `xs`, in double, on the host (fences); each
/// bitwise equal to ops::squared_norm_value of that tensor.
template <class Exec, class V>
std::vector<double> squared_norms(const Exec& exec, const std::vector<V>& xs) {
  using P                = typename V::pointer_type;
  const std::vector<P> p = detail::tensor_data<Exec>(xs);
  std::vector<double> out(xs.size(), 0.0);
  // squared_norm's chunks (reduce_chunk elements), so that the partials and their order match
  const std::vector<detail::TensorChunk> chunks = detail::tensor_chunks(detail::tensor_sizes(xs), detail::reduce_chunk);
  if (chunks.empty()) return out;
  if (detail::multi_tensor_table<Exec>()) {
    // devices: one launch, a chunk's partial per thread (reduce_span, as squared_norm's), and
    // one copy of the partials to the host, summed there per tensor in chunk order
    using Mem          = typename Exec::memory_space;
    const auto P       = detail::pointer_table<Exec>(p);
    const auto table   = detail::DeviceTables<Mem, detail::TensorChunk>::get("pmt::ops::multi_tensor::chunks", chunks);
    const auto partial = workspace_view<Kokkos::View<double*, Kokkos::LayoutRight, Mem>>(
        "pmt::ops::squared_norms::partial", chunks.size());
    Kokkos::parallel_for(
        "pmt::ops::squared_norms", Kokkos::RangePolicy<Exec>(exec, 0, static_cast<std::int64_t>(chunks.size())),
        KOKKOS_LAMBDA(std::int64_t i) {
          const detail::TensorChunk c = table(i);
          partial(i)                  = detail::reduce_span<detail::ReduceKind::SumSquares>(P(c.tensor).p, c.lo, c.hi);
        });
    const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), partial);  // fences
    for (std::size_t c = 0; c < chunks.size(); ++c) out[chunks[c].tensor] += host(c);
    return out;
  }
  if constexpr (is_host_space_v<Exec>) {
    std::vector<double> partial(chunks.size());
    const P* pp                      = p.data();
    double* part                     = partial.data();
    const detail::TensorChunk* first = chunks.data();
    detail::for_each_chunk(exec, "pmt::ops::squared_norms", chunks, [=](const detail::TensorChunk& c) {
      part[&c - first] = detail::reduce_span<detail::ReduceKind::SumSquares>(pp[c.tensor], c.lo, c.hi);
    });
    for (std::size_t c = 0; c < chunks.size(); ++c) out[chunks[c].tensor] += partial[c];
  }
  return out;
}

/// \brief ops::adamw_update on every (values[i], grads[i], m[i], v[i]) (no fence on device spaces).
/// \throws pmt::ShapeError when the lists differ in length or tensor i in size; pmt::ConfigError
/// for step < 1.
template <class Exec, class PV, class GV, class SV>
void adamw_update_all(const Exec& exec, const std::vector<PV>& values, const std::vector<GV>& grads,
                      const std::vector<SV>& m, const std::vector<SV>& v, const AdamWParams& h) {
  constexpr const char* op = "pmt::ops::adamw_update_all";
  detail::require_same_sizes(op, "grads", grads, values);
  detail::require_same_sizes(op, "m", m, values);
  detail::require_same_sizes(op, "v", v, values);
  using S                       = typename SV::non_const_value_type;
  const detail::AdamWStep<S> st = detail::adamw_step<S>(op, h);  // checks the step on every space
  if (detail::multi_tensor_table<Exec>()) {
    const auto P = detail::pointer_table<Exec>(detail::tensor_data<Exec>(values));
    const auto G = detail::pointer_table<Exec>(detail::tensor_data<Exec>(grads));
    const auto M = detail::pointer_table<Exec>(detail::tensor_data<Exec>(m));
    const auto V = detail::pointer_table<Exec>(detail::tensor_data<Exec>(v));
    detail::for_each_chunk_table(
        exec, op, detail::tensor_chunks(detail::tensor_sizes(values), detail::multi_tensor_chunk),
        KOKKOS_LAMBDA(std::size_t t, std::int64_t i) {
          detail::adamw_element(st, P(t).p[i], G(t).p[i], M(t).p[i], V(t).p[i]);
        });
    return;
  }
  if constexpr (is_host_space_v<Exec>) {
    const auto pv = detail::tensor_data<Exec>(values);
    const auto gv = detail::tensor_data<Exec>(grads);
    const auto mv = detail::tensor_data<Exec>(m), vv = detail::tensor_data<Exec>(v);
    const auto* P = pv.data();
    const auto* G = gv.data();
    const auto* M = mv.data();
    const auto* V = vv.data();
    detail::for_each_chunk(exec, op, detail::tensor_chunks(detail::tensor_sizes(values), detail::multi_tensor_chunk),
                           [=](const detail::TensorChunk& c) {
                             auto* p       = P[c.tensor];
                             const auto* g = G[c.tensor];
                             S* mm         = M[c.tensor];
                             S* vv2        = V[c.tensor];
                             for (std::int64_t i = c.lo; i < c.hi; ++i)
                               detail::adamw_element(st, p[i], g[i], mm[i], vv2[i]);
                           });
  }
}

/// \brief ops::sgd_update on every (values[i], grads[i], velocity[i]) (no fence on device spaces).
/// \throws pmt::ShapeError when the lists differ in length or tensor i in size.
template <class Exec, class PV, class GV, class SV>
void sgd_update_all(const Exec& exec, const std::vector<PV>& values, const std::vector<GV>& grads,
                    const std::vector<SV>& velocity, const SgdParams& h) {
  constexpr const char* op = "pmt::ops::sgd_update_all";
  detail::require_same_sizes(op, "grads", grads, values);
  detail::require_same_sizes(op, "velocity", velocity, values);
  using T                     = typename PV::non_const_value_type;  // sgd_update's scalars
  const detail::SgdStep<T> st = detail::sgd_step<T>(h);
  if (detail::multi_tensor_table<Exec>()) {
    const auto P = detail::pointer_table<Exec>(detail::tensor_data<Exec>(values));
    const auto G = detail::pointer_table<Exec>(detail::tensor_data<Exec>(grads));
    const auto V = detail::pointer_table<Exec>(detail::tensor_data<Exec>(velocity));
    detail::for_each_chunk_table(
        exec, op, detail::tensor_chunks(detail::tensor_sizes(values), detail::multi_tensor_chunk),
        KOKKOS_LAMBDA(std::size_t t, std::int64_t i) { detail::sgd_element(st, P(t).p[i], G(t).p[i], V(t).p[i]); });
    return;
  }
  if constexpr (is_host_space_v<Exec>) {
    const auto pv = detail::tensor_data<Exec>(values);
    const auto gv = detail::tensor_data<Exec>(grads);
    const auto vv = detail::tensor_data<Exec>(velocity);
    const auto* P = pv.data();
    const auto* G = gv.data();
    const auto* V = vv.data();
    detail::for_each_chunk(exec, op, detail::tensor_chunks(detail::tensor_sizes(values), detail::multi_tensor_chunk),
                           [=](const detail::TensorChunk& c) {
                             auto* p       = P[c.tensor];
                             const auto* g = G[c.tensor];
                             auto* vel     = V[c.tensor];
                             for (std::int64_t i = c.lo; i < c.hi; ++i) detail::sgd_element(st, p[i], g[i], vel[i]);
                           });
  }
}

}  // namespace pmt::ops
