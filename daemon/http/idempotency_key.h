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

// RFC 7240 `Prefer: wait=N` (N: delta-seconds, RFC 9111 5.2: digits, at
// most 2^31-1). `values`: every Prefer header of the request; each holds a
// comma-separated list of preferences, each possibly with ";param"s.
// Preferences other than wait are ignored (RFC 7240 section 2). Returns the
// wait in milliseconds, clamped to [0, max_wait_ms] (the server may honour
// less than asked), 0 when absent. InvalidArgument (field "header:Prefer")
// when wait is not a number or is out of range; the range is checked before
// scaling, so no value overflows.
StatusOr<int64_t> ParsePreferWait(const std::vector<std::string>& values, int64_t max_wait_ms);

// sha256 hex of method, path and the canonical (JCS) body.
std::string RequestFingerprint(std::string_view method, std::string_view path,
                               std::string_view canonical_body);

}  // namespace idem
