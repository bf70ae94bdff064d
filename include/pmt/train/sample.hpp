// SPDX-License-Identifier: Apache-2.0
#pragma once
// sample_text: a byte-level Gpt continues a prompt, on any dp x tp x pp layout of its mesh. Each
// new byte runs the chunks in virtual-stage order round the ring of pipeline stages; the last
// stage gathers the last position's logits over tp and draws from softmax(logits / temperature)
// with the counter-based generator (the same draw on every rank and every layout); it then
// broadcasts the byte over pp. Collective over the model's tp and pp communicators.
//   const std::string text = pmt::train::sample_text(mesh, model, "Once", 160, 0.8, RngKey{seed, 4242});

#include "pmt/comm/collectives.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/core/random.hpp"
#include "pmt/nn/gpt.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace pmt::train {

namespace detail {

/// The byte drawn from the last row of `out` (this tp rank's vocabulary columns), gathered over tp.
template <class Activation, class B>
std::int32_t draw_byte(const Activation& out, const comm::Communicator<B>& tp, double temperature, const RngKey& key,
                       std::uint64_t index) {
  const std::size_t vl = out.extent(1), n = out.extent(0);
  Kokkos::View<float*, Kokkos::HostSpace> mine("pmt::train::sample_text::mine", vl),
      all("pmt::train::sample_text::all", vl * static_cast<std::size_t>(tp.size()));
  auto ho = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  for (std::size_t v = 0; v < vl; ++v) mine(v) = ho(n - 1, v);
  comm::all_gather(tp, Kokkos::DefaultHostExecutionSpace(), mine, all);
  double mx = -1e300, z = 0;
  for (std::size_t v = 0; v < all.size(); ++v) mx = std::max(mx, double(all(v)) / temperature);
  std::vector<double> prob(all.size());
  for (std::size_t v = 0; v < all.size(); ++v) z += prob[v] = std::exp(double(all(v)) / temperature - mx);
  double u      = random_uniform(key, index) * z;
  std::size_t v = 0;
  while (v + 1 < all.size() && (u -= prob[v]) > 0) ++v;
  return static_cast<std::int32_t>(v);
}

}  // namespace detail

/// `count` bytes after `prompt` (returned with it), drawn at `temperature` with `key`.
/// Collective over the mesh's tp and pp communicators; every rank returns the same text.
template <class T, class Exec, class Backend>
std::string sample_text(const Mesh<Backend>& mesh, nn::Gpt<T, Exec, Backend>& model, const std::string& prompt,
                        int count, double temperature, const RngKey& key) {
  using Model          = nn::Gpt<T, Exec, Backend>;
  using Ids            = typename Model::Ids;
  const std::size_t Tn = model.config().context, C = model.config().width;
  const auto& pp = mesh.comm(Axis::pp);
  const int s = model.stage(), P = model.stages();
  std::string text = prompt;
  for (int g = 0; g < count; ++g) {
    const std::size_t n = std::min<std::size_t>(text.size(), Tn);
    Ids ids("pmt::train::sample_text::ids", n);
    auto hi = Kokkos::create_mirror_view(ids);
    for (std::size_t t = 0; t < n; ++t) hi(t) = static_cast<unsigned char>(text[text.size() - n + t]);
    Kokkos::deep_copy(ids, hi);
    typename Model::Activation out;  // the chunks in virtual-stage order (one pass with one chunk)
    for (int k = 0; k < model.chunks(); ++k) {
      typename Model::Activation x;
      if (!model.first_chunk(k)) {
        x = typename Model::Activation("pmt::train::sample_text::x", n, C);
        comm::recv(pp, Exec(), x, (s + P - 1) % P, 21);
      }
      out = model.infer_chunk(Exec(), k, ids, x, 1, n);
      if (!model.last_chunk(k)) comm::send(pp, Exec(), out, (s + 1) % P, 21);
    }
    Kokkos::View<std::int32_t*, Kokkos::HostSpace> next("pmt::train::sample_text::next", 1);
    if (s + 1 == P)
      next(0) = detail::draw_byte(out, mesh.comm(Axis::tp), temperature, key, static_cast<std::uint64_t>(g));
    if (P > 1) comm::broadcast(pp, Kokkos::DefaultHostExecutionSpace(), next, P - 1);
    text += static_cast<char>(next(0));
  }
  return text;
}

}  // namespace pmt::train
