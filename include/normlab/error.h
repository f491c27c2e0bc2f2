// normlab/error.h — how normlab reports problems.
//
// Contract:
//   * Bad user input (shapes, axes, eps, files) throws normlab::Error with a message that names the
//     offending value and the valid range. These checks are always on, in every build type.
//   * Internal invariants use NL_DCHECK, which is compiled only in debug builds.
//   * The library never calls exit() and never prints; only the CLI turns errors into exit codes.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace normlab {

// The one exception type thrown for invalid input or unreadable files.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Throws normlab::Error with a formatted message: NL_CHECK(n > 0, "empty tensor: shape {}", s);
#define NL_CHECK(cond, ...)                                              \
  do {                                                                   \
    if (!(cond)) throw ::normlab::Error(::fmt::format(__VA_ARGS__));     \
  } while (0)

#ifndef NDEBUG
#define NL_DCHECK(cond)                                                                     \
  do {                                                                                      \
    if (!(cond))                                                                            \
      throw ::normlab::Error(::fmt::format("internal invariant failed: {} at {}:{}", #cond, \
                                           __FILE__, __LINE__));                            \
  } while (0)
#else
#define NL_DCHECK(cond) \
  do {                  \
  } while (0)
#endif

}  // namespace normlab
