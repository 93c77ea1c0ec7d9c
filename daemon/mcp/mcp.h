// McpProtocol: the Model Context Protocol over Streamable HTTP (revision
// 2025-11-25, and the older revisions the official TypeScript SDK still
// negotiates: 2025-06-18, 2025-03-26, 2024-11-05), on one endpoint.
//
// Transport (what Handle promises):
//   POST   a JSON-RPC message or a batch (an array). Requests are answered
//          200 with application/json, or with one SSE event
//          (text/event-stream) when the client's Accept names only that;
//          a body of notifications and responses only is 202 with no body.
//          Accept must name application/json or text/event-stream (406).
//   initialize (no session needed) creates a session: its id comes back in
//          the Mcp-Session-Id header and every later request must carry it
//          (400 without, 404 for an unknown or ended one: the client then
//          initializes again). A requested protocol version that is
//          supported is echoed; otherwise the latest is offered.
//          MCP-Protocol-Version, when sent, must be a supported version (400).
//          A body of one message that is no valid JSON-RPC message is 400
//          with its -32600 error (the message's id when readable); in a
//          batch each message's error is its answer in the batch's 200.
//   GET    405 (Allow: POST, DELETE): this server opens no server-to-client
//          stream. HEAD is answered as GET.
//   DELETE ends the session (200; 404 if unknown; 400 without
//          Mcp-Session-Id or with an unsupported MCP-Protocol-Version).
// Methods: initialize, notifications/initialized (and any other
// notification: accepted, ignored), ping, tools/list (paged: nextCursor),
// tools/call. JSON-RPC errors for protocol faults: -32600 invalid request,
// -32601 unknown method, -32602 invalid params (unknown tool, a bad cursor),
// and tool failures are results with isError: true and a text a
// model can act on (McpToolbox decides them).
//
// Sessions are kept in memory (a restart ends them; clients re-initialize),
// at most options.max_sessions, the least recently used dropped first, at
// most options.max_sessions_per_caller of one token (its own least recently
// used dropped first), and each expires after options.session_idle_ms
// without a request.
//
// Thread-safety: Handle may be called concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "daemon/core/version.h"

namespace idem {

using Json = nlohmann::json;

inline constexpr const char* kMcpLatestVersion = "2025-11-25";

// The tools behind the protocol.
class McpToolbox {
 public:
  virtual ~McpToolbox() = default;
  // Every tool: {name, title?, description, inputSchema, outputSchema?,
  // annotations?}, in a stable order.
  virtual const std::vector<Json>& Tools() const = 0;
  // A tools/call result ({content, structuredContent?, isError?}); nullopt-
  // like null Json for an unknown tool (the protocol answers -32602).
  virtual Json Call(const std::string& name, const Json& arguments, const Json& meta,
                    const std::string& caller, const std::string& request_id) = 0;
};

struct McpHttpRequest {
  std::string method;            // POST, GET, DELETE
  std::string accept;            // Accept header ("" when absent)
  std::string session_id;        // Mcp-Session-Id ("" when absent)
  std::string protocol_version;  // MCP-Protocol-Version ("" when absent)
  std::string caller;            // the token name (or "anonymous")
  std::string request_id;
  Json body;  // the parsed POST body
  // Empty, or takes one of the caller's rate-limit tokens: each call of a
  // batch after the first (the HTTP request took one) needs its own, and a
  // call without one is answered -32000 "rate limited".
  std::function<bool()> take_rate_token;
};

struct McpHttpResponse {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string content_type = "application/json";
  std::string body;
};

struct McpOptions {
  size_t max_sessions = 10'000;
  size_t max_sessions_per_caller = 1'000;  // past it a caller's own oldest goes
  int64_t session_idle_ms = 3'600'000;
  size_t tools_page_size = 100;
  size_t max_batch = 100;  // messages per POST
  std::string server_name = "idem";
  std::string server_version = kVersion;  // initialize's serverInfo, as `idem --version`
};

// The JSON-RPC error (id null) for a POST body the HTTP layer refused before
// Handle: -32700 (parse error) when it is not JSON, -32600 (invalid request)
// when it is JSON of the wrong shape.
std::string McpBodyRefusal(const std::string& message, bool not_json);

class McpProtocol {
 public:
  // `toolbox` must outlive the protocol. `now_ms` is the clock for session
  // expiry.
  McpProtocol(McpToolbox& toolbox, McpOptions options);
  ~McpProtocol();

  McpHttpResponse Handle(const McpHttpRequest& request, int64_t now_ms);

  size_t session_count() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem
