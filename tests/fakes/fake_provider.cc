#include "tests/fakes/fake_provider.h"

#include <httplib.h>

#include <algorithm>
#include <cctype>
#include <chrono>

#include "tests/fakes/serve.h"

namespace idem::fakes {
namespace {

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string ReplaceAll(std::string text, std::string_view from, std::string_view to) {
  if (from.empty()) return text;
  for (size_t p = 0; (p = text.find(from, p)) != std::string::npos; p += to.size()) {
    text.replace(p, from.size(), to);
  }
  return text;
}

// The key the request authenticated with, whatever the wire format.
std::string PresentedKey(const httplib::Request& req) {
  std::string auth = req.get_header_value("Authorization");
  if (auth.rfind("Bearer ", 0) == 0) return auth.substr(7);
  return req.get_header_value("x-api-key");
}

std::string OpenAiErrorType(int status) {
  switch (status) {
    case 401:
      return "invalid_api_key";
    case 404:
      return "model_not_found";
    case 429:
      return "rate_limit_exceeded";
    default:
      return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

std::string AnthropicErrorType(int status) {
  switch (status) {
    case 400:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 529:
      return "overloaded_error";
    default:
      return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

std::string DefaultErrorMessage(int status) {
  switch (status) {
    case 401:
      return "Incorrect API key provided: {key}. You can find your API key in your account.";
    case 429:
      return "Rate limit reached for requests. Please try again later.";
    case 529:
      return "Overloaded";
    default:
      return status >= 500 ? "The server had an error while processing your request."
                           : "Invalid request.";
  }
}

}  // namespace

// ---- FakeReply ----

FakeReply FakeReply::Output(Json output) {
  FakeReply r;
  r.kind = Kind::kOutput;
  r.output = std::move(output);
  return r;
}

FakeReply FakeReply::SchemaViolating() { return Output({{"unexpected", true}}); }

FakeReply FakeReply::Text(std::string content) {
  FakeReply r;
  r.kind = Kind::kText;
  r.text = std::move(content);
  return r;
}

FakeReply FakeReply::Refusal(std::string explanation) {
  FakeReply r;
  r.kind = Kind::kRefusal;
  r.text = std::move(explanation);
  return r;
}

FakeReply FakeReply::Truncated(std::string partial) {
  FakeReply r;
  r.kind = Kind::kTruncated;
  r.text = std::move(partial);
  return r;
}

FakeReply FakeReply::ContentFilter() {
  FakeReply r;
  r.kind = Kind::kContentFilter;
  return r;
}

FakeReply FakeReply::HttpError(int status, std::string message, std::string error_type) {
  FakeReply r;
  r.kind = Kind::kHttpError;
  r.status = status;
  r.text = message.empty() ? DefaultErrorMessage(status) : std::move(message);
  r.error_type = std::move(error_type);
  return r;
}

FakeReply FakeReply::RateLimited(std::string retry_after) {
  return HttpError(429).WithHeader("retry-after", std::move(retry_after));
}

FakeReply FakeReply::RateLimitedMs(int64_t ms) {
  return HttpError(429).WithHeader("retry-after-ms", std::to_string(ms));
}

FakeReply FakeReply::QuotaExhausted() {
  return HttpError(429,
                   "You exceeded your current quota, please check your plan and billing details.",
                   "insufficient_quota");
}

FakeReply FakeReply::Overloaded() { return HttpError(529, "Overloaded", "overloaded_error"); }

FakeReply FakeReply::CutMidBody() {
  FakeReply r = Output({{"label", "billing"}});
  r.kind = Kind::kCutMidBody;
  return r;
}

FakeReply FakeReply::MalformedBody() {
  FakeReply r;
  r.kind = Kind::kMalformedBody;
  return r;
}

FakeReply FakeReply::Raw(int status, std::string body) {
  FakeReply r;
  r.kind = Kind::kRaw;
  r.status = status;
  r.text = std::move(body);
  return r;
}

FakeReply FakeReply::WithLatency(int ms) const {
  FakeReply r = *this;
  r.latency_ms = ms;
  return r;
}

FakeReply FakeReply::WithHeader(std::string name, std::string value) const {
  FakeReply r = *this;
  r.headers.emplace_back(std::move(name), std::move(value));
  return r;
}

FakeReply FakeReply::WithUsage(int64_t input, int64_t output, int64_t cached) const {
  FakeReply r = *this;
  r.input_tokens = input;
  r.output_tokens = output;
  r.cached_tokens = cached;
  return r;
}

std::string RecordedRequest::Header(std::string_view lower_name) const {
  for (const auto& [name, value] : headers) {
    if (name == lower_name) return value;
  }
  return "";
}

// ---- Rendering, one function per wire format ----

namespace {

std::string ModelOf(const Json& request) {
  auto it = request.is_object() ? request.find("model") : request.end();
  return it != request.end() && it->is_string() ? it->get<std::string>() : "fake-model";
}

Json OpenAiSuccess(const FakeReply& r, const Json& request, int n) {
  Json content = nullptr;
  Json refusal = nullptr;
  std::string finish = "stop";
  switch (r.kind) {
    case FakeReply::Kind::kOutput:
    case FakeReply::Kind::kCutMidBody:
      content = Dump(r.output);
      break;
    case FakeReply::Kind::kRefusal:
      refusal = r.text;
      break;
    case FakeReply::Kind::kTruncated:
      content = r.text;
      finish = "length";
      break;
    case FakeReply::Kind::kContentFilter:
      content = "";
      finish = "content_filter";
      break;
    default:
      content = r.text;
  }
  return {
      {"id", "chatcmpl-fake" + std::to_string(n)},
      {"object", "chat.completion"},
      {"created", 1700000000 + n},
      {"model", ModelOf(request)},
      {"choices", Json::array({{{"index", 0},
                                {"message",
                                 {{"role", "assistant"},
                                  {"content", content},
                                  {"refusal", refusal},
                                  {"annotations", Json::array()}}},
                                {"logprobs", nullptr},
                                {"finish_reason", finish}}})},
      {"usage",
       {{"prompt_tokens", r.input_tokens},
        {"completion_tokens", r.output_tokens},
        {"total_tokens", r.input_tokens + r.output_tokens},
        {"prompt_tokens_details", {{"cached_tokens", r.cached_tokens}, {"audio_tokens", 0}}},
        {"completion_tokens_details",
         {{"reasoning_tokens", 0},
          {"audio_tokens", 0},
          {"accepted_prediction_tokens", 0},
          {"rejected_prediction_tokens", 0}}}}},
      {"service_tier", "default"},
      {"system_fingerprint", "fp_fake"},
  };
}

Json AnthropicSuccess(const FakeReply& r, const Json& request, int n) {
  // A forced tool call answers with a tool_use block, as the API does.
  std::string forced_tool;
  if (request.is_object()) {
    auto tc = request.find("tool_choice");
    if (tc != request.end() && tc->is_object() && tc->value("type", "") == "tool") {
      forced_tool = tc->value("name", "");
    }
  }
  auto text_block = [](std::string text) { return Json{{"type", "text"}, {"text", text}}; };
  auto tool_block = [&](Json input) {
    return Json{{"type", "tool_use"},
                {"id", "toolu_fake" + std::to_string(n)},
                {"name", forced_tool},
                {"input", std::move(input)}};
  };
  Json content = Json::array();
  std::string stop = "end_turn";
  switch (r.kind) {
    case FakeReply::Kind::kOutput:
    case FakeReply::Kind::kCutMidBody:
      if (!forced_tool.empty()) {
        content.push_back(tool_block(r.output));
        stop = "tool_use";
      } else {
        content.push_back(text_block(Dump(r.output)));
      }
      break;
    case FakeReply::Kind::kRefusal:
    case FakeReply::Kind::kContentFilter:
      content.push_back(text_block(r.text.empty() ? "I can't help with that." : r.text));
      stop = "refusal";
      break;
    case FakeReply::Kind::kTruncated:
      if (!forced_tool.empty()) {
        content.push_back(tool_block(Json::object()));
      } else {
        content.push_back(text_block(r.text));
      }
      stop = "max_tokens";
      break;
    default:
      content.push_back(text_block(r.text));
  }
  return {
      {"id", "msg_fake" + std::to_string(n)},
      {"type", "message"},
      {"role", "assistant"},
      {"model", ModelOf(request)},
      {"content", std::move(content)},
      {"stop_reason", stop},
      {"stop_sequence", nullptr},
      {"usage",
       {{"input_tokens", r.input_tokens},
        {"cache_creation_input_tokens", 0},
        {"cache_read_input_tokens", r.cached_tokens},
        {"output_tokens", r.output_tokens}}},
  };
}

Json OllamaSuccess(const FakeReply& r, const Json& request) {
  std::string content;
  std::string done_reason = "stop";
  switch (r.kind) {
    case FakeReply::Kind::kOutput:
    case FakeReply::Kind::kCutMidBody:
      content = Dump(r.output);
      break;
    case FakeReply::Kind::kTruncated:
      content = r.text;
      done_reason = "length";
      break;
    default:
      content = r.text;
  }
  return {
      {"model", ModelOf(request)},
      {"created_at", "2024-11-14T22:13:20.000000Z"},
      {"message", {{"role", "assistant"}, {"content", content}}},
      {"done_reason", done_reason},
      {"done", true},
      {"total_duration", 4883583458LL},
      {"load_duration", 1334875},
      {"prompt_eval_count", r.input_tokens},
      {"prompt_eval_duration", 342546000},
      {"eval_count", r.output_tokens},
      {"eval_duration", 4535599000LL},
  };
}

}  // namespace

// ---- FakeProviderServer ----

FakeProviderServer::FakeProviderServer() : server_(std::make_unique<httplib::Server>()) {
  default_reply_ = FakeReply::HttpError(500, "fake: no scripted reply");
}

std::unique_ptr<FakeProviderServer> FakeProviderServer::Start() {
  std::unique_ptr<FakeProviderServer> fake(new FakeProviderServer());
  httplib::Server& svr = *fake->server_;
  svr.set_keep_alive_max_count(1000);
  svr.new_task_queue = [] { return new httplib::ThreadPool(8); };
  svr.set_payload_max_length(16u << 20);
  FakeProviderServer* self = fake.get();
  // Each path also under one prefix segment, as behind a gateway's route.
  svr.Post("(/[^/]+)?/v1/chat/completions",
           [self](const httplib::Request& req, httplib::Response& res) {
             self->Handle(Wire::kOpenAi, req, res);
           });
  svr.Post("(/[^/]+)?/v1/messages", [self](const httplib::Request& req, httplib::Response& res) {
    self->Handle(Wire::kAnthropic, req, res);
  });
  svr.Post("(/[^/]+)?/api/chat", [self](const httplib::Request& req, httplib::Response& res) {
    self->Handle(Wire::kOllama, req, res);
  });
  fake->port_ = ServeInBackground(svr, 0, fake->thread_);
  if (fake->port_ <= 0) return nullptr;
  return fake;
}

FakeProviderServer::~FakeProviderServer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

std::string FakeProviderServer::base_url() const {
  return "http://127.0.0.1:" + std::to_string(port_);
}

void FakeProviderServer::Enqueue(FakeReply reply) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back(std::move(reply));
}

void FakeProviderServer::SetDefault(FakeReply reply) {
  std::lock_guard<std::mutex> lock(mu_);
  default_reply_ = std::move(reply);
}

int FakeProviderServer::calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(requests_.size());
}

std::vector<RecordedRequest> FakeProviderServer::requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_;
}

RecordedRequest FakeProviderServer::last_request() const {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_.empty() ? RecordedRequest{} : requests_.back();
}

void FakeProviderServer::Handle(Wire wire, const httplib::Request& req, httplib::Response& res) {
  RecordedRequest rec;
  rec.method = req.method;
  rec.path = req.path;
  for (const auto& [name, value] : req.headers) rec.headers.emplace_back(Lower(name), value);
  rec.body = req.body;
  rec.json = Json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (rec.json.is_discarded()) rec.json = nullptr;
  rec.remote_port = req.remote_port;
  const Json request_json = rec.json;

  FakeReply reply;
  int n = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    requests_.push_back(std::move(rec));
    n = static_cast<int>(requests_.size());
    if (queue_.empty()) {
      reply = default_reply_;
    } else {
      reply = std::move(queue_.front());
      queue_.pop_front();
    }
    if (reply.latency_ms > 0) {
      stop_cv_.wait_for(lock, std::chrono::milliseconds(reply.latency_ms),
                        [this] { return stopping_; });
    }
  }

