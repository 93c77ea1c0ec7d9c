#include "tests/fakes/fake_telegram.h"

#include <httplib.h>

#include <chrono>
#include <utility>

#include "tests/fakes/serve.h"

namespace idem::fakes {
namespace {

using Json = nlohmann::json;

void Answer(httplib::Response& res, int status, const Json& body) {
  res.status = status;
  res.set_content(body.dump(), "application/json");
}

Json Failure(int code, const std::string& description) {
  return Json{{"ok", false}, {"error_code", code}, {"description", description}};
}

}  // namespace

FakeTelegramServer::FakeTelegramServer(std::string token)
    : token_(std::move(token)), server_(std::make_unique<httplib::Server>()) {}

std::unique_ptr<FakeTelegramServer> FakeTelegramServer::Start(std::string token) {
  std::unique_ptr<FakeTelegramServer> fake(new FakeTelegramServer(std::move(token)));
  httplib::Server& svr = *fake->server_;
  svr.new_task_queue = [] { return new httplib::ThreadPool(8); };
  fake->Install();
  fake->port_ = ServeInBackground(svr, 0, fake->thread_);
  if (fake->port_ <= 0) return nullptr;
  return fake;
}

FakeTelegramServer::~FakeTelegramServer() {
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

std::string FakeTelegramServer::base_url() const {
  return "http://127.0.0.1:" + std::to_string(port_);
}

void FakeTelegramServer::FloodNext(int n, int retry_after_s) {
  std::lock_guard<std::mutex> lock(mu_);
  flood_next_ = n;
  flood_retry_after_s_ = retry_after_s;
}

void FakeTelegramServer::SetKnownChats(std::set<std::string> chats) {
  std::lock_guard<std::mutex> lock(mu_);
  restrict_chats_ = true;
  known_chats_ = std::move(chats);
}

void FakeTelegramServer::EchoPath() {
  std::lock_guard<std::mutex> lock(mu_);
  echo_path_ = true;
}

std::vector<TelegramMessage> FakeTelegramServer::messages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return messages_;
}

std::vector<TelegramCall> FakeTelegramServer::calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return calls_;
}

void FakeTelegramServer::Install() {
  auto handler = [this](const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu_);
    auto done = [&](int status, const Json& body) {
      Answer(res, status, body);
      calls_.push_back({req.path, req.body, status});
    };
    const std::string prefix = "/bot";
    const std::string suffix = "/sendMessage";
    if (req.method != "POST" || !req.path.starts_with(prefix) || !req.path.ends_with(suffix) ||
        req.path.size() < prefix.size() + suffix.size()) {
      return done(404, Failure(404, "Not Found"));
    }
    std::string token =
        req.path.substr(prefix.size(), req.path.size() - prefix.size() - suffix.size());
    if (token != token_) return done(401, Failure(401, "Unauthorized"));
    if (req.get_header_value("Content-Type").find("application/json") != 0) {
      return done(400, Failure(400, "Bad Request: message text is empty"));
    }
    Json body = Json::parse(req.body, nullptr, false);
    if (!body.is_object()) return done(400, Failure(400, "Bad Request: can't parse JSON"));
    if (!body.contains("chat_id") ||
        !(body["chat_id"].is_number_integer() ||
          (body["chat_id"].is_string() && !body["chat_id"].get<std::string>().empty()))) {
      return done(400, Failure(400, "Bad Request: chat_id is empty"));
    }
    if (!body.contains("text") || !body["text"].is_string() ||
        body["text"].get<std::string>().empty()) {
      return done(400, Failure(400, "Bad Request: message text is empty"));
    }
    if (flood_next_ > 0) {
      --flood_next_;
      Json failure =
          Failure(429, "Too Many Requests: retry after " + std::to_string(flood_retry_after_s_));
      failure["parameters"] = {{"retry_after", flood_retry_after_s_}};
      return done(429, failure);
    }
    const std::string chat =
        body["chat_id"].is_string() ? body["chat_id"].get<std::string>() : body["chat_id"].dump();
    if (restrict_chats_ && known_chats_.count(chat) == 0) {
      return done(400, Failure(400, "Bad Request: chat not found"));
    }
    TelegramMessage m{next_message_id_++, chat, body["text"].get<std::string>()};
    messages_.push_back(m);
    Json chat_json = Json{{"id", body["chat_id"]}, {"type", "private"}};
    Json answer = Json{{"ok", true},
                       {"result",
                        {{"message_id", m.message_id},
                         {"from",
                          {{"id", 424242},
                           {"is_bot", true},
                           {"first_name", "idem test"},
                           {"username", "idem_test_bot"}}},
                         {"chat", chat_json},
                         {"date", std::chrono::duration_cast<std::chrono::seconds>(
                                      std::chrono::system_clock::now().time_since_epoch())
                                      .count()},
                         {"text", m.text}}}};
    if (echo_path_) answer["result"]["request_path"] = req.path;
    done(200, answer);
  };
  server_->Post(".*", handler);
  server_->Get(".*", handler);
}

}  // namespace idem::fakes
