#include "tests/fakes/fake_effector.h"

#include <httplib.h>

#include <cctype>
#include <chrono>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "tests/fakes/serve.h"

namespace idem::fakes {
namespace {

constexpr const char* kFingerprintField = "idem_fingerprint";
constexpr const char* kCollections = "(replies|records|messages|items)";

std::optional<Json> ParseBody(const std::string& text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

void SendJson(httplib::Response& res, int status, const Json& body) {
  res.status = status;
  res.set_content(body.dump(), "application/json");
}

void SendError(httplib::Response& res, int status, const std::string& message) {
  SendJson(res, status, Json{{"error", {{"message", message}, {"type", "fake_effector"}}}});
}

}  // namespace

Json FakeEffectorStats::ToJson() const {
  return Json{
      {"raw_calls", raw_calls}, {"effects", effects}, {"duplicates_by_key", duplicates_by_key},
      {"replays", replays},     {"updates", updates}, {"lookups", lookups},
      {"records", records}};
}

FakeEffectorServer::FakeEffectorServer() : server_(std::make_unique<httplib::Server>()) {}

std::unique_ptr<FakeEffectorServer> FakeEffectorServer::Start(int port, int threads) {
  std::unique_ptr<FakeEffectorServer> fake(new FakeEffectorServer());
  httplib::Server& svr = *fake->server_;
  // Every client connection holds a pool thread while it lives (keep-alive),
  // so the pool must exceed the concurrent clients a test opens.
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_keep_alive_max_count(1000);
  svr.set_payload_max_length(4u << 20);
  svr.set_read_timeout(30, 0);
  svr.set_write_timeout(30, 0);
  fake->Install();
  fake->port_ = ServeInBackground(svr, port, fake->thread_);
  if (fake->port_ <= 0) return nullptr;
  return fake;
}

FakeEffectorServer::~FakeEffectorServer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

std::string FakeEffectorServer::base_url() const {
  return "http://127.0.0.1:" + std::to_string(port_);
}

void FakeEffectorServer::SetLatencyMs(int ms) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.latency_ms = ms;
}

void FakeEffectorServer::FailNext(int n, int status, int retry_after_s) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.fail_next = n;
  faults_.fail_status = status;
  faults_.retry_after_s = retry_after_s;
}

void FakeEffectorServer::TimeoutNext(int n, int sleep_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.timeout_next = n;
  faults_.timeout_ms = sleep_ms;
}

void FakeEffectorServer::DropResponseAfterCommit(int n, bool as_500) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.drop_next = n;
  faults_.drop_as_500 = as_500;
}

void FakeEffectorServer::FailLookupsNext(int n) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.fail_lookups_next = n;
}

void FakeEffectorServer::SetBusinessKeyField(std::string pointer) {
  std::lock_guard<std::mutex> lock(mu_);
  business_key_field_ = std::move(pointer);
}

void FakeEffectorServer::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  faults_ = Faults{};
  stats_ = FakeEffectorStats{};
  effects_by_key_.clear();
  collections_.clear();
  keys_.clear();
  calls_.clear();
}

bool FakeEffectorServer::WaitForEffects(int64_t n, std::chrono::milliseconds limit) const {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stats_.effects >= n) return true;
    }
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

FakeEffectorStats FakeEffectorServer::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  FakeEffectorStats s = stats_;
  s.records = 0;
  for (const auto& [name, records] : collections_)
    s.records += static_cast<int64_t>(records.size());
  return s;
}

bool FakeEffectorServer::DeleteRecord(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [name, records] : collections_) {
    if (records.erase(id) > 0) return true;
  }
  return false;
}

std::vector<Json> FakeEffectorServer::Records(const std::string& collection) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Json> out;
  auto it = collections_.find(collection);
  if (it == collections_.end()) return out;
  for (const auto& [id, record] : it->second) out.push_back(record);
  return out;
}

std::vector<FakeEffectorCall> FakeEffectorServer::calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return calls_;
}

void FakeEffectorServer::Record(const httplib::Request& req) {
  FakeEffectorCall call;
  call.method = req.method;
  call.path = req.path;
  size_t q = req.target.find('?');
  if (q != std::string::npos) call.query = req.target.substr(q + 1);
  for (const auto& [name, value] : req.headers) {
    std::string lower = name;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    call.headers[lower] = value;
  }
  call.body = req.body;
  std::lock_guard<std::mutex> lock(mu_);
  calls_.push_back(std::move(call));
}

void FakeEffectorServer::Sleep(int ms) {
  if (ms <= 0) return;
  std::unique_lock<std::mutex> lock(mu_);
  stop_cv_.wait_for(lock, std::chrono::milliseconds(ms), [this] { return stopping_; });
}

