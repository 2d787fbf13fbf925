// datapar's exceptions and the checks that raise them.
//
// datapar throws, as libtorch does. Every error is a datapar::Error; the subclass says what
// kind of failure it is and whether retrying can help (docs/errors.md):
//   InvalidArgumentError  the caller asked for something impossible; fix the call.
//   TimeoutError          something did not arrive in time; a retry may succeed.
//   CommError             a peer or transport failed; rebuild the process group.
//   CheckpointError       a checkpoint is missing, truncated or corrupt.
// A message says what happened, with the values involved, and what to do next.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace datapar {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class InvalidArgumentError : public Error {
 public:
  using Error::Error;
};

class TimeoutError : public Error {
 public:
  using Error::Error;
};

class CommError : public Error {
 public:
  using Error::Error;
};

class CheckpointError : public Error {
 public:
  using Error::Error;
};

namespace detail {

template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

[[noreturn]] void throw_internal_error(const char* file, int line, const char* condition,
                                       const std::string& detail);

}  // namespace detail
}  // namespace datapar

// For caller mistakes: throws InvalidArgumentError with the streamed message.
#define DATAPAR_CHECK(cond, ...)                                                     \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      throw ::datapar::InvalidArgumentError(::datapar::detail::str_cat(__VA_ARGS__)); \
    }                                                                                \
  } while (0)

// Comparison forms print both values after the message.
#define DATAPAR_CHECK_OP_(a, b, op, ...)                                                 \
  do {                                                                                   \
    const auto& datapar_a_ = (a);                                                        \
    const auto& datapar_b_ = (b);                                                        \
    if (!(datapar_a_ op datapar_b_)) {                                                   \
      throw ::datapar::InvalidArgumentError(::datapar::detail::str_cat(                  \
          __VA_ARGS__, " (" #a " = ", datapar_a_, ", " #b " = ", datapar_b_, ")"));      \
    }                                                                                    \
  } while (0)
#define DATAPAR_CHECK_EQ(a, b, ...) DATAPAR_CHECK_OP_(a, b, ==, __VA_ARGS__)
#define DATAPAR_CHECK_LT(a, b, ...) DATAPAR_CHECK_OP_(a, b, <, __VA_ARGS__)
#define DATAPAR_CHECK_LE(a, b, ...) DATAPAR_CHECK_OP_(a, b, <=, __VA_ARGS__)

// For datapar's own bugs: a broken invariant, never a user's mistake.
#define DATAPAR_INTERNAL_ASSERT(cond, ...)                                      \
  do {                                                                          \
    if (!(cond)) {                                                              \
      ::datapar::detail::throw_internal_error(__FILE__, __LINE__, #cond,        \
                                              ::datapar::detail::str_cat("" __VA_ARGS__)); \
    }                                                                           \
  } while (0)
