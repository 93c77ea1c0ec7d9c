// The libcurl implementation of HttpClient. This is the one file that talks
// to libcurl: CURLcode values become Status here. libcurl is not linked: it is
// loaded on the first Send (daemon/core/dynlib.h) and called through CurlApi;
// <curl/curl.h> gives the types and constants only.
#include <curl/curl.h>
#include <strings.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/core/dynlib.h"
#include "daemon/core/http_client.h"
#include "daemon/core/mutex.h"

namespace idem {
namespace {

// The libcurl functions this file calls. decltype keeps the variadic ones
// (curl_easy_setopt, curl_easy_getinfo, curl_share_setopt) variadic. The
// members are not named like the functions: curl's typecheck-gcc.h defines
// function-like macros of those names.
struct CurlApi {
  decltype(&::curl_global_init) global_init;
  decltype(&::curl_easy_strerror) easy_strerror;
  decltype(&::curl_slist_append) slist_append;
  decltype(&::curl_slist_free_all) slist_free_all;
  decltype(&::curl_share_init) share_init;
  decltype(&::curl_share_setopt) share_setopt;
  decltype(&::curl_share_cleanup) share_cleanup;
  decltype(&::curl_easy_init) easy_init;
  decltype(&::curl_easy_setopt) easy_setopt;
  decltype(&::curl_easy_perform) easy_perform;
  decltype(&::curl_easy_getinfo) easy_getinfo;
  decltype(&::curl_easy_reset) easy_reset;
  decltype(&::curl_easy_cleanup) easy_cleanup;
};

void BindCurl(DynSymbols& s, CurlApi& a) {
  s.Bind(a.global_init, "curl_global_init");
  s.Bind(a.easy_strerror, "curl_easy_strerror");
  s.Bind(a.slist_append, "curl_slist_append");
  s.Bind(a.slist_free_all, "curl_slist_free_all");
  s.Bind(a.share_init, "curl_share_init");
  s.Bind(a.share_setopt, "curl_share_setopt");
  s.Bind(a.share_cleanup, "curl_share_cleanup");
  s.Bind(a.easy_init, "curl_easy_init");
  s.Bind(a.easy_setopt, "curl_easy_setopt");
  s.Bind(a.easy_perform, "curl_easy_perform");
  s.Bind(a.easy_getinfo, "curl_easy_getinfo");
  s.Bind(a.easy_reset, "curl_easy_reset");
  s.Bind(a.easy_cleanup, "curl_easy_cleanup");
}

// libcurl, loaded and globally initialised once per process.
StatusOr<const CurlApi*> LoadCurl() {
  // Never destroyed: threads may still send while the process exits.
  static auto* lib = new LazyLibrary<CurlApi>("libcurl.so.4", "libcurl4", &BindCurl);
  ASSIGN_OR_RETURN(const CurlApi* api, lib->Get());
  // curl_global_init is not guaranteed thread-safe; run it exactly once.
  static std::once_flag once;
  std::call_once(once, [api] { api->global_init(CURL_GLOBAL_DEFAULT); });
  return api;
}

struct WriteState {
  std::string* body;
  size_t limit;
  bool truncate = false;
  bool too_large = false;
};

size_t OnBody(char* data, size_t size, size_t count, void* user) {
  auto* state = static_cast<WriteState*>(user);
  size_t n = size * count;
  if (state->body->size() + n > state->limit) {
    if (state->truncate) {  // kept up to the limit; the rest is read and dropped
      state->body->append(data, state->limit - state->body->size());
      return n;
    }
    state->too_large = true;
    return 0;  // makes curl abort with CURLE_WRITE_ERROR
  }
  state->body->append(data, n);
  return n;
}

// CURLOPT_XFERINFOFUNCTION: nonzero ends the transfer
// (CURLE_ABORTED_BY_CALLBACK) once the request's cancel flag is set.
int OnProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return static_cast<const std::atomic<bool>*>(user)->load(std::memory_order_relaxed) ? 1 : 0;
}

std::string Trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t' || s[b] == '\r' || s[b] == '\n')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\r' || s[e - 1] == '\n')) {
    --e;
  }
  return std::string(s.substr(b, e - b));
}

