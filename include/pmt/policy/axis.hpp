// SPDX-License-Identifier: Apache-2.0
#pragma once
// Mesh axes (dp, tp, pp), the split directions of a tensor-parallel layer (Col, Row), and the
// `dynamic` sentinel for degrees known only at run time. Policy headers never include MPI or NCCL.

namespace pmt {

/// \brief The three mesh axes: data, tensor and pipeline parallel.
enum class Axis { dp, tp, pp };

/// \brief "dp", "tp" or "pp".
inline constexpr const char* to_string(Axis a) { return a == Axis::dp ? "dp" : (a == Axis::tp ? "tp" : "pp"); }

/// \brief Column split: a weight (in, out) is split along out; the output stays sharded.
struct Col {};
/// \brief Row split: a weight (in, out) is split along in; partial outputs are all-reduced.
struct Row {};
/// \brief Model-level tensor split: each layer chooses Col or Row.
struct AutoSplit {};
/// \brief Model-level tensor split with sequence parallelism: each layer chooses Col or Row, and
/// the activations between the tensor-parallel regions hold 1/tp of the rows (tokens) per rank.
struct Sequence {};

/// \brief A degree fixed only at run time (read from the Mesh), as in Pipeline<>.
inline constexpr int dynamic = -1;

}  // namespace pmt
