#include "daemon/core/status.h"

namespace idem {

std::string_view CodeName(Code code) {
  switch (code) {
    case Code::kOk:
      return "OK";
    case Code::kInvalidArgument:
      return "InvalidArgument";
    case Code::kNotFound:
      return "NotFound";
    case Code::kAlreadyExists:
      return "AlreadyExists";
    case Code::kFailedPrecondition:
      return "FailedPrecondition";
    case Code::kAborted:
      return "Aborted";
    case Code::kUnavailable:
      return "Unavailable";
    case Code::kDeadlineExceeded:
      return "DeadlineExceeded";
    case Code::kResourceExhausted:
      return "ResourceExhausted";
    case Code::kUnauthenticated:
      return "Unauthenticated";
    case Code::kPermissionDenied:
      return "PermissionDenied";
    case Code::kInternal:
      return "Internal";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(CodeName(code_));
  out += ": ";
  out += message_;
  // A message that already names its field (a config error's
  // "file:line: /pointer: ...") is not told it again at its end.
  if (!field_.empty() && message_.find(field_) == std::string::npos) {
    out += " (at " + field_ + ")";
  }
  return out;
}

}  // namespace idem
