#include "daemon/mcp/mcp.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <list>
#include <mutex>
#include <string_view>
#include <unordered_map>

#include "daemon/core/crypto.h"

namespace idem {
namespace {

constexpr const char* kSupportedVersions[] = {"2025-11-25", "2025-06-18", "2025-03-26",
                                              "2024-11-05"};

bool Supported(const std::string& v) {
  for (const char* s : kSupportedVersions) {
    if (v == s) return true;
  }
  return false;
}

// Whether an Accept header (RFC 9110 12.5.1) takes type/subtype: the most
// specific media range that covers it (type/subtype, then type/*, then
// */*) has a weight above 0.
bool Accepts(std::string_view accept, std::string_view type, std::string_view subtype) {
  auto trim = [](std::string_view v) {
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
    return v;
  };
  auto same = [](std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::tolower(static_cast<unsigned char>(a[i])) != b[i]) return false;
    }
    return true;
  };
  int best = -1;  // the specificity of the best range so far
  double best_q = 0;
  while (!accept.empty()) {
    const size_t comma = accept.find(',');
    std::string_view range = accept.substr(0, comma);
    accept = comma == std::string_view::npos ? std::string_view() : accept.substr(comma + 1);
    const size_t semi = range.find(';');
    const std::string_view media = trim(range.substr(0, semi));
    const size_t slash = media.find('/');
    if (slash == std::string_view::npos) continue;
    const std::string_view t = media.substr(0, slash), s = media.substr(slash + 1);
    const int specific = same(t, type) && same(s, subtype) ? 2
                         : same(t, type) && s == "*"       ? 1
                         : t == "*" && s == "*"            ? 0
                                                           : -1;
    if (specific < best) continue;
    double q = 1;
    for (std::string_view params = semi == std::string_view::npos ? "" : range.substr(semi + 1);
         !params.empty();) {
      const size_t next = params.find(';');
      const std::string_view p = trim(params.substr(0, next));
      params = next == std::string_view::npos ? std::string_view() : params.substr(next + 1);
      if (p.size() >= 2 && (p[0] == 'q' || p[0] == 'Q') && p[1] == '=') {
        q = std::atof(std::string(p.substr(2)).c_str());
      }
    }
    if (specific > best) {
      best = specific;
      best_q = q;
    } else {
      best_q = std::max(best_q, q);  // the same range twice: the kinder weight
    }
  }
  return best >= 0 && best_q > 0;
}

Json RpcError(const Json& id, int code, const std::string& message) {
  return {{"jsonrpc", "2.0"}, {"id", id}, {"error", {{"code", code}, {"message", message}}}};
}

Json RpcResult(const Json& id, Json result) {
  return {{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}};
}

// A transport-level refusal: an HTTP status with a JSON-RPC error body
// (id null), as the specification's examples answer them.
McpHttpResponse Refuse(int status, int code, const std::string& message) {
  McpHttpResponse r;
  r.status = status;
  r.body = RpcError(nullptr, code, message).dump();
  return r;
}

bool ValidId(const Json& id) { return id.is_string() || id.is_number_integer(); }

}  // namespace

std::string McpBodyRefusal(const std::string& message, bool not_json) {
  return RpcError(nullptr, not_json ? -32700 : -32600, message).dump();
}

struct McpProtocol::Impl {
  Impl(McpToolbox& toolbox, McpOptions options) : toolbox(toolbox), options(std::move(options)) {}

  McpToolbox& toolbox;
  McpOptions options;

  struct Session {
    std::string id;
    std::string version;
    std::string caller;
    int64_t last_used_ms = 0;
  };
  mutable std::mutex mu;
  std::list<Session> lru;  // most recently used first
  std::unordered_map<std::string, std::list<Session>::iterator> sessions;
  std::unordered_map<std::string, size_t> per_caller;  // sessions of each caller

