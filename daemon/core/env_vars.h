// `${VAR}` references in config values (headers of effectors, providers,
// outbox subscribers and notification webhooks): the one reading of them.
//
// Promises: ExpandEnv replaces each `${NAME}` in `value` with the
// environment variable NAME's value, and appends every value it used to
// `used` (when not null) so the caller can redact them wherever the header
// might be echoed (an upstream's error body, a log line). Text outside
// `${...}` is kept as it is.
//
// Errors: InvalidArgument at `field` for an unclosed `${`;
// FailedPrecondition at `field` for a variable that is unset or empty (the
// message names the variable, never a value).
//
// Thread-safety: reads the environment; safe as long as nothing calls
// setenv concurrently (the daemon reads its config at start-up only).
#pragma once

#include <string>
#include <vector>

#include "daemon/core/status.h"

namespace idem {

StatusOr<std::string> ExpandEnv(const std::string& value, const std::string& field,
                                std::vector<std::string>* used = nullptr);

}  // namespace idem
