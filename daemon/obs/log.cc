#include "daemon/obs/log.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <mutex>

#include "daemon/obs/trace.h"

namespace idem {
namespace {

std::atomic<bool> access_log{true};

std::shared_ptr<spdlog::logger> Logger() {
  // shared_ptr: spdlog's registry API hands out shared loggers.
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_logger_mt("idem");
    l->set_pattern("%v");
    l->set_level(spdlog::level::info);
    l->flush_on(spdlog::level::info);
    return l;
  }();
  return logger;
}

spdlog::level::level_enum ToSpd(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return spdlog::level::debug;
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kWarn:
      return spdlog::level::warn;
    case LogLevel::kError:
      return spdlog::level::err;
  }
  return spdlog::level::info;
}

const char* Name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

}  // namespace

void SetLogLevel(std::string_view level) {
  LogLevel l = LogLevel::kInfo;
  if (level == "debug") l = LogLevel::kDebug;
  if (level == "warn") l = LogLevel::kWarn;
  if (level == "error") l = LogLevel::kError;
  Logger()->set_level(ToSpd(l));
}

void SetAccessLog(bool on) { access_log.store(on, std::memory_order_relaxed); }

void LogAccess(const nlohmann::json& fields) {
  if (access_log.load(std::memory_order_relaxed)) LogEvent(LogLevel::kInfo, "access", fields);
}

bool LogEnabled(LogLevel level) { return Logger()->should_log(ToSpd(level)); }

bool AccessLogEnabled() {
  return access_log.load(std::memory_order_relaxed) && LogEnabled(LogLevel::kInfo);
}

void LogEvent(LogLevel level, std::string_view event, const nlohmann::json& fields) {
  auto logger = Logger();
  if (!logger->should_log(ToSpd(level))) return;
  nlohmann::json line = nlohmann::json::object();
  auto now = std::chrono::system_clock::now();
  line["ts_ms"] =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  line["level"] = Name(level);
  line["event"] = event;
  if (const TraceContext* trace = CurrentTrace()) {
    if (!trace->request_id.empty()) line["request_id"] = trace->request_id;
    line["trace_id"] = trace->trace_id;
  }
  if (fields.is_object()) {
    for (auto it = fields.begin(); it != fields.end(); ++it) line[it.key()] = it.value();
  }
  logger->log(ToSpd(level), "{}",
              line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

}  // namespace idem
