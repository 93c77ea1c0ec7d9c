// The Idempotency-Key request header (IETF draft-ietf-httpapi-
// idempotency-key-header-07) and the request fingerprint.
//
// The value is an RFC 8941 sf-string ("...": printable ASCII, with \" and
// \\ escapes); a bare token (the many clients that send `Idempotency-Key:
// abc-123`) is accepted too. At most 255 characters after unquoting, never
// empty. A header repeated in one request is an error.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "daemon/core/status.h"

namespace idem {

// `values`: every Idempotency-Key header of the request, in order.
// Returns the key (unquoted), or "" when there is none;
// InvalidArgument (field "header:Idempotency-Key") when malformed.
StatusOr<std::string> ParseIdempotencyKey(const std::vector<std::string>& values);

// sha256 hex of method, path and the canonical (JCS) body.
std::string RequestFingerprint(std::string_view method, std::string_view path,
                               std::string_view canonical_body);

}  // namespace idem
