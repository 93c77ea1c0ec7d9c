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
// Writes {"ts":..., "level":..., "event":event, ...fields}.
void LogEvent(LogLevel level, std::string_view event, const nlohmann::json& fields = {});

}  // namespace idem
