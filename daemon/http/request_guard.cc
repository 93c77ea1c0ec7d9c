#include "daemon/http/request_guard.h"

#include <algorithm>
#include <cctype>

namespace idem {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string Unbracket(std::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::string(host);
}

bool Contains(const std::vector<std::string>& list, const std::string& s) {
  return std::find(list.begin(), list.end(), s) != list.end();
}

Refusal Forbidden(std::string message, std::string pointer) {
  return Refusal{403, Status(Code::kPermissionDenied, std::move(message), std::move(pointer))};
}

// "host[:port]" or "[v6][:port]" -> lower-case host without brackets and
// the port text ("" when absent). False when malformed.
bool SplitHostHeader(std::string_view value, std::string* host, std::string* port) {
  if (value.empty()) return false;
  std::string_view h = value, p;
  if (value.front() == '[') {
    size_t close = value.find(']');
    if (close == std::string_view::npos) return false;
    h = value.substr(1, close - 1);
    std::string_view rest = value.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return false;
      p = rest.substr(1);
    }
  } else {
    size_t colon = value.rfind(':');
    if (colon != std::string_view::npos) {
      h = value.substr(0, colon);
      p = value.substr(colon + 1);
    }
    if (h.find(':') != std::string_view::npos) return false;
  }
  if (h.empty()) return false;
  for (char c : p) {
    if (c < '0' || c > '9') return false;
  }
  *host = Lower(h);
  *port = std::string(p);
  return true;
}

}  // namespace

void RequestGuard::Configure(const ServerConfig& server, const std::string& listen_host, int port) {
  builtin_hosts_ = {"localhost", "127.0.0.1", "::1"};
  std::string listen = Lower(Unbracket(listen_host));
  if (!Contains(builtin_hosts_, listen)) builtin_hosts_.push_back(listen);
  allowed_hosts_.clear();
  for (const auto& h : server.allowed_hosts) allowed_hosts_.push_back(Lower(Unbracket(h)));
  allowed_origins_.clear();
  for (const auto& o : server.allowed_origins) allowed_origins_.push_back(Lower(o));
  SetBoundPort(port);
}

std::optional<Refusal> RequestGuard::CheckSource(const http1::Request& req) const {
  if (auto refused = CheckHost(req)) return refused;
  return CheckOrigin(req);
}

std::optional<Refusal> RequestGuard::CheckHost(const http1::Request& req) const {
  if (req.HeaderCount("Host") != 1) {
    return Refusal{400, InvalidArgument("a request needs exactly one Host header", "header:Host")};
  }
  // No browser reaches the Unix socket, so no rebinding page either; its
  // clients name it as they like ("localhost", Go's "unix", the escaped
  // path that Python's requests-unixsocket sends).
  if (req.local_socket) return std::nullopt;
  std::string host, port;
  if (!SplitHostHeader(http1::TrimOws(req.HeaderValue("Host")), &host, &port)) {
    return Refusal{400, InvalidArgument("the Host header is not host[:port]", "header:Host")};
  }
  const int bound = port_.load(std::memory_order_acquire);
  bool ok = Contains(allowed_hosts_, host) ||
            (Contains(builtin_hosts_, host) && (port.empty() || port == std::to_string(bound)));
  if (!ok) {
    // The name a rebinding page would send; the message says how to allow a real one.
    return Forbidden("Host '" + host + (port.empty() ? "" : ":" + port) +
                         "' does not name this daemon; add the name to server.allowed_hosts "
                         "if clients use it",
                     "header:Host");
  }
  return std::nullopt;
}

std::optional<Refusal> RequestGuard::CheckOrigin(const http1::Request& req) const {
  size_t origins = req.HeaderCount("Origin");
  if (origins == 0) return std::nullopt;  // not a browser
  std::string origin = Lower(http1::TrimOws(req.HeaderValue("Origin")));
  // The daemon's own page (/ui/): a browser sends Origin on its same-origin
  // POSTs too, and that origin is the Host, when the Host names this daemon
  // (a rebinding page's Origin is its Host too, but that Host is not ours).
  std::string self = Lower(http1::TrimOws(req.HeaderValue("Host")));
  if (origins == 1 && (origin == "http://" + self || origin == "https://" + self) &&
      !CheckHost(req)) {
    return std::nullopt;
  }
  if (origins > 1 || origin == "null" || !Contains(allowed_origins_, origin)) {
    return Forbidden("requests from web origin '" + origin +
                         "' are refused; list trusted origins in server.allowed_origins",
                     "header:Origin");
  }
  return std::nullopt;
}

