// SPDX-License-Identifier: Apache-2.0
#pragma once
// Sharded checkpoints of a model's parameters and its optimizer state, crash-safe and
// reshardable: AdamW (moments exp_avg, exp_avg_sq and the step count), Sgd (the momentum
// buffers), or the weights only (save_weights / load_weights: no optimizer). ZeroAdamW (ZeRO-1)
// and Zero2AdamW (ZeRO-2) write and read AdamW's files: their moments are all-gathered over dp for
// the save, and each rank keeps its part on load, so a checkpoint moves between the three
// optimizers and between dp degrees. The manifest names the optimizer ("optimizer adamw|sgd|none"); loading into
// another optimizer is refused, and load_weights takes the parameters of any checkpoint. Named per-parameter states
// beside the optimizer's (ParameterStates: a Trainer's state(), e.g. DiLoCo's outer anchor and momentum, the residual
// of compressed gradients) travel as records of their own kind; a checkpoint without them loads them as zeros (or as
// the parameters, where the state says).
//   DIR/step-00000006/shard-00003.bin   one per world rank: that rank's parameter shards and
//                                        their Adam moments (pipeline copies such as the tied
//                                        LM head are not written: the owning stage writes them;
//                                        a copy writes only its own values of per-rank states,
//                                        "grad_residual@copy/NAME", read back on the same layout)
//   DIR/step-00000006/MANIFEST          written by rank 0 last: format, step, layout, model
//                                        description, extra fields (seed, data position), each
//                                        shard's size and CRC-32, and last its own checksum
//   DIR/LATEST                          the name of the newest complete checkpoint
//   DIR/LOCK                            "pid host" of the one run writing DIR (pmt::run::DirectoryLock,
//   pmt/run/lock.hpp)
// Saving: every rank writes its shard to a temporary file, fsyncs it and renames it, inside
// DIR/step-N.partial; rank 0 then writes MANIFEST the same way, fsyncs the directory, renames
// step-N.partial to step-N, fsyncs DIR, and replaces LATEST (temporary, fsync, rename, fsync).
// A crash at any moment leaves LATEST naming the previous checkpoint, whole; a directory
// without a MANIFEST, or a .partial one, is never loaded. If any rank fails, every rank raises.
// Parameters are matched by name (Parameter::name): two of one name are refused, on save before
// anything is written and on load (pmt::nn::name_parameters gives a model unique names).
// Loading verifies the manifest's checksum and, before reading a shard, its size; then the CRC-32
// of every shard it reads, and every record's sizes (against overflow and the global shape)
// before any of its bytes is used. It refuses a damaged, incomplete or crafted checkpoint with a
// message naming the file, or one of another model shape or precision. A save refuses
// parameters or moments holding nan or inf (LATEST keeps naming the last good checkpoint).
// Managing a directory: verify_checkpoint, checkpoint_steps, resumable_checkpoint (LATEST, or
// the newest step that verifies), prune_checkpoints (--keep N), remove_stale_partials. With
// the same layout each rank reads its own shard; with another dp x tp x pp each rank reads the
// shards and copies, for each of its parameters (matched by global name), the overlap of its
// slice with every saved slice (GlobalSlice), so the loaded model equals the saved one.
// Shard file: "PMTSHRD1", u32 record count, records of (u32 name length, name, u32 element
// size, u64 global[2], offset[2], local[2], u64 bytes, data), little-endian as the machine.

#include "pmt/comm/agree.hpp"
#include "pmt/comm/collectives.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/parameter.hpp"
#include "pmt/optim/optimizers.hpp"
#include "pmt/optim/zero.hpp"
#include "pmt/optim/zero2.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
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
#include <signal.h>
#include <unistd.h>

