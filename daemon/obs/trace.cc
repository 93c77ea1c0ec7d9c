#include "daemon/obs/trace.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include "daemon/core/crypto.h"

namespace idem {
namespace {

thread_local const TraceContext* current_trace = nullptr;

std::mutex sink_mu;
std::shared_ptr<const TraceSink> sink;  // guarded by sink_mu

bool LowerHex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool AllZero(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == '0'; });
}

int HexDigit(char c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// key = simple-key / tenant-id "@" system-id (lcalpha first, then
// lcalpha, digits, "_", "-", "*", "/"); the tenant form may start with a digit.
bool ValidKey(std::string_view key) {
  if (key.empty() || key.size() > 256) return false;
  size_t at = key.find('@');
  auto chars_ok = [](std::string_view part, bool digit_first, size_t max) {
    if (part.empty() || part.size() > max) return false;
    char f = part.front();
    if (!((f >= 'a' && f <= 'z') || (digit_first && f >= '0' && f <= '9'))) return false;
    return std::all_of(part.begin(), part.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '*' ||
             c == '/';
    });
  };
  if (at == std::string_view::npos) return chars_ok(key, false, 256);
  return chars_ok(key.substr(0, at), true, 241) && chars_ok(key.substr(at + 1), false, 14);
}

// value: 1-256 printable ASCII except "," and "=", not ending in a space.
bool ValidValue(std::string_view value) {
  if (value.empty() || value.size() > 256 || value.back() == ' ') return false;
  return std::all_of(value.begin(), value.end(),
                     [](char c) { return c >= 0x20 && c <= 0x7e && c != ',' && c != '='; });
}

std::string RandomNonZeroHex(size_t bytes) {
  for (;;) {
    std::string id = RandomHex(bytes);
    if (!AllZero(id)) return id;
  }
}

class TracingHttpClient final : public HttpClient {
 public:
  explicit TracingHttpClient(HttpClient& inner) : inner_(inner) {}
  StatusOr<HttpResponse> Send(const HttpRequest& request) override {
    const TraceContext* trace = CurrentTrace();
    if (trace == nullptr) return inner_.Send(request);
    HttpRequest traced = request;
    trace->AddHeaders(traced.headers);
    return inner_.Send(traced);
  }

 private:
  HttpClient& inner_;
};

}  // namespace

std::optional<Traceparent> ParseTraceparent(std::string_view v) {
  // version "-" trace-id "-" parent-id "-" flags: 2+1+32+1+16+1+2 = 55.
  if (v.size() < 55) return std::nullopt;
  std::string_view version = v.substr(0, 2);
  if (!LowerHex(version) || version == "ff") return std::nullopt;
  if (version == "00" ? v.size() != 55 : (v.size() > 55 && v[55] != '-')) return std::nullopt;
  if (v[2] != '-' || v[35] != '-' || v[52] != '-') return std::nullopt;
  std::string_view trace_id = v.substr(3, 32), parent_id = v.substr(36, 16),
                   flags = v.substr(53, 2);
  if (!LowerHex(trace_id) || !LowerHex(parent_id) || !LowerHex(flags)) return std::nullopt;
  if (AllZero(trace_id) || AllZero(parent_id)) return std::nullopt;
  Traceparent out;
  out.trace_id = std::string(trace_id);
  out.parent_id = std::string(parent_id);
  out.flags = static_cast<uint8_t>(HexDigit(flags[0]) * 16 + HexDigit(flags[1]));
  return out;
}

std::string FormatTraceparent(const std::string& trace_id, const std::string& span_id,
                              uint8_t flags) {
  static const char kHex[] = "0123456789abcdef";
  std::string out = "00-" + trace_id + "-" + span_id + "-";
  out += kHex[flags >> 4];
  out += kHex[flags & 0xf];
  return out;
}

