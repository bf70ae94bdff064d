// SPDX-License-Identifier: Apache-2.0
#pragma once
// The checkpoint files (io/checkpoint.hpp describes the layout): CheckpointInfo, the shard and
// manifest formats with their CRC-32 checks, crash-safe writes (temporary file, fsync, rename),
// and managing a checkpoint directory: checkpoint_step_dir, latest_checkpoint,
// verify_checkpoint, checkpoint_steps, resumable_checkpoint, remove_stale_partials,
// prune_checkpoints. No communication: what one process does with the files.

#include "pmt/comm/mesh.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/parameter.hpp"
#include "pmt/io/file_system.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
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

namespace detail {

inline std::uint32_t crc32(const void* data, std::size_t n, std::uint32_t crc = 0) {
  // slicing by 8: eight tables, eight bytes per round (about 5x the byte-at-a-time loop)
  static const auto t = [] {
    std::array<std::array<std::uint32_t, 256>, 8> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (std::size_t k = 1; k < 8; ++k)
      for (std::size_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFFu];
    return t;
  }();
  crc             = ~crc;
  const auto* p   = static_cast<const unsigned char*>(data);
  const auto word = [](const unsigned char* q) {  // four bytes, the first lowest (any byte order)
    return std::uint32_t(q[0]) | std::uint32_t(q[1]) << 8 | std::uint32_t(q[2]) << 16 | std::uint32_t(q[3]) << 24;
  };
  for (; n >= 8; p += 8, n -= 8) {
    const std::uint32_t lo = word(p) ^ crc, hi = word(p + 4);
    crc = t[7][lo & 0xFFu] ^ t[6][(lo >> 8) & 0xFFu] ^ t[5][(lo >> 16) & 0xFFu] ^ t[4][lo >> 24] ^ t[3][hi & 0xFFu] ^
          t[2][(hi >> 8) & 0xFFu] ^ t[1][(hi >> 16) & 0xFFu] ^ t[0][hi >> 24];
  }
  for (; n > 0; ++p, --n) crc = t[0][(crc ^ *p) & 0xFFu] ^ (crc >> 8);
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

/// Writes `size` bytes to path.tmp, fsyncs, renames to path. `abort_half` is the test hook:
/// abort() after writing half of the bytes (a crash during the save).
inline void write_atomically(const std::string& path, const char* data, std::size_t size, bool abort_half = false) {
  const std::string tmp = path + ".tmp";
  errno                 = 0;
  const int fd          = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) io_fail("cannot create " + tmp);
  std::size_t done        = 0;
  const std::size_t limit = abort_half ? size / 2 : size;
  while (done < limit) {
    const ssize_t w = ::write(fd, data + done, limit - done);
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

/// The same for a string.
inline void write_atomically(const std::string& path, const std::string& bytes, bool abort_half = false) {
  write_atomically(path, bytes.data(), bytes.size(), abort_half);
}

/// A growable byte buffer that leaves what it grows into unset (a shard's snapshot writes every
/// byte once; std::string would zero it first) and keeps its capacity when cleared.
class ShardBuffer {
 public:
  void clear() noexcept { m_size = 0; }
  std::size_t size() const noexcept { return m_size; }
  const char* data() const noexcept { return m_data.get(); }
  void reserve(std::size_t n) {
    if (n <= m_capacity) return;
    std::unique_ptr<char[]> grown(new char[n]);  // default-initialized: not zeroed
    if (m_size > 0) std::memcpy(grown.get(), m_data.get(), m_size);
    m_data     = std::move(grown);
    m_capacity = n;
  }
  /// The next `n` bytes, to be written by the caller.
  char* extend(std::size_t n) {
    if (m_size + n > m_capacity) reserve(std::max(m_size + n, 2 * m_capacity));
    char* at = m_data.get() + m_size;
    m_size += n;
    return at;
  }
  void append(const void* p, std::size_t n) {
    if (n > 0) std::memcpy(extend(n), p, n);
  }
  void append(const std::string& s) { append(s.data(), s.size()); }

 private:
  std::unique_ptr<char[]> m_data;
  std::size_t m_size = 0, m_capacity = 0;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("pmt::io::checkpoint", path + ": cannot be read (missing file?)");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

template <class V>
void put(std::string& out, const V& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(V));
}
template <class V>
void put(ShardBuffer& out, const V& v) {
  out.append(&v, sizeof(V));
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
  const auto& [file, size] = m.shards[static_cast<std::size_t>(q)];
  const std::string path   = step_dir + "/" + file;
  if (!detail::is_regular_file(path)) throw IoError("pmt::io::checkpoint", path + ": missing (or not a regular file)");
  std::uint64_t on_disk = 0;
  const bool sized      = detail::file_size(path, on_disk);
  if (!sized || on_disk != size)
    throw IoError("pmt::io::checkpoint", pmt::detail::str(path, ": damaged (",
                                                          !sized ? std::string("its size cannot be read")
                                                                 : pmt::detail::str(on_disk, " bytes"),
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

}  // namespace detail

/// \brief The directory of step `step`'s checkpoint under `dir` ("DIR/step-00000006").
inline std::string checkpoint_step_dir(const std::string& dir, std::int64_t step) {
  return dir + "/" + detail::step_name(step);
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
  const auto m = detail::read_manifest(step_dir);
  for (int q = 0; q < m.world; ++q) detail::read_shard_file(step_dir, m, q);
  return m.step;
}

/// \brief The step directories under `dir` (step-N with a MANIFEST; .partial ones excluded),
/// oldest first.
inline std::vector<std::string> checkpoint_steps(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& name : detail::list_directory(dir)) {
    if (name.size() == 13 && name.rfind("step-", 0) == 0 &&
        name.find_first_not_of("0123456789", 5) == std::string::npos && detail::exists(dir + "/" + name + "/MANIFEST"))
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
  std::string name, why;
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
    else if (!detail::exists(dir + "/" + name + "/MANIFEST"))
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
  std::vector<std::string> gone;
  for (const auto& name : detail::list_directory(dir)) {
    const auto ends = [&](const std::string& tail) {
      return name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    if ((name.rfind("step-", 0) == 0 && (ends(".partial") || ends(".old") || ends(".tmp"))) || name == "LATEST.tmp")
      gone.push_back(name);
  }
  std::sort(gone.begin(), gone.end());
  for (const auto& name : gone) detail::remove_all(dir + "/" + name);
  return gone;
}

/// \brief Keeps the newest `keep` checkpoints under `dir` (and always the one LATEST names),
/// removing older step directories. Returns the names removed.
inline std::vector<std::string> prune_checkpoints(const std::string& dir, std::size_t keep) {
  std::vector<std::string> gone;
  const auto steps = checkpoint_steps(dir);
  std::string latest;
  std::ifstream(dir + "/LATEST") >> latest;
  for (std::size_t i = 0; i + keep < steps.size(); ++i) {
    if (steps[i] == latest) continue;
    detail::remove_all(dir + "/" + steps[i]);
    gone.push_back(steps[i]);
  }
  return gone;
}

}  // namespace pmt::io
