// SPDX-License-Identifier: Apache-2.0
#pragma once
// Sharded checkpoints of a model's parameters and its AdamW state, crash-safe and reshardable.
// ZeroAdamW (ZeRO-1) writes and reads the same files: its moments are all-gathered over dp for
// the save, and each rank keeps its part on load, so a checkpoint moves between the two
// optimizers and between dp degrees.
//   DIR/step-00000006/shard-00003.bin   one per world rank: that rank's parameter shards and
//                                        their Adam moments (pipeline copies such as the tied
//                                        LM head are not written: the owning stage writes them)
//   DIR/step-00000006/MANIFEST          written by rank 0 last: format, step, layout, model
//                                        description, extra fields (seed, data position), and
//                                        each shard's size and CRC-32
//   DIR/LATEST                          the name of the newest complete checkpoint
// Saving: every rank writes its shard to a temporary file, fsyncs it and renames it, inside
// DIR/step-N.partial; rank 0 then writes MANIFEST the same way, fsyncs the directory, renames
// step-N.partial to step-N, fsyncs DIR, and replaces LATEST (temporary, fsync, rename, fsync).
// A crash at any moment leaves LATEST naming the previous checkpoint, whole; a directory
// without a MANIFEST, or a .partial one, is never loaded. If any rank fails, every rank raises.
// Parameters are matched by name (Parameter::name): two of one name are refused, on save before
// anything is written and on load (pmt::nn::name_parameters gives a model unique names).
// Loading verifies the CRC-32 of every shard it reads and refuses a damaged or incomplete
// checkpoint with a message naming the file, or one of another model shape or precision. With
// the same layout each rank reads its own shard; with another dp x tp x pp each rank reads the
// shards and copies, for each of its parameters (matched by global name), the overlap of its
// slice with every saved slice (GlobalSlice), so the loaded model equals the saved one.
// Shard file: "PMTSHRD1", u32 record count, records of (u32 name length, name, u32 element
// size, u64 global[2], offset[2], local[2], u64 bytes, data), little-endian as the machine.

#include "pmt/comm/collectives.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/core/error.hpp"
#include "pmt/nn/module.hpp"
#include "pmt/optim/optimizers.hpp"
#include "pmt/optim/zero.hpp"

#include <Kokkos_Core.hpp>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace pmt::io {

/// \brief What a checkpoint records besides the tensors.
struct CheckpointInfo {
  std::int64_t step = 0;                      ///< steps completed
  std::string model;                          ///< the model's shape, e.g. "gpt vocab=256 ..."; must match on load
  std::map<std::string, std::string> extra;   ///< e.g. seed, data position (one word each)
  MeshShape layout{};                         ///< filled by load: the layout it was saved with
  std::string path;                           ///< filled by save and load: the step directory
};

namespace checkpoint_detail {

inline std::uint32_t crc32(const void* data, std::size_t n, std::uint32_t crc = 0) {
  static const auto table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

[[noreturn]] inline void io_fail(const std::string& what) {
  throw IoError("pmt::io::checkpoint", what + (errno ? std::string(": ") + std::strerror(errno) : std::string()));
}

inline void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) io_fail("cannot open " + path + " to sync it");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) io_fail("cannot sync " + path);
}

/// Writes bytes to path.tmp, fsyncs, renames to path. `abort_half` is the test hook: abort()
/// after writing half of the bytes (a crash during the save).
inline void write_atomically(const std::string& path, const std::string& bytes, bool abort_half = false) {
  const std::string tmp = path + ".tmp";
  errno                 = 0;
  const int fd          = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) io_fail("cannot create " + tmp);
  std::size_t done = 0;
  const std::size_t limit = abort_half ? bytes.size() / 2 : bytes.size();
  while (done < limit) {
    const ssize_t w = ::write(fd, bytes.data() + done, limit - done);
    if (w < 0) {
      ::close(fd);
      io_fail("cannot write " + tmp);
    }
    done += static_cast<std::size_t>(w);
  }
  if (abort_half) {
    ::fsync(fd);
    std::fprintf(stderr, "pmt::io::checkpoint: PMT_CHECKPOINT_TEST_ABORT: aborting in the middle of %s\n", tmp.c_str());
    std::abort();
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    io_fail("cannot sync " + tmp);
  }
  ::close(fd);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) io_fail("cannot rename " + tmp + " to " + path);
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("pmt::io::checkpoint", path + ": cannot be read (missing file?)");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

template <class V>
void put(std::string& out, const V& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(V));
}