bool FakeEffectorServer::Preamble(bool mutating, httplib::Response& res, bool* delay_past_timeout,
                                  bool* drop_after_commit, bool* drop_as_500) {
  int latency = 0;
  int fail_status = 0;
  int retry_after = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    latency = faults_.latency_ms;
    if (mutating) {
      ++stats_.raw_calls;
      if (faults_.fail_next > 0) {
        --faults_.fail_next;
        fail_status = faults_.fail_status;
        retry_after = faults_.retry_after_s;
      } else {
        if (faults_.timeout_next > 0) {
          --faults_.timeout_next;
          *delay_past_timeout = true;
        }
        if (faults_.drop_next > 0) {
          --faults_.drop_next;
          *drop_after_commit = true;
          *drop_as_500 = faults_.drop_as_500;
        }
      }
    } else {
      ++stats_.lookups;
      if (faults_.fail_lookups_next > 0) {
        --faults_.fail_lookups_next;
        fail_status = 503;
      }
    }
  }
  Sleep(latency);
  if (fail_status != 0) {
    if (retry_after >= 0) res.set_header("Retry-After", std::to_string(retry_after));
    SendError(res, fail_status, "fake: injected failure");
    return true;
  }
  return false;
}

std::string FakeEffectorServer::BusinessKeyLocked(const Json& body) const {
  if (!business_key_field_.empty() && body.is_object()) {
    Json::json_pointer p(business_key_field_);
    if (body.contains(p)) return body.at(p).dump();
  }
  Json stripped = body;
  if (stripped.is_object()) stripped.erase(kFingerprintField);
  return stripped.dump();  // object keys are sorted: a stable form
}

Json FakeEffectorServer::CommitLocked(const std::string& collection, const std::string& id,
                                      Json body, const std::string& business_key) {
  Json record = body.is_object() ? std::move(body) : Json{{"value", std::move(body)}};
  record["id"] = id;
  collections_[collection][id] = record;
  ++stats_.effects;
  if (effects_by_key_[business_key]++ > 0) ++stats_.duplicates_by_key;
  return record;
}

void FakeEffectorServer::LoseAnswer(httplib::Response& res, bool as_500, const std::string& body) {
  if (as_500) {
    res.status = 500;
    res.body.clear();
    return;
  }
  // Promise the whole answer, send half, then fail: httplib closes the
  // connection and the client sees a short read after the commit. (A set
  // body would win over the provider, so drop it first.)
  res.body.clear();
  auto text = std::make_shared<std::string>(body);
  res.set_content_provider(text->size(), "application/json",
                           [text](size_t, size_t, httplib::DataSink& sink) {
                             sink.write(text->data(), text->size() / 2);
                             return false;
                           });
}

void FakeEffectorServer::Create(const std::string& collection, const httplib::Request& req,
                                httplib::Response& res) {
  Record(req);
  bool delay = false, drop = false, drop_as_500 = false;
  if (Preamble(true, res, &delay, &drop, &drop_as_500)) return;
  std::optional<Json> body = ParseBody(req.body);
  if (!body) return SendError(res, 400, "fake: the body is not JSON");
  const std::string key = req.get_header_value("Idempotency-Key");
  int timeout_ms = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    timeout_ms = faults_.timeout_ms;
    if (!key.empty()) {
      auto it = keys_.find(key);
      if (it != keys_.end()) {
        if (it->second.request_body != req.body) {
          return SendError(res, 422, "fake: Idempotency-Key reused with another body");
        }
        if (!it->second.done) {
          return SendError(res, 409, "fake: a request with this Idempotency-Key is in progress");
        }
        ++stats_.replays;
        res.status = it->second.answer.status;
        res.set_header("Idempotent-Replayed", "true");
        res.set_content(it->second.answer.body, "application/json");
        if (drop) LoseAnswer(res, drop_as_500, it->second.answer.body);
        return;
      }
      keys_[key] = KeyState{false, req.body, {}};
    }
  }
  if (delay) Sleep(timeout_ms);
  std::string answer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::string id = collection.substr(0, 3) + "_" + std::to_string(next_id_++);
    std::string business_key = BusinessKeyLocked(*body);
    Json record = CommitLocked(collection, id, std::move(*body), business_key);
    answer = record.dump();
    if (!key.empty()) keys_[key] = KeyState{true, req.body, Stored{201, answer}};
  }
  res.status = 201;
  res.set_content(answer, "application/json");
  if (drop) LoseAnswer(res, drop_as_500, answer);
}

void FakeEffectorServer::Upsert(const std::string& key, const httplib::Request& req,
                                httplib::Response& res) {
  Record(req);
  bool delay = false, drop = false, drop_as_500 = false;
  if (Preamble(true, res, &delay, &drop, &drop_as_500)) return;
  std::optional<Json> body = ParseBody(req.body);
  if (!body) return SendError(res, 400, "fake: the body is not JSON");
  if (delay) {
    int ms = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ms = faults_.timeout_ms;
    }
    Sleep(ms);
  }
  std::string answer;
  int status = 200;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& items = collections_["items"];
    auto it = items.find(key);
    if (it != items.end()) {
      ++stats_.updates;
      Json record = body->is_object() ? std::move(*body) : Json{{"value", std::move(*body)}};
      record["id"] = key;
      it->second = record;
      answer = record.dump();
    } else {
      status = 201;
      answer = CommitLocked("items", key, std::move(*body), "items/" + key).dump();
    }
  }
  res.status = status;
  res.set_content(answer, "application/json");
  if (drop) LoseAnswer(res, drop_as_500, answer);
}

