// The libcurl implementation of HttpClient. This is the one file that talks
// to libcurl: CURLcode values become Status here.
#include <curl/curl.h>
#include <strings.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/core/http_client.h"
#include "daemon/core/mutex.h"

namespace idem {
namespace {

void GlobalInitOnce() {
  // curl_global_init is not guaranteed thread-safe; run it exactly once.
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// The URL as it may appear in an error message: without the query string or
// fragment (some APIs take keys as query parameters) and without userinfo.
std::string UrlForMessages(const std::string& url) {
  std::string out = url.substr(0, url.find_first_of("?#"));
  size_t scheme_end = out.find("://");
  size_t host_start = scheme_end == std::string::npos ? 0 : scheme_end + 3;
  size_t path_start = out.find('/', host_start);
  size_t at = out.find('@', host_start);
  if (at != std::string::npos && (path_start == std::string::npos || at < path_start)) {
    out.erase(host_start, at + 1 - host_start);
  }
  return out;
}

struct WriteState {
  std::string* body;
  size_t limit;
  bool too_large = false;
};

size_t OnBody(char* data, size_t size, size_t count, void* user) {
  auto* state = static_cast<WriteState*>(user);
  size_t n = size * count;
  if (state->body->size() + n > state->limit) {
    state->too_large = true;
    return 0;  // makes curl abort with CURLE_WRITE_ERROR
  }
  state->body->append(data, n);
  return n;
}

std::string Trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t' || s[b] == '\r' || s[b] == '\n')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\r' || s[e - 1] == '\n')) {
    --e;
  }
  return std::string(s.substr(b, e - b));
}

size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  auto* headers = static_cast<HttpHeaders*>(user);
  size_t n = size * count;
  std::string_view line(data, n);
  if (line.starts_with("HTTP/")) {
    // A new status line: an interim 1xx response ended; start over.
    headers->clear();
    return n;
  }
  size_t colon = line.find(':');
  if (colon == std::string_view::npos || colon == 0) return n;  // blank or folded line
  std::string name(line.substr(0, colon));
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  headers->emplace_back(std::move(name), Trim(line.substr(colon + 1)));
  return n;
}

struct SlistDeleter {
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};
using Slist = std::unique_ptr<curl_slist, SlistDeleter>;

bool HasLineBreak(std::string_view s) { return s.find_first_of("\r\n") != std::string_view::npos; }

Status StatusFromCurl(CURLcode code, const std::string& what, const char* errbuf) {
  std::string detail = curl_easy_strerror(code);
  if (errbuf[0] != '\0') {
    detail += ": ";
    detail += Trim(errbuf);
  }
  std::string msg = what + ": " + detail;
  switch (code) {
    case CURLE_OPERATION_TIMEDOUT:
      return DeadlineExceeded(std::move(msg));
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_BAD_FUNCTION_ARGUMENT:
      return InvalidArgument(std::move(msg));
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
      // A certificate that does not verify is a configuration problem or an
      // attack; repeating the call will not fix it.
      return Unavailable(std::move(msg), /*retryable=*/false);
    case CURLE_OUT_OF_MEMORY:
      return Internal(std::move(msg));
    default:
      // Resolve/connect failures, resets, partial bodies, empty replies,
      // handshake failures: the network, which a later attempt may find well.
      return Unavailable(std::move(msg), /*retryable=*/true);
  }
}

