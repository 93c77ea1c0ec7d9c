// FakeTelegramServer: an in-process HTTP server on 127.0.0.1 that speaks the
// Telegram Bot API's wire format for sendMessage, and counts what it sent.
//
//   POST /bot<token>/sendMessage   JSON {"chat_id": int|string, "text": string}
//     -> 200 {"ok": true, "result": {"message_id", "from", "chat", "date", "text"}}
//   a wrong token   -> 401 {"ok": false, "error_code": 401, "description": "Unauthorized"}
//   no chat_id/text -> 400 {"ok": false, "error_code": 400, "description": "Bad Request: ..."}
//   an unknown chat (when SetKnownChats was called)
//                   -> 400 "Bad Request: chat not found"
//   flood control (FloodNext) -> 429 {"ok": false, "error_code": 429, "description":
//                   "Too Many Requests: retry after N", "parameters": {"retry_after": N}}
//   any other path  -> 404 {"ok": false, "error_code": 404, "description": "Not Found"}
//
// Thread-safety: all methods may be called from any thread while requests
// are served.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace httplib {
class Server;
}  // namespace httplib

namespace idem::fakes {

struct TelegramMessage {
  int64_t message_id = 0;
  std::string chat_id;  // as text
  std::string text;
};

struct TelegramCall {
  std::string path;  // with the token, as received
  std::string body;
  int status = 0;  // what the fake answered
};

class FakeTelegramServer {
 public:
  // nullptr when no port can be bound.
  static std::unique_ptr<FakeTelegramServer> Start(std::string token);
  ~FakeTelegramServer();
  FakeTelegramServer(const FakeTelegramServer&) = delete;
  FakeTelegramServer& operator=(const FakeTelegramServer&) = delete;

  // "http://127.0.0.1:<port>": the Bot API base_url.
  std::string base_url() const;

  // The next n sendMessage calls answer 429 with parameters.retry_after.
  void FloodNext(int n, int retry_after_s);
  // Only these chats exist (chat not found for the others).
  void SetKnownChats(std::set<std::string> chats);
  // A sendMessage's answer also says the path it came on (result.request_path),
  // as a compatible server or a proxy that echoes the request may.
  void EchoPath();

  std::vector<TelegramMessage> messages() const;
  std::vector<TelegramCall> calls() const;

 private:
  explicit FakeTelegramServer(std::string token);
  void Install();

  const std::string token_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;

  mutable std::mutex mu_;
  int flood_next_ = 0;
  int flood_retry_after_s_ = 1;
  bool restrict_chats_ = false;
  bool echo_path_ = false;
  std::set<std::string> known_chats_;
  int64_t next_message_id_ = 1;
  std::vector<TelegramMessage> messages_;
  std::vector<TelegramCall> calls_;
};

}  // namespace idem::fakes
