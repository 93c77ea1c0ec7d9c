// Upstream errors: what an HTTP answer from a model provider (or, later, an
// effector) means for the caller, as a Status with the retryable bit, plus
// the plumbing every provider adapter shares (the checked send, the API key
// lookup, config reading, the failure statuses of a 200 answer that is still
// not an answer). It is the one place where an upstream's answer becomes a
// Status, so the adapters stay thin and agree with each other.
//
// Classification of a non-2xx answer (ClassifyHttpFailure):
//   HTTP status  Code                retryable
//   400, 422     InvalidArgument     no
//   401          Unauthenticated     no
//   403          PermissionDenied    no
//   404          NotFound            no
//   408          DeadlineExceeded    yes
//   409          Aborted             yes (a conflicting request in flight)
//   413          ResourceExhausted   no  (request too large)
//   429          ResourceExhausted   yes; NO when the body says
//                                        "insufficient_quota" (billing, not rate)
//   500,502,503  Unavailable         yes
//   504          DeadlineExceeded    yes
//   529          Unavailable         yes (Anthropic "overloaded")
//   other 5xx    Unavailable         yes
//   other 4xx    FailedPrecondition  no
//   1xx/3xx      Unavailable         no  (an answer the adapter cannot use)
// Network failures come from HttpClient already classified (see
// daemon/core/http_client.h).
//
// Retry-After: `retry-after-ms` (milliseconds, OpenAI) wins over
// `retry-after` (delta-seconds or an HTTP-date, RFC 9110 10.2.3). The value
// is reported only on retryable failures, clamped to [0, 24h].
//
// How retry_after_ms travels. Provider::Complete returns StatusOr, which on
// failure holds only a Status, so ProviderResponse::retry_after_ms cannot
// carry it, and Status stays as it is. Instead:
//   - ClassifyHttpFailure returns an UpstreamError {status, retry_after_ms}
//     for callers that talk HTTP themselves (the apply executor);
//   - adapters return ToStatus(error), which appends a fixed, machine-read
//     marker " [retry_after_ms=N]" to the message, and the decide engine
//     reads it back with RetryAfterMillis(status). The marker stays the last
//     thing in the message under Annotate (which only prefixes).
//
// Messages: "<upstream>: HTTP <status>: <the provider's error.message>
// (<error.type or code>)". Provider text is cut to 512 bytes and every
// occurrence of the secret passed in is replaced by "[redacted]", so a 401
// that echoes the key does not leak it. Request headers are never read.
//
// Thread-safety: pure functions (ApiKeyFromEnv reads the process
// environment).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/config/config.h"
#include "daemon/core/env.h"
#include "daemon/core/http_client.h"
#include "daemon/core/status.h"