struct Record {
  std::string name;
  std::uint32_t elem = 0;
  std::uint64_t global[2]{}, offset[2]{}, local[2]{};
  const char* data = nullptr;
};

inline std::vector<Record> parse_shard(const std::string& file, const std::string& bytes) {
  std::size_t at = 0;
  const auto need = [&](std::size_t n) {
    if (at + n > bytes.size()) throw IoError("pmt::io::checkpoint", file + ": truncated or damaged shard");
  };
  const auto get = [&](auto& v) {
    need(sizeof(v));
    std::memcpy(&v, bytes.data() + at, sizeof(v));
    at += sizeof(v);
  };
  need(8);
  if (bytes.compare(0, 8, "PMTSHRD1") != 0) throw IoError("pmt::io::checkpoint", file + ": not a pmt shard");
  at = 8;
  std::uint32_t count = 0;
  get(count);
  std::vector<Record> out;
  for (std::uint32_t k = 0; k < count; ++k) {
    Record r;
    std::uint32_t len = 0;
    get(len);
    need(len);
    r.name.assign(bytes.data() + at, len);
    at += len;
    get(r.elem);
    for (auto* a : {r.global, r.offset, r.local}) get(a[0]), get(a[1]);
    std::uint64_t nbytes = 0;
    get(nbytes);
    need(nbytes);
    if (nbytes != r.local[0] * r.local[1] * r.elem) throw IoError("pmt::io::checkpoint", file + ": inconsistent record " + r.name);
    r.data = bytes.data() + at;
    at += nbytes;
    out.push_back(r);
  }
  return out;
}

inline std::string step_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}
inline std::string shard_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "shard-%05d.bin", rank);
  return buf;
}

/// Every rank learns whether all succeeded; the failing ranks rethrow their error, the others
/// raise one naming the failing ranks' count.
template <class Backend>
void agree(const comm::Communicator<Backend>& world, const std::exception_ptr& local_error, const std::string& what) {
  Kokkos::View<int, Kokkos::HostSpace> failed("pmt::io::failed");
  failed() = local_error ? 1 : 0;
  comm::all_reduce(world, Kokkos::DefaultHostExecutionSpace(), failed);
  if (local_error) std::rethrow_exception(local_error);
  if (failed() > 0)
    throw IoError("pmt::io::checkpoint", pmt::detail::str(what, " failed on ", failed(), " other rank(s) (see their messages)"));
}

/// Checkpoints match parameters by name: two parameters of one name (Linear's default names
/// repeat for layers of the same policy) would load each other's values. Copies of another
/// stage's parameter (pp_copy) share its name by design.
template <class T, class Exec>
void require_unique_names(const std::vector<nn::Parameter<T, Exec>*>& ps) {
  std::map<std::string, std::size_t> first;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    if (ps[i]->pp_copy) continue;
    const auto [it, fresh] = first.emplace(ps[i]->name, i);
    if (!fresh)
      throw ConfigError("pmt::io::checkpoint",
                        pmt::detail::str("parameters ", it->second, " and ", i, " are both named \"", ps[i]->name,
                                         "\"; checkpoints match parameters by name: give each its own, the same on "
                                         "every layout (pmt::nn::name_parameters)"));
  }
}

struct GlobalShape {
  std::uint64_t g[2], o[2], l[2];
};
template <class T, class Exec>
GlobalShape shape_of(const nn::Parameter<T, Exec>& p) {
  GlobalSlice s  = p.slice;
  const bool two = p.local_shape.size() > 1;
  return {{s.extent[0], two ? s.extent[1] : 1}, {s.offset[0], two ? s.offset[1] : 0},
          {p.local_shape[0], two ? p.local_shape[1] : 1}};
}

}  // namespace checkpoint_detail

/// \brief The newest complete checkpoint under `dir` (its step directory), or "" when none.
inline std::string latest_checkpoint(const std::string& dir) {
  std::ifstream in(dir + "/LATEST");
  std::string name;
  if (!(in >> name)) return {};
  return dir + "/" + name;
}

namespace checkpoint_detail {

/// ZeroAdamW's state seen as plain AdamW's: per-parameter moments, views into full flat moments.
/// For saving they are all-gathered over dp (every dp rank then writes what plain AdamW would);
/// for loading they are filled per parameter, and store() keeps the rank's part.
template <class T, class Exec, class Backend>
class ZeroAsAdamW {
 public:
  using value_type      = T;
  using execution_space = Exec;
  using Zero            = optim::ZeroAdamW<T, Exec, Backend>;
  /// For saving: collective over the dp axis.
  ZeroAsAdamW(const Zero& opt, const Exec& exec) : m_params(opt.parameters()), m_steps(opt.steps()) {
    std::tie(m_m, m_v) = opt.gathered_moments(exec);
    exec.fence();
    index();
  }
  /// For loading into `opt` (then store()).
  explicit ZeroAsAdamW(Zero& opt)
      : m_params(opt.parameters()), m_target(&opt), m_m("pmt::io::checkpoint::m", opt.padded_size()),
        m_v("pmt::io::checkpoint::v", opt.padded_size()) {
    index();
  }
  const std::vector<nn::Parameter<T, Exec>*>& parameters() const noexcept { return m_params; }
  Tensor<T, 1, Exec> exp_avg(std::size_t i) const { return part(m_m, i); }
  Tensor<T, 1, Exec> exp_avg_sq(std::size_t i) const { return part(m_v, i); }
  std::int64_t steps() const noexcept { return m_steps; }
  void set_steps(std::int64_t n) noexcept { m_steps = n; }
  void store(const Exec& exec) {
    m_target->set_moments(exec, m_m, m_v);
    m_target->set_steps(m_steps);
    exec.fence();
  }