struct HeaderState {
  HttpHeaders* headers;
  size_t bytes = 0;  // every line so far, interim answers' included
  bool too_large = false;
};

size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  auto* state = static_cast<HeaderState*>(user);
  HttpHeaders* headers = state->headers;
  size_t n = size * count;
  state->bytes += n;
  if (state->bytes > kMaxResponseHeaderBytes) {
    state->too_large = true;
    return 0;  // makes curl abort with CURLE_WRITE_ERROR
  }
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
  const CurlApi* curl;
  void operator()(curl_slist* list) const { curl->slist_free_all(list); }
};
using Slist = std::unique_ptr<curl_slist, SlistDeleter>;

bool HasLineBreak(std::string_view s) { return s.find_first_of("\r\n") != std::string_view::npos; }

Status StatusFromCurl(const CurlApi& curl, CURLcode code, const std::string& what,
                      const char* errbuf) {
  std::string detail = curl.easy_strerror(code);
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
      // What libcurl also answers, before any header callback, for one
      // response header line past its own cap (CURL_MAX_HTTP_HEADER, 100
      // KiB): far likelier here than the process running out of memory.
      return ResourceExhausted(
          std::move(msg) + " (a response header line past libcurl's 100 KiB limit, or no memory)");
    default:
      // Resolve/connect failures, resets, partial bodies, empty replies,
      // handshake failures: the network, which a later attempt may find well.
      return Unavailable(std::move(msg), /*retryable=*/true);
  }
}

class CurlHttpClient final : public HttpClient {
 public:
  CurlHttpClient() = default;

  ~CurlHttpClient() override {
    const CurlApi* curl = curl_.load(std::memory_order_acquire);
    if (curl == nullptr) return;  // never sent: nothing of libcurl's to free
    {
      MutexLock lock(pool_mu_);
      for (CURL* h : idle_) curl->easy_cleanup(h);
      idle_.clear();
    }
    if (share_ != nullptr) curl->share_cleanup(share_);
  }