namespace pmt::io {

/// \brief What a checkpoint records besides the tensors.
struct CheckpointInfo {
  std::int64_t step = 0;                     ///< steps completed
  std::string model;                         ///< the model's shape, e.g. "gpt vocab=256 ..."; must match on load
  std::map<std::string, std::string> extra;  ///< e.g. seed, data position (one word each)
  MeshShape layout{};                        ///< filled by load: the layout it was saved with
  std::string path;                          ///< filled by save and load: the step directory
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
  crc           = ~crc;
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
  std::size_t done        = 0;
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

/// a * b, or false when it overflows 64 bits.
inline bool mul_ok(std::uint64_t a, std::uint64_t b, std::uint64_t& out) { return !__builtin_mul_overflow(a, b, &out); }

/// The records of a shard. Every size is checked before a byte of data is used: lengths against
/// the bytes left (no arithmetic that can wrap), the element size, each slice inside its global
/// shape, and the data size against local[0] x local[1] x element without overflow.
inline std::vector<Record> parse_shard(const std::string& file, const std::string& bytes) {
  std::size_t at  = 0;
  const auto need = [&](std::uint64_t n) {
    if (n > bytes.size() - at) throw IoError("pmt::io::checkpoint", file + ": truncated or damaged shard");
  };
  const auto get = [&](auto& v) {
    need(sizeof(v));
    std::memcpy(&v, bytes.data() + at, sizeof(v));
    at += sizeof(v);
  };
  need(8);
  if (bytes.compare(0, 8, "PMTSHRD1") != 0) throw IoError("pmt::io::checkpoint", file + ": not a pmt shard");
  at                  = 8;
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
    std::uint64_t nbytes = 0, elems = 0, want = 0;
    get(nbytes);
    const auto bad = [&](const std::string& why) {
      return IoError("pmt::io::checkpoint",
                     pmt::detail::str(file, ": record ", k, " (", r.name, ") is damaged: ", why));
    };
    if (r.elem != 2 && r.elem != 4 && r.elem != 8) throw bad(pmt::detail::str("element size ", r.elem));
    for (int d = 0; d < 2; ++d)
      if (r.offset[d] > r.global[d] || r.local[d] > r.global[d] - r.offset[d])
        throw bad(pmt::detail::str("slice [", r.offset[d], ", +", r.local[d], ") of dimension ", d,
                                   " is outside its global extent ", r.global[d]));
    if (!mul_ok(r.local[0], r.local[1], elems) || !mul_ok(elems, r.elem, want) || nbytes != want)
      throw bad(pmt::detail::str(nbytes, " data bytes for a (", r.local[0], ", ", r.local[1], ") slice of ", r.elem,
                                 "-byte values"));
    need(nbytes);
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

/// A parsed MANIFEST.
struct Manifest {
  std::int64_t step = 0, adam_steps = 0;
  std::string optimizer = "adamw";  // manifests before the optimizer line held AdamW state
  MeshShape layout{};
  int world        = 0;
  std::size_t elem = 0;
  std::string model;
  std::map<std::string, std::string> extra;
  std::vector<std::pair<std::string, std::uint64_t>> shards;  // file, bytes
  std::vector<std::uint32_t> crcs;
};

/// The manifest text's own checksum line: "checksum XXXXXXXX" over every byte before it.
inline std::string manifest_checksum_line(const std::string& text) {
  char line[32];
  std::snprintf(line, sizeof line, "checksum %08x\n", static_cast<unsigned>(crc32(text.data(), text.size())));
  return line;
}

/// Reads and checks step_dir/MANIFEST: its checksum (the last line), its header, and a shard
/// entry for every rank of the saved world, with names of the form shard-NNNNN.bin.
inline Manifest read_manifest(const std::string& step_dir) {
  const std::string path = step_dir + "/MANIFEST";
  const std::string text = read_file(path);
  const auto damaged     = [&](const std::string& why) {
    return IoError("pmt::io::checkpoint", path + ": damaged manifest (" + why + ")");
  };
  const std::size_t last = text.size() >= 2 ? text.rfind('\n', text.size() - 2) : std::string::npos;
  const std::size_t body = last == std::string::npos ? 0 : last + 1;
  if (text.compare(body, 9, "checksum ") != 0)
    throw damaged("no checksum line at its end: truncated, or written by another program");
  if (text.substr(body) != manifest_checksum_line(text.substr(0, body)))
    throw damaged("its checksum does not match its text");
  Manifest m;
  std::istringstream in(text.substr(0, body));
  std::string line, key;
  bool header = false;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    ls >> key;
    if (key == "pmt-checkpoint")
      header = true;
    else if (key == "step")
      ls >> m.step;
    else if (key == "layout")
      ls >> m.layout.dp >> m.layout.tp >> m.layout.pp;
    else if (key == "world")
      ls >> m.world;
    else if (key == "element")
      ls >> m.elem;
    else if (key == "adam_steps")
      ls >> m.adam_steps;
    else if (key == "optimizer")
      ls >> m.optimizer;
    else if (key == "model")
      m.model = line.size() > 6 ? line.substr(6) : "";
    else if (key == "extra") {
      std::string k, v;
      ls >> k >> v;
      m.extra[k] = v;
    } else if (key == "shard") {
      std::string file, crc;
      std::uint64_t bytes = 0;
      ls >> file >> bytes >> crc;
      if (file != shard_name(static_cast<int>(m.shards.size()))) throw damaged("shard entry '" + line + "'");
      m.shards.emplace_back(file, bytes);
      m.crcs.push_back(static_cast<std::uint32_t>(std::strtoul(crc.c_str(), nullptr, 16)));
    }
  }
  if (!header || m.world <= 0 || m.shards.size() != static_cast<std::size_t>(m.world) || m.step < 0)
    throw damaged("incomplete header or shard list");
  return m;
}

/// A shard's bytes, after checking that it is a regular file of the manifest's size (before
/// reading it) and that its CRC-32 matches.
inline std::string read_shard_file(const std::string& step_dir, const Manifest& m, int q) {
  namespace fs             = std::filesystem;
  const auto& [file, size] = m.shards[static_cast<std::size_t>(q)];
  const std::string path   = step_dir + "/" + file;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw IoError("pmt::io::checkpoint", path + ": missing (or not a regular file)");
  const auto on_disk = fs::file_size(path, ec);
  if (ec || on_disk != size)
    throw IoError("pmt::io::checkpoint",
                  pmt::detail::str(path, ": damaged (",
                                   ec ? std::string("its size cannot be read") : pmt::detail::str(on_disk, " bytes"),
                                   ", the manifest says ", size, ")"));
  const std::string bytes = read_file(path);
  if (bytes.size() != size || crc32(bytes.data(), bytes.size()) != m.crcs[static_cast<std::size_t>(q)])
    throw IoError("pmt::io::checkpoint", path + ": damaged (its size or CRC-32 differs from the manifest's)");
  return bytes;
}

/// Checkpoints match parameters by name: two parameters of one name (Linear's default names
/// repeat for layers of the same policy) would load each other's values. Copies of another
/// stage's parameter (pp_copy) share its name by design.
template <class T, class Exec>
void require_unique_names(const std::vector<Parameter<T, Exec>*>& ps) {
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
GlobalShape shape_of(const Parameter<T, Exec>& p) {
  GlobalSlice s  = p.slice;
  const bool two = p.local_shape.size() > 1;
  return {{s.extent[0], two ? s.extent[1] : 1},
          {s.offset[0], two ? s.offset[1] : 0},
          {p.local_shape[0], two ? p.local_shape[1] : 1}};
}

}  // namespace checkpoint_detail

/// \brief The directory of step `step`'s checkpoint under `dir` ("DIR/step-00000006").
inline std::string checkpoint_step_dir(const std::string& dir, std::int64_t step) {
  return dir + "/" + checkpoint_detail::step_name(step);
}

/// \brief The newest complete checkpoint under `dir` (its step directory), or "" when none.
inline std::string latest_checkpoint(const std::string& dir) {
  std::ifstream in(dir + "/LATEST");
  std::string name;
  if (!(in >> name)) return {};
  return dir + "/" + name;
}

/// \brief Checks a step directory without loading it: the manifest's own checksum and header,
/// and every shard's size and CRC-32. Returns the manifest's step.
/// \throws pmt::IoError naming the first file that is missing or damaged.
inline std::int64_t verify_checkpoint(const std::string& step_dir) {
  const auto m = checkpoint_detail::read_manifest(step_dir);
  for (int q = 0; q < m.world; ++q) checkpoint_detail::read_shard_file(step_dir, m, q);
  return m.step;
}

/// \brief The step directories under `dir` (step-N with a MANIFEST; .partial ones excluded),
/// oldest first.
inline std::vector<std::string> checkpoint_steps(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() == 13 && name.rfind("step-", 0) == 0 &&
        name.find_first_not_of("0123456789", 5) == std::string::npos && fs::exists(e.path() / "MANIFEST", ec))
      out.push_back(name);
  }
  std::sort(out.begin(), out.end());  // fixed-width step numbers: name order is step order
  return out;
}

