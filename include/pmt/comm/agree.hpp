// SPDX-License-Identifier: Apache-2.0
#pragma once
// agree_on_errors: one rank's exception becomes an error on every rank (no rank is left waiting).
// agree_on_text: every rank must hold the same text (a command line, a configuration): the ranks
// that differ from rank 0 are named in one pmt::ConfigError, raised on every rank.
// agree_choices: turns the measured choices (core/measured_choice.hpp) that any rank of a job
// holds pending into decisions that are the same on every rank. Collective over `world`, which
// must be the job's whole world (process_context().size ranks); on a smaller communicator it
// decides nothing and communicates nothing, since ranks outside it could not take part.
//
// Three all-reduces of host values: the largest pending count, every rank's pending keys (each
// rank writes its own slot of a zeroed table, so a sum gathers them), and per key of their union
// the summed seconds of each path and the number of ranks that measured it. A key's path is the
// one with the smaller mean; ties keep the default path.

#include "pmt/comm/collectives.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/failure.hpp"
#include "pmt/core/measured_choice.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <map>
#include <string>
#include <vector>

namespace pmt::comm {

/// \brief Collective over `world`: every rank learns whether any rank holds an error. A rank
/// holding one rethrows it; the others raise pmt::IoError(op, "<what> failed on N other rank(s);
/// rank R: <R's message>"), R the lowest failing rank (its message cut at 2,000 characters), so
/// no rank goes on into a collective the others will not enter and every rank can say why.
template <class B>
void agree_on_errors(const Communicator<B>& world, const std::exception_ptr& local_error, const char* op,
                     const std::string& what) {
  const auto host = Kokkos::DefaultHostExecutionSpace();
  Kokkos::View<int*, Kokkos::HostSpace> failed("pmt::comm::agree_on_errors", 2);
  failed(0) = local_error ? 1 : 0;
  failed(1) = local_error ? -world.rank() : -world.size();  // max: minus the lowest failing rank
  all_reduce(world, host, failed, ReduceOp::Max);
  if (failed(0) == 0) return;  // every rank alike: nothing more to say
  // how many failed, and the lowest failing rank's message, to every rank
  Kokkos::View<int, Kokkos::HostSpace> count("pmt::comm::agree_on_errors::count");
  count() = local_error ? 1 : 0;
  all_reduce(world, host, count);
  const int first           = -failed(1);
  constexpr std::size_t cap = 2000;
  Kokkos::View<std::int8_t*, Kokkos::HostSpace> text("pmt::comm::agree_on_errors::text", cap);
  if (world.rank() == first) {
    const std::string message = pmt::detail::message_of(local_error);
    for (std::size_t i = 0; i < message.size() && i + 1 < cap; ++i) text(i) = static_cast<std::int8_t>(message[i]);
  }
  broadcast(world, host, text, first);
  if (local_error) std::rethrow_exception(local_error);
  std::string message;
  for (std::size_t i = 0; i < cap && text(i) != 0; ++i) message += static_cast<char>(text(i));
  throw IoError(op, pmt::detail::str(what, " failed on ", count(), " other rank(s); rank ", first, ": ", message));
}

/// \brief FNV-1a 64-bit hash of `text` (the same on every machine).
inline std::uint64_t text_hash(const std::string& text) noexcept {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

/// \brief Collective over `world`: raises pmt::ConfigError(op, ...) on every rank when some rank's
/// `text` differs from rank 0's, naming those ranks (up to 16) and `what` the text is ("the
/// command line", "the model configuration"). Only a 64-bit hash of each text travels.
template <class B>
void agree_on_text(const Communicator<B>& world, const std::string& text, const char* op, const std::string& what) {
  const std::uint64_t h = text_hash(text);
  Kokkos::View<double*, Kokkos::HostSpace> mine("pmt::comm::agree_on_text::mine", 2),
      all("pmt::comm::agree_on_text::all", 2 * static_cast<std::size_t>(world.size()));
  mine(0) = double(h >> 32), mine(1) = double(h & 0xffffffffu);  // exact in doubles
  all_gather(world, Kokkos::DefaultHostExecutionSpace(), mine, all);
  std::vector<int> differ;
  for (int q = 1; q < world.size(); ++q)
    if (all(2 * q) != all(0) || all(2 * q + 1) != all(1)) differ.push_back(q);
  if (differ.empty()) return;
  std::string list;
  for (std::size_t i = 0; i < differ.size() && i < 16; ++i) list += (i ? ", " : "") + std::to_string(differ[i]);
  if (differ.size() > 16) list += ", ...";
  throw ConfigError(op, detail::str("the ranks hold different ", what, ": rank", differ.size() == 1 ? " " : "s ", list,
                                    differ.size() == 1 ? " differs" : " differ",
                                    " from rank 0 (every rank needs the same ", what, ")"));
}

/// \brief Decides, identically on every rank, every measured choice that any rank holds pending.
/// Collective over `world` when it is the job's whole world; returns the number of keys decided.
template <class B, class Exec>
int agree_choices(const Communicator<B>& world, const Exec& exec) {
  if (world.size() != detail::process_context().size) return 0;
  std::vector<std::pair<ChoiceKey, Choice>> mine;
  for (const auto& e : measured_choices())
    if (!e.second.decided()) mine.push_back(e);
  using HostI = Kokkos::View<std::int64_t*, Kokkos::HostSpace>;
  using HostD = Kokkos::View<double*, Kokkos::HostSpace>;
  HostI count("pmt::comm::agree_choices::count", 1);
  count(0) = static_cast<std::int64_t>(mine.size());
  all_reduce_host_values(world, exec, count, ReduceOp::Max);
  const std::int64_t most = count(0);
  if (most == 0) return 0;
  const std::int64_t n = world.size(), r = world.rank();
  HostI keys("pmt::comm::agree_choices::keys", static_cast<std::size_t>(n * most * 4));
  for (std::size_t i = 0; i < mine.size(); ++i) {
    const std::size_t at = static_cast<std::size_t>((r * most + static_cast<std::int64_t>(i)) * 4);
    keys(at)             = 1;  // slot used
    keys(at + 1)         = mine[i].first.op;
    keys(at + 2)         = mine[i].first.a;
    keys(at + 3)         = mine[i].first.b;
  }
  all_reduce_host_values(world, exec, keys);
  std::vector<ChoiceKey> all;
  for (std::size_t at = 0; at < keys.size(); at += 4)
    if (keys(at) == 1) all.push_back(ChoiceKey{keys(at + 1), keys(at + 2), keys(at + 3)});
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  // per key: the summed seconds of path 0 and path 1, the ranks that measured it and their
  // summed flops (means once divided by the ranks; the shape string for reports stays local)
  const std::map<ChoiceKey, Choice> local(mine.begin(), mine.end());
  HostD sums("pmt::comm::agree_choices::sums", all.size() * 4);
  for (std::size_t i = 0; i < all.size(); ++i)
    if (const auto it = local.find(all[i]); it != local.end()) {
      sums(4 * i)     = it->second.seconds[0];
      sums(4 * i + 1) = it->second.seconds[1];
      sums(4 * i + 2) = 1;
      sums(4 * i + 3) = it->second.flops;
    }
  all_reduce_host_values(world, exec, sums);
  std::vector<std::pair<ChoiceKey, Choice>> decided;
  for (std::size_t i = 0; i < all.size(); ++i) {
    Choice c;
    const double ranks = sums(4 * i + 2);
    c.seconds[0]       = sums(4 * i) / ranks;
    c.seconds[1]       = sums(4 * i + 1) / ranks;
    c.flops            = sums(4 * i + 3) / ranks;
    c.path             = c.seconds[1] < c.seconds[0] ? 1 : 0;
    c.state            = Choice::State::Agreed;
    if (const auto it = local.find(all[i]); it != local.end()) c.shape = it->second.shape;
    decided.emplace_back(all[i], c);
  }
  set_measured_choices(decided);
  return static_cast<int>(decided.size());
}

}  // namespace pmt::comm
