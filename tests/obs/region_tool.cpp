// SPDX-License-Identifier: Apache-2.0
// A minimal Kokkos Tools library: counts the regions pushed, by name, and prints those starting
// with "pmt::" when Kokkos finalizes. Loaded through KOKKOS_PROFILE_LIBRARY (Kokkos 3.4) or
// KOKKOS_TOOLS_LIBS (4.x), it shows that a user's tool sees pmt's structure with no code.
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>

namespace {
std::map<std::string, long>& counts() {
  static std::map<std::string, long> c;
  return c;
}
}  // namespace

extern "C" {
void kokkosp_init_library(const int, const std::uint64_t, const std::uint32_t, void*) {}
void kokkosp_finalize_library() {
  for (const auto& [name, n] : counts())
    if (name.rfind("pmt::", 0) == 0) std::fprintf(stderr, "region_tool: %s %ld\n", name.c_str(), n);
}
void kokkosp_push_profile_region(const char* name) { ++counts()[name]; }
void kokkosp_pop_profile_region() {}
}
