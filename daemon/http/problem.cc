#include "daemon/http/problem.h"

#include <utility>

#include "daemon/http/http1.h"
#include "daemon/obs/log.h"

namespace idem {

int HttpStatusFor(Code code) {
  switch (code) {
    case Code::kOk:
      return 200;
    case Code::kInvalidArgument:
      return 400;
    case Code::kNotFound:
      return 404;
    case Code::kAlreadyExists:
      return 409;
    case Code::kFailedPrecondition:
      return 409;
    case Code::kAborted:
      return 409;
    case Code::kUnavailable:
      return 503;
    case Code::kDeadlineExceeded:
      return 504;
    case Code::kResourceExhausted:
      return 413;
    case Code::kUnauthenticated:
      return 401;
    case Code::kPermissionDenied:
      return 403;
    case Code::kInternal:
      return 500;
  }
  return 500;
}

Status StatusForRefusal(int http_status, std::string message) {
  switch (http_status) {
    case 503:
      return Unavailable(std::move(message));
    case 408:
      return DeadlineExceeded(std::move(message));
    case 413:
    case 431:
      return ResourceExhausted(std::move(message));
    default:
      return InvalidArgument(std::move(message));
  }
}

std::string CallerDetail(int http_status, const Status& status, const std::string& request_id) {
  const std::string& detail = status.message();
  // The store's message may come annotated ("store: postgres: ...").
  const bool database =
      detail.starts_with("postgres: ") || detail.find(": postgres: ") != std::string::npos;
  if (http_status < 500 || !database) return detail;
  // The database's own words name its host and port and the statement
  // that failed: the operator's to read (in the log), not every caller's.
  LogEvent(LogLevel::kWarn, "http.store_error",
           {{"request_id", request_id}, {"status", http_status}, {"error", detail}});
  return "the PostgreSQL store cannot serve this now" +
         std::string(status.retryable() ? "; retry later" : "") +
         " (the daemon's log has the database's message under http.store_error, request_id " +
         request_id + ")";
}

Status BodyParseError(const Status& parsed, size_t body_bytes, size_t max_bytes) {
  Status why = parsed.field().empty() ? parsed.WithField(kWholeBody) : parsed;
  if (why.code() == Code::kResourceExhausted && body_bytes <= max_bytes) {
    return InvalidArgument(why.message(), why.field());
  }
  return why;
}

nlohmann::json ProblemBody(int http_status, const Status& status, const std::string& request_id) {
  std::string detail = CallerDetail(http_status, status, request_id);
  nlohmann::json body = {
      {"type", "urn:idem:problem:" + std::string(CodeName(status.code()))},
      {"title", std::string(http1::ReasonPhrase(http_status))},
      {"status", http_status},
      {"detail", std::move(detail)},
  };
  if (status.field() == kWholeBody) {
    body["pointer"] = "";
  } else if (!status.field().empty()) {
    body["pointer"] = status.field();
  }
  if (status.retryable()) body["retryable"] = true;
  if (!request_id.empty()) body["request_id"] = request_id;
  return body;
}

}  // namespace idem