  StatusOr<HttpResponse> Send(const HttpRequest& request) override {
    const std::string what = request.method + " " + UrlForMessages(request.url);
    if (request.url.empty()) return InvalidArgument("HTTP request without a URL");
    StatusOr<const CurlApi*> loaded = Curl();
    if (!loaded.ok()) return loaded.status().Annotate(what);
    const CurlApi& curl = **loaded;
    static constexpr std::array<std::string_view, 6> kMethods = {"GET",   "POST",   "PUT",
                                                                 "PATCH", "DELETE", "HEAD"};
    if (std::find(kMethods.begin(), kMethods.end(), request.method) == kMethods.end()) {
      return InvalidArgument(what + ": unsupported HTTP method");
    }
    Slist headers(nullptr, SlistDeleter{&curl});
    bool has_expect = false;
    for (const auto& [name, value] : request.headers) {
      if (name.empty() || HasLineBreak(name) || HasLineBreak(value) ||
          name.find(':') != std::string::npos) {
        // Name the header, never its value: values carry keys.
        return InvalidArgument(what + ": invalid request header '" +
                               (HasLineBreak(name) ? std::string("?") : name) + "'");
      }
      std::string line = name + ": " + value;
      curl_slist* next = curl.slist_append(headers.get(), line.c_str());
      if (next == nullptr) return Internal(what + ": out of memory building headers");
      headers.release();
      headers.reset(next);
      if (strcasecmp(name.c_str(), "expect") == 0) has_expect = true;
    }
    if (!has_expect) {
      // No "Expect: 100-continue" round trip before large bodies.
      curl_slist* next = curl.slist_append(headers.get(), "Expect:");
      if (next == nullptr) return Internal(what + ": out of memory building headers");
      headers.release();
      headers.reset(next);
    }

    CURL* h = Acquire(curl);
    if (h == nullptr) return Internal(what + ": curl_easy_init failed");

    HttpResponse response;
    WriteState write{&response.body, request.max_response_bytes, request.truncate_response};
    HeaderState header_state{&response.headers};
    char errbuf[CURL_ERROR_SIZE];
    errbuf[0] = '\0';

    curl.easy_setopt(h, CURLOPT_URL, request.url.c_str());
    if (share_ != nullptr) curl.easy_setopt(h, CURLOPT_SHARE, share_);
    curl.easy_setopt(h, CURLOPT_NOSIGNAL, 1L);  // required with threads and timeouts
    curl.easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl.easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    curl.easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 1L);
    curl.easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 2L);
    curl.easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    if (request.fresh_connection) {
      curl.easy_setopt(h, CURLOPT_FRESH_CONNECT, 1L);
      curl.easy_setopt(h, CURLOPT_FORBID_REUSE, 1L);
    }
    curl.easy_setopt(h, CURLOPT_ACCEPT_ENCODING, "");  // whatever curl can decode
    curl.easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(std::max<int64_t>(1, request.connect_timeout_ms)));
    curl.easy_setopt(h, CURLOPT_TIMEOUT_MS,
                     static_cast<long>(std::max<int64_t>(1, request.timeout_ms)));
    curl.easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl.easy_setopt(h, CURLOPT_WRITEFUNCTION, &OnBody);
    curl.easy_setopt(h, CURLOPT_WRITEDATA, &write);
    curl.easy_setopt(h, CURLOPT_HEADERFUNCTION, &OnHeader);
    curl.easy_setopt(h, CURLOPT_HEADERDATA, &header_state);
    curl.easy_setopt(h, CURLOPT_HTTPHEADER, headers.get());
    if (request.cancel != nullptr) {
      curl.easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
      curl.easy_setopt(h, CURLOPT_XFERINFOFUNCTION, &OnProgress);
      curl.easy_setopt(h, CURLOPT_XFERINFODATA, const_cast<std::atomic<bool>*>(request.cancel));
    }

    if (request.method == "GET") {
      curl.easy_setopt(h, CURLOPT_HTTPGET, 1L);
    } else if (request.method == "HEAD") {
      curl.easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else {
      if (request.method != "POST") {
        curl.easy_setopt(h, CURLOPT_CUSTOMREQUEST, request.method.c_str());
      }
      if (request.method == "POST" || !request.body.empty()) {
        curl.easy_setopt(h, CURLOPT_POSTFIELDS, request.body.data());
        curl.easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE,
                         static_cast<curl_off_t>(request.body.size()));
      }
    }

    CURLcode rc = curl.easy_perform(h);
    long status = 0;
    if (rc == CURLE_OK) curl.easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    Status error;
    if (rc != CURLE_OK) {
      if (rc == CURLE_ABORTED_BY_CALLBACK && request.cancel != nullptr) {
        error = Unavailable(what + ": cancelled", true);
      } else if (rc == CURLE_WRITE_ERROR && write.too_large) {
        error = ResourceExhausted(what + ": response body larger than " +
                                  std::to_string(request.max_response_bytes) + " bytes");
      } else if (rc == CURLE_WRITE_ERROR && header_state.too_large) {
        error = ResourceExhausted(what + ": response headers larger than " +
                                  std::to_string(kMaxResponseHeaderBytes) + " bytes");
      } else {
        error = StatusFromCurl(curl, rc, what, errbuf);
      }
    }
    // Drop every pointer into this stack frame; live connections survive.
    curl.easy_reset(h);
    Release(curl, h);
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

  // libcurl and this client's share handle, made on the first Send.
  StatusOr<const CurlApi*> Curl() {
    if (const CurlApi* curl = curl_.load(std::memory_order_acquire)) return curl;
    MutexLock lock(init_mu_);
    if (const CurlApi* curl = curl_.load(std::memory_order_relaxed)) return curl;
    ASSIGN_OR_RETURN(const CurlApi* curl, LoadCurl());
    share_ = curl->share_init();
    if (share_ != nullptr) {
      curl->share_setopt(share_, CURLSHOPT_LOCKFUNC, &CurlHttpClient::LockShared);
      curl->share_setopt(share_, CURLSHOPT_UNLOCKFUNC, &CurlHttpClient::UnlockShared);
      curl->share_setopt(share_, CURLSHOPT_USERDATA, this);
      curl->share_setopt(share_, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
      curl->share_setopt(share_, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
      // The connection cache is deliberately not shared (CURL_LOCK_DATA_CONNECT):
      // with transfers running in several threads, libcurl 7.x reads the
      // state of connections in use by other threads while scanning a shared
      // cache (curl issue #4915). Each pooled easy handle keeps its own live
      // connections instead, which curl_easy_reset preserves, so a handle
      // taken from the pool reuses the connection its last request opened.
    }
    // Publishes share_ with the table: readers load curl_ first.
    curl_.store(curl, std::memory_order_release);
    return curl;
  }

  CURL* Acquire(const CurlApi& curl) {
    {
      MutexLock lock(pool_mu_);
      if (!idle_.empty()) {
        CURL* h = idle_.back();
        idle_.pop_back();
        return h;
      }
    }
    return curl.easy_init();
  }

  void Release(const CurlApi& curl, CURL* h) {
    {
      MutexLock lock(pool_mu_);
      if (idle_.size() < kMaxIdleHandles) {
        idle_.push_back(h);
        return;
      }
    }
    curl.easy_cleanup(h);
  }

  Mutex init_mu_;  // serialises the first Send's Curl()
  std::atomic<const CurlApi*> curl_{nullptr};
  CURLSH* share_ = nullptr;  // written once before curl_ is set, then read-only
  // One lock per kind of shared data, as curl_share_setopt asks.
  std::array<std::mutex, CURL_LOCK_DATA_LAST> share_locks_;
  Mutex pool_mu_;
  // Most recently used last: Acquire takes the handle whose connection is
  // the freshest and therefore the likeliest still open.
  std::vector<CURL*> idle_ GUARDED_BY(pool_mu_);
};

std::string Base64(std::string_view bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t n = static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << 16;
    if (i + 1 < bytes.size())
      n |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8;
    if (i + 2 < bytes.size()) n |= static_cast<unsigned char>(bytes[i + 2]);
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[n & 63] : '=';
  }
  return out;
}