std::string BoundTracestate(std::string_view value) {
  if (value.size() > 8 * kMaxTracestateChars) return "";  // not worth reading
  std::vector<std::string_view> members;
  size_t start = 0;
  while (start <= value.size()) {
    size_t comma = value.find(',', start);
    if (comma == std::string_view::npos) comma = value.size();
    std::string_view member = Trim(value.substr(start, comma - start));
    start = comma + 1;
    if (member.empty()) continue;  // empty list members are allowed and dropped
    size_t eq = member.find('=');
    if (eq == std::string_view::npos || !ValidKey(member.substr(0, eq)) ||
        !ValidValue(member.substr(eq + 1))) {
      return "";  // one malformed member: the whole header is discarded
    }
    members.push_back(member);
  }
  std::string out;
  size_t kept = 0;
  for (std::string_view m : members) {
    if (kept == kMaxTracestateMembers) break;
    size_t grown = out.size() + (out.empty() ? 0 : 1) + m.size();
    if (grown > kMaxTracestateChars) break;
    if (!out.empty()) out += ',';
    out.append(m);
    ++kept;
  }
  return out;
}

bool ValidTraceId(std::string_view id) { return id.size() == 32 && LowerHex(id) && !AllZero(id); }

std::string NewTraceId() { return RandomNonZeroHex(16); }
std::string NewSpanId() { return RandomNonZeroHex(8); }

TraceContext TraceContext::FromHeaders(std::string_view traceparent, std::string_view tracestate,
                                       std::string request_id) {
  TraceContext c;
  c.request_id = std::move(request_id);
  c.span_id = NewSpanId();
  if (auto parsed = ParseTraceparent(Trim(traceparent))) {
    c.trace_id = std::move(parsed->trace_id);
    c.parent_id = std::move(parsed->parent_id);
    c.flags = parsed->flags;
    c.tracestate = BoundTracestate(tracestate);
  } else {
    c.trace_id = NewTraceId();
    c.flags = 0x01;
  }
  return c;
}

TraceContext TraceContext::Continue(std::string_view trace_id, std::string request_id) {
  TraceContext c;
  c.request_id = std::move(request_id);
  c.trace_id = ValidTraceId(trace_id) ? std::string(trace_id) : NewTraceId();
  c.flags = 0x01;
  return c;
}

std::string TraceContext::OutgoingTraceparent() const {
  return FormatTraceparent(trace_id, NewSpanId(), flags);
}

void TraceContext::AddHeaders(HttpHeaders& headers) const {
  auto drop = [&](std::string_view name) {
    std::erase_if(headers, [&](const auto& h) {
      if (h.first.size() != name.size()) return false;
      for (size_t i = 0; i < name.size(); ++i) {
        char c = h.first[i];
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
        if (c != name[i]) return false;
      }
      return true;
    });
  };
  drop("traceparent");
  drop("tracestate");
  headers.emplace_back("traceparent", OutgoingTraceparent());
  if (!tracestate.empty()) headers.emplace_back("tracestate", tracestate);
  if (!request_id.empty()) {
    drop("x-request-id");
    headers.emplace_back("X-Request-Id", request_id);
  }
}

const TraceContext* CurrentTrace() { return current_trace; }

std::string CurrentTraceId() { return current_trace ? current_trace->trace_id : std::string(); }
std::string CurrentRequestId() { return current_trace ? current_trace->request_id : std::string(); }

TraceScope::TraceScope(TraceContext context)
    : context_(std::move(context)), previous_(current_trace) {
  current_trace = &context_;
}

TraceScope::~TraceScope() { current_trace = previous_; }

void SetTraceSink(TraceSink s) {
  std::shared_ptr<const TraceSink> next;
  if (s) next = std::make_shared<const TraceSink>(std::move(s));
  std::lock_guard<std::mutex> lock(sink_mu);
  sink = std::move(next);
}

void RecordTraceEvent(std::string_view type, std::string_view ref, std::string detail) {
  if (current_trace == nullptr) return;
  RecordTraceEventIn(current_trace->trace_id, type, ref, std::move(detail));
}

void RecordTraceEventIn(const std::string& trace_id, std::string_view type, std::string_view ref,
                        std::string detail) {
  std::shared_ptr<const TraceSink> s;
  {
    std::lock_guard<std::mutex> lock(sink_mu);
    s = sink;
  }
  if (s) (*s)(trace_id, type, ref, std::move(detail));
}

std::string TraceDetail(const nlohmann::json& detail) {
  return detail.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::unique_ptr<HttpClient> MakeTracingHttpClient(HttpClient& inner) {
  return std::make_unique<TracingHttpClient>(inner);
}

}  // namespace idem
