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

// {type, title, status, detail, pointer?, request_id, retryable?}
nlohmann::json ProblemBody(int http_status, const Status& status, const std::string& request_id);

inline constexpr const char* kProblemContentType = "application/problem+json";

}  // namespace idem
