// SPDX-License-Identifier: Apache-2.0
#pragma once
// The run's timeline as one Chrome-trace / Perfetto JSON: every rank's recorded events
// (core/instrument.hpp) gathered on rank 0, clocks aligned, one process per rank (named with its
// mesh coordinates), one thread per track (compute, p2p, collectives, optimizer), flow arrows from
// each pipeline send to its receive.
//   pmt::TraceRecorder::instance().enable();   ... train ...
//   pmt::obs::write_trace(mesh, "run.json");   // collective; rank 0 writes
// Clock alignment: rank r's events are shifted by its clock's offset to rank 0's, estimated from
// ping-pongs with rank 0 (the shortest round trip's midpoint), so the ranks' time axes agree to
// half a round trip (microseconds).

#include "pmt/comm/collectives.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/instrument.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace pmt::obs {

/// \brief A rank's events with its clock offset applied (seconds on rank 0's clock).
struct RankTrace {
  int rank = 0;
  std::string where;  ///< "dp 0/2, tp 1/2, pp 0/1"
  std::vector<TraceEvent> events;
};

namespace detail {

inline std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) o += c;
  }
  return o;
}

// events <-> bytes: name length, name, track, begin, end, flow_out, flow_in
inline void pack(std::string& out, const TraceEvent& e) {
  const auto put = [&](const auto& v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(static_cast<std::uint32_t>(e.name.size()));
  out += e.name;
  put(static_cast<std::int32_t>(e.track));
  put(e.begin), put(e.end), put(e.flow_out), put(e.flow_in);
}
inline std::vector<TraceEvent> unpack(const char* p, std::size_t n) {
  std::vector<TraceEvent> out;
  std::size_t at = 0;
  const auto get = [&](auto& v) {
    std::memcpy(&v, p + at, sizeof(v));
    at += sizeof(v);
  };
  while (at < n) {
    TraceEvent e;
    std::uint32_t len = 0;
    get(len);
    e.name.assign(p + at, len);
    at += len;
    std::int32_t track = 0;
    get(track);
    e.track = static_cast<Track>(track);
    get(e.begin), get(e.end), get(e.flow_out), get(e.flow_in);
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace detail

namespace detail {

/// Seconds to add to this rank's clock to get rank 0's (0 on rank 0), from `rounds` ping-pongs
/// with rank 0, one rank at a time: each gives rank 0's time against the midpoint of the round
/// trip, and the shortest round trip is kept, so the error is at most half of it (NTP's estimate;
/// microseconds). A barrier-and-broadcast estimate is off by however late a rank leaves the
/// barrier, which on an oversubscribed node is a scheduler time slice.
template <class Comm>
double clock_offset_to_root(const Comm& world, int rounds = 8) {
  const auto host = Kokkos::DefaultHostExecutionSpace();
  Kokkos::View<double, Kokkos::HostSpace> t("pmt::obs::clock");
  double offset = 0, best = 1e300;
  for (int q = 1; q < world.size(); ++q)
    for (int k = 0; k < rounds; ++k) {
      if (world.rank() == 0) {
        comm::recv(world, host, t, q, 44);
        t() = TraceRecorder::now();
        comm::send(world, host, t, q, 45);
      } else if (world.rank() == q) {
        const double sent = TraceRecorder::now();
        t()               = sent;
        comm::send(world, host, t, 0, 44);
        comm::recv(world, host, t, 0, 45);
        const double back = TraceRecorder::now();
        if (back - sent < best) {
          best   = back - sent;
          offset = t() - 0.5 * (sent + back);
        }
      }
    }
  return offset;
}

}  // namespace detail

/// \brief Gathers every rank's recorded events on rank 0, clocks aligned (empty elsewhere).
/// Collective over the mesh's world.
template <class Backend>
std::vector<RankTrace> gather_trace(const Mesh<Backend>& mesh) {
  const auto& world   = mesh.world();
  const auto host     = Kokkos::DefaultHostExecutionSpace();
  const double offset = detail::clock_offset_to_root(world);
  std::string bytes;
  for (const auto& e : TraceRecorder::instance().events()) {
    TraceEvent a = e;
    a.begin += offset, a.end += offset;
    detail::pack(bytes, a);
  }
  std::vector<RankTrace> all;
  Kokkos::View<std::uint64_t, Kokkos::HostSpace> len("pmt::obs::len");
  if (world.rank() == 0) {
    all.push_back({0, mesh.where(), detail::unpack(bytes.data(), bytes.size())});
    for (int q = 1; q < world.size(); ++q) {
      comm::recv(world, host, len, q, 41);
      Kokkos::View<char*, Kokkos::HostSpace> buf("pmt::obs::buf", len());
      Kokkos::View<char*, Kokkos::HostSpace> where("pmt::obs::where", 64);
      comm::recv(world, host, buf, q, 42);
      comm::recv(world, host, where, q, 43);
      all.push_back({q, std::string(where.data()), detail::unpack(buf.data(), buf.size())});
    }
  } else {
    len() = bytes.size();
    comm::send(world, host, len, 0, 41);
    Kokkos::View<char*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> buf(bytes.data(), bytes.size());
    comm::send(world, host, buf, 0, 42);
    Kokkos::View<char*, Kokkos::HostSpace> where("pmt::obs::where", 64);
    const std::string w = mesh.where().substr(0, 63);
    std::copy(w.begin(), w.end(), where.data());
    comm::send(world, host, where, 0, 43);
  }
  return all;
}

/// \brief The Chrome-trace JSON of gathered traces (times in µs from the earliest event).
inline std::string trace_json(const std::vector<RankTrace>& all) {
  double origin = 1e300;
  for (const auto& r : all)
    for (const auto& e : r.events) origin = std::min(origin, e.begin);
  std::ostringstream o;
  o.precision(15);
  o << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first     = true;
  const auto sep = [&] {
    if (!first) o << ",\n";
    first = false;
  };
  for (const auto& r : all) {
    sep();
    o << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << r.rank << ",\"args\":{\"name\":\"rank " << r.rank << " ("
      << detail::escape(r.where) << ")\"}}";
    for (int t = 0; t < track_count; ++t) {
      sep();
      o << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" << r.rank << ",\"tid\":" << t << ",\"args\":{\"name\":\""
        << track_name(static_cast<Track>(t)) << "\"}}";
    }
    for (const auto& e : r.events) {
      const double ts = (e.begin - origin) * 1e6, dur = (e.end - e.begin) * 1e6;
      const int tid = static_cast<int>(e.track);
      sep();
      o << "{\"name\":\"" << detail::escape(e.name) << "\",\"cat\":\"" << track_name(e.track)
        << "\",\"ph\":\"X\",\"pid\":" << r.rank << ",\"tid\":" << tid << ",\"ts\":" << ts << ",\"dur\":" << dur << "}";
      if (e.flow_out >= 0) {
        sep();
        o << "{\"name\":\"p2p\",\"cat\":\"flow\",\"ph\":\"s\",\"id\":" << e.flow_out << ",\"pid\":" << r.rank
          << ",\"tid\":" << tid << ",\"ts\":" << ts << "}";
      }
      if (e.flow_in >= 0) {
        sep();
        o << "{\"name\":\"p2p\",\"cat\":\"flow\",\"ph\":\"f\",\"bp\":\"e\",\"id\":" << e.flow_in
          << ",\"pid\":" << r.rank << ",\"tid\":" << tid << ",\"ts\":" << ts + dur << "}";
      }
    }
  }
  o << "\n]}\n";
  return o.str();
}

/// \brief Writes this rank's own recorded events to `path`, without communicating: what a rank
/// keeps when it cannot reach the others (an error on this rank alone). `where` names its place
/// ("dp 0/2, tp 1/2, pp 0/1", or "").
/// \throws pmt::IoError when the file cannot be written.
inline void write_rank_trace(const std::string& path, int rank, const std::string& where) {
  std::ofstream out(path);
  out << trace_json({RankTrace{rank, where, TraceRecorder::instance().events()}});
  pmt::detail::require<IoError>(static_cast<bool>(out), "pmt::obs::write_rank_trace",
                                [&] { return path + ": cannot be written"; });
}

/// \brief Gathers the trace and writes it to `path` on rank 0. Collective.
/// \throws pmt::IoError on rank 0 when the file cannot be written.
template <class Backend>
void write_trace(const Mesh<Backend>& mesh, const std::string& path) {
  const auto all = gather_trace(mesh);
  if (mesh.world().rank() != 0) return;
  std::ofstream out(path);
  out << trace_json(all);
  pmt::detail::require<IoError>(static_cast<bool>(out), "pmt::obs::write_trace",
                                [&] { return path + ": cannot be written"; });
}

}  // namespace pmt::obs
