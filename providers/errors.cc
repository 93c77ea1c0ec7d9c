#include "providers/errors.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <ctime>
#include <vector>

#include "daemon/core/env_vars.h"
#include "daemon/core/json.h"

namespace idem {
namespace {

constexpr int64_t kMaxRetryAfterMs = 24LL * 3600 * 1000;
constexpr size_t kMaxProviderTextBytes = 512;
constexpr std::string_view kRetryMarker = " [retry_after_ms=";
constexpr std::string_view kRefusal = "model refused: ";
constexpr std::string_view kTruncated = "output truncated (";
constexpr std::string_view kFiltered = "output blocked by content filter";

std::string_view TrimView(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// A non-negative decimal number of units ("2", "1.5"), as milliseconds.
std::optional<int64_t> ParseDecimal(std::string_view text, double units_to_ms) {
  text = TrimView(text);
  if (text.empty() || text.size() > 32) return std::nullopt;
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c)) && c != '.') return std::nullopt;
  }
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  double ms = value * units_to_ms;
  if (ms > static_cast<double>(kMaxRetryAfterMs)) return kMaxRetryAfterMs;
  return static_cast<int64_t>(ms + 0.5);
}

int MonthIndex(std::string_view name) {
  static constexpr std::array<std::string_view, 12> kMonths = {
      "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  for (size_t i = 0; i < kMonths.size(); ++i) {
    if (name == kMonths[i]) return static_cast<int>(i);
  }
  return -1;
}

bool ParseInt(std::string_view text, int& out) {
  text = TrimView(text);
  if (text.empty()) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

bool ParseClock(std::string_view text, std::tm& tm) {
  // "HH:MM:SS"
  if (text.size() != 8 || text[2] != ':' || text[5] != ':') return false;
  return ParseInt(text.substr(0, 2), tm.tm_hour) && ParseInt(text.substr(3, 2), tm.tm_min) &&
         ParseInt(text.substr(6, 2), tm.tm_sec) && tm.tm_hour < 24 && tm.tm_min < 60 &&
         tm.tm_sec <= 60;
}

std::vector<std::string_view> SplitSpaces(std::string_view s) {
  std::vector<std::string_view> parts;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && s[i] == ' ') ++i;
    size_t j = i;
    while (j < s.size() && s[j] != ' ') ++j;
    if (j > i) parts.push_back(s.substr(i, j - i));
    i = j;
  }
  return parts;
}

std::string TypeOrCode(const Json& error) {
  for (const char* key : {"code", "type"}) {
    auto it = error.find(key);
    if (it != error.end() && it->is_string() && !it->get_ref<const std::string&>().empty()) {
      return it->get<std::string>();
    }
  }
  return "";
}

bool MessageHas(const Status& status, std::string_view marker) {
  return !status.ok() && status.message().find(marker) != std::string::npos;
}

}  // namespace

Code CodeForHttpStatus(int s) {
  switch (s) {
    case 400:
    case 422:
      return Code::kInvalidArgument;
    case 401:
      return Code::kUnauthenticated;
    case 403:
      return Code::kPermissionDenied;
    case 404:
      return Code::kNotFound;
    case 408:
    case 504:
      return Code::kDeadlineExceeded;
    case 409:
      return Code::kAborted;
    case 413:
    case 429:
      return Code::kResourceExhausted;
    default:
      break;
  }
  if (s >= 500 && s <= 599) return Code::kUnavailable;
  if (s >= 400 && s <= 499) return Code::kFailedPrecondition;
  if (s >= 200 && s <= 299) return Code::kOk;
  return Code::kUnavailable;
}

bool IsRetryableHttpStatus(int s) {
  return s == 408 || s == 409 || s == 429 || (s >= 500 && s <= 599);
}

