// SPDX-License-Identifier: Apache-2.0
#pragma once
// Part of the run harness (pmt/run.hpp): programs include it; the library never does.
// parameter_fingerprint: one number that sums up a model's parameters independently of the
// layout, to check that two runs (a saved and a resumed one, one rank and a dp x tp x pp layout)
// hold the same model: sum over every element of the global model of value * w(global index,
// name), each element counted once (tp-replicated parameters on tp rank 0 only, pipeline copies
// not at all, dp replicas on dp rank 0 only), summed over the mesh's world. Equal models give
// fingerprints equal to rounding (the sum's order differs between layouts); a changed element
// changes it. Collective over the mesh's world; values are read on the host.

#include "pmt/comm/collectives.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/core/parameter.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pmt::run {

/// \brief The layout-free fingerprint of `params` (this rank's, e.g. a model's parameters()).
template <class T, class Exec, class Backend>
double parameter_fingerprint(const Mesh<Backend>& mesh, const std::vector<Parameter<T, Exec>*>& params) {
  Kokkos::View<double, Kokkos::HostSpace> fp("pmt::run::parameter_fingerprint");
  const bool counts = mesh.coord(Axis::dp) == 0;  // dp replicas hold the same values
  for (auto* p : params) {
    if (!counts || p->pp_copy || (p->tp_replicated && mesh.coord(Axis::tp) != 0)) continue;
    auto h                   = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), p->value);
    const bool matrix        = p->local_shape.size() > 1;
    const std::size_t cols   = matrix ? p->local_shape[1] : 1;
    const std::uint64_t gcol = matrix ? p->slice.extent[1] : 1;
    double name_weight       = 1;
    for (unsigned char c : p->name) name_weight += double(c % 7) / 64;
    for (std::size_t i = 0; i < h.size(); ++i) {
      const std::uint64_t g = (p->slice.offset[0] + i / cols) * gcol + (matrix ? p->slice.offset[1] + i % cols : 0);
      fp() += double(h(i)) * (1.0 + double((g * 2654435761u) % 1000) / 1000.0) * name_weight;
    }
  }
  comm::all_reduce(mesh.world(), Kokkos::DefaultHostExecutionSpace(), fp);
  return fp();
}

}  // namespace pmt::run

namespace pmt::parallel {
/// \brief Deprecated (0.2): pmt::run::parameter_fingerprint.
template <class T, class Exec, class Backend>
[[deprecated("moved to pmt::run::parameter_fingerprint (pmt/run/fingerprint.hpp)")]] double parameter_fingerprint(
    const Mesh<Backend>& mesh, const std::vector<Parameter<T, Exec>*>& params) {
  return run::parameter_fingerprint(mesh, params);
}
}  // namespace pmt::parallel
