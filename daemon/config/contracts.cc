// Durations and the contract sentences `idem contracts` prints (R1-R3).
#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>

#include "daemon/config/config.h"

namespace idem {
namespace {

constexpr int64_t kSecond = 1000;
constexpr int64_t kMinute = 60 * kSecond;
constexpr int64_t kHour = 60 * kMinute;
constexpr int64_t kDay = 24 * kHour;

std::string JoinWords(const std::vector<std::string>& words) {
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i > 0) out += i + 1 == words.size() ? " and " : ", ";
    out += words[i];
  }
  return out;
}

std::string FormatNumber(double value) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(value);
}

std::string Window(int64_t ms) { return ms == 0 ? "forever" : "for " + FormatDuration(ms); }

std::string StepSentence(const StepConfig& s) {
  std::string identity = "the same input";
  if (!s.input.drop.empty()) identity += " (ignoring " + JoinWords(s.input.drop) + ")";
  identity += " sent to provider " + s.provider + ", model " + s.model + ", prompt " +
              s.prompt.version + ", " +
              (s.temperature ? "temperature " + FormatNumber(*s.temperature)
                             : std::string("the provider's default temperature")) +
              " and the same output schema";
  if (!s.tools.empty()) identity += " and tools";
  return "step " + s.name + ": the same work is " + identity + "; it is remembered " +
         Window(s.cache_window_ms) +
         "; a duplicate returns the cached decision without calling the model again.";
}

std::string ActionSentence(const ActionConfig& a) {
  std::string duplicate;
  if (a.on_duplicate == "return_original") {
    duplicate = "a duplicate returns the original result";
  } else if (a.on_duplicate == "conflict") {
    duplicate = "a duplicate is refused with a conflict error and nothing runs again";
  } else if (a.on_duplicate == "ignore") {
    duplicate = "a duplicate is silently ignored: nothing runs again and no result is returned";
  } else {
    duplicate = "a duplicate is answered with " + a.on_duplicate;
  }
  return "action " + a.name + ": the same work is the same " + JoinWords(a.identity_fields) +
         " (version " + a.identity_version + "); it is remembered " + Window(a.window_ms) + "; " +
         duplicate + ".";
}

}  // namespace

StatusOr<std::pair<std::string, int>> ParseListen(const std::string& listen) {
  size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= listen.size()) {
    return InvalidArgument("listen address '" + listen + "' is not host:port", "/server/listen");
  }
  std::string host = listen.substr(0, colon);
  if (host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = 0;
  for (char c : listen.substr(colon + 1)) {
    if (c < '0' || c > '9') {
      return InvalidArgument("listen port in '" + listen + "' is not a number", "/server/listen");
    }
    port = port * 10 + (c - '0');
    if (port > 65535) {
      return InvalidArgument("listen port in '" + listen + "' is above 65535", "/server/listen");
    }
  }
  return std::make_pair(host, port);
}

bool IsReservedCallerName(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower == "anonymous" || lower == "idem" || lower.rfind("inbox:", 0) == 0;
}

std::string HttpUrl(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

StatusOr<int64_t> ParseDuration(const std::string& text) {
  if (text == "forever") return int64_t{0};
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0) {
    return InvalidArgument("'" + text + "' is not a duration (like 250ms, 30s, 5m, 24h, 7d)");
  }
  const std::string unit = text.substr(digits);
  int64_t scale = 0;
  if (unit == "ms") {
    scale = 1;
  } else if (unit == "s") {
    scale = kSecond;
  } else if (unit == "m") {
    scale = kMinute;
  } else if (unit == "h") {
    scale = kHour;
  } else if (unit == "d") {
    scale = kDay;
  } else {
    return InvalidArgument("'" + text +
                           "' is not a duration: a whole number and one unit (ms, s, m, h or d), "
                           "like 1500ms or 90m");
  }
  // Durations are added to "now" (expiries, leases): a bound far below
  // INT64_MAX keeps every such sum from overflowing. Checked before scaling.
  constexpr int64_t kMaxDurationMs = 36500 * kDay;  // 100 years; longer is "forever"
  int64_t count = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + digits, count);
  if (ec != std::errc() || count > kMaxDurationMs / scale) {
    return InvalidArgument("'" + text + "' is too long a duration (at most 36500d)");
  }
  return count * scale;
}

std::string FormatDuration(int64_t ms) {
  if (ms != 0 && ms % kDay == 0 && ms >= 2 * kDay) return std::to_string(ms / kDay) + "d";
  if (ms != 0 && ms % kHour == 0) return std::to_string(ms / kHour) + "h";
  if (ms != 0 && ms % kMinute == 0) return std::to_string(ms / kMinute) + "m";
  if (ms != 0 && ms % kSecond == 0) return std::to_string(ms / kSecond) + "s";
  return std::to_string(ms) + "ms";
}

std::string DescribeContracts(const Config& config) {
  std::string out;
  for (const auto& [name, step] : config.steps) out += StepSentence(step) + "\n";
  for (const auto& [name, action] : config.actions) out += ActionSentence(action) + "\n";
  return out;
}

}  // namespace idem
