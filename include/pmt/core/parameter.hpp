// SPDX-License-Identifier: Apache-2.0
#pragma once
// Parameter: a trainable tensor: its value and gradient (flat, contiguous, this rank's shard
// only), its global shape and where the shard sits in it, whether it is replicated over tp (so
// that clipping by global norm counts it once), whether it is a pipeline copy of a parameter
// another stage owns (a tied LM head on the last stage: updated like the original, left out of
// the global norm), whether its gradient is a partial sum over tp (a replicated parameter of a
// sequence-parallel region, whose tp ranks each see their own rows: the norms' weights, a Row
// layer's bias; parallel::sum_partial_grads completes them), and whether ZeRO-3 holds its values
// sharded over dp (dp_sharded: value and grad exist only while a layer reads or writes them).
// It sits below the layers (nn/), the parallel layer (parallel/), the optimizers and the
// checkpoints, which all hold pointers to a model's parameters.

#include "pmt/core/random.hpp"
#include "pmt/core/tensor.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace pmt {

/// \brief A trainable tensor (see the file comment): value and grad (this rank's shard, flat),
/// local_shape, the GlobalSlice it holds of the global tensor, tp_replicated, pp_copy, and a
/// layout-free name (checkpoints match by it).
template <class T, class Exec>
struct Parameter {
  std::string name;
  Tensor<T, 1, Exec> value, grad;        // flat views of this rank's shard
  std::vector<std::size_t> local_shape;  // the shard's shape
  GlobalSlice slice;                     // global shape and the shard's offsets
  bool tp_replicated = true;             // the same on every tp rank (e.g. a Row layer's bias)
  bool pp_copy       = false;            // a copy of a parameter of another pipeline stage
  bool tp_partial    = false;            // sequence parallelism: a tp-replicated parameter whose grad
                                         // holds this tp rank's rows' part (parallel::sum_partial_grads)
  bool dp_sharded = false;               // ZeRO-3 (optim::Zero3AdamW) keeps the values sharded over dp:
                                         // value and grad are empty except while a layer uses them

  Parameter() = default;
  Parameter(std::string n, std::vector<std::size_t> shape, const GlobalSlice& s, bool replicated)
      : name(std::move(n)), local_shape(std::move(shape)), slice(s), tp_replicated(replicated) {
    std::size_t count = 1;
    for (std::size_t e : local_shape) count *= e;
    value = Tensor<T, 1, Exec>(name + "::value", count);
    grad  = Tensor<T, 1, Exec>(name + "::grad", count);
  }

  /// \brief The shard's element count (local_shape's product; also while dp_sharded leaves value empty).
  std::size_t size() const noexcept {
    if (!dp_sharded) return value.size();
    std::size_t count = 1;
    for (std::size_t e : local_shape) count *= e;
    return count;
  }
  std::size_t bytes() const noexcept { return value.size() * sizeof(T); }

  /// \brief The value as a rank-2 (rows, cols) unmanaged View over the same memory.
  auto value2d() const { return as2d(value); }
  auto grad2d() const { return as2d(grad); }

 private:
  auto as2d(const Tensor<T, 1, Exec>& v) const {
    return Kokkos::View<T**, Kokkos::LayoutRight, typename Exec::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
        v.data(), local_shape.at(0), local_shape.size() > 1 ? local_shape[1] : 1);
  }
};

/// \brief Named per-parameter state kept outside the optimizer that a checkpoint saves beside it
/// (the Trainer's: DiLoCo's outer anchor and momentum, the error-feedback residual of compressed
/// gradients). `of[i]` belongs to the i-th parameter of the optimizer's parameters() and has its
/// size (an empty tensor: this parameter has none). A state a checkpoint lacks is loaded as zeros,
/// or as the parameter's loaded value when `defaults_to_value`; `loaded`, when set, is set to
/// true by a load. A `per_rank` state holds each rank's own values (the error-feedback residual):
/// a pipeline copy of a parameter (pp_copy, the tied LM head) keeps its own record of it, since
/// its values differ from the owning stage's.
template <class T, class Exec>
struct ParameterStates {
  /// One named state of every parameter.
  struct State {
    std::string name;
    std::vector<Tensor<T, 1, Exec>> of;
    bool defaults_to_value = false;
    bool per_rank          = false;
  };
  std::vector<State> states;
  bool* loaded = nullptr;
};

}  // namespace pmt