  // The session's negotiated version, touched; "" when unknown, expired or
  // opened by another caller (a session id is no credential: it belongs to
  // the token that initialized it, and to no other).
  std::string Touch(const std::string& id, const std::string& caller, int64_t now) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = sessions.find(id);
    if (it == sessions.end() || it->second->caller != caller) return "";
    if (now - it->second->last_used_ms > options.session_idle_ms) {
      Drop(it->second);
      return "";
    }
    it->second->last_used_ms = now;
    lru.splice(lru.begin(), lru, it->second);
    return it->second->version;
  }

  std::string Open(const std::string& version, const std::string& caller, int64_t now) {
    std::lock_guard<std::mutex> lock(mu);
    // A caller past its own share drops its own least recently used session,
    // never another token's: one agent's initialize loop cannot end the
    // sessions of the rest.
    if (per_caller[caller] >= options.max_sessions_per_caller) {
      for (auto it = lru.rbegin(); it != lru.rend(); ++it) {
        if (it->caller == caller) {
          Drop(std::next(it).base());
          break;
        }
      }
    }
    while (sessions.size() >= options.max_sessions && !lru.empty()) {
      Drop(std::prev(lru.end()));
    }
    std::string id = RandomHex(16);
    lru.push_front(Session{id, version, caller, now});
    sessions[id] = lru.begin();
    ++per_caller[caller];
    return id;
  }

  void Drop(std::list<Session>::iterator it) {
    if (--per_caller[it->caller] == 0) per_caller.erase(it->caller);
    sessions.erase(it->id);
    lru.erase(it);
  }

  bool Close(const std::string& id, const std::string& caller) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = sessions.find(id);
    if (it == sessions.end() || it->second->caller != caller) return false;
    Drop(it->second);
    return true;
  }

  // One JSON-RPC message; null for a notification or a response (no
  // answer). *invalid is set when the message is no valid JSON-RPC message
  // at all (-32600): its answer carries the message's id when that is a
  // valid one (JSON-RPC 2.0, 5), else null.
  Json Dispatch(const Json& msg, const McpHttpRequest& req, std::string* new_session, int64_t now,
                bool* invalid) {
    auto refuse = [&msg, invalid](const std::string& why) {
      *invalid = true;
      const bool readable = msg.is_object() && msg.contains("id") && ValidId(msg["id"]);
      return RpcError(readable ? msg["id"] : Json(), -32600, why);
    };
    if (!msg.is_object() || msg.value("jsonrpc", Json()) != "2.0") {
      return refuse("not a JSON-RPC 2.0 message");
    }
    if (!msg.contains("method")) {
      // A response to us (this server asks nothing, so it is dropped); a
      // message that is neither request nor response is invalid (JSON-RPC
      // 2.0, 5.1).
      if (msg.contains("result") || msg.contains("error")) return Json();
      return refuse("neither a request (method) nor a response (result or error)");
    }
    if (!msg["method"].is_string()) return refuse("method must be a string");
    const std::string method = msg["method"];
    if (!msg.contains("id")) return Json();  // a notification: accepted, nothing to say
    const Json& id = msg["id"];
    if (!ValidId(id)) return refuse("id must be a string or an integer");
    const Json params = msg.value("params", Json::object());
    if (!params.is_object()) return RpcError(id, -32602, "params must be an object");

    if (method == "initialize") {
      // Required by the specification's InitializeRequest: the version the
      // client speaks (an unknown one is answered with ours).
      if (!params.contains("protocolVersion")) {
        return RpcError(id, -32602, "params.protocolVersion is required");
      }
      const Json& asked_json = params["protocolVersion"];
      if (!asked_json.is_string()) {
        return RpcError(id, -32602, "params.protocolVersion must be a string");
      }
      const std::string asked = asked_json.get<std::string>();
      std::string version = Supported(asked) ? asked : kMcpLatestVersion;
      *new_session = Open(version, req.caller, now);
      return RpcResult(
          id, {{"protocolVersion", version},
               {"capabilities", {{"tools", {{"listChanged", false}}}}},
               {"serverInfo", {{"name", options.server_name}, {"version", options.server_version}}},
               {"instructions",
                "idem runs LLM decisions and their effects exactly once. decide_<step> tools "
                "return cached or new validated decisions; do_<kind> tools execute an action "
                "once per unit of work (calling again with the same arguments returns the "
                "original result, never a second effect). A result with state "
                "awaiting_approval waits for a human: call again later with the same "
                "arguments for the outcome, or read it with get_plan."}});
    }
    if (method == "ping") return RpcResult(id, Json::object());
    if (method == "tools/list") {
      const std::vector<Json>& tools = toolbox.Tools();
      size_t start = 0;
      if (params.contains("cursor")) {
        const Json& c = params["cursor"];
        char* end = nullptr;
        std::string text = c.is_string() ? c.get<std::string>() : "";
        unsigned long v = std::strtoul(text.c_str(), &end, 10);
        if (text.empty() || *end != '\0' || v >= tools.size()) {
          return RpcError(id, -32602, "invalid cursor");
        }
        start = v;
      }
      size_t stop = std::min(tools.size(), start + options.tools_page_size);
      Json list = Json::array();
      for (size_t i = start; i < stop; ++i) list.push_back(tools[i]);
      Json result = {{"tools", std::move(list)}};
      if (stop < tools.size()) result["nextCursor"] = std::to_string(stop);
      return RpcResult(id, std::move(result));
    }
    if (method == "tools/call") {
      if (!params.contains("name") || !params["name"].is_string()) {
        return RpcError(id, -32602, "tools/call needs params.name");
      }
      Json arguments = params.value("arguments", Json::object());
      if (!arguments.is_object()) return RpcError(id, -32602, "arguments must be an object");
      Json meta = params.value("_meta", Json::object());
      // The spec's _meta is an object; another value is no key at all, and
      // taken as "none" a client's pinned key would be silently dropped.
      if (!meta.is_object()) return RpcError(id, -32602, "_meta must be an object");
      Json result = toolbox.Call(params["name"], arguments, meta, req.caller, req.request_id);
      if (result.is_null()) {
        return RpcError(id, -32602, "unknown tool: " + params["name"].get<std::string>());
      }
      return RpcResult(id, std::move(result));
    }
    return RpcError(id, -32601, "method not found: " + method);
  }
};