std::optional<int64_t> ParseHttpDate(std::string_view text) {
  text = TrimView(text);
  std::vector<std::string_view> parts = SplitSpaces(text);
  std::tm tm{};
  int year = 0;
  if (parts.size() == 6 && parts[0].size() == 4 && parts[0][3] == ',' && parts[5] == "GMT") {
    // IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT"
    tm.tm_mon = MonthIndex(parts[2]);
    if (!ParseInt(parts[1], tm.tm_mday) || !ParseInt(parts[3], year) || !ParseClock(parts[4], tm)) {
      return std::nullopt;
    }
  } else if (parts.size() == 4 && parts[0].ends_with(',') && parts[3] == "GMT") {
    // RFC 850: "Sunday, 06-Nov-94 08:49:37 GMT"
    std::string_view date = parts[1];
    if (date.size() != 9 || date[2] != '-' || date[6] != '-') return std::nullopt;
    tm.tm_mon = MonthIndex(date.substr(3, 3));
    if (!ParseInt(date.substr(0, 2), tm.tm_mday) || !ParseInt(date.substr(7, 2), year) ||
        !ParseClock(parts[2], tm)) {
      return std::nullopt;
    }
    year += year < 70 ? 2000 : 1900;  // RFC 9110: interpret within 50 years
  } else if (parts.size() == 5) {
    // asctime: "Sun Nov  6 08:49:37 1994"
    tm.tm_mon = MonthIndex(parts[1]);
    if (!ParseInt(parts[2], tm.tm_mday) || !ParseClock(parts[3], tm) || !ParseInt(parts[4], year)) {
      return std::nullopt;
    }
  } else {
    return std::nullopt;
  }
  if (tm.tm_mon < 0 || tm.tm_mday < 1 || tm.tm_mday > 31 || year < 1970 || year > 9999) {
    return std::nullopt;
  }
  tm.tm_year = year - 1900;
  time_t seconds = timegm(&tm);
  if (seconds == static_cast<time_t>(-1)) return std::nullopt;
  return static_cast<int64_t>(seconds) * 1000;
}

std::optional<int64_t> ParseRetryAfter(const HttpHeaders& headers, int64_t now_wall_ms) {
  const std::string* ms = nullptr;
  const std::string* plain = nullptr;
  for (const auto& [name, value] : headers) {
    if (name == "retry-after-ms" && ms == nullptr) ms = &value;
    if (name == "retry-after" && plain == nullptr) plain = &value;
  }
  if (ms != nullptr) {
    if (auto v = ParseDecimal(*ms, 1.0)) return v;
  }
  if (plain != nullptr) {
    if (auto v = ParseDecimal(*plain, 1000.0)) return v;
    if (auto date = ParseHttpDate(*plain)) {
      return std::clamp<int64_t>(*date - now_wall_ms, 0, kMaxRetryAfterMs);
    }
  }
  return std::nullopt;
}

std::string ProviderErrorText(std::string_view body) {
  std::optional<Json> parsed = ParseJsonBody(body);
  if (!parsed || !parsed->is_object()) return "";
  const Json& j = *parsed;
  std::string text;
  std::string kind;
  auto err = j.find("error");
  if (err != j.end() && err->is_object()) {
    auto msg = err->find("message");
    if (msg != err->end() && msg->is_string()) text = msg->get<std::string>();
    kind = TypeOrCode(*err);
  } else if (err != j.end() && err->is_string()) {
    text = err->get<std::string>();
  } else {
    auto msg = j.find("message");
    if (msg != j.end() && msg->is_string()) text = msg->get<std::string>();
    kind = TypeOrCode(j);
  }
  if (!kind.empty() && text.find(kind) == std::string::npos) {
    text += text.empty() ? kind : " (" + kind + ")";
  }
  return text;
}

std::string Redact(std::string text, std::string_view secret) {
  if (secret.size() < 4) return text;
  size_t pos = 0;
  while ((pos = text.find(secret, pos)) != std::string::npos) {
    text.replace(pos, secret.size(), "[redacted]");
    pos += 10;
  }
  return text;
}