/// \brief The checkpoint a resumed run should load from `dir`: the one LATEST names when it
/// verifies; when LATEST is missing, empty or names no complete checkpoint, the newest step
/// directory that verifies, with `note` saying why (a LATEST naming a damaged checkpoint is an
/// error: the damage is the user's to see). "" when `dir` holds no checkpoint at all.
/// \throws pmt::IoError when LATEST names a damaged checkpoint, or when step directories exist
/// but none verifies (naming the first problem of the newest).
inline std::string resumable_checkpoint(const std::string& dir, std::string* note = nullptr) {
  namespace fs = std::filesystem;
  std::string name, why;
  std::error_code ec;
  {
    std::ifstream in(dir + "/LATEST");
    if (!in)
      why = "LATEST is missing";
    else if (!(in >> name))
      why = "LATEST is empty";
  }
  if (!name.empty()) {
    if (name.rfind("step-", 0) != 0 || name.find('/') != std::string::npos)
      why = "LATEST is damaged ('" + name.substr(0, 40) + "')";
    else if (!fs::exists(dir + "/" + name + "/MANIFEST", ec))
      why = "LATEST names " + name + ", which is not a complete checkpoint";
    else {
      try {
        verify_checkpoint(dir + "/" + name);
      } catch (const IoError& e) {
        const auto steps = checkpoint_steps(dir);
        std::string older;
        for (auto it = steps.rbegin(); it != steps.rend() && older.empty(); ++it) {
          if (*it == name) continue;
          try {
            verify_checkpoint(dir + "/" + *it);
            older = *it;
          } catch (const IoError&) {
          }
        }
        throw IoError("pmt::io::checkpoint",
                      std::string(e.what()) + (older.empty() ? std::string("; no older checkpoint verifies either")
                                                             : "; " + older + " verifies: write its name into " + dir +
                                                                   "/LATEST to resume from it"));
      }
      return dir + "/" + name;
    }
  }
  const auto steps = checkpoint_steps(dir);
  std::string first_problem;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    try {
      verify_checkpoint(dir + "/" + *it);
      if (note) *note = why + "; resuming from the newest checkpoint that verifies, " + *it;
      return dir + "/" + *it;
    } catch (const IoError& e) {
      if (first_problem.empty()) first_problem = e.what();
    }
  }
  if (!steps.empty())
    throw IoError("pmt::io::checkpoint", pmt::detail::str(dir, ": ", why, ", and none of its ", steps.size(),
                                                          " checkpoints verifies (the newest: ", first_problem, ")"));
  return {};
}

/// \brief Removes what an interrupted save leaves under `dir` (step-N.partial and step-N.old
/// directories, *.tmp files). Only for the directory's one writer (pmt::run::DirectoryLock).
/// Returns the names removed.
inline std::vector<std::string> remove_stale_partials(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> gone;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return gone;
  std::vector<fs::path> doomed;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const auto ends        = [&](const std::string& tail) {
      return name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    if (name.rfind("step-", 0) == 0 && (ends(".partial") || ends(".old") || ends(".tmp"))) doomed.push_back(e.path());
    if (name == "LATEST.tmp") doomed.push_back(e.path());
  }
  for (const auto& p : doomed) {
    fs::remove_all(p, ec);
    gone.push_back(p.filename().string());
  }
  return gone;
}