 private:
  void index() {
    std::size_t offset = 0;
    for (auto* p : m_params) m_offset.push_back(offset), offset += p->size();
  }
  Tensor<T, 1, Exec> part(const Tensor<T, 1, Exec>& flat, std::size_t i) const {
    return Kokkos::subview(flat, std::make_pair(m_offset.at(i), m_offset[i] + m_params[i]->size()));
  }
  std::vector<nn::Parameter<T, Exec>*> m_params;
  Zero* m_target = nullptr;
  std::int64_t m_steps = 0;
  Tensor<T, 1, Exec> m_m, m_v;
  std::vector<std::size_t> m_offset;
};

template <class Opt, class Backend>
std::string save(const std::string& dir, const Mesh<Backend>& mesh, const Opt& opt, const CheckpointInfo& info) {
  using T                 = typename Opt::value_type;
  using Exec              = typename Opt::execution_space;
  namespace fs            = std::filesystem;
  const auto& world       = mesh.world();
  const int r             = world.rank();
  const std::string final_dir = dir + "/" + checkpoint_detail::step_name(info.step);
  const std::string partial   = final_dir + ".partial";
  std::exception_ptr err;
  try {
    checkpoint_detail::require_unique_names(opt.parameters());  // before anything is written
    if (r == 0) {
      std::error_code ec;
      fs::create_directories(dir, ec);
      fs::remove_all(partial, ec);
      errno = 0;
      if (!fs::create_directories(partial, ec) || ec) checkpoint_detail::io_fail("cannot create " + partial + " (" + ec.message() + ")");
    }
  } catch (...) {  // whatever it is, the other ranks must not wait for this one
    err = std::current_exception();
  }
  checkpoint_detail::agree(world, err, "creating " + partial);
  // this rank's shard
  std::uint64_t meta[2] = {0, 0};  // bytes, crc
  try {
    std::string bytes = "PMTSHRD1";
    const auto& ps = opt.parameters();
    std::vector<std::size_t> index;
    for (std::size_t i = 0; i < ps.size(); ++i)
      if (!ps[i]->pp_copy) index.push_back(i);
    checkpoint_detail::put(bytes, static_cast<std::uint32_t>(3 * index.size()));
    for (std::size_t i : index) {
      const auto& p = *ps[i];
      const auto sh = checkpoint_detail::shape_of(p);
      using Entry = std::pair<std::string, Tensor<T, 1, Exec>>;  // no braced list in a range-for: nvcc's front end trips on it
      const Entry entries[] = {Entry("param/", p.value), Entry("exp_avg/", opt.exp_avg(i)),
                               Entry("exp_avg_sq/", opt.exp_avg_sq(i))};
      for (const auto& [prefix, view] : entries) {
        const std::string name = prefix + p.name;
        checkpoint_detail::put(bytes, static_cast<std::uint32_t>(name.size()));
        bytes += name;
        checkpoint_detail::put(bytes, static_cast<std::uint32_t>(sizeof(T)));
        for (int d = 0; d < 3; ++d) {
          const auto* a = d == 0 ? sh.g : d == 1 ? sh.o : sh.l;  // global, offset, local
          checkpoint_detail::put(bytes, a[0]);
          checkpoint_detail::put(bytes, a[1]);
        }
        checkpoint_detail::put(bytes, static_cast<std::uint64_t>(view.size() * sizeof(T)));
        auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
        bytes.append(reinterpret_cast<const char*>(host.data()), host.size() * sizeof(T));
      }
    }
    // test hook "RANK:STEP": that rank aborts halfway through its shard of that step
    const char* hook = std::getenv("PMT_CHECKPOINT_TEST_ABORT");
    const bool crash = hook != nullptr && std::string(hook) == std::to_string(r) + ":" + std::to_string(info.step);
    checkpoint_detail::write_atomically(partial + "/" + checkpoint_detail::shard_name(r), bytes, crash);
    meta[0] = bytes.size();
    meta[1] = checkpoint_detail::crc32(bytes.data(), bytes.size());
  } catch (...) {  // whatever it is, the other ranks must not wait for this one
    err = std::current_exception();
  }
  checkpoint_detail::agree(world, err, "writing a shard");
  Kokkos::View<std::uint64_t*, Kokkos::HostSpace> mine(meta, 2);
  Kokkos::View<std::uint64_t*, Kokkos::HostSpace> all("pmt::io::shards", 2 * static_cast<std::size_t>(world.size()));
  comm::all_gather(world, Kokkos::DefaultHostExecutionSpace(), mine, all);
  try {
    if (r == 0) {
      const auto s = mesh.shape();
      std::ostringstream m;
      m << "pmt-checkpoint 1\nstep " << info.step << "\nlayout " << s.dp << " " << s.tp << " " << s.pp << "\nworld "
        << world.size() << "\nelement " << sizeof(T) << "\nadam_steps " << opt.steps() << "\nmodel " << info.model << "\n";
      for (const auto& [k, v] : info.extra) m << "extra " << k << " " << v << "\n";
      for (int q = 0; q < world.size(); ++q) {
        char crc[16];
        std::snprintf(crc, sizeof crc, "%08x", static_cast<unsigned>(all(2 * q + 1)));
        m << "shard " << checkpoint_detail::shard_name(q) << " " << all(2 * q) << " " << crc << "\n";
      }
      checkpoint_detail::write_atomically(partial + "/MANIFEST", m.str());
      checkpoint_detail::fsync_path(partial, true);
      std::error_code ec;
      if (fs::exists(final_dir, ec)) {  // the same step saved again: replace it
        fs::remove_all(final_dir + ".old", ec);
        fs::rename(final_dir, final_dir + ".old", ec);
      }
      errno = 0;
      if (std::rename(partial.c_str(), final_dir.c_str()) != 0) checkpoint_detail::io_fail("cannot rename " + partial + " to " + final_dir);
      checkpoint_detail::fsync_path(dir, true);
      checkpoint_detail::write_atomically(dir + "/LATEST", checkpoint_detail::step_name(info.step) + "\n");
      checkpoint_detail::fsync_path(dir, true);
      fs::remove_all(final_dir + ".old", ec);
    }
  } catch (...) {  // whatever it is, the other ranks must not wait for this one
    err = std::current_exception();
  }
  checkpoint_detail::agree(world, err, "writing the manifest");
  return final_dir;
}

template <class Opt, class Backend>
CheckpointInfo load(const std::string& step_dir, const Mesh<Backend>& mesh, Opt& opt, const std::string& expected_model) {
  using T           = typename Opt::value_type;
  const auto& world = mesh.world();
  CheckpointInfo info;
  info.path = step_dir;
  std::exception_ptr err;
  std::vector<std::pair<std::string, std::uint64_t>> shards;  // file, bytes
  std::vector<std::uint32_t> crcs;
  std::int64_t adam_steps = 0;
  int saved_world = 0;
  try {
    checkpoint_detail::require_unique_names(opt.parameters());
    const std::string manifest = step_dir + "/MANIFEST";
    std::istringstream in(checkpoint_detail::read_file(manifest));
    std::string line, key;
    bool header = false;
    std::size_t elem = 0;
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      ls >> key;
      if (key == "pmt-checkpoint") header = true;
      else if (key == "step") ls >> info.step;
      else if (key == "layout") ls >> info.layout.dp >> info.layout.tp >> info.layout.pp;
      else if (key == "world") ls >> saved_world;
      else if (key == "element") ls >> elem;
      else if (key == "adam_steps") ls >> adam_steps;
      else if (key == "model") info.model = line.size() > 6 ? line.substr(6) : "";
      else if (key == "extra") {
        std::string k, v;
        ls >> k >> v;
        info.extra[k] = v;
      } else if (key == "shard") {
        std::string file, crc;
        std::uint64_t bytes = 0;
        ls >> file >> bytes >> crc;
        shards.emplace_back(file, bytes);
        crcs.push_back(static_cast<std::uint32_t>(std::strtoul(crc.c_str(), nullptr, 16)));
      }
    }
    if (!header || saved_world <= 0 || shards.size() != static_cast<std::size_t>(saved_world))
      throw IoError("pmt::io::checkpoint", manifest + ": incomplete or damaged manifest");
    if (info.model != expected_model)
      throw IoError("pmt::io::checkpoint", pmt::detail::str(step_dir, " holds a different model: \"", info.model,
                                                             "\"; this run is \"", expected_model, "\""));
    if (elem != sizeof(T))
      throw IoError("pmt::io::checkpoint", pmt::detail::str(step_dir, " holds ", elem, "-byte values; this run uses ",
                                                             sizeof(T), "-byte values"));
    // Which shards to read: our own with the same layout (then the others only for what it does
    // not hold, e.g. the tied LM head's copy, saved by the first stage), all of them otherwise.
    const auto s    = mesh.shape();
    const bool same = s.dp == info.layout.dp && s.tp == info.layout.tp && s.pp == info.layout.pp;
    const auto& ps  = opt.parameters();
    std::vector<std::size_t> filled(ps.size(), 0);
    std::vector<std::vector<T>> hv(ps.size()), hm(ps.size()), hs(ps.size());
    std::vector<std::vector<char>> got(ps.size());  // which elements some shard provided (dp replicas repeat them)
    for (std::size_t i = 0; i < ps.size(); ++i) {
      hv[i].resize(ps[i]->size()), hm[i].resize(ps[i]->size()), hs[i].resize(ps[i]->size());
      got[i].assign(ps[i]->size(), 0);
    }
    const auto read_shard = [&](int q, const std::vector<bool>& wanted) {
      const auto& [file, size] = shards[static_cast<std::size_t>(q)];
      const std::string path   = step_dir + "/" + file;
      const std::string bytes  = checkpoint_detail::read_file(path);
      if (bytes.size() != size || checkpoint_detail::crc32(bytes.data(), bytes.size()) != crcs[static_cast<std::size_t>(q)])
        throw IoError("pmt::io::checkpoint", path + ": damaged (its size or CRC-32 differs from the manifest's)");
      for (const auto& rec : checkpoint_detail::parse_shard(path, bytes)) {
        const auto slash = rec.name.find('/');
        const std::string kind = rec.name.substr(0, slash), pname = rec.name.substr(slash + 1);
        for (std::size_t i = 0; i < ps.size(); ++i) {
          if (ps[i]->name != pname || !wanted[i]) continue;
          const auto sh = checkpoint_detail::shape_of(*ps[i]);
          if (rec.elem != sizeof(T) || rec.global[0] != sh.g[0] || rec.global[1] != sh.g[1])
            throw IoError("pmt::io::checkpoint", pmt::detail::str(path, ": ", rec.name, " has global shape (", rec.global[0], ", ",
                                                                   rec.global[1], "); the model's is (", sh.g[0], ", ", sh.g[1], ")"));
          auto& dst = kind == "param" ? hv[i] : (kind == "exp_avg" ? hm[i] : hs[i]);
          // the overlap of the saved slice [o, o + l) with ours, per dimension
          std::uint64_t lo[2], hi[2];
          bool any = true;
          for (int d = 0; d < 2; ++d) {
            lo[d] = std::max(rec.offset[d], sh.o[d]);
            hi[d] = std::min(rec.offset[d] + rec.local[d], sh.o[d] + sh.l[d]);
            any   = any && lo[d] < hi[d];
          }
          if (!any) continue;
          for (std::uint64_t a = lo[0]; a < hi[0]; ++a)  // records are not necessarily aligned: memcpy
            std::memcpy(&dst[(a - sh.o[0]) * sh.l[1] + (lo[1] - sh.o[1])],
                        rec.data + ((a - rec.offset[0]) * rec.local[1] + (lo[1] - rec.offset[1])) * sizeof(T),
                        (hi[1] - lo[1]) * sizeof(T));
          if (kind == "param")
            for (std::uint64_t a = lo[0]; a < hi[0]; ++a)
              for (std::uint64_t b = lo[1]; b < hi[1]; ++b) {
                char& g = got[i][(a - sh.o[0]) * sh.l[1] + (b - sh.o[1])];
                filled[i] += g == 0;
                g = 1;
              }
        }
      }
    };
    const auto missing = [&] {
      std::vector<bool> m(ps.size());
      bool any = false;
      for (std::size_t i = 0; i < ps.size(); ++i) any = (m[i] = filled[i] != ps[i]->size()) || any;
      return std::make_pair(any, m);
    };
    if (same) read_shard(world.rank(), std::vector<bool>(ps.size(), true));
    if (auto [any, wanted] = missing(); any)
      for (int q = 0; q < saved_world; ++q)
        if (!same || q != world.rank()) read_shard(q, wanted);
    for (std::size_t i = 0; i < ps.size(); ++i)
      if (filled[i] != ps[i]->size())
        throw IoError("pmt::io::checkpoint", pmt::detail::str(step_dir, ": parameter ", ps[i]->name, " is covered by ", filled[i],
                                                               " of its ", ps[i]->size(), " elements on this rank (a checkpoint of another model?)"));
    for (std::size_t i = 0; i < ps.size(); ++i) {
      Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> v(hv[i].data(), hv[i].size()),
          m(hm[i].data(), hm[i].size()), q(hs[i].data(), hs[i].size());
      Kokkos::deep_copy(ps[i]->value, v);
      Kokkos::deep_copy(opt.exp_avg(i), m);
      Kokkos::deep_copy(opt.exp_avg_sq(i), q);
    }
    opt.set_steps(adam_steps);
  } catch (...) {  // whatever it is, the other ranks must not wait for this one
    err = std::current_exception();
  }
  checkpoint_detail::agree(world, err, "loading " + step_dir);
  return info;
}

}  // namespace checkpoint_detail

