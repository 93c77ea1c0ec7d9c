// Private to daemon/store: the JSON form of the records that store.h does
// not give a ToJson/FromJson of their own, and the conversion between a JSON
// value and the bytes a backend stores.
//
// Decoders never throw: a malformed stored record is Internal.
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "daemon/core/status.h"
#include "daemon/store/store.h"

namespace idem::store_internal {

// Compact JSON text. InvalidArgument if a string in `j` is not valid UTF-8.
StatusOr<std::string> EncodeJson(const Json& j);
// Parses stored JSON text; Internal if it is not JSON. `what` names the
// record family in the message.
StatusOr<Json> DecodeJson(std::string_view text, std::string_view what);

// WorkItem::FromJson(parsed text) without building the whole document: the
// journal's read path (every duplicate claim) decodes straight from the
// stored text. Same acceptance rules as WorkItem::FromJson.
StatusOr<WorkItem> DecodeWorkItem(std::string_view text);
// The stored text of a WorkItem, written directly rather than through a Json
// tree (every claim writes one): the members of WorkItem::ToJson, which
// DecodeWorkItem reads back. InvalidArgument if a string is not UTF-8.
StatusOr<std::string> EncodeWorkItem(const WorkItem& w);

// A decision as both engines store it (store.h, DecisionStore::GetByKey):
// the hot record, Decision::ToJson with `trace` cut to TraceSummary and
// kTraceApartMember true, and beside it the whole trace, which only reads
// by id need. A trace without detail stays whole in the hot record (no
// `trace`). InvalidArgument if a string is not UTF-8.
inline constexpr char kTraceApartMember[] = "trace_apart";
struct StoredDecision {
  std::string hot;
  std::optional<std::string> trace;  // the whole trace's JSON text, when apart
};
StatusOr<StoredDecision> EncodeDecision(const Decision& d);
// Decodes a hot record. A record holding its whole trace (no
// kTraceApartMember: a trace without detail, or a record written before
// the split) reads whole. `trace_apart` (optional) tells whether the whole
// trace is stored apart; d.trace_whole is its negation.
StatusOr<Decision> DecodeDecision(std::string_view hot, bool* trace_apart = nullptr);
// Puts the whole trace, stored apart, back into `d`; Internal if not JSON.
Status AttachTrace(Decision& d, std::string_view trace_text);
// Cuts a whole trace with detail to its summary (what GetByKey answers).
void CutTraceToSummary(Decision& d);

Json IdemRecordToJson(const IdemRecord& r);
StatusOr<IdemRecord> IdemRecordFromJson(const Json& j);
std::string_view IdemStateName(IdemRecord::State s);

Json NamedLeaseToJson(const NamedLease& l);
StatusOr<NamedLease> NamedLeaseFromJson(const Json& j);

// The event without `hash`: exactly what the audit chain hashes.
Json AuditEventBodyToJson(const AuditEvent& e);
// The stored form: the body plus `hash`.
Json AuditEventToJson(const AuditEvent& e);
StatusOr<AuditEvent> AuditEventFromJson(const Json& j);

StatusOr<WorkState> ParseWorkState(std::string_view name);

// A list's ?cursor= that no page of that list returned (decisions, plans;
// both engines): 400 with pointer query:cursor.
inline Status BadCursor() {
  return InvalidArgument("cursor is not one this list returned", "query:cursor");
}

}  // namespace idem::store_internal