  for (const auto& [name, value] : reply.headers) res.set_header(name, value);
  res.set_header(wire == Wire::kAnthropic ? "request-id" : "x-request-id",
                 "req_fake" + std::to_string(n));

  switch (reply.kind) {
    case FakeReply::Kind::kHttpError: {
      res.status = reply.status;
      std::string message = ReplaceAll(reply.text, "{key}", PresentedKey(req));
      Json body;
      if (wire == Wire::kOllama) {
        body = {{"error", message}};
      } else if (wire == Wire::kAnthropic || reply.status == 529) {
        body = {{"type", "error"},
                {"error",
                 {{"type",
                   reply.error_type.empty() ? AnthropicErrorType(reply.status) : reply.error_type},
                  {"message", message}}},
                {"request_id", "req_fake" + std::to_string(n)}};
      } else {
        std::string type =
            reply.error_type.empty() ? OpenAiErrorType(reply.status) : reply.error_type;
        body = {{"error",
                 {{"message", message},
                  {"type", reply.status == 429 && reply.error_type.empty() ? "requests" : type},
                  {"param", nullptr},
                  {"code", type}}}};
      }
      res.set_content(Dump(body), "application/json");
      return;
    }
    case FakeReply::Kind::kRaw:
      res.status = reply.status;
      res.set_content(reply.text, "application/json");
      return;
    case FakeReply::Kind::kMalformedBody:
      res.status = 200;
      res.set_content("{\"id\": \"chatcmpl-broken\", \"choices\": [{\"message\": ",
                      "application/json");
      return;
    default:
      break;
  }

  Json body;
  switch (wire) {
    case Wire::kOpenAi:
      body = OpenAiSuccess(reply, request_json, n);
      break;
    case Wire::kAnthropic:
      body = AnthropicSuccess(reply, request_json, n);
      break;
    case Wire::kOllama:
      body = OllamaSuccess(reply, request_json);
      break;
  }
  res.status = 200;
  if (reply.kind == FakeReply::Kind::kCutMidBody) {
    // Promise the whole body, send half, then fail the provider: httplib
    // closes the connection and the client sees a short read.
    auto text = std::make_shared<std::string>(Dump(body));
    res.set_content_provider(text->size(), "application/json",
                             [text](size_t, size_t, httplib::DataSink& sink) {
                               sink.write(text->data(), text->size() / 2);
                               return false;
                             });
    return;
  }
  res.set_content(Dump(body), "application/json");
}

}  // namespace idem::fakes