std::string RedactAll(std::string text, const std::vector<std::string>& secrets) {
  for (const std::string& secret : secrets) text = Redact(std::move(text), secret);
  return text;
}

nlohmann::json RedactAllIn(nlohmann::json value, const std::vector<std::string>& secrets) {
  if (secrets.empty()) return value;
  if (value.is_string()) return RedactAll(value.get<std::string>(), secrets);
  if (value.is_array()) {
    for (nlohmann::json& element : value) element = RedactAllIn(std::move(element), secrets);
    return value;
  }
  if (!value.is_object()) return value;
  nlohmann::json out = nlohmann::json::object();
  for (auto& [name, member] : value.items()) {
    out[RedactAll(name, secrets)] = RedactAllIn(std::move(member), secrets);
  }
  return out;
}

UpstreamError ClassifyHttpFailure(std::string_view upstream, const HttpResponse& response,
                                  int64_t now_wall_ms, const std::vector<std::string>& secrets) {
  const int s = response.status;
  Code code = CodeForHttpStatus(s);
  bool retryable = IsRetryableHttpStatus(s);
  if (code == Code::kOk) {
    code = Code::kInternal;  // a caller bug: a 2xx is not a failure
    retryable = false;
  }
  // A 429 that means "out of credit" will not pass by waiting.
  bool out_of_quota = s == 429 && response.body.find("insufficient_quota") != std::string::npos;
  if (out_of_quota) retryable = false;

  std::string text = ProviderErrorText(response.body);
  if (text.empty() && !response.body.empty() && response.body.size() <= 200 &&
      response.body.find('<') == std::string::npos) {
    text = ValidUtf8Text(TrimView(response.body));  // a short plain-text body
  }
  std::string msg(upstream);
  msg += ": HTTP " + std::to_string(s);
  if (out_of_quota) msg += " (quota exhausted)";
  // Redacted whole, then cut: the other way round, a secret the cut went
  // through kept its first bytes.
  if (!text.empty()) {
    msg += ": " + CutUtf8(RedactAll(std::move(text), secrets), kMaxProviderTextBytes, "...");
  }
  // The marker is ours alone: a provider cannot forge a retry hint.
  for (size_t p; (p = msg.find(kRetryMarker)) != std::string::npos;) msg.erase(p, 1);
  msg = RedactAll(std::move(msg), secrets);

  UpstreamError out;
  out.status = Status(code, std::move(msg), {}, retryable);
  if (retryable) out.retry_after_ms = ParseRetryAfter(response.headers, now_wall_ms).value_or(0);
  return out;
}

Status ToStatus(const UpstreamError& error) {
  if (error.status.ok() || error.retry_after_ms <= 0) return error.status;
  std::string msg = error.status.message();
  msg += kRetryMarker;
  msg += std::to_string(error.retry_after_ms) + "]";
  return Status(error.status.code(), std::move(msg), error.status.field(),
                error.status.retryable());
}

int64_t RetryAfterMillis(const Status& status) {
  const std::string& m = status.message();
  if (status.ok() || m.empty() || m.back() != ']') return 0;
  size_t p = m.rfind(kRetryMarker);
  if (p == std::string::npos) return 0;
  std::string_view digits(m);
  digits = digits.substr(p + kRetryMarker.size());
  digits.remove_suffix(1);
  int64_t v = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc() || end != digits.data() + digits.size() || v < 0) return 0;
  return v;
}

Status WithoutRetryMarker(const Status& status) {
  if (RetryAfterMillis(status) == 0) return status;  // no marker (a provider's text has none)
  std::string msg = status.message();
  msg.erase(msg.rfind(kRetryMarker));
  return Status(status.code(), std::move(msg), status.field(), status.retryable());
}

Status RefusalError(std::string_view upstream, std::string_view refusal_text) {
  std::string msg(upstream);
  msg += ": ";
  msg += kRefusal;
  msg += CutUtf8(refusal_text, kMaxProviderTextBytes, "...");
  return Status(Code::kFailedPrecondition, std::move(msg));
}

