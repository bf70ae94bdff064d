// SPDX-License-Identifier: Apache-2.0
#pragma once
// name_parameters: layout-free names for a model's parameters (checkpoints match by name).
// pmt::Parameter (core/parameter.hpp) is also reachable as pmt::nn::Parameter.

#include "pmt/core/parameter.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace pmt::nn {

/// \brief pmt::Parameter (core/parameter.hpp), as the layers name it.
template <class T, class Exec>
using Parameter = pmt::Parameter<T, Exec>;

/// \brief Gives `params` the names prefix.0, prefix.1, ... in list order. Checkpoints match
/// parameters by name (pmt/io/checkpoint.hpp), so each parameter of a model needs a name of its
/// own that is the same on every layout; a layer's or Chain's parameters() lists the same
/// parameters in the same order on any tp degree, so these names are.
template <class T, class Exec>
void name_parameters(const std::vector<Parameter<T, Exec>*>& params, const std::string& prefix) {
  for (std::size_t j = 0; j < params.size(); ++j) params[j]->name = prefix + "." + std::to_string(j);
}

}  // namespace pmt::nn