/// \brief Saves the parameters of `opt` and its moments as step `info.step` under `dir`
/// (collective over the mesh's world; see the file comment). Returns the step directory.
/// Test hook: PMT_CHECKPOINT_TEST_ABORT=r:s makes world rank r abort() halfway through its shard
/// of step s (a crash during the save).
/// \throws pmt::IoError on every rank when any rank cannot write; pmt::ConfigError, before
/// anything is written, when two parameters share a name (the other ranks: pmt::IoError).
template <class T, class Exec, class Backend>
std::string save_checkpoint(const std::string& dir, const Mesh<Backend>& mesh, const optim::AdamW<T, Exec>& opt,
                            const CheckpointInfo& info) {
  return checkpoint_detail::save(dir, mesh, opt, info);
}

/// \brief ZeroAdamW (ZeRO-1): the same checkpoint as plain AdamW's, so either optimizer and any
/// dp degree can load it. Each dp group first all-gathers its moments (2 P values per rank for
/// the time of the save).
template <class T, class Exec, class Backend>
std::string save_checkpoint(const std::string& dir, const Mesh<Backend>& mesh,
                            const optim::ZeroAdamW<T, Exec, Backend>& opt, const CheckpointInfo& info) {
  const checkpoint_detail::ZeroAsAdamW<T, Exec, Backend> state(opt, Exec());
  return checkpoint_detail::save(dir, mesh, state, info);
}

