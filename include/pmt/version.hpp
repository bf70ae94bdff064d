// SPDX-License-Identifier: Apache-2.0
#pragma once
// pmt's version: PMT_VERSION_MAJOR/MINOR/PATCH and pmt::version() ("0.1.0").

#define PMT_VERSION_MAJOR 0
#define PMT_VERSION_MINOR 2
#define PMT_VERSION_PATCH 0

namespace pmt {

/// \brief The library version as "MAJOR.MINOR.PATCH".
inline constexpr const char* version() noexcept { return "0.2.0"; }

}  // namespace pmt
