// Status and StatusOr<T>: the error currency at every component boundary.
//
// A Status is either OK or carries a canonical code, a human message, an
// optional JSON pointer to the offending field (used for RFC 9457
// problem+json answers), and a `retryable` bit that says whether repeating
// the same operation later can help (set by upstream adapters).
//
// No exception crosses a component boundary: third-party errors are
// translated into Status in the one adapter file that talks to the library.
//
// Thread-safety: values; safe to copy between threads.
#pragma once

#include <cassert>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace idem {

enum class Code {
  kOk = 0,
  kInvalidArgument,     // bad input from the caller; fix the request
  kNotFound,            // no such record
  kAlreadyExists,       // a unique record exists already
  kFailedPrecondition,  // the system is not in the state the call requires
  kAborted,             // a conflict (e.g. same key, other payload)
  kUnavailable,         // an upstream or the store is down; retry may help
  kDeadlineExceeded,    // the operation ran out of time
  kResourceExhausted,   // a limit was hit (size, depth, quota, rate)
  kUnauthenticated,     // no or bad credentials
  kPermissionDenied,    // credentials lack the role
  kInternal,            // a bug or a broken invariant
};

std::string_view CodeName(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(Code code, std::string message, std::string field = {}, bool retryable = false)
      : code_(code),
        message_(std::move(message)),
        field_(std::move(field)),
        retryable_(retryable) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // JSON pointer (RFC 6901) of the offending field, or empty.
  const std::string& field() const { return field_; }
  bool retryable() const { return retryable_; }

  Status WithField(std::string field) const& {
    Status s = *this;
    s.field_ = std::move(field);
    return s;
  }
  Status WithRetryable(bool r) const& {
    Status s = *this;
    s.retryable_ = r;
    return s;
  }
  // Prefixes the message with context: "loading config: <message>".
  Status Annotate(std::string_view context) const& {
    Status s = *this;
    s.message_ = std::string(context) + ": " + s.message_;
    return s;
  }

  // "InvalidArgument: message (at /path)".
  std::string ToString() const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
  std::string field_;
  bool retryable_ = false;
};

inline Status InvalidArgument(std::string msg, std::string field = {}) {
  return Status(Code::kInvalidArgument, std::move(msg), std::move(field));
}
inline Status NotFound(std::string msg) { return Status(Code::kNotFound, std::move(msg)); }
inline Status AlreadyExists(std::string msg) {
  return Status(Code::kAlreadyExists, std::move(msg));
}
inline Status FailedPrecondition(std::string msg) {
  return Status(Code::kFailedPrecondition, std::move(msg));
}
inline Status Aborted(std::string msg) { return Status(Code::kAborted, std::move(msg)); }
inline Status Unavailable(std::string msg, bool retryable = true) {
  return Status(Code::kUnavailable, std::move(msg), {}, retryable);
}
inline Status DeadlineExceeded(std::string msg) {
  return Status(Code::kDeadlineExceeded, std::move(msg), {}, true);
}
inline Status ResourceExhausted(std::string msg, std::string field = {}) {
  return Status(Code::kResourceExhausted, std::move(msg), std::move(field));
}
inline Status Internal(std::string msg) { return Status(Code::kInternal, std::move(msg)); }

// StatusOr<T>: a T or a non-OK Status. Accessing the value of an error aborts.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    if (status_.ok()) std::abort();                       // OK without a value is a bug
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  T& value() & {
    if (!value_) std::abort();
    return *value_;
  }
  const T& value() const& {
    if (!value_) std::abort();
    return *value_;
  }
  T&& value() && {
    if (!value_) std::abort();
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

#define IDEM_CONCAT_INNER(a, b) a##b
#define IDEM_CONCAT(a, b) IDEM_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)    \
  do {                           \
    ::idem::Status _st = (expr); \
    if (!_st.ok()) return _st;   \
  } while (0)

#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()

#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(IDEM_CONCAT(_statusor_, __LINE__), lhs, expr)

}  // namespace idem