class CurlHttpClient final : public HttpClient {
 public:
  CurlHttpClient() {
    share_ = curl_share_init();
    if (share_ != nullptr) {
      curl_share_setopt(share_, CURLSHOPT_LOCKFUNC, &CurlHttpClient::LockShared);
      curl_share_setopt(share_, CURLSHOPT_UNLOCKFUNC, &CurlHttpClient::UnlockShared);
      curl_share_setopt(share_, CURLSHOPT_USERDATA, this);
      curl_share_setopt(share_, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
      curl_share_setopt(share_, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
      // The connection cache is deliberately not shared (CURL_LOCK_DATA_CONNECT):
      // with transfers running in several threads, libcurl 7.x reads the
      // state of connections in use by other threads while scanning a shared
      // cache (curl issue #4915). Each pooled easy handle keeps its own live
      // connections instead, which curl_easy_reset preserves, so a handle
      // taken from the pool reuses the connection its last request opened.
    }
  }

  ~CurlHttpClient() override {
    {
      MutexLock lock(pool_mu_);
      for (CURL* h : idle_) curl_easy_cleanup(h);
      idle_.clear();
    }
    if (share_ != nullptr) curl_share_cleanup(share_);
  }

  StatusOr<HttpResponse> Send(const HttpRequest& request) override {
    const std::string what = request.method + " " + UrlForMessages(request.url);
    if (request.url.empty()) return InvalidArgument("HTTP request without a URL");
    static constexpr std::array<std::string_view, 6> kMethods = {"GET",   "POST",   "PUT",
                                                                 "PATCH", "DELETE", "HEAD"};
    if (std::find(kMethods.begin(), kMethods.end(), request.method) == kMethods.end()) {
      return InvalidArgument(what + ": unsupported HTTP method");
    }
    Slist headers;
    bool has_expect = false;
    for (const auto& [name, value] : request.headers) {
      if (name.empty() || HasLineBreak(name) || HasLineBreak(value) ||
          name.find(':') != std::string::npos) {
        // Name the header, never its value: values carry keys.
        return InvalidArgument(what + ": invalid request header '" +
                               (HasLineBreak(name) ? std::string("?") : name) + "'");
      }
      std::string line = name + ": " + value;
      curl_slist* next = curl_slist_append(headers.get(), line.c_str());
      if (next == nullptr) return Internal(what + ": out of memory building headers");
      headers.release();
      headers.reset(next);
      if (strcasecmp(name.c_str(), "expect") == 0) has_expect = true;
    }
    if (!has_expect) {
      // No "Expect: 100-continue" round trip before large bodies.
      curl_slist* next = curl_slist_append(headers.get(), "Expect:");
      if (next == nullptr) return Internal(what + ": out of memory building headers");
      headers.release();
      headers.reset(next);
    }

    CURL* h = Acquire();
    if (h == nullptr) return Internal(what + ": curl_easy_init failed");

    HttpResponse response;
    WriteState write{&response.body, request.max_response_bytes};
    char errbuf[CURL_ERROR_SIZE];
    errbuf[0] = '\0';

    curl_easy_setopt(h, CURLOPT_URL, request.url.c_str());
    if (share_ != nullptr) curl_easy_setopt(h, CURLOPT_SHARE, share_);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);  // required with threads and timeouts
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 2L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_ACCEPT_ENCODING, "");  // whatever curl can decode
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(std::max<int64_t>(1, request.connect_timeout_ms)));
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS,
                     static_cast<long>(std::max<int64_t>(1, request.timeout_ms)));
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &OnBody);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &write);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, &OnHeader);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &response.headers);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers.get());

    if (request.method == "GET") {
      curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
    } else if (request.method == "HEAD") {
      curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else {
      if (request.method != "POST") {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, request.method.c_str());
      }
      if (request.method == "POST" || !request.body.empty()) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, request.body.data());
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE,
                         static_cast<curl_off_t>(request.body.size()));
      }
    }

    CURLcode rc = curl_easy_perform(h);
    long status = 0;
    if (rc == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    Status error;
    if (rc != CURLE_OK) {
      if (rc == CURLE_WRITE_ERROR && write.too_large) {
        error = ResourceExhausted(what + ": response body larger than " +
                                  std::to_string(request.max_response_bytes) + " bytes");
      } else {
        error = StatusFromCurl(rc, what, errbuf);
      }
    }
    // Drop every pointer into this stack frame; live connections survive.
    curl_easy_reset(h);
    Release(h);
    if (!error.ok()) return error;
    response.status = static_cast<int>(status);
    return response;
  }

 private:
  static constexpr size_t kMaxIdleHandles = 64;

  static void LockShared(CURL*, curl_lock_data data, curl_lock_access, void* user) {
    auto* self = static_cast<CurlHttpClient*>(user);
    self->share_locks_[static_cast<size_t>(data) % self->share_locks_.size()].lock();
  }
  static void UnlockShared(CURL*, curl_lock_data data, void* user) {
    auto* self = static_cast<CurlHttpClient*>(user);
    self->share_locks_[static_cast<size_t>(data) % self->share_locks_.size()].unlock();
  }

  CURL* Acquire() {
    {
      MutexLock lock(pool_mu_);
      if (!idle_.empty()) {
        CURL* h = idle_.back();
        idle_.pop_back();
        return h;
      }
    }
    return curl_easy_init();
  }

  void Release(CURL* h) {
    {
      MutexLock lock(pool_mu_);
      if (idle_.size() < kMaxIdleHandles) {
        idle_.push_back(h);
        return;
      }
    }
    curl_easy_cleanup(h);
  }

  CURLSH* share_ = nullptr;
  // One lock per kind of shared data, as curl_share_setopt asks.
  std::array<std::mutex, CURL_LOCK_DATA_LAST> share_locks_;
  Mutex pool_mu_;
  // Most recently used last: Acquire takes the handle whose connection is
  // the freshest and therefore the likeliest still open.
  std::vector<CURL*> idle_ GUARDED_BY(pool_mu_);
};

}  // namespace

std::unique_ptr<HttpClient> MakeCurlHttpClient() {
  GlobalInitOnce();
  return std::make_unique<CurlHttpClient>();
}

}  // namespace idem
