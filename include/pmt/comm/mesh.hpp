// SPDX-License-Identifier: Apache-2.0
#pragma once
// Mesh: a world communicator arranged as dp x tp x pp. Rank order: tp varies fastest, then dp, then
// pp (world rank = tp_i + tp * (dp_i + dp * pp_i)), so a tp group sits on one node. One
// sub-communicator per axis is split once at construction and reused.

#include "pmt/comm/backend.hpp"
#include "pmt/comm/communicator.hpp"
#include "pmt/core/error.hpp"
#include "pmt/policy/axis.hpp"

#include <array>
#include <string>
#include <vector>

namespace pmt {

/// \brief The degrees of a mesh; their product must equal the world size.
struct MeshShape {
  int dp = 1, tp = 1, pp = 1;
};

// ---------------------------------------------------------------------------------------------

/// \brief A world communicator arranged as dp x tp x pp (see the file comment).
/// \code
/// pmt::comm::Communicator<pmt::comm::Mpi> world(MPI_COMM_WORLD);
/// pmt::Mesh mesh(world, pmt::MeshShape{/*dp=*/2, /*tp=*/2, /*pp=*/1});
/// pmt::comm::all_reduce(mesh.comm(pmt::Axis::tp), exec, partial_sums);
/// \endcode
/// \throws pmt::ConfigError naming every factor when dp * tp * pp != world size or a degree < 1.
template <class Backend>
class Mesh {
 public:
  Mesh(const comm::Communicator<Backend>& world, MeshShape shape) : m_world(world), m_shape(shape) {
    const int n = world.size();
    detail::require<ConfigError>(shape.dp >= 1 && shape.tp >= 1 && shape.pp >= 1, "pmt::Mesh", [&] {
      return detail::str("dp(", shape.dp, "), tp(", shape.tp, "), pp(", shape.pp, "): every degree must be >= 1");
    });
    detail::require<ConfigError>(static_cast<long>(shape.dp) * shape.tp * shape.pp == n, "pmt::Mesh", [&] {
      return detail::str("dp(", shape.dp, ") * tp(", shape.tp, ") * pp(", shape.pp,
                         ") = ", static_cast<long>(shape.dp) * shape.tp * shape.pp, " != world size ", n);
    });
    const int r    = world.rank();
    m_coord        = {r / shape.tp % shape.dp, r % shape.tp, r / (shape.tp * shape.dp)};  // dp, tp, pp
    const int dp_i = m_coord[0], tp_i = m_coord[1], pp_i = m_coord[2];
    // In index order (dp, tp, pp), the same on every rank: each split is collective over the world.
    // The color names the other two coordinates; the key orders the group by this axis.
    m_axis_comm.reserve(3);
    m_axis_comm.push_back(world.split(tp_i + shape.tp * pp_i, dp_i));  // dp group
    m_axis_comm.push_back(world.split(dp_i + shape.dp * pp_i, tp_i));  // tp group
    m_axis_comm.push_back(world.split(tp_i + shape.tp * dp_i, pp_i));  // pp group
  }

  const comm::Communicator<Backend>& world() const noexcept { return m_world; }
  /// \brief The communicator of this rank's group along `a` (its ranks differ only in `a`).
  const comm::Communicator<Backend>& comm(Axis a) const noexcept { return m_axis_comm[index(a)]; }
  /// \brief The size of axis `a`.
  int degree(Axis a) const noexcept { return a == Axis::dp ? m_shape.dp : (a == Axis::tp ? m_shape.tp : m_shape.pp); }
  /// \brief This rank's index along axis `a`.
  int coord(Axis a) const noexcept { return m_coord[index(a)]; }
  MeshShape shape() const noexcept { return m_shape; }
  /// \brief The world rank at mesh coordinates (dp, tp, pp).
  int world_rank_of(int dp, int tp, int pp) const noexcept { return tp + m_shape.tp * (dp + m_shape.dp * pp); }
  bool is_root() const noexcept { return m_world.rank() == 0; }
  /// \brief "dp 1/2, tp 0/2, pp 0/1": this rank's place, for messages.
  std::string where() const {
    return detail::str("dp ", coord(Axis::dp), "/", m_shape.dp, ", tp ", coord(Axis::tp), "/", m_shape.tp, ", pp ",
                       coord(Axis::pp), "/", m_shape.pp);
  }

 private:
  static constexpr std::size_t index(Axis a) { return static_cast<std::size_t>(a); }  // dp 0, tp 1, pp 2

  comm::Communicator<Backend> m_world;
  MeshShape m_shape;
  std::array<int, 3> m_coord{};
  std::vector<comm::Communicator<Backend>> m_axis_comm;  // indexed by Axis
};

}  // namespace pmt
