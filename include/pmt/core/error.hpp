// SPDX-License-Identifier: Apache-2.0
#pragma once
// pmt's error types and the helpers that build their messages.
//
// Every runtime failure is a pmt::Error. Messages follow one format:
//   <qualified op>: <what is wrong>: <shapes/values>; expected <rule> [<context>]
// where the context names this process' rank in a multi-rank run plus any ErrorContext in scope
// (for example "tp rank 1/4"). Messages are built lazily: the passing path costs one branch.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace pmt::detail {

/// Process-wide facts the error messages mention. ScopeGuard sets rank/size after MPI_Init.
struct ProcessContext {
  int rank = 0;
  int size = 1;
};

inline ProcessContext& process_context() noexcept {
  static ProcessContext ctx;
  return ctx;
}

/// Context tags pushed by ErrorContext (innermost last); thread-local, so OpenMP threads that
/// throw on the host see their own stack.
inline std::vector<std::string>& context_stack() {
  thread_local std::vector<std::string> stack;
  return stack;
}

/// " [rank 1/4, tp rank 0/2]", or "" in a one-rank run with no ErrorContext in scope.
inline std::string context_suffix() {
  std::string out;
  const ProcessContext& pc = process_context();
  if (pc.size > 1) out = "rank " + std::to_string(pc.rank) + "/" + std::to_string(pc.size);
  for (const std::string& tag : context_stack()) {
    if (!out.empty()) out += ", ";
    out += tag;
  }
  return out.empty() ? out : " [" + out + "]";
}

/// Streams every argument into one string: str("(", 3, ", ", 4, ")") == "(3, 4)".
template <class... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

}  // namespace pmt::detail

namespace pmt {

// ---------------------------------------------------------------------------------------------

/// \brief Base of every error pmt throws; catch this to handle them all.
///
/// `op()` is the qualified operation ("pmt::ops::matmul"), `what()` the full message including
/// the rank context.
class Error : public std::runtime_error {
 public:
  Error(std::string_view op, const std::string& message)
      : std::runtime_error(std::string(op) + ": " + message + detail::context_suffix()), m_op(op) {}
  const std::string& op() const noexcept { return m_op; }

 private:
  std::string m_op;
};

/// \brief Tensor shapes or sizes that do not fit the op (wrong extents, non-divisible splits).
class ShapeError : public Error {
 public:
  using Error::Error;
};

/// \brief A configuration that cannot run (degrees that do not multiply to the world size,
/// a backend that is not available, an invalid option value).
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// \brief A communication failure reported by MPI or NCCL, or a collective mismatch.
class CommError : public Error {
 public:
  using Error::Error;
};

/// \brief A file that cannot be read or written, or whose contents are damaged.
class IoError : public Error {
 public:
  using Error::Error;
};

/// \brief RAII tag added to every pmt error message thrown on this thread while in scope.
///
/// \code
/// pmt::ErrorContext ctx("tp rank " + std::to_string(r) + "/" + std::to_string(n));
/// \endcode
class ErrorContext {
 public:
  explicit ErrorContext(std::string tag) { detail::context_stack().push_back(std::move(tag)); }
  ~ErrorContext() { detail::context_stack().pop_back(); }
  ErrorContext(const ErrorContext&)            = delete;
  ErrorContext& operator=(const ErrorContext&) = delete;
};

/// \brief The extents of a View as text: "(32, 768)"; "()" for a rank-0 View.
template <class View>
std::string shape_str(const View& v) {
  static_assert(Kokkos::is_view<View>::value, "pmt::shape_str: the argument must be a Kokkos::View");
  std::string out = "(";
  if constexpr (View::rank > 0) {  // no `i < 0` loop for rank 0 (nvcc warns of it)
    for (std::size_t i = 0; i < static_cast<std::size_t>(View::rank); ++i) {
      if (i > 0) out += ", ";
      out += std::to_string(v.extent(i));
    }
  } else {
    (void)v;
  }
  return out + ")";
}

namespace detail {

/// Throws ErrorT(op, message()) when `cond` is false; `message` is only called on failure.
template <class ErrorT = ShapeError, class MessageFn>
inline void require(bool cond, std::string_view op, MessageFn&& message) {
  static_assert(std::is_base_of_v<Error, ErrorT>, "pmt::detail::require: ErrorT must derive from pmt::Error");
  if (!cond) throw ErrorT(op, std::forward<MessageFn>(message)());
}

}  // namespace detail
}  // namespace pmt
