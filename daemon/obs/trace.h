// Trace context (W3C Trace Context, https://www.w3.org/TR/trace-context/):
// the trace id that links a request to everything it causes (a decision,
// a plan, its approvals, work items and their attempts, provider and
// effector calls, log lines).
//
// Incoming: a caller's `traceparent` is accepted when valid (version 00
// exactly 55 characters; a higher version at least that long, with the
// fields of 00 first; lower-case hex; trace id and parent id not all zero;
// version ff never); an invalid or absent one is ignored and a new trace is
// generated, never an error. `tracestate` is kept only with a valid
// traceparent, only when every member is well formed (key=value), at most
// 32 members and 512 characters (members past either bound are dropped
// from the end).
//
// Outgoing: every HTTP call made while a TraceScope is active (provider
// and effector calls; see TracingHttpClient) carries
// `traceparent: 00-<trace id>-<a new span id>-<flags>`, `tracestate` when
// there is one, and `X-Request-Id`.
//
// Thread-safety: the parse/format functions are pure; CurrentTrace and
// TraceScope are per thread (a scope set by the server around a handler,
// or by a worker around one item of work).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "daemon/core/http_client.h"

namespace idem {

inline constexpr size_t kMaxTracestateChars = 512;
inline constexpr size_t kMaxTracestateMembers = 32;

struct Traceparent {
  std::string trace_id;   // 32 lower-case hex, not all zero
  std::string parent_id;  // 16 lower-case hex, not all zero
  uint8_t flags = 0;      // bit 0: sampled
};

// The fields of a valid header value, nullopt for an invalid one.
std::optional<Traceparent> ParseTraceparent(std::string_view value);
// "00-<trace_id>-<span_id>-<flags as 2 hex>".
std::string FormatTraceparent(const std::string& trace_id, const std::string& span_id,
                              uint8_t flags);
// The bounded tracestate ("" when the value is invalid or empty): members
// trimmed and joined by ",".
std::string BoundTracestate(std::string_view value);
// Is `id` a trace id idem would accept (32 lower-case hex, not all zero)?
bool ValidTraceId(std::string_view id);

std::string NewTraceId();  // 32 random hex
std::string NewSpanId();   // 16 random hex

struct TraceContext {
  std::string trace_id;
  std::string parent_id;  // the caller's span ("" when the trace started here)
  std::string span_id;    // this request's own span (FromHeaders makes one)
  uint8_t flags = 0;
  std::string tracestate;
  std::string request_id;

  // The caller's context when `traceparent` is valid, else a new trace
  // (flags 01, no tracestate).
  static TraceContext FromHeaders(std::string_view traceparent, std::string_view tracestate,
                                  std::string request_id);
  // A stored trace id (a work item's) continued by a later actor: a new
  // trace when `trace_id` is not valid (a record from before traces).
  static TraceContext Continue(std::string_view trace_id, std::string request_id);

  // A traceparent for one outgoing call: a new span id each time.
  std::string OutgoingTraceparent() const;
  // Adds traceparent, tracestate (when set) and X-Request-Id (when set),
  // replacing any of them already in `headers`.
  void AddHeaders(HttpHeaders& headers) const;
};

// The context of the calling thread, nullptr when none is set.
const TraceContext* CurrentTrace();
// trace_id / request_id of the current context, "" when none.
std::string CurrentTraceId();
std::string CurrentRequestId();

// Sets the calling thread's context until destroyed (then the previous one
// is back). Not movable: a scope lives on one thread's stack.
class TraceScope {
 public:
  explicit TraceScope(TraceContext context);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  TraceContext context_;
  const TraceContext* previous_;
};

// Where RecordTraceEvent goes (the daemon points it at the store's trace
// index, store.h TraceIndex); empty: nowhere. Set before threads use it,
// cleared (empty) before what it refers to is destroyed. `detail` is the
// text of a JSON object.
using TraceSink = std::function<void(const std::string& trace_id, std::string_view type,
                                     std::string_view ref, std::string detail)>;
void SetTraceSink(TraceSink sink);
// Records that `type` `ref` happened under the calling thread's trace; a
// no-op without a TraceScope or a sink. `detail`: the text of a JSON object
// (JsonObjectWriter on hot paths, TraceDetail elsewhere).
void RecordTraceEvent(std::string_view type, std::string_view ref, std::string detail = "{}");
// The same under `trace_id` (a valid one, ValidTraceId) instead of the
// calling thread's trace: for a caller that has the id at hand, without
// setting a TraceScope (which copies a whole context) for one entry.
void RecordTraceEventIn(const std::string& trace_id, std::string_view type, std::string_view ref,
                        std::string detail = "{}");
// `detail`'s text for RecordTraceEvent; text that is not UTF-8 is replaced
// (U+FFFD), so it never fails.
std::string TraceDetail(const nlohmann::json& detail);

// An HttpClient that adds the current thread's trace headers (see above)
// to every request, then sends it through `inner` (which must outlive it).
std::unique_ptr<HttpClient> MakeTracingHttpClient(HttpClient& inner);

}  // namespace idem