void FakeEffectorServer::Lookup(const std::string& collection, const httplib::Request& req,
                                httplib::Response& res) {
  Record(req);
  bool unused1 = false, unused2 = false, unused3 = false;
  if (Preamble(false, res, &unused1, &unused2, &unused3)) return;
  const bool filtered = req.has_param("fingerprint");
  const std::string fingerprint = req.get_param_value("fingerprint");
  const std::string field =
      req.has_param("field") ? req.get_param_value("field") : kFingerprintField;
  Json out = Json::array();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = collections_.find(collection);
    if (it != collections_.end()) {
      for (const auto& [id, record] : it->second) {
        if (filtered) {
          auto f = record.find(field);
          if (f == record.end() || !f->is_string() || f->get<std::string>() != fingerprint)
            continue;
        }
        out.push_back(record);
      }
    }
  }
  SendJson(res, 200, out);
}

void FakeEffectorServer::Search(const std::string& collection, const httplib::Request& req,
                                httplib::Response& res) {
  Record(req);
  bool unused1 = false, unused2 = false, unused3 = false;
  if (Preamble(false, res, &unused1, &unused2, &unused3)) return;
  std::optional<Json> query = ParseBody(req.body);
  if (!query || !query->is_object())
    return SendError(res, 400, "fake: the query must be an object");
  Json out = Json::array();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = collections_.find(collection);
  if (it != collections_.end()) {
    for (const auto& [id, record] : it->second) {
      bool match = true;
      for (const auto& [name, value] : query->items()) {
        auto f = record.find(name);
        match = match && f != record.end() && *f == value;
      }
      if (match) out.push_back(record);
    }
  }
  SendJson(res, 200, Json{{"data", out}});
}

void FakeEffectorServer::Install() {
  httplib::Server& svr = *server_;
  svr.Post(R"(/(replies|records|messages))",
           [this](const httplib::Request& req, httplib::Response& res) {
             Create(req.matches[1], req, res);
           });
  svr.Post(std::string("/") + kCollections + "/_search",
           [this](const httplib::Request& req, httplib::Response& res) {
             Search(req.matches[1], req, res);
           });
  svr.Put(R"(/items/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    Upsert(req.matches[1], req, res);
  });
  svr.Get(std::string("/") + kCollections,
          [this](const httplib::Request& req, httplib::Response& res) {
            Lookup(req.matches[1], req, res);
          });
  svr.Get(std::string("/") + kCollections + "/(.+)",
          [this](const httplib::Request& req, httplib::Response& res) {
            std::lock_guard<std::mutex> lock(mu_);
            ++stats_.lookups;
            auto& records = collections_[req.matches[1]];
            auto it = records.find(req.matches[2]);
            if (it == records.end()) return SendError(res, 404, "fake: no such record");
            SendJson(res, 200, it->second);
          });
  svr.Delete(std::string("/") + kCollections + "/(.+)",
             [this](const httplib::Request& req, httplib::Response& res) {
               bool removed = DeleteRecord(req.matches[2]);
               if (!removed) return SendError(res, 404, "fake: no such record");
               res.status = 204;
             });
  svr.Get("/_stats", [this](const httplib::Request&, httplib::Response& res) {
    SendJson(res, 200, stats().ToJson());
  });
  svr.Post("/_reset", [this](const httplib::Request&, httplib::Response& res) {
    Reset();
    SendJson(res, 200, Json{{"reset", true}});
  });
  svr.Post("/_faults", [this](const httplib::Request& req, httplib::Response& res) {
    std::optional<Json> body = ParseBody(req.body);
    if (!body || !body->is_object()) return SendError(res, 400, "fake: faults must be an object");
    std::lock_guard<std::mutex> lock(mu_);
    faults_.latency_ms = body->value("latency_ms", faults_.latency_ms);
    faults_.fail_next = body->value("fail_next", faults_.fail_next);
    faults_.fail_status = body->value("fail_status", faults_.fail_status);
    faults_.retry_after_s = body->value("retry_after_s", faults_.retry_after_s);
    faults_.timeout_next = body->value("timeout_next", faults_.timeout_next);
    faults_.timeout_ms = body->value("timeout_ms", faults_.timeout_ms);
    faults_.drop_next = body->value("drop_next", faults_.drop_next);
    faults_.drop_as_500 = body->value("drop_as_500", faults_.drop_as_500);
    faults_.fail_lookups_next = body->value("fail_lookups_next", faults_.fail_lookups_next);
    SendJson(res, 200, Json{{"ok", true}});
  });
}

}  // namespace idem::fakes
