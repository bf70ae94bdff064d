// SPDX-License-Identifier: Apache-2.0
#pragma once
// Workspace: the memory a training step allocates and frees again (activations, gradients, the
// ops' scratch, receive buffers), planned by the first step and reused by every later one, so a
// steady-state step makes no allocation at all: no cudaMalloc on a device, no malloc / page
// faults on a host (glibc gives freed blocks above its mmap threshold back to the kernel, and a
// step that allocates them again faults every page in afresh).
// Layers and ops take their temporaries from pmt::workspace_view<V>(label, extents...) instead of
// constructing a View. Outside a WorkspaceScope that is a plain allocation (contents
// uninitialised). Inside one (train::Trainer opens one around each step) the view comes from the
// process's Workspace: a block of exactly that View type and those extents that nobody holds any
// more (the Workspace keeps one reference to each block; a block is free when that is the only
// one), or a new block it keeps. When the outermost scope closes, the blocks the scope did not
// use are freed (a validation pass of other shapes does not stay allocated), so the blocks held
// are what one step needs at its peak of each shape.
// A block is reused as soon as its last View handle is dropped: a caller must not keep only an
// unmanaged alias of a workspace view (its data() pointer) beyond the handle's lifetime.
// The view's label is that of the call that allocated the block. Kokkos::finalize frees the
// blocks (a finalize hook); Workspace::release() frees them earlier.
//   { pmt::WorkspaceScope step; ... forward, backward ... }   // what the Trainer does
//   auto y = pmt::workspace_view<pmt::Tensor<T, 2, Exec>>("pmt::nn::Linear::y", N, out);

#include <Kokkos_Core.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <typeindex>
#include <utility>
#include <vector>

namespace pmt {

/// \brief The process's cache of step memory (see the file comment).
class Workspace {
 public:
  static Workspace& instance() {
    static Workspace w;
    return w;
  }

  /// \brief A View of type V and these extents (contents uninitialised): from the cache inside a
  /// WorkspaceScope, a plain allocation outside.
  template <class V, class... N>
  V get(const std::string& label, N... extents) {
    static_assert(sizeof...(N) == V::rank, "pmt::workspace_view: one extent per dimension");
    std::lock_guard<std::mutex> lock(m_mutex);
    if (m_depth == 0)
      return V(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), static_cast<std::size_t>(extents)...);
    Key key{std::type_index(typeid(V)), {static_cast<std::size_t>(extents)...}};
    auto& list = m_blocks[key];
    for (auto& b : list)
      if (b->free()) {
        b->used = true;
        ++m_hits;
        return static_cast<Block<V>&>(*b).view;
      }
    if (!m_hooked) {  // blocks must go before Kokkos does
      Kokkos::push_finalize_hook([] { Workspace::instance().finalize(); });
      m_hooked = true;
    }
    auto block = std::make_unique<Block<V>>(
        V(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), static_cast<std::size_t>(extents)...));
    block->used = true;
    ++m_misses;
    V v = block->view;
    list.push_back(std::move(block));
    return v;
  }

  /// \brief Frees every block no View holds (all of them, used in this scope or not).
  void release() {
    std::lock_guard<std::mutex> lock(m_mutex);
    trim(/*keep_used=*/false);
  }
  /// \brief Blocks the cache holds, and how many requests it served from them / allocated anew.
  std::size_t blocks() const {
    std::lock_guard<std::mutex> lock(m_mutex);
    std::size_t n = 0;
    for (const auto& [key, list] : m_blocks) n += list.size();
    return n;
  }
  std::uint64_t hits() const noexcept { return m_hits; }
  std::uint64_t misses() const noexcept { return m_misses; }

 private:
  friend class WorkspaceScope;
  struct Key {
    std::type_index type;
    std::array<std::size_t, 8> extents;
    bool operator<(const Key& o) const { return type != o.type ? type < o.type : extents < o.extents; }
  };
  struct BlockBase {
    virtual ~BlockBase()      = default;
    virtual bool free() const = 0;
    bool used                 = false;  // handed out since the outermost scope opened
  };
  template <class V>
  struct Block final : BlockBase {
    explicit Block(V v) : view(std::move(v)) {}
    bool free() const override { return view.use_count() <= 1; }
    V view;
  };
  Workspace()  = default;
  ~Workspace() = default;  // Kokkos::finalize released the blocks (finalize())

  /// Kokkos::finalize's hook: every free block goes; the next initialisation starts afresh.
  void finalize() {
    std::lock_guard<std::mutex> lock(m_mutex);
    trim(/*keep_used=*/false);
    m_hooked = false;
  }

  void open() {
    std::lock_guard<std::mutex> lock(m_mutex);
    ++m_depth;
  }
  void close() {
    std::lock_guard<std::mutex> lock(m_mutex);
    if (--m_depth == 0) trim(/*keep_used=*/true);
  }
  /// Frees the free blocks (keep_used: those not handed out in the scope just closed), and marks
  /// the rest unused for the next scope.
  void trim(bool keep_used) {
    for (auto it = m_blocks.begin(); it != m_blocks.end();) {
      auto& list = it->second;
      std::vector<std::unique_ptr<BlockBase>> kept;
      for (auto& b : list)
        if (!b->free() || (keep_used && b->used)) {
          b->used = false;
          kept.push_back(std::move(b));
        }
      list = std::move(kept);
      it   = list.empty() ? m_blocks.erase(it) : std::next(it);
    }
  }

  mutable std::mutex m_mutex;
  int m_depth   = 0;
  bool m_hooked = false;  // a Kokkos finalize hook is registered
  std::map<Key, std::vector<std::unique_ptr<BlockBase>>> m_blocks;
  std::uint64_t m_hits = 0, m_misses = 0;
};

/// \brief While one is open (they nest), workspace_view serves from the Workspace; the outermost
/// one frees, on closing, the blocks it did not use.
class WorkspaceScope {
 public:
  WorkspaceScope() { Workspace::instance().open(); }
  ~WorkspaceScope() { Workspace::instance().close(); }
  WorkspaceScope(const WorkspaceScope&)            = delete;
  WorkspaceScope& operator=(const WorkspaceScope&) = delete;
};

/// \brief A View of type V with these extents for a step's temporary (contents uninitialised;
/// see the file comment).
template <class V, class... N>
V workspace_view(const std::string& label, N... extents) {
  return Workspace::instance().get<V>(label, extents...);
}

}  // namespace pmt
