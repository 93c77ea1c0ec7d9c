// RequestGuard: the checks that keep a web page the user happens to visit
// from driving the daemon through the user's browser. Without auth tokens
// the daemon trusts whoever reaches 127.0.0.1; a browser reaches it too,
// either cross-site (a page on evil.example POSTs to 127.0.0.1:7411) or by
// DNS rebinding (evil.example resolves to 127.0.0.1 and the browser treats
// the daemon as same-origin). HttpServer::Admit runs these checks on every
// route that is not public (health probes and /openapi.json are public),
// and the Origin check on a public route marked `browser_origin_checked`
// (the inbox).
//
// Host (DNS rebinding): the Host header must name this daemon:
//   - the listen host, localhost, 127.0.0.1 or [::1] (case-insensitive),
//     with the bound port (the real one when listening on port 0) or no
//     port at all;
//   - or a name in server.allowed_hosts (host names or IP literals, no
//     port; any port is accepted for them: a reverse proxy may rewrite it).
//   A missing Host, or more than one, is 400 (RFC 9112 section 3.2). Any
//   other name is 403 with pointer "header:Host": a rebinding page sends its
//   own name, which is not on the list. On the Unix socket
//   (Request::local_socket), which no browser can reach, any one Host
//   passes.
// Origin (cross-site requests): a request without Origin comes from a
//   non-browser client (curl, SDKs) and passes. The daemon's own origin
//   passes: http:// or https:// followed by the Host header that passed the
//   check above (the operator page at /ui/, whose same-origin POSTs carry
//   Origin; a rebinding page never gets here, its Host is refused). Any
//   other Origin must equal one of
//   server.allowed_origins (scheme://host[:port], case-insensitive); any
//   other, "null" (sandboxed frames, file: pages) or more than one Origin
//   header is 403 with pointer "header:Origin". Browsers send Origin on
//   every cross-origin POST and DELETE, form posts without a body included,
//   so this check also covers the body-less POST routes (plans apply,
//   dead-letter replay, reconcile) whose Content-Type is never looked at.
// Content-Type (CheckContentType, routes that take a JSON body): the media
//   type must be application/json (or one of the types a route names, such
//   as application/x-ndjson for an import), case-insensitive, with optional
//   parameters; a charset parameter must be utf-8. Anything else, or none,
//   is 415 with pointer "header:Content-Type". application/*+json types are
//   refused: no route takes one, and a browser cannot send application/json
//   cross-site without a CORS preflight, which the daemon never answers.
//
// Thread-safety: Configure before the server starts; SetBoundPort may race
// with checks (the port is atomic); checks are const and concurrent.
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/config/config.h"
#include "daemon/core/status.h"
#include "daemon/http/http1.h"

namespace idem {

// A refused request: the HTTP status to answer and the problem's detail and
// pointer.
struct Refusal {
  int http_status;
  Status status;
};

class RequestGuard {
 public:
  // `listen_host` as written in server.listen (brackets of an IPv6 literal
  // removed); `port` may be 0 until SetBoundPort.
  void Configure(const ServerConfig& server, const std::string& listen_host, int port);
  void SetBoundPort(int port) { port_.store(port, std::memory_order_release); }

  // Host, then Origin.
  std::optional<Refusal> CheckSource(const http1::Request& req) const;
  std::optional<Refusal> CheckHost(const http1::Request& req) const;
  // Origin alone, for a public route that still runs something (the inbox:
  // webhook senders send no Origin and may name the daemon by any Host,
  // but a web page must not deliver events through the user's browser).
  // The daemon's own origin passes only with a Host that CheckHost accepts.
  std::optional<Refusal> CheckOrigin(const http1::Request& req) const;
  static std::optional<Refusal> CheckContentType(const http1::Request& req,
                                                 const std::vector<std::string>& accepted = {
                                                     "application/json"});

 private:
  std::vector<std::string> builtin_hosts_;  // lower case, without brackets
  std::vector<std::string> allowed_hosts_;  // lower case, without brackets
  std::vector<std::string> allowed_origins_;
  std::atomic<int> port_{0};
};

// True for localhost, 127.0.0.0/8 in dotted-quad form and ::1 (with or
// without brackets): addresses only this machine can reach. 0.0.0.0, ::
// and every other name are not loopback.
bool IsLoopbackHost(std::string_view host);

// The credentials of an `Authorization: Bearer <token>` value (RFC 6750;
// the scheme is case-insensitive per RFC 9110 section 11.1, one or more
// spaces before the token). nullopt for any other scheme or an empty token.
std::optional<std::string> BearerCredentials(std::string_view authorization);

// Idem-Caller: without auth tokens, the caller's self-chosen name that
// scopes its Idempotency-Keys (with tokens the token's name does, and the
// header is ignored). nullopt when absent; InvalidArgument (pointer
// "header:Idem-Caller") unless it is one value of 1-64 characters from
// letters, digits, "_", "-", "." and ":" that starts with a letter or digit.
StatusOr<std::optional<std::string>> IdemCaller(const http1::Request& req);

}  // namespace idem
