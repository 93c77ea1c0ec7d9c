#include "daemon/http/problem.h"

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

namespace {

const char* TitleFor(int http_status) {
  switch (http_status) {
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 409:
      return "Conflict";
    case 413:
      return "Content Too Large";
    case 415:
      return "Unsupported Media Type";
    case 422:
      return "Unprocessable Content";
    case 429:
      return "Too Many Requests";
    case 500:
      return "Internal Server Error";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
  }
  return "Error";
}

}  // namespace

nlohmann::json ProblemBody(int http_status, const Status& status, const std::string& request_id) {
  nlohmann::json body = {
      {"type", "urn:idem:problem:" + std::string(CodeName(status.code()))},
      {"title", TitleFor(http_status)},
      {"status", http_status},
      {"detail", status.message()},
  };
  if (!status.field().empty()) body["pointer"] = status.field();
  if (status.retryable()) body["retryable"] = true;
  if (!request_id.empty()) body["request_id"] = request_id;
  return body;
}

}  // namespace idem
