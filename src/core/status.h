// Error values for bad input: every failure names what it was reading and why (file, tensor,
// position, reason). Broken internal invariants use FP4MOE_CHECK (core/check.h) instead.
#pragma once

#include <string>
#include <utility>
#include <variant>

#include "core/check.h"

namespace fp4moe {

// What kind of failure an Error is, for the exit-code table of the CLI (0 ok, 1 a check or the
// operation failed, 2 bad input, 130/143 interrupted). Most errors are bad input.
enum class ErrorKind {
  kBadInput,     // the input (a file, a tensor, an option) is wrong: exit status 2
  kFailed,       // the input was fine but the operation failed (I/O, an output check): 1
  kInterrupted,  // stopped on request (SIGINT/SIGTERM): 128 + the signal
};

struct Error {
  std::string message;  // complete and human-readable: "<file>: tensor '<name>': <reason>"
  ErrorKind kind = ErrorKind::kBadInput;
};

// A value or an Error. Deliberately small: std::expected is C++23.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}      // NOLINT(google-explicit-constructor)
  Result(Error error) : state_(std::move(error)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return state_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & {
    FP4MOE_CHECK(ok());
    return std::get<0>(state_);
  }
  const T& value() const& {
    FP4MOE_CHECK(ok());
    return std::get<0>(state_);
  }
  T&& value() && {
    FP4MOE_CHECK(ok());
    return std::get<0>(std::move(state_));
  }
  const Error& error() const {
    FP4MOE_CHECK(!ok());
    return std::get<1>(state_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Error> state_;
};

// Success or an Error, for operations without a result value.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), failed_(true) {}  // NOLINT
  static Status Ok() { return Status(); }

  bool ok() const { return !failed_; }
  explicit operator bool() const { return ok(); }
  const Error& error() const {
    FP4MOE_CHECK(failed_);
    return error_;
  }

 private:
  Error error_;
  bool failed_ = false;
};

}  // namespace fp4moe

// Propagates an error out of a function that returns Status or Result<U>.
#define FP4MOE_RETURN_IF_ERROR(expr)                         \
  do {                                                       \
    auto fp4moe_status_ = (expr);                            \
    if (!fp4moe_status_.ok()) return fp4moe_status_.error(); \
  } while (0)
