// HttpClient: one outgoing HTTP exchange (provider and effector calls).
//
// Send performs exactly one request: no retries, no redirects followed (a 3xx
// comes back as a response). Any HTTP status, 4xx and 5xx included, is a
// successful exchange and returns an HttpResponse; what a status means is up
// to the caller (see providers/errors.h).
//
// Errors (the exchange did not complete):
//   DeadlineExceeded, retryable   connect or total timeout elapsed;
//   Unavailable, retryable        DNS, connect, TLS handshake, reset,
//                                 connection cut mid-body, empty reply;
//   Unavailable, not retryable    TLS certificate verification failed;
//   ResourceExhausted             the response body exceeded
//                                 max_response_bytes (unless
//                                 truncate_response), or its header
//                                 lines, interim (1xx) answers' included,
//                                 kMaxResponseHeaderBytes;
//   Unavailable, retryable        the request's `cancel` was set;
//   InvalidArgument               malformed URL, unsupported scheme or
//                                 method, a header containing CR or LF.
//   FailedPrecondition            (the libcurl client) libcurl.so.4 cannot
//                                 be loaded: the message names it and the
//                                 Debian package to install (libcurl4).
// Status messages name the method and the URL without its query string,
// userinfo, or any path segment longer than 12 characters or other than
// letters, digits and ._:- (shown as "…": webhook URLs carry secrets in the
// path), and never contain request headers or bodies (headers carry API
// keys).
//
// Thread-safety: implementations are safe for concurrent Send calls.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/core/status.h"

namespace idem {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// The most header bytes (status lines and header lines as received) one
// exchange takes: a server that sends endless headers is cut off there,
// whatever libcurl's own limit is.
inline constexpr size_t kMaxResponseHeaderBytes = 64u << 10;

struct HttpRequest {
  std::string method = "POST";  // GET, POST, PUT, PATCH, DELETE or HEAD
  std::string url;              // http:// or https://
  HttpHeaders headers;          // sent as given; may contain secrets
  std::string body;
  int64_t connect_timeout_ms = 10'000;
  int64_t timeout_ms = 30'000;  // the whole exchange, connect included
  size_t max_response_bytes = 16u << 20;
  // Past max_response_bytes: false, the exchange fails (ResourceExhausted);
  // true, the body is cut there and the response returned (for a caller
  // that reads only the status).
  bool truncate_response = false;
  // When set (by another thread) while the exchange runs, it ends at once
  // with Unavailable (retryable) "cancelled"; may be null.
  const std::atomic<bool>* cancel = nullptr;
  // A new connection, closed afterwards. libcurl sends a request again,
  // unasked, when a kept-alive connection it reused dies before the first
  // byte of the answer: the server may have acted on the first one (it
  // crashed or reset after committing). A request that must reach the
  // server at most once per call (an effect without an idempotency key)
  // sets this, so a dead connection is an error the caller sees.
  bool fresh_connection = false;
};

struct HttpResponse {
  int status = 0;
  HttpHeaders headers;  // names lower-cased, values trimmed, in arrival order
  std::string body;

  // The first value of header `lower_name` (which must be lower-case), or
  // nullptr. The pointer lives as long as this response is not modified.
  const std::string* FindHeader(std::string_view lower_name) const {
    for (const auto& [name, value] : headers) {
      if (name == lower_name) return &value;
    }
    return nullptr;
  }
};

// The URL as it may appear in a message: without the query string or
// fragment (some APIs take keys as query parameters), without userinfo
// (user:password@), and with each path segment that could be a secret
// shown as "…" (the rule in the comment at the top).
std::string UrlForMessages(const std::string& url);

// The parts of `url` that UrlForMessages hides, as secrets to redact from
// other text (an upstream's answer that echoes the request): the userinfo
// (user:password) and its password, the credential libcurl sends for them
// in `Authorization: Basic` (base64 of the decoded user:password), the
// value of each query parameter (the whole parameter when it has no '='),
// and each path segment UrlForMessages shows as "…"; each as written and
// percent-decoded. In a URL template, a placeholder in braces ({key}, filled
// per call; braces are no URL's own characters) is no part of a secret, the
// literal text around it is: a path segment's pieces are each judged as a
// segment. Short parts are returned too: the caller decides what is too
// short to redact.
std::vector<std::string> UrlSecrets(std::string_view url);

// Whether a URL part is plain enough to show: at most 12 letters, digits and
// `._:-`, as /v1/chat/completions. Slack's /services/T…/B…/<secret> and
// Discord's /api/webhooks/<id>/<token> carry their secret in the path, so a
// path segment is shown only when plain.
bool PlainSegment(std::string_view segment);

// Two redaction lists of a caller that sends to `urls` (each may be empty)
// and was handed `own` secrets (a key, `${VAR}` header values): `errors`,
// for its error texts, gets `own` and every UrlSecrets part; `answers`, for
// a 2xx answer it stores, gets `own` and the parts that are not
// PlainSegment (a query's "json" is no secret, and likelier the answer's
// own data). Each is sorted longest first, so a secret that holds another
// is redacted whole.
struct RedactionLists {
  std::vector<std::string> errors;
  std::vector<std::string> answers;
};
RedactionLists RedactionListsFor(std::vector<std::string> own,
                                 std::initializer_list<std::string_view> urls);

// Percent-decoding of a URL component; '+' means space when
// `plus_is_space`. Malformed escapes are kept as they are.
std::string PercentDecode(std::string_view s, bool plus_is_space);
// `text` as one URL path segment or query value: every byte but RFC 3986's
// unreserved (letters, digits, - . _ ~) as %XX, so "/", "?", "#" and ".."
// stay inside it.
std::string PercentEncode(std::string_view text);

class HttpClient {
 public:
  virtual ~HttpClient() = default;
  virtual StatusOr<HttpResponse> Send(const HttpRequest& request) = 0;
};

// The libcurl client. It keeps a pool of easy handles, each holding its
// live connections for reuse (keep-alive), and shares the DNS cache and TLS
// sessions between them. TLS peer and host verification are always on; the
// usual proxy variables (http_proxy, https_proxy, no_proxy) are honoured.
// Creating a client costs nothing: libcurl is not linked into `idem` but
// loaded (dlopen, daemon/core/dynlib.h) by the first Send of any client in
// the process, which also calls curl_global_init; a daemon that never calls
// out never maps libcurl and its TLS/Kerberos/LDAP dependencies (idle RSS,
// issue 9). If it cannot be loaded, every Send fails with FailedPrecondition
// (and tries loading again).
std::unique_ptr<HttpClient> MakeCurlHttpClient();

// Loads libcurl now, as the first Send would: for a caller that will surely
// call out (a daemon with an LLM provider) and wants a missing library
// reported when it starts. OK, or the FailedPrecondition above.
Status LoadLibcurl();

}  // namespace idem