/// \brief Keeps the newest `keep` checkpoints under `dir` (and always the one LATEST names),
/// removing older step directories. Returns the names removed.
inline std::vector<std::string> prune_checkpoints(const std::string& dir, std::size_t keep) {
  namespace fs = std::filesystem;
  std::vector<std::string> gone;
  const auto steps = checkpoint_steps(dir);
  std::string latest;
  std::ifstream(dir + "/LATEST") >> latest;
  std::error_code ec;
  for (std::size_t i = 0; i + keep < steps.size(); ++i) {
    if (steps[i] == latest) continue;
    fs::remove_all(dir + "/" + steps[i], ec);
    gone.push_back(steps[i]);
  }
  return gone;
}

namespace checkpoint_detail {

/// ZeroAdamW's state seen as plain AdamW's: per-parameter moments, views into full flat moments.
/// For saving they are all-gathered over dp (every dp rank then writes what plain AdamW would);
/// for loading they are filled per parameter, and store() keeps the rank's part.
/// The optimizer state a checkpoint holds, seen alike for every optimizer: its kind (the
/// manifest's "optimizer" line), the names of its per-parameter tensors, those tensors, and a
/// step count.
template <class T, class Exec>
class AdamWState {
 public:
  using value_type      = T;
  using execution_space = Exec;
  explicit AdamWState(const optim::AdamW<T, Exec>& opt) : m_opt(&opt) {}            // for saving
  explicit AdamWState(optim::AdamW<T, Exec>& opt) : m_opt(&opt), m_target(&opt) {}  // for loading
  const std::vector<Parameter<T, Exec>*>& parameters() const noexcept { return m_opt->parameters(); }
  static const char* kind() noexcept { return "adamw"; }
  static std::vector<std::string> states() { return {"exp_avg", "exp_avg_sq"}; }
  Tensor<T, 1, Exec> state(std::size_t i, std::size_t k) const {
    return k == 0 ? m_opt->exp_avg(i) : m_opt->exp_avg_sq(i);
  }
  std::int64_t steps() const noexcept { return m_opt->steps(); }
  void set_steps(std::int64_t n) noexcept { m_target->set_steps(n); }

 private:
  const optim::AdamW<T, Exec>* m_opt;
  optim::AdamW<T, Exec>* m_target = nullptr;  // loading only
};
template <class T, class Exec>
class SgdState {
 public:
  using value_type      = T;
  using execution_space = Exec;
  explicit SgdState(const optim::Sgd<T, Exec>& opt) : m_opt(&opt) {}
  const std::vector<Parameter<T, Exec>*>& parameters() const noexcept { return m_opt->parameters(); }
  static const char* kind() noexcept { return "sgd"; }
  static std::vector<std::string> states() { return {"velocity"}; }
  Tensor<T, 1, Exec> state(std::size_t i, std::size_t) const { return m_opt->velocity(i); }
  std::int64_t steps() const noexcept { return 0; }
  void set_steps(std::int64_t) noexcept {}

 private:
  const optim::Sgd<T, Exec>* m_opt;
};
template <class T, class Exec>
class WeightsOnly {
 public:
  using value_type      = T;
  using execution_space = Exec;
  explicit WeightsOnly(std::vector<Parameter<T, Exec>*> params) : m_params(std::move(params)) {}
  const std::vector<Parameter<T, Exec>*>& parameters() const noexcept { return m_params; }
  static const char* kind() noexcept { return "none"; }
  static std::vector<std::string> states() { return {}; }
  Tensor<T, 1, Exec> state(std::size_t, std::size_t) const { return {}; }
  std::int64_t steps() const noexcept { return 0; }
  void set_steps(std::int64_t) noexcept {}

