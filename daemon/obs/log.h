// Structured logs: one JSON object per line on stderr, through spdlog.
// Fields are passed as JSON so values are escaped properly. Callers never
// pass secrets (provider keys, bearer tokens); request ids and work ids are
// fine and are what links a log line to a journal record (R38).
//
// Thread-safety: all functions may be called concurrently.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

namespace idem {

enum class LogLevel { kDebug, kInfo, kWarn, kError };

// Sets the minimum level ("debug", "info", "warn", "error"); default info.
void SetLogLevel(std::string_view level);
bool LogEnabled(LogLevel level);
// Writes {"ts_ms":..., "level":..., "event":event, "request_id", "trace_id",
// ...fields}: request_id and trace_id come from the calling thread's
// TraceScope (daemon/obs/trace.h) when one is set; `fields` may override them.
void LogEvent(LogLevel level, std::string_view event, const nlohmann::json& fields = {});

// The access log: one line per HTTP request, event "access", level info
// (so log.level warn or error silences it too). On by default.
void SetAccessLog(bool on);
void LogAccess(const nlohmann::json& fields);
// Would LogAccess write a line? (Callers skip building the fields when not.)
bool AccessLogEnabled();

}  // namespace idem