Status TruncationError(std::string_view upstream, std::string_view reason) {
  std::string msg(upstream);
  msg += ": ";
  msg += kTruncated;
  msg += reason;
  msg += "): the answer hit the output token limit";
  return Status(Code::kResourceExhausted, std::move(msg));
}

Status ContentFilterError(std::string_view upstream) {
  return Status(Code::kFailedPrecondition, std::string(upstream) + ": " + std::string(kFiltered));
}

bool IsRefusal(const Status& status) {
  return status.code() == Code::kFailedPrecondition && MessageHas(status, kRefusal);
}
bool IsTruncation(const Status& status) {
  return status.code() == Code::kResourceExhausted && MessageHas(status, kTruncated);
}
bool IsContentFiltered(const Status& status) {
  return status.code() == Code::kFailedPrecondition && MessageHas(status, kFiltered);
}

Status MalformedAnswerError(std::string_view upstream, std::string_view what) {
  return Unavailable(std::string(upstream) + ": malformed answer: " + std::string(what),
                     /*retryable=*/true);
}

StatusOr<std::string> ApiKeyFromEnv(const ProviderConfig& config, bool required) {
  const std::string who = "provider '" + config.name + "' (" + config.type + ")";
  // The pointer into the config: the daemon tells these with file and line.
  const std::string at = "/providers/" + JsonPointerToken(config.name);
  if (config.api_key_env.empty()) {
    if (!required) return std::string();
    return Status(Code::kFailedPrecondition,
                  who +
                      ": api_key_env is not configured; name the environment variable that "
                      "holds the API key",
                  at);
  }
  const char* value = std::getenv(config.api_key_env.c_str());
  if (value == nullptr || *value == '\0') {
    return Status(Code::kFailedPrecondition,
                  who + ": environment variable " + config.api_key_env + " is not set or empty",
                  at + "/api_key_env");
  }
  // It goes into a header line: a CR or LF would start another header (or
  // a request) to the provider. Trailing ones are a copy-paste slip.
  std::string key(value);
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r')) key.pop_back();
  if (key.empty() || key.find_first_of("\r\n") != std::string::npos) {
    return Status(Code::kFailedPrecondition,
                  who + ": environment variable " + config.api_key_env +
                      " holds a line break inside the key (the value is not shown)",
                  at + "/api_key_env");
  }
  return key;
}

StatusOr<HttpResponse> SendChecked(HttpClient& http, Env& env, std::string_view upstream,
                                   const HttpRequest& request, const ProviderSecrets& secrets) {
  StatusOr<HttpResponse> response = http.Send(request);
  if (!response.ok()) {
    const Status& s = response.status();
    return Status(s.code(), RedactAll(std::string(upstream) + ": " + s.message(), secrets.errors),
                  s.field(), s.retryable());
  }
  if (response->status >= 200 && response->status <= 299) {
    response->body = RedactAll(std::move(response->body), secrets.answers);
    return response;
  }
  return ToStatus(ClassifyHttpFailure(upstream, *response, env.WallMillis(), secrets.errors));
}

std::string SchemaNameForWire(std::string_view name) {
  std::string out;
  for (char c : name) {
    if (out.size() == 64) break;
    bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
    out += ok ? c : '_';
  }
  if (out.empty()) out = "output";
  return out;
}

StatusOr<int64_t> ConfigInt(const ProviderConfig& config, std::string_view key,
                            int64_t default_value, int64_t min, int64_t max) {
  if (!config.raw.is_object()) return default_value;
  auto it = config.raw.find(key);
  if (it == config.raw.end() || it->is_null()) return default_value;
  std::optional<int64_t> value;
  if (it->is_number_integer()) {
    value = it->get<int64_t>();
  } else if (it->is_string()) {
    const std::string& text = it->get_ref<const std::string&>();
    int64_t v = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec == std::errc() && end == text.data() + text.size()) value = v;
  }
  std::string where = "provider '" + config.name + "': " + std::string(key);
  if (!value) return InvalidArgument(where + ": must be an integer", "/" + std::string(key));
  if (*value < min || *value > max) {
    return InvalidArgument(
        where + ": must be between " + std::to_string(min) + " and " + std::to_string(max),
        "/" + std::string(key));
  }
  return *value;
}