// `text` without its {placeholders}: the literal pieces around them.
std::vector<std::string_view> LiteralPieces(std::string_view text) {
  std::vector<std::string_view> pieces;
  for (;;) {
    const size_t open = text.find('{');
    const size_t close = open == std::string_view::npos ? open : text.find('}', open);
    if (close == std::string_view::npos) break;
    if (open > 0) pieces.push_back(text.substr(0, open));
    text.remove_prefix(close + 1);
  }
  if (!text.empty()) pieces.push_back(text);
  return pieces;
}

}  // namespace

std::string PercentEncode(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                      c == '-' || c == '.' || c == '_' || c == '~';
    if (unreserved) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string PercentDecode(std::string_view s, bool plus_is_space) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out += static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2]));
      i += 2;
      continue;
    }
    out += (plus_is_space && c == '+') ? ' ' : c;
  }
  return out;
}

std::vector<std::string> UrlSecrets(std::string_view url) {
  std::vector<std::string> out;
  auto add = [&out](std::string_view part, bool plus_is_space) {
    if (part.empty()) return;
    out.emplace_back(part);
    std::string decoded = PercentDecode(part, plus_is_space);
    if (decoded != part) out.push_back(std::move(decoded));
  };
  url = url.substr(0, url.find('#'));
  const size_t scheme_end = url.find("://");
  const size_t host_start = scheme_end == std::string_view::npos ? 0 : scheme_end + 3;
  const size_t authority_end = std::min(url.find_first_of("/?", host_start), url.size());
  const std::string_view authority = url.substr(host_start, authority_end - host_start);
  if (const size_t at = authority.rfind('@'); at != std::string_view::npos) {
    const std::string_view userinfo = authority.substr(0, at);
    add(userinfo, false);
    const size_t colon = userinfo.find(':');
    if (colon != std::string_view::npos) add(userinfo.substr(colon + 1), false);
    const std::string user = PercentDecode(userinfo.substr(0, colon), false);
    const std::string password =
        colon == std::string_view::npos ? "" : PercentDecode(userinfo.substr(colon + 1), false);
    out.push_back(Base64(user + ":" + password));
  }
  const size_t query = std::min(url.find('?', authority_end), url.size());
  std::string_view path = url.substr(authority_end, query - authority_end);
  while (!path.empty()) {
    path.remove_prefix(1);  // the '/'
    const size_t end = std::min(path.find('/'), path.size());
    for (std::string_view piece : LiteralPieces(path.substr(0, end))) {
      if (!PlainSegment(piece)) add(piece, false);
    }
    path.remove_prefix(end);
  }
  std::string_view params = query < url.size() ? url.substr(query + 1) : std::string_view();
  while (!params.empty()) {
    const size_t amp = std::min(params.find('&'), params.size());
    std::string_view param = params.substr(0, amp);
    const size_t eq = param.find('=');
    for (std::string_view piece :
         LiteralPieces(eq == std::string_view::npos ? param : param.substr(eq + 1))) {
      add(piece, true);
    }
    params.remove_prefix(std::min(amp + 1, params.size()));
  }
  return out;
}