 private:
  std::vector<Parameter<T, Exec>*> m_params;
};

template <class Zero, class T, class Exec>
class ZeroAsAdamW {
 public:
  using value_type      = T;
  using execution_space = Exec;
  /// For saving: collective over the dp axis.
  ZeroAsAdamW(const Zero& opt, const Exec& exec) : m_params(opt.parameters()), m_steps(opt.steps()) {
    std::tie(m_m, m_v) = opt.gathered_moments(exec);
    exec.fence();
    index();
  }
  /// For loading into `opt` (then store()).
  explicit ZeroAsAdamW(Zero& opt)
      : m_params(opt.parameters()),
        m_target(&opt),
        m_m("pmt::io::checkpoint::m", opt.padded_size()),
        m_v("pmt::io::checkpoint::v", opt.padded_size()) {
    index();
  }
  const std::vector<Parameter<T, Exec>*>& parameters() const noexcept { return m_params; }
  static const char* kind() noexcept { return "adamw"; }
  static std::vector<std::string> states() { return {"exp_avg", "exp_avg_sq"}; }
  Tensor<T, 1, Exec> state(std::size_t i, std::size_t k) const { return part(k == 0 ? m_m : m_v, i); }
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
  std::vector<Parameter<T, Exec>*> m_params;
  Zero* m_target       = nullptr;
  std::int64_t m_steps = 0;
  Tensor<T, 1, Exec> m_m, m_v;
  std::vector<std::size_t> m_offset;
};

/// An optimizer's state with named per-parameter states appended (ParameterStates: the
/// Trainer's). Opt may be const (for saving).
template <class Opt>
class WithStates {
 public:
  using value_type      = typename std::remove_const_t<Opt>::value_type;
  using execution_space = typename std::remove_const_t<Opt>::execution_space;
  using T               = value_type;
  using Exec            = execution_space;
  /// \throws pmt::ConfigError when a state does not have one tensor of each parameter's size.
  WithStates(Opt& opt, const ParameterStates<T, Exec>& extra) : m_opt(&opt), m_extra(extra), m_base(opt.states()) {
    const auto& ps = opt.parameters();
    for (const auto& st : m_extra.states) {
      pmt::detail::require<ConfigError>(st.of.size() == ps.size(), "pmt::io::checkpoint", [&] {
        return pmt::detail::str("state \"", st.name, "\" has ", st.of.size(), " tensors for ", ps.size(),
                                " parameters");
      });
      for (std::size_t i = 0; i < ps.size(); ++i)
        pmt::detail::require<ConfigError>(
            st.of[i].size() == 0 || st.of[i].size() == ps[i]->size(), "pmt::io::checkpoint", [&] {
              return pmt::detail::str("state \"", st.name, "\" of parameter ", ps[i]->name, " has ", st.of[i].size(),
                                      " values; the parameter has ", ps[i]->size(), " (or none)");
            });
    }
  }
  const std::vector<Parameter<T, Exec>*>& parameters() const noexcept { return m_opt->parameters(); }
  const char* kind() const noexcept { return m_opt->kind(); }
  std::vector<std::string> states() const {
    auto out = m_base;
    for (const auto& st : m_extra.states) out.push_back(st.name);
    return out;
  }
  Tensor<T, 1, Exec> state(std::size_t i, std::size_t k) const {
    return k < m_base.size() ? m_opt->state(i, k) : m_extra.states[k - m_base.size()].of.at(i);
  }
  std::int64_t steps() const noexcept { return m_opt->steps(); }
  void set_steps(std::int64_t n) noexcept { m_opt->set_steps(n); }
  bool defaults_to_value(std::size_t k) const noexcept {
    return k >= m_base.size() && m_extra.states[k - m_base.size()].defaults_to_value;
  }
  bool per_rank(std::size_t k) const noexcept {
    return k >= m_base.size() && m_extra.states[k - m_base.size()].per_rank;
  }
  void mark_loaded() const noexcept {
    if (m_extra.loaded) *m_extra.loaded = true;
  }