McpProtocol::McpProtocol(McpToolbox& toolbox, McpOptions options)
    : impl_(std::make_unique<Impl>(toolbox, std::move(options))) {}
McpProtocol::~McpProtocol() = default;

size_t McpProtocol::session_count() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->sessions.size();
}

McpHttpResponse McpProtocol::Handle(const McpHttpRequest& req, int64_t now_ms) {
  Impl& m = *impl_;
  // HEAD is GET without the body (RFC 9110 9.3.2): the same status and Allow.
  if (req.method == "GET" || req.method == "HEAD") {
    McpHttpResponse r = Refuse(405, -32000, "this server opens no server-to-client stream");
    r.headers.push_back({"Allow", "POST, DELETE"});
    return r;
  }
  if (req.method == "DELETE") {
    if (req.session_id.empty()) return Refuse(400, -32000, "Mcp-Session-Id header required");
    if (!req.protocol_version.empty() && !Supported(req.protocol_version)) {
      return Refuse(400, -32000, "unsupported MCP-Protocol-Version " + req.protocol_version);
    }
    if (!m.Close(req.session_id, req.caller)) return Refuse(404, -32001, "session not found");
    McpHttpResponse r;
    r.body = "{}";
    return r;
  }
  if (req.method != "POST") return Refuse(405, -32000, "method not allowed");

  const bool json_ok = Accepts(req.accept, "application", "json");
  const bool sse_ok = Accepts(req.accept, "text", "event-stream");
  if (!json_ok && !sse_ok) {
    return Refuse(406, -32000, "Accept must name application/json or text/event-stream");
  }

  const bool batch = req.body.is_array();
  std::vector<Json> messages;
  if (batch) {
    if (req.body.empty()) return Refuse(400, -32600, "an empty batch");
    if (req.body.size() > m.options.max_batch) {
      return Refuse(413, -32600,
                    "at most " + std::to_string(m.options.max_batch) + " messages per batch");
    }
    for (const Json& j : req.body) messages.push_back(j);
  } else {
    messages.push_back(req.body);
  }
  bool initializing = false;
  for (const Json& msg : messages) {
    if (msg.is_object() && msg.value("method", Json()).is_string() &&
        msg["method"] == "initialize") {
      initializing = true;
    }
  }
  if (initializing && batch) return Refuse(400, -32600, "initialize must be sent alone");
  if (!initializing) {
    if (req.session_id.empty()) {
      return Refuse(400, -32000, "Mcp-Session-Id header required (send initialize first)");
    }
    std::string version = m.Touch(req.session_id, req.caller, now_ms);
    if (version.empty()) return Refuse(404, -32001, "session not found: initialize again");
    if (batch && version >= "2025-06-18") {
      return Refuse(400, -32600, "batches are not part of MCP " + version + "; send one message");
    }
    if (!req.protocol_version.empty() && !Supported(req.protocol_version)) {
      return Refuse(400, -32000, "unsupported MCP-Protocol-Version " + req.protocol_version);
    }
  }

  std::string new_session;
  Json answers = Json::array();
  bool first_call = true;
  bool invalid = false;  // a message that is no JSON-RPC message (-32600)
  for (const Json& msg : messages) {
    // Every call past the request's first takes its own rate-limit token,
    // so a batch is limited as that many requests would be.
    if (msg.is_object() && msg.value("method", Json()) == "tools/call") {
      if (!first_call && req.take_rate_token && !req.take_rate_token()) {
        if (msg.contains("id")) {
          answers.push_back(RpcError(msg["id"], -32000,
                                     "rate limited: past server.rate_limit; send this call "
                                     "again later"));
        }
        continue;
      }
      first_call = false;
    }
    Json a = m.Dispatch(msg, req, &new_session, now_ms, &invalid);
    if (!a.is_null()) answers.push_back(std::move(a));
  }
  // A lone message the server cannot accept is an HTTP error (MCP
  // transports, "Sending Messages to the Server"), its JSON-RPC error the
  // body; in a batch, each message's error is its answer in the batch's.
  if (invalid && !batch) {
    McpHttpResponse r;
    r.status = 400;
    r.body = answers[0].dump(-1, ' ', false, Json::error_handler_t::replace);
    return r;
  }
  McpHttpResponse r;
  if (!new_session.empty()) r.headers.push_back({"Mcp-Session-Id", new_session});
  if (answers.empty()) {
    r.status = 202;
    r.body.clear();
    return r;
  }
  std::string payload = batch ? answers.dump(-1, ' ', false, Json::error_handler_t::replace)
                              : answers[0].dump(-1, ' ', false, Json::error_handler_t::replace);
  if (!json_ok) {
    r.content_type = "text/event-stream";
    r.headers.push_back({"Cache-Control", "no-store"});
    r.body = "event: message\ndata: " + payload + "\n\n";
  } else {
    r.body = std::move(payload);
  }
  return r;
}

}  // namespace idem