std::optional<Refusal> RequestGuard::CheckContentType(const http1::Request& req,
                                                      const std::vector<std::string>& accepted) {
  // The accepted types are named only in a refusal (this runs on every request with a body).
  auto refuse = [&accepted](const std::string& why) {
    std::string names;
    for (const std::string& a : accepted) names += (names.empty() ? "" : " or ") + a;
    return Refusal{415, InvalidArgument("this route takes Content-Type: " + names + "; " + why,
                                        "header:Content-Type")};
  };
  if (req.HeaderCount("Content-Type") != 1) {
    return refuse(req.HasHeader("Content-Type") ? "got several" : "got none");
  }
  std::string value = Lower(req.HeaderValue("Content-Type"));
  size_t semi = value.find(';');
  std::string media(http1::TrimOws(value.substr(0, semi)));
  if (std::find(accepted.begin(), accepted.end(), media) == accepted.end()) {
    return refuse("got " + media);
  }
  while (semi != std::string::npos) {
    size_t next = value.find(';', semi + 1);
    std::string param(http1::TrimOws(value.substr(semi + 1, next - semi - 1)));
    semi = next;
    if (param.rfind("charset=", 0) != 0) continue;
    std::string charset = param.substr(8);
    if (charset.size() >= 2 && charset.front() == '"' && charset.back() == '"') {
      charset = charset.substr(1, charset.size() - 2);
    }
    if (charset != "utf-8" && charset != "utf8") return refuse("JSON is UTF-8, not " + charset);
  }
  return std::nullopt;
}

bool IsLoopbackHost(std::string_view host) {
  std::string h = Lower(Unbracket(host));
  if (h == "localhost" || h == "::1") return true;
  // 127.0.0.0/8: four decimal octets, the first 127.
  int parts = 0;
  size_t i = 0;
  while (i <= h.size()) {
    size_t dot = h.find('.', i);
    std::string octet = h.substr(i, dot == std::string::npos ? std::string::npos : dot - i);
    if (octet.empty() || octet.size() > 3) return false;
    for (char c : octet) {
      if (c < '0' || c > '9') return false;
    }
    if (std::stoi(octet) > 255) return false;
    if (parts == 0 && octet != "127") return false;
    ++parts;
    if (dot == std::string::npos) break;
    i = dot + 1;
  }
  return parts == 4;
}

std::optional<std::string> BearerCredentials(std::string_view authorization) {
  std::string_view v = http1::TrimOws(authorization);
  size_t space = v.find(' ');
  if (space == std::string_view::npos || Lower(v.substr(0, space)) != "bearer") {
    return std::nullopt;
  }
  std::string_view token = v.substr(space);
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  if (token.empty() || token.find(' ') != std::string_view::npos) return std::nullopt;
  return std::string(token);
}

StatusOr<std::optional<std::string>> IdemCaller(const http1::Request& req) {
  size_t n = req.HeaderCount("Idem-Caller");
  if (n == 0) return std::optional<std::string>();
  auto bad = [] {
    return InvalidArgument(
        "Idem-Caller must be one name of 1-64 letters, digits, '_', '-', '.' or ':', starting "
        "with a letter or digit",
        "header:Idem-Caller");
  };
  if (n > 1) return bad();
  std::string v(http1::TrimOws(req.HeaderValue("Idem-Caller")));
  if (v.empty() || v.size() > 64 || !std::isalnum(static_cast<unsigned char>(v[0]))) return bad();
  for (char c : v) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.' &&
        c != ':') {
      return bad();
    }
  }
  if (IsReservedCallerName(v)) {
    return InvalidArgument("Idem-Caller '" + v +
                               "' is reserved: anonymous, idem and inbox:<source> are the names "
                               "the daemon writes itself in the audit trail",
                           "header:Idem-Caller");
  }
  return std::optional<std::string>(std::move(v));
}

}  // namespace idem
