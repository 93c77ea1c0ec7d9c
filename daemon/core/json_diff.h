// A structural diff of two JSON values, by RFC 6901 pointer: what a replayed
// decision changed. Objects are compared member by member, arrays index by
// index (an element moved is a change at each index it touches), anything
// else by value (numbers as JSON compares them: 1 and 1.0 are equal).
//
// Thread-safety: a pure function.
#pragma once

#include <nlohmann/json.hpp>

namespace idem {

// {"added": [{pointer, value}], "removed": [{pointer, value}],
//  "changed": [{pointer, from, to}]} in document order; all three empty when
// the values are equal. A change of type at a pointer is one "changed".
// Depth beyond `max_depth` is compared as a whole value.
nlohmann::json JsonDiff(const nlohmann::json& from, const nlohmann::json& to, int max_depth = 64);

}  // namespace idem