StatusOr<std::string> ConfigString(const ProviderConfig& config, std::string_view key,
                                   std::string_view default_value,
                                   std::initializer_list<std::string_view> allowed) {
  std::string value(default_value);
  if (config.raw.is_object()) {
    auto it = config.raw.find(key);
    if (it != config.raw.end() && !it->is_null()) {
      if (!it->is_string()) {
        return InvalidArgument(
            "provider '" + config.name + "': " + std::string(key) + ": must be a string",
            "/" + std::string(key));
      }
      value = it->get<std::string>();
    }
  }
  if (allowed.size() > 0 &&
      std::find(allowed.begin(), allowed.end(), std::string_view(value)) == allowed.end()) {
    std::string list;
    for (std::string_view a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
    return InvalidArgument("provider '" + config.name + "': " + std::string(key) + ": '" + value +
                               "' is not one of " + list,
                           "/" + std::string(key));
  }
  return value;
}

StatusOr<HttpHeaders> ConfigHeaders(const ProviderConfig& config,
                                    std::vector<std::string>* secrets) {
  HttpHeaders out;
  if (!config.raw.is_object()) return out;
  auto it = config.raw.find("headers");
  if (it == config.raw.end() || it->is_null()) return out;
  const std::string who = "provider '" + config.name + "': headers";
  if (!it->is_object()) return InvalidArgument(who + ": must be a map of strings", "/headers");
  for (auto& [name, value] : it->items()) {
    bool bad_name = name.empty() || name.find_first_of(":\r\n") != std::string::npos;
    if (bad_name || !value.is_string() ||
        value.get_ref<const std::string&>().find_first_of("\r\n") != std::string::npos) {
      return InvalidArgument(who + ": '" + (bad_name ? std::string("?") : name) +
                                 "' must be a header name with a one-line string value",
                             "/headers");
    }
    std::vector<std::string> used;
    StatusOr<std::string> env =
        ExpandEnv(value.get<std::string>(), "/headers/" + JsonPointerToken(name), &used);
    if (!env.ok()) {
      return Status(env.status().code(), who + ": " + env.status().message(), env.status().field());
    }
    std::string expanded = std::move(env).value();
    if (expanded.find_first_of("\r\n") != std::string::npos) {
      return InvalidArgument(who + ": '" + name + "' must be a one-line string value", "/headers");
    }
    if (secrets != nullptr) {
      std::string lower = name;
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      const bool authenticates =
          lower.find("key") != std::string::npos || lower.find("token") != std::string::npos ||
          lower.find("auth") != std::string::npos || lower.find("secret") != std::string::npos ||
          lower.find("signature") != std::string::npos || lower == "cookie";
      if (authenticates) secrets->push_back(expanded);
      for (std::string& v : used) secrets->push_back(std::move(v));
    }
    out.emplace_back(name, std::move(expanded));
  }
  return out;
}

std::string DumpJson(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::optional<Json> ParseJsonBody(std::string_view body) {
  // The size was bounded as the body arrived; the depth is bounded here,
  // since everything that walks a value (dump, JCS, schema checks, ==)
  // recurses: a body nested 120,000 deep overflowed a handler's stack.
  StatusOr<Json> parsed =
      ParseJson(body, JsonLimits{.max_bytes = body.size(), .max_depth = kMaxWireJsonDepth});
  if (!parsed.ok()) return std::nullopt;
  return std::move(parsed).value();
}

}  // namespace idem