namespace idem {

using Json = nlohmann::json;

struct UpstreamError {
  Status status;
  int64_t retry_after_ms = 0;  // 0: the upstream did not say
};

// Code and retryable bit for an HTTP status, from the table above (without
// the body-dependent insufficient_quota rule).
Code CodeForHttpStatus(int http_status);
bool IsRetryableHttpStatus(int http_status);

// REQUIRES: response.status is not 2xx. `now_wall_ms` turns an HTTP-date
// Retry-After into a delay. `secrets` are redacted from the upstream's text
// before it is cut to 512 bytes (a cut would leave a secret's start that no
// whole-secret redaction finds).
UpstreamError ClassifyHttpFailure(std::string_view upstream, const HttpResponse& response,
                                  int64_t now_wall_ms,
                                  const std::vector<std::string>& secrets = {});

// The Retry-After delay in milliseconds from `retry-after-ms` or
// `retry-after`; nullopt when absent or unparseable.
std::optional<int64_t> ParseRetryAfter(const HttpHeaders& headers, int64_t now_wall_ms);

// An HTTP-date (IMF-fixdate, RFC 850 or asctime form) as milliseconds since
// the Unix epoch; nullopt when not a valid date.
std::optional<int64_t> ParseHttpDate(std::string_view text);

// The provider's error text from a JSON error body: error.message (OpenAI,
// Anthropic), error when it is a string (Ollama), or message. With the
// error's type or code in parentheses when present. Empty when the body is
// not JSON or carries no message.
std::string ProviderErrorText(std::string_view body);

// `text` with every occurrence of `secret` replaced by "[redacted]".
// Secrets shorter than 4 bytes are ignored (they would redact noise).
std::string Redact(std::string text, std::string_view secret);
// The same for each of `secrets` (a provider's API key and the values its
// headers carry: see ConfigHeaders).
std::string RedactAll(std::string text, const std::vector<std::string>& secrets);
// `value` with RedactAll applied to every string in it, member names
// included (an upstream's answer that echoes the request, before it is
// stored). Two members whose names become equal keep the later one.
nlohmann::json RedactAllIn(nlohmann::json value, const std::vector<std::string>& secrets);

// The error as one Status, with the retry-after marker when retry_after_ms
// is positive.
Status ToStatus(const UpstreamError& error);
// The retry-after marker of a Status made by ToStatus, or 0.
int64_t RetryAfterMillis(const Status& status);
// `status` without its retry-after marker: what a caller, a trace or an
// escalation is shown (read RetryAfterMillis first).
Status WithoutRetryMarker(const Status& status);

// Failures of a 200 answer. All are not retryable: the same request will
// most likely get the same answer. Each message starts with a fixed prefix
// so that the decide engine can tell them apart (Is* below).
//   refusal:    FailedPrecondition "<upstream>: model refused: <text>"
//   truncation: ResourceExhausted  "<upstream>: output truncated (<reason>)"
//               the decide engine may repair (e.g. ask for a shorter answer)
//   filtered:   FailedPrecondition "<upstream>: output blocked by content filter"
Status RefusalError(std::string_view upstream, std::string_view refusal_text);
Status TruncationError(std::string_view upstream, std::string_view reason);
Status ContentFilterError(std::string_view upstream);
bool IsRefusal(const Status& status);
bool IsTruncation(const Status& status);
bool IsContentFiltered(const Status& status);

// A 2xx answer whose body is not the JSON the wire format promises: an
// upstream or proxy glitch, Unavailable and retryable.
Status MalformedAnswerError(std::string_view upstream, std::string_view what);

// The API key from the environment variable named in config.api_key_env.
// Empty api_key_env: "" when !required, else FailedPrecondition. Variable
// unset or empty, or a key with a line break inside (a trailing one is
// dropped): FailedPrecondition naming the provider and the variable (never
// a value).
StatusOr<std::string> ApiKeyFromEnv(const ProviderConfig& config, bool required);

// ---- Adapter plumbing shared by every provider adapter ----

// What an adapter keeps out of everything it hands back (errors, and the
// answers the engine stores, traces and shows), since an upstream may echo
// the request, in an error or inside a 2xx (a refusal quoting it, a model
// repeating it): RedactionListsFor(the key and the headers' secrets
// (ConfigHeaders), {base_url}). Its `answers` are redacted from a 2xx body
// before anything reads it: a plain URL part stays, lest the model's answer
// change.
using ProviderSecrets = RedactionLists;

// Sends `request` and returns the response when its status is 2xx, its body
// with `secrets.answers` redacted. A network failure comes back as
// HttpClient classified it, prefixed with `upstream`; any other status as
// ToStatus(ClassifyHttpFailure(...)); both with `secrets.errors` redacted,
// and env.WallMillis() as the time for an HTTP-date Retry-After.
StatusOr<HttpResponse> SendChecked(HttpClient& http, Env& env, std::string_view upstream,
                                   const HttpRequest& request, const ProviderSecrets& secrets);

// A name usable as an OpenAI json_schema name or an Anthropic tool name:
// [A-Za-z0-9_-], at most 64 characters; "output" when nothing is left.
std::string SchemaNameForWire(std::string_view name);

// Reads an optional integer (a number or a numeric string, as YAML may give)
// from config.raw[key]; InvalidArgument naming the provider and key when it
// is not an integer in [min, max].
StatusOr<int64_t> ConfigInt(const ProviderConfig& config, std::string_view key,
                            int64_t default_value, int64_t min, int64_t max);
// Reads an optional string from config.raw[key]; InvalidArgument when it is
// not a string or (if `allowed` is not empty) not one of `allowed`.
StatusOr<std::string> ConfigString(const ProviderConfig& config, std::string_view key,
                                   std::string_view default_value,
                                   std::initializer_list<std::string_view> allowed = {});

// Extra request headers from config.raw["headers"] (an object of strings),
// in key order; empty when absent. `${VAR}` in a value is replaced from the
// environment (ExpandEnv: FailedPrecondition naming an unset variable). The
// values that must stay out of error texts are appended to `secrets`: each
// expanded variable's value, and the whole value of a header whose name
// says it authenticates (…key…, …token…, …auth…, …secret…, cookie,
// …signature…). InvalidArgument (naming the header, never its value) when
// it is not an object of strings or a name or value holds CR or LF.
StatusOr<HttpHeaders> ConfigHeaders(const ProviderConfig& config,
                                    std::vector<std::string>* secrets);

// JSON text for a wire body. Invalid UTF-8 in strings is replaced with
// U+FFFD instead of throwing.
std::string DumpJson(const Json& value);

// How deep a provider's or an effector's answer (and a model's output in
// it) may nest. As deep as a request may (server.max_json_depth's default).
inline constexpr int kMaxWireJsonDepth = 64;

// Parses a provider's or an effector's answer body without throwing;
// nullopt if it is not JSON, nests deeper than kMaxWireJsonDepth, repeats
// a member name, or holds invalid UTF-8 (ParseJson).
std::optional<Json> ParseJsonBody(std::string_view body);

}  // namespace idem
