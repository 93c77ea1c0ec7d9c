// RFC 9457 problem details: every error the daemon answers is a
// `application/problem+json` body with type, title, status, detail, the
// JSON pointer of the offending field (when there is one) and the request
// id, so a caller can log one line and find the daemon's log line.
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "daemon/core/status.h"

namespace idem {

// The one table from canonical codes to HTTP statuses.
int HttpStatusFor(Code code);

// The status behind an answer the HTTP layer gives before any route runs
// (http_status from http1.h's framing errors or EventServer's refusals): 503
// (overloaded or shutting down) is Unavailable and 408 (the request was too
// slow to arrive) DeadlineExceeded, both retryable; 413 and 431 are
// ResourceExhausted; any other framing error is InvalidArgument.
Status StatusForRefusal(int http_status, std::string message);

// A Status field that means the request body as a whole: ProblemBody
// writes it as the pointer "" (RFC 6901: the whole document), which an
// empty field (no pointer at all) cannot say.
inline constexpr const char* kWholeBody = "#body";

// A request body that ParseJson refused (`parsed`, for a body of
// `body_bytes` under a size limit of `max_bytes`), as the request's error:
// nesting past the limit is a malformed request, InvalidArgument (400)
// with the pointer where it went too deep (the size was checked as the
// body arrived: 413); any other refusal as it is, at the whole body (pointer
// "") when it names no field.
Status BodyParseError(const Status& parsed, size_t body_bytes, size_t max_bytes);

// {type, title, status, detail, pointer?, request_id, retryable?}
nlohmann::json ProblemBody(int http_status, const Status& status, const std::string& request_id);
// The text of `status` a caller gets (ProblemBody's detail, an MCP tool's
// error, a part of an answer that reports a store failure): its message,
// except that the database's own words on a 5xx (host, port, statement;
// a message that starts "postgres: ", or has it after a context such as
// "store: ") are logged as http.store_error instead.
std::string CallerDetail(int http_status, const Status& status, const std::string& request_id);

inline constexpr const char* kProblemContentType = "application/problem+json";

}  // namespace idem