/// \brief Loads the checkpoint in `step_dir` (e.g. latest_checkpoint(dir)) into the parameters
/// of `opt` and its moments, on any layout of the same model (see the file comment). Returns
/// what the checkpoint recorded. Collective over the mesh's world.
/// \throws pmt::IoError on every rank for a missing, incomplete or damaged checkpoint (naming the
/// file), one of another model (`expected_model` differs) or another precision; pmt::ConfigError
/// when two parameters share a name.
template <class T, class Exec, class Backend>
CheckpointInfo load_checkpoint(const std::string& step_dir, const Mesh<Backend>& mesh, optim::AdamW<T, Exec>& opt,
                               const std::string& expected_model) {
  return checkpoint_detail::load(step_dir, mesh, opt, expected_model);
}

/// \brief ZeroAdamW (ZeRO-1): loads a checkpoint of either optimizer and of any dp degree; each
/// rank keeps its part of the moments.
template <class T, class Exec, class Backend>
CheckpointInfo load_checkpoint(const std::string& step_dir, const Mesh<Backend>& mesh,
                               optim::ZeroAdamW<T, Exec, Backend>& opt, const std::string& expected_model) {
  checkpoint_detail::ZeroAsAdamW<T, Exec, Backend> state(opt);
  CheckpointInfo info = checkpoint_detail::load(step_dir, mesh, state, expected_model);
  state.store(Exec());
  return info;
}

}  // namespace pmt::io