bool PlainSegment(std::string_view segment) {
  constexpr size_t kPlainSegment = 12;
  return segment.size() <= kPlainSegment &&
         std::all_of(segment.begin(), segment.end(), [](unsigned char c) {
           return std::isalnum(c) != 0 || c == '.' || c == '_' || c == ':' || c == '-';
         });
}

RedactionLists RedactionListsFor(std::vector<std::string> own,
                                 std::initializer_list<std::string_view> urls) {
  RedactionLists out;
  out.answers = own;
  out.errors = std::move(own);
  for (std::string_view url : urls) {
    for (std::string& part : UrlSecrets(url)) {
      if (!PlainSegment(part)) out.answers.push_back(part);
      out.errors.push_back(std::move(part));
    }
  }
  for (std::vector<std::string>* list : {&out.errors, &out.answers}) {
    std::stable_sort(list->begin(), list->end(), [](const std::string& a, const std::string& b) {
      return a.size() > b.size();
    });
  }
  return out;
}

std::string UrlForMessages(const std::string& url) {
  std::string out = url.substr(0, url.find_first_of("?#"));
  size_t scheme_end = out.find("://");
  size_t host_start = scheme_end == std::string::npos ? 0 : scheme_end + 3;
  size_t path_start = out.find('/', host_start);
  size_t at = out.find('@', host_start);
  if (at != std::string::npos && (path_start == std::string::npos || at < path_start)) {
    out.erase(host_start, at + 1 - host_start);
    path_start = out.find('/', host_start);
  }
  if (path_start == std::string::npos) return out;
  std::string shown = out.substr(0, path_start);
  size_t seg = path_start + 1;
  for (;;) {
    size_t end = out.find('/', seg);
    std::string_view segment(out.data() + seg, (end == std::string::npos ? out.size() : end) - seg);
    shown += '/';
    shown += PlainSegment(segment) ? std::string(segment) : std::string("…");
    if (end == std::string::npos) break;
    seg = end + 1;
  }
  return shown;
}

Status LoadLibcurl() { return LoadCurl().status(); }

std::unique_ptr<HttpClient> MakeCurlHttpClient() { return std::make_unique<CurlHttpClient>(); }

}  // namespace idem
