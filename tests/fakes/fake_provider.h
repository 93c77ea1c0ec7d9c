// FakeProviderServer: an in-process HTTP server on 127.0.0.1 (a free port)
// that speaks three model-provider wire formats, scripted per test:
//
//   POST /v1/chat/completions   OpenAI Chat Completions (also what vLLM,
//                               LM Studio, llama.cpp server and Ollama /v1 speak)
//   POST /v1/messages           Anthropic Messages
//   POST /api/chat              Ollama native chat (stream: false)
//
// each also under one prefix segment (/gw/v1/messages), as behind a gateway.
//
// Each request takes the next FakeReply from a queue (when the queue is
// empty: HTTP 500 "fake: no scripted reply") and renders it in the wire
// format of the path it arrived on, so one script works for every adapter:
// Output({...}) is an OpenAI chat.completion with the JSON as message
// content, an Anthropic message with a tool_use block (when the request
// forced a tool with tool_choice {type: "tool"}) or a text block, and an
// Ollama chat response. Error replies carry each API's error body shape.
//
// Fault switches: latency, 429 with Retry-After (seconds, HTTP-date) or
// retry-after-ms, 429 insufficient_quota, 500/502/503/504, 529 overloaded,
// a connection cut mid-body (Content-Length promised, half sent, socket
// closed), a 200 whose body is not JSON, model output that is not JSON or
// violates the schema, refusals and truncation.
//
// Every request is recorded (method, path, headers, body, parsed JSON,
// client port) so tests can check the body shape and the auth header.
// A 401 reply's default message echoes the API key the request carried,
// as a careless provider might: adapters must redact it.
//
// Thread-safety: all methods may be called from any thread while requests
// are served.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "daemon/core/http_client.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace idem::fakes {

using Json = nlohmann::json;

struct FakeReply {
  enum class Kind {
    kOutput,         // output rendered as the model's JSON answer
    kText,           // text as the model's answer, verbatim
    kRefusal,        // the model refuses, text is its explanation
    kTruncated,      // the answer hit the token limit (text: the partial answer)
    kContentFilter,  // OpenAI finish_reason content_filter (a refusal elsewhere)
    kHttpError,      // status + the wire format's error body with text as message
    kCutMidBody,     // a 200 whose body stops halfway; the connection is closed
    kMalformedBody,  // a 200 whose body is not JSON
    kRaw,            // status + text as the body, verbatim
  };

  Kind kind = Kind::kOutput;
  Json output;
  std::string text;
  int status = 200;
  std::string error_type;  // kHttpError: the API's error type/code; "" = usual for status
  HttpHeaders headers;     // extra response headers
  int latency_ms = 0;      // wait this long before answering (cut short on shutdown)
  int64_t input_tokens = 42;
  int64_t output_tokens = 7;
  int64_t cached_tokens = 0;

  static FakeReply Output(Json output);
  // {"unexpected": true}: JSON, but not what any step schema allows.
  static FakeReply SchemaViolating();
  static FakeReply Text(std::string content);
  static FakeReply Refusal(std::string explanation);
  static FakeReply Truncated(std::string partial = "{\"label\": \"bil");
  static FakeReply ContentFilter();
  // "{key}" in message is replaced by the API key the request carried.
  static FakeReply HttpError(int status, std::string message = "", std::string error_type = "");
  // 429 with `retry-after: <value>` (delta-seconds or an HTTP-date).
  static FakeReply RateLimited(std::string retry_after);
  // 429 with `retry-after-ms: <ms>`.
  static FakeReply RateLimitedMs(int64_t ms);
  // 429 whose body says insufficient_quota (billing, not a rate).
  static FakeReply QuotaExhausted();
  // 529 overloaded_error (Anthropic's shape on every path).
  static FakeReply Overloaded();
  static FakeReply CutMidBody();
  static FakeReply MalformedBody();
  static FakeReply Raw(int status, std::string body);

  FakeReply WithLatency(int ms) const;
  FakeReply WithHeader(std::string name, std::string value) const;
  FakeReply WithUsage(int64_t input, int64_t output, int64_t cached = 0) const;
};

struct RecordedRequest {
  std::string method;
  std::string path;
  HttpHeaders headers;  // names lower-cased
  std::string body;
  Json json;  // body parsed; null when not JSON
  int remote_port = 0;

  // The first value of the lower-case header name, or "" when absent.
  std::string Header(std::string_view lower_name) const;
};

class FakeProviderServer {
 public:
  // Binds 127.0.0.1 on a free port and serves on a background thread.
  // nullptr when no port could be bound.
  static std::unique_ptr<FakeProviderServer> Start();
  ~FakeProviderServer();
  FakeProviderServer(const FakeProviderServer&) = delete;
  FakeProviderServer& operator=(const FakeProviderServer&) = delete;

  // "http://127.0.0.1:<port>" (no trailing slash, no /v1).
  std::string base_url() const;
  int port() const { return port_; }

  void Enqueue(FakeReply reply);
  // What a request gets when the queue is empty (default: HTTP 500).
  void SetDefault(FakeReply reply);

  int calls() const;
  std::vector<RecordedRequest> requests() const;
  // REQUIRES: calls() > 0.
  RecordedRequest last_request() const;

 private:
  enum class Wire { kOpenAi, kAnthropic, kOllama };
  FakeProviderServer();
  void Handle(Wire wire, const httplib::Request& req, httplib::Response& res);

  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;

  mutable std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::deque<FakeReply> queue_;
  FakeReply default_reply_;
  std::vector<RecordedRequest> requests_;
};

}  // namespace idem::fakes