 private:
  Opt* m_opt;
  ParameterStates<T, Exec> m_extra;
  std::vector<std::string> m_base;
};

template <class Opt, class = void>
inline constexpr bool has_state_defaults_v = false;
template <class Opt>
inline constexpr bool
    has_state_defaults_v<Opt, std::void_t<decltype(std::declval<const Opt&>().defaults_to_value(std::size_t(0)))>> =
        true;

/// Whether state k of Opt holds each rank's own values (ParameterStates::State::per_rank).
template <class Opt>
bool per_rank_state(const Opt& opt, std::size_t k) {
  if constexpr (has_state_defaults_v<Opt>)
    return opt.per_rank(k);
  else
    return (void)opt, (void)k, false;
}
/// The record kind of a pipeline copy's own value of a per-rank state ("grad_residual@copy").
inline constexpr const char* copy_suffix = "@copy";

template <class Opt, class Backend>
std::string save(const std::string& dir, const Mesh<Backend>& mesh, const Opt& opt, const CheckpointInfo& info) {
  using T                     = typename Opt::value_type;
  using Exec                  = typename Opt::execution_space;
  namespace fs                = std::filesystem;
  const auto& world           = mesh.world();
  const int r                 = world.rank();
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
      if (!fs::create_directories(partial, ec) || ec)
        checkpoint_detail::io_fail("cannot create " + partial + " (" + ec.message() + ")");
    }
  } catch (...) {  // whatever it is, the other ranks must not wait for this one
    err = std::current_exception();
  }
  comm::agree_on_errors(world, err, "pmt::io::checkpoint", "creating " + partial);
  // this rank's shard
  std::uint64_t meta[2] = {0, 0};  // bytes, crc
  try {
    std::string bytes                    = "PMTSHRD1";
    const auto& ps                       = opt.parameters();
    const std::vector<std::string> kinds = opt.states();
    std::vector<std::size_t> index;
    using Entry = std::pair<std::string, Tensor<T, 1, Exec>>;
    std::vector<std::vector<Entry>> records;  // per parameter: its value, then each state it has
    std::uint32_t count = 0;
    for (std::size_t i = 0; i < ps.size(); ++i) {
      // a pipeline copy (the tied LM head on the last stage): the owning stage writes its value
      // and states; the copy writes only its own values of per-rank states
      std::vector<Entry> entries;
      if (!ps[i]->pp_copy) entries.emplace_back("param/", ps[i]->value);
      for (std::size_t k = 0; k < kinds.size(); ++k)
        if (auto st = opt.state(i, k); st.size() > 0 && (!ps[i]->pp_copy || per_rank_state(opt, k)))
          entries.emplace_back(kinds[k] + (ps[i]->pp_copy ? copy_suffix : "") + "/", st);
      if (entries.empty()) continue;
      index.push_back(i);
      count += static_cast<std::uint32_t>(entries.size());
      records.push_back(std::move(entries));
    }
    checkpoint_detail::put(bytes, count);
    for (std::size_t j = 0; j < index.size(); ++j) {
      const auto& p = *ps[index[j]];
      const auto sh = checkpoint_detail::shape_of(p);
      for (const auto& [prefix, view] : records[j]) {
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
        for (std::size_t e = 0; e < host.size(); ++e)  // a checkpoint never holds nan or inf
          if (!std::isfinite(static_cast<double>(host(e))))
            throw IoError("pmt::io::checkpoint",
                          pmt::detail::str("refusing to save step ", info.step, ": ", name, " holds ",
                                           static_cast<double>(host(e)), " at element ", e, " on rank ", r,
                                           "; LATEST keeps naming the last good checkpoint"));
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
  comm::agree_on_errors(world, err, "pmt::io::checkpoint", "writing a shard");
  Kokkos::View<std::uint64_t*, Kokkos::HostSpace> mine(meta, 2);
  Kokkos::View<std::uint64_t*, Kokkos::HostSpace> all("pmt::io::shards", 2 * static_cast<std::size_t>(world.size()));
  comm::all_gather(world, Kokkos::DefaultHostExecutionSpace(), mine, all);
  try {
    if (r == 0) {
      const auto s = mesh.shape();
      std::ostringstream m;
      m << "pmt-checkpoint 1\nstep " << info.step << "\nlayout " << s.dp << " " << s.tp << " " << s.pp << "\nworld "
        << world.size() << "\nelement " << sizeof(T) << "\noptimizer " << opt.kind() << "\nadam_steps " << opt.steps()
        << "\nmodel " << info.model << "\n";
      for (const auto& [k, v] : info.extra) m << "extra " << k << " " << v << "\n";
      for (int q = 0; q < world.size(); ++q) {
        char crc[16];
        std::snprintf(crc, sizeof crc, "%08x", static_cast<unsigned>(all(2 * q + 1)));
        m << "shard " << checkpoint_detail::shard_name(q) << " " << all(2 * q) << " " << crc << "\n";
      }
      const std::string text = m.str();
      checkpoint_detail::write_atomically(partial + "/MANIFEST",
                                          text + checkpoint_detail::manifest_checksum_line(text));
      checkpoint_detail::fsync_path(partial, true);
      std::error_code ec;
      if (fs::exists(final_dir, ec)) {  // the same step saved again: replace it
        fs::remove_all(final_dir + ".old", ec);
        fs::rename(final_dir, final_dir + ".old", ec);
      }
      errno = 0;
      if (std::rename(partial.c_str(), final_dir.c_str()) != 0)
        checkpoint_detail::io_fail("cannot rename " + partial + " to " + final_dir);
      checkpoint_detail::fsync_path(dir, true);
      checkpoint_detail::write_atomically(dir + "/LATEST", checkpoint_detail::step_name(info.step) + "\n");
      checkpoint_detail::fsync_path(dir, true);
      fs::remove_all(final_dir + ".old", ec);
    }
  } catch (...) {  // whatever it is, the other ranks must not wait for this one
    err = std::current_exception();
  }
  comm::agree_on_errors(world, err, "pmt::io::checkpoint", "writing the manifest");
  return final_dir;
}

template <class Opt, class Backend>
CheckpointInfo load(const std::string& step_dir, const Mesh<Backend>& mesh, Opt& opt,
                    const std::string& expected_model) {
  using T           = typename Opt::value_type;
  const auto& world = mesh.world();
  CheckpointInfo info;
  info.path = step_dir;
  std::exception_ptr err;
  try {
    checkpoint_detail::require_unique_names(opt.parameters());
    const checkpoint_detail::Manifest man = checkpoint_detail::read_manifest(step_dir);
    info.step = man.step, info.layout = man.layout, info.model = man.model, info.extra = man.extra;
    const std::int64_t adam_steps = man.adam_steps;
    const int saved_world         = man.world;
    const std::size_t elem        = man.elem;
    if (info.model != expected_model)
      throw IoError("pmt::io::checkpoint", pmt::detail::str(step_dir, " holds a different model: \"", info.model,
                                                            "\"; this run is \"", expected_model, "\""));
    if (elem != sizeof(T))
      throw IoError("pmt::io::checkpoint", pmt::detail::str(step_dir, " holds ", elem, "-byte values; this run uses ",
                                                            sizeof(T), "-byte values"));
    const std::vector<std::string> kinds = opt.states();
    if (!kinds.empty() && man.optimizer != opt.kind())
      throw IoError(
          "pmt::io::checkpoint",
          man.optimizer == "none"
              ? pmt::detail::str(step_dir, " holds weights only, no optimizer state; this run's optimizer \"",
                                 opt.kind(), "\" needs its state (pmt::io::load_weights loads the weights)")
              : pmt::detail::str(step_dir, " holds the state of optimizer \"", man.optimizer, "\"; this run's is \"",
                                 opt.kind(), "\" (pmt::io::load_weights takes the parameters of any checkpoint)"));
    // Which shards to read: our own with the same layout (then the others only for what it does
    // not hold, e.g. the tied LM head's copy, saved by the first stage), all of them otherwise.
    const auto s    = mesh.shape();
    const bool same = s.dp == info.layout.dp && s.tp == info.layout.tp && s.pp == info.layout.pp;
    const auto& ps  = opt.parameters();
    std::vector<std::size_t> filled(ps.size(), 0);
    // hv: values; hst[k]: optimizer state k, per parameter
    std::vector<std::vector<T>> hv(ps.size());
    std::vector<std::vector<std::vector<T>>> hst(kinds.size(), std::vector<std::vector<T>>(ps.size()));
    std::vector<std::vector<char>> got(ps.size());  // which elements some shard provided (dp replicas repeat them)
    std::vector<std::vector<char>> found(kinds.size(),
                                         std::vector<char>(ps.size(), 0));  // a record of state k for parameter i
    // a pipeline copy's own record of a per-rank state k (in this rank's shard, same layout): the
    // owning stage's record does not replace it
    std::vector<std::vector<char>> own_copy(kinds.size(), std::vector<char>(ps.size(), 0));
    for (std::size_t i = 0; i < ps.size(); ++i) {
      hv[i].resize(ps[i]->size());
      for (auto& st : hst) st[i].resize(ps[i]->size());
      got[i].assign(ps[i]->size(), 0);
    }
    const auto read_shard = [&](int q, const std::vector<bool>& wanted) {
      const std::string path  = step_dir + "/" + man.shards[static_cast<std::size_t>(q)].first;
      const std::string bytes = checkpoint_detail::read_shard_file(step_dir, man, q);
      for (const auto& rec : checkpoint_detail::parse_shard(path, bytes)) {
        const auto slash = rec.name.find('/');
        std::string kind = rec.name.substr(0, slash), pname = rec.name.substr(slash + 1);
        const std::size_t suffix = std::string(copy_suffix).size();
        const bool copy_record   = kind.size() > suffix && kind.compare(kind.size() - suffix, suffix, copy_suffix) == 0;
        if (copy_record) {  // a pipeline copy's own values: only for this rank's copy, on the same layout
          if (!same || q != world.rank()) continue;
          kind.resize(kind.size() - suffix);
        }
        std::size_t state_k = kinds.size();  // which state this record is (kinds.size(): none we load)
        for (std::size_t k = 0; k < kinds.size(); ++k)
          if (kinds[k] == kind) state_k = k;
        if (kind != "param" && state_k == kinds.size()) continue;  // e.g. moments, loading weights only
        for (std::size_t i = 0; i < ps.size(); ++i) {
          if (ps[i]->name != pname || (copy_record ? !ps[i]->pp_copy : !wanted[i])) continue;
          if (kind != "param" && own_copy[state_k][i]) continue;  // the copy's own record was read
          if (copy_record) own_copy[state_k][i] = 1;
          const auto sh = checkpoint_detail::shape_of(*ps[i]);
          if (rec.elem != sizeof(T) || rec.global[0] != sh.g[0] || rec.global[1] != sh.g[1])
            throw IoError("pmt::io::checkpoint",
                          pmt::detail::str(path, ": ", rec.name, " has global shape (", rec.global[0], ", ",
                                           rec.global[1], "); the model's is (", sh.g[0], ", ", sh.g[1], ")"));
          auto& dst = kind == "param" ? hv[i] : hst[state_k][i];
          if (kind != "param") found[state_k][i] = 1;
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
        throw IoError("pmt::io::checkpoint",
                      pmt::detail::str(step_dir, ": parameter ", ps[i]->name, " is covered by ", filled[i], " of its ",
                                       ps[i]->size(), " elements on this rank (a checkpoint of another model?)"));
    using HostView = Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    for (std::size_t i = 0; i < ps.size(); ++i) {
      Kokkos::deep_copy(ps[i]->value, HostView(hv[i].data(), hv[i].size()));
      for (std::size_t k = 0; k < kinds.size(); ++k) {
        const auto st = opt.state(i, k);
        if (st.size() == 0) continue;  // this parameter has no such state
        bool from_value = false;       // a state the checkpoint lacks: zeros, or the loaded value
        if constexpr (checkpoint_detail::has_state_defaults_v<Opt>)
          from_value = !found[k][i] && opt.defaults_to_value(k);
        const auto& src = from_value ? hv[i] : hst[k][i];
        Kokkos::deep_copy(st, HostView(src.data(), src.size()));
      }
    }
    if (!kinds.empty()) opt.set_steps(adam_steps);
    if constexpr (checkpoint_detail::has_state_defaults_v<Opt>) opt.mark_loaded();
  } catch (...) {  // whatever it is, the other ranks must not wait for this one
    err = std::current_exception();
  }
  comm::agree_on_errors(world, err, "pmt::io::checkpoint", "loading " + step_dir);
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
                            const CheckpointInfo& info, const ParameterStates<T, Exec>& extra = {}) {
  const checkpoint_detail::AdamWState<T, Exec> state(opt);
  return checkpoint_detail::save(dir, mesh, checkpoint_detail::WithStates<const decltype(state)>(state, extra), info);
}

/// \brief Sgd: the parameters and the momentum buffers ("optimizer sgd").
template <class T, class Exec, class Backend>
std::string save_checkpoint(const std::string& dir, const Mesh<Backend>& mesh, const optim::Sgd<T, Exec>& opt,
                            const CheckpointInfo& info, const ParameterStates<T, Exec>& extra = {}) {
  const checkpoint_detail::SgdState<T, Exec> state(opt);
  return checkpoint_detail::save(dir, mesh, checkpoint_detail::WithStates<const decltype(state)>(state, extra), info);
}

/// \brief The weights only, no optimizer state ("optimizer none"): for inference, evaluation or
/// a fine-tuning run with a fresh optimizer. `params`: a model's parameters() (this stage's).
template <class T, class Exec, class Backend>
std::string save_weights(const std::string& dir, const Mesh<Backend>& mesh,
                         const std::vector<Parameter<T, Exec>*>& params, const CheckpointInfo& info) {
  return checkpoint_detail::save(dir, mesh, checkpoint_detail::WeightsOnly<T, Exec>(params), info);
}

/// \brief ZeroAdamW (ZeRO-1): the same checkpoint as plain AdamW's, so either optimizer and any
/// dp degree can load it. Each dp group first all-gathers its moments (2 P values per rank for
/// the time of the save).
template <class T, class Exec, class Backend>
std::string save_checkpoint(const std::string& dir, const Mesh<Backend>& mesh,
                            const optim::ZeroAdamW<T, Exec, Backend>& opt, const CheckpointInfo& info,
                            const ParameterStates<T, Exec>& extra = {}) {
  const checkpoint_detail::ZeroAsAdamW<optim::ZeroAdamW<T, Exec, Backend>, T, Exec> state(opt, Exec());
  return checkpoint_detail::save(dir, mesh, checkpoint_detail::WithStates<const decltype(state)>(state, extra), info);
}

/// \brief Loads the checkpoint in `step_dir` (e.g. latest_checkpoint(dir)) into the parameters
/// of `opt` and its moments, on any layout of the same model (see the file comment). Returns
/// what the checkpoint recorded. Collective over the mesh's world.
/// \throws pmt::IoError on every rank for a missing, incomplete or damaged checkpoint (naming the
/// file), one of another model (`expected_model` differs) or another precision; pmt::ConfigError
/// when two parameters share a name.
template <class T, class Exec, class Backend>
CheckpointInfo load_checkpoint(const std::string& step_dir, const Mesh<Backend>& mesh, optim::AdamW<T, Exec>& opt,
                               const std::string& expected_model, const ParameterStates<T, Exec>& extra = {}) {
  checkpoint_detail::AdamWState<T, Exec> state(opt);
  checkpoint_detail::WithStates<decltype(state)> with(state, extra);
  return checkpoint_detail::load(step_dir, mesh, with, expected_model);
}

/// \brief Sgd: the parameters and momentum buffers of an Sgd checkpoint, on any layout.
template <class T, class Exec, class Backend>
CheckpointInfo load_checkpoint(const std::string& step_dir, const Mesh<Backend>& mesh, optim::Sgd<T, Exec>& opt,
                               const std::string& expected_model, const ParameterStates<T, Exec>& extra = {}) {
  checkpoint_detail::SgdState<T, Exec> state(opt);
  checkpoint_detail::WithStates<decltype(state)> with(state, extra);
  return checkpoint_detail::load(step_dir, mesh, with, expected_model);
}

/// \brief The parameters of any checkpoint (AdamW's, Sgd's or save_weights'), on any layout;
/// optimizer state in it is skipped. Collective over the mesh's world.
template <class T, class Exec, class Backend>
CheckpointInfo load_weights(const std::string& step_dir, const Mesh<Backend>& mesh,
                            const std::vector<Parameter<T, Exec>*>& params, const std::string& expected_model) {
  checkpoint_detail::WeightsOnly<T, Exec> state(params);
  return checkpoint_detail::load(step_dir, mesh, state, expected_model);
}

/// \brief ZeroAdamW (ZeRO-1): loads a checkpoint of either optimizer and of any dp degree; each
/// rank keeps its part of the moments.
template <class T, class Exec, class Backend>
CheckpointInfo load_checkpoint(const std::string& step_dir, const Mesh<Backend>& mesh,
                               optim::ZeroAdamW<T, Exec, Backend>& opt, const std::string& expected_model,
                               const ParameterStates<T, Exec>& extra = {}) {
  checkpoint_detail::ZeroAsAdamW<optim::ZeroAdamW<T, Exec, Backend>, T, Exec> state(opt);
  checkpoint_detail::WithStates<decltype(state)> with(state, extra);
  CheckpointInfo info = checkpoint_detail::load(step_dir, mesh, with, expected_model);
  state.store(Exec());
  return info;
}

/// \brief Zero2AdamW (ZeRO-2): the same checkpoint as plain AdamW's (its moments all-gathered
/// bucket by bucket over dp for the save).
template <class T, class Exec, class Backend>
std::string save_checkpoint(const std::string& dir, const Mesh<Backend>& mesh,
                            const optim::Zero2AdamW<T, Exec, Backend>& opt, const CheckpointInfo& info,
                            const ParameterStates<T, Exec>& extra = {}) {
  const checkpoint_detail::ZeroAsAdamW<optim::Zero2AdamW<T, Exec, Backend>, T, Exec> state(opt, Exec());
  return checkpoint_detail::save(dir, mesh, checkpoint_detail::WithStates<const decltype(state)>(state, extra), info);
}

/// \brief Zero2AdamW (ZeRO-2): loads a checkpoint of AdamW, ZeroAdamW or Zero2AdamW and of any dp
/// degree; each rank keeps its part of the moments.
template <class T, class Exec, class Backend>
CheckpointInfo load_checkpoint(const std::string& step_dir, const Mesh<Backend>& mesh,
                               optim::Zero2AdamW<T, Exec, Backend>& opt, const std::string& expected_model,
                               const ParameterStates<T, Exec>& extra = {}) {
  checkpoint_detail::ZeroAsAdamW<optim::Zero2AdamW<T, Exec, Backend>, T, Exec> state(opt);
  checkpoint_detail::WithStates<decltype(state)> with(state, extra);
  CheckpointInfo info = checkpoint_detail::load(step_dir, mesh, with, expected_model);
  state.store(Exec());
  return info;
}

}  // namespace pmt::io
