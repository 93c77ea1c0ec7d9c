// The identity of a unit of work of an action kind (R1, R4): the values at
// the kind's identity fields (JSON pointers into the args), as an object
// keyed by those pointers, hashed into the work_id:
//   work_id = sha256(kind + ":" + version + ":" + JCS(identity)).
//
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "daemon/config/config.h"
#include "daemon/core/identity.h"
#include "daemon/core/status.h"

namespace idem {

// InvalidArgument (field "/args<pointer>") when an identity field is absent,
// or holds an integer with |n| >= 2^53 (see CheckExactIntegers).
StatusOr<Json> ExtractIdentity(const Json& args, const std::vector<std::string>& fields);

// The work_id of `args` for action kind `action`.
StatusOr<KeyMaterial> ActionWorkId(const ActionConfig& action, const Json& args);

// A planned action's kind ({"kind": ..., "args": ...}): its "kind" member
// when that is a string; nullopt when the action is no object or its kind
// no string. A plan's actions come from a model's output, which the step's
// schema may leave open: readers name such an action, never throw on it.
std::optional<std::string> ActionKind(const Json& action);

// The call a request is (WorkItem::call_id): sha256 hex of the caller's name
// and its Idempotency-Key, the pair the daemon keys a call's answer under
// (neither holds a newline). "" when the request has no key: such a call
// cannot be told from another.
std::string CallId(const std::string& caller, const std::string& idempotency_key);

// A planned action's call_id (GateAction stores the gated call's there); ""
// when it has none or it is not a string.
std::string ActionCallId(const Json& action);

}  // namespace idem
