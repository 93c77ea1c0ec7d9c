// FakeEffectorServer: an in-process HTTP server on 127.0.0.1 that plays the
// external system an action's effect lands in, at each idempotency level
// (R15-R17), and counts what really happened there.
//
//   POST /{replies|records|messages}   create a record: 201 {"id": ..., <body>}
//        with `Idempotency-Key` (level 1): the first request with a key
//        creates; a repeat with the same body gets the stored answer again
//        (status and body, `Idempotent-Replayed: true`) and creates nothing;
//        the same key with another body is 422; the same key while the first
//        is still being handled is 409. Without the header every call creates.
//   PUT  /items/{key}                  upsert (level 2): 201 created, 200
//        overwritten; the key is the record's id; repeats never add effects.
//   GET  /{collection}?fingerprint=X   lookup (level 3): a JSON array of the
//        records whose `idem_fingerprint` member (or ?field=<name>) equals X;
//        without the parameter, every record of the collection.
//   POST /{collection}/_search         {"member": value, ...}: {"data": [the records
//                                       whose members all equal the query's]}
//   GET  /{collection}/{id}            one record, or 404.
//   DELETE /{collection}/{id}          removes a record (tests stage a lost effect).
//   GET  /_stats                       {"raw_calls", "effects", "duplicates_by_key",
//                                       "replays", "updates", "lookups", "records"}
//   POST /_faults                      sets faults from JSON (for the standalone
//                                       binary): {"latency_ms", "fail_next",
//                                       "fail_status", "retry_after_s",
//                                       "timeout_next", "timeout_ms", "drop_next",
//                                       "drop_as_500", "fail_lookups_next"}
//   POST /_reset                       forgets records, counters and faults.
//
// Counting: raw_calls counts every create/upsert request (faulted ones too);
// effects counts records created; duplicates_by_key counts created records
// whose business key another created record already had — true double
// effects. The business key is the value at SetBusinessKeyField's pointer
// when set and present, else the whole body without the fingerprint member;
// for PUT /items/{key} it is the key.
//
// Faults, on create/upsert requests unless noted:
//   latency          every request (lookups too) waits first;
//   fail next N      answer `status` (Retry-After when given) with nothing done;
//   timeout next N   sleep `ms` before handling (past the client's timeout);
//                    the effect still lands afterwards, as on a real server;
//   drop next N      drop_response_after_commit: commit the effect, then cut
//                    the connection mid-body (or answer 500 with no body);
//   fail lookups N   lookups answer 503.
// Sleeps end early when the server stops.
//
// Thread-safety: all methods may be called from any thread while requests
// are served.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace idem::fakes {

using Json = nlohmann::json;

struct FakeEffectorStats {
  int64_t raw_calls = 0;
  int64_t effects = 0;
  int64_t duplicates_by_key = 0;
  int64_t replays = 0;  // Idempotency-Key repeats answered from the stored answer
  int64_t updates = 0;  // upserts that overwrote
  int64_t lookups = 0;
  int64_t records = 0;  // records stored now (after deletions)

  Json ToJson() const;
};

// One request as the fake received it.
struct FakeEffectorCall {
  std::string method;
  std::string path;                            // decoded, without the query
  std::string query;                           // raw target after '?', "" when none
  std::map<std::string, std::string> headers;  // names lower-cased; last value wins
  std::string body;
};

class FakeEffectorServer {
 public:
  // Binds 127.0.0.1:`port` (0: a free port) and serves on background
  // threads. nullptr when the port cannot be bound.
  static std::unique_ptr<FakeEffectorServer> Start(int port = 0, int threads = 32);
  ~FakeEffectorServer();
  FakeEffectorServer(const FakeEffectorServer&) = delete;
  FakeEffectorServer& operator=(const FakeEffectorServer&) = delete;

  // "http://127.0.0.1:<port>" (no trailing slash).
  std::string base_url() const;
  int port() const { return port_; }

  void SetLatencyMs(int ms);
  // The next n creates/upserts answer `status` (with `Retry-After:
  // retry_after_s` when >= 0) and do nothing.
  void FailNext(int n, int status = 503, int retry_after_s = -1);
  // The next n creates/upserts sleep `sleep_ms` before being handled.
  void TimeoutNext(int n, int sleep_ms);
  // The next n creates/upserts commit, then lose their answer: the
  // connection is cut mid-body, or (as_500) the answer is a bodiless 500.
  void DropResponseAfterCommit(int n, bool as_500 = false);
  void FailLookupsNext(int n);
  // JSON pointer into the request body naming the business key.
  void SetBusinessKeyField(std::string pointer);
  // Forgets records, counters and faults.
  void Reset();

  FakeEffectorStats stats() const;
  // Waits until at least `n` effects have been committed (a delayed
  // create landing, with its Idempotency-Key's stored answer), up to
  // `limit` of wall time; false when it ran out. Tests wait on this, not
  // on a sleep that a loaded or sanitized run can outlast.
  bool WaitForEffects(int64_t n, std::chrono::milliseconds limit) const;
  // Removes the record `id` from whichever collection holds it; false if none.
  bool DeleteRecord(const std::string& id);
  // The records of `collection` ("replies", "records", "messages", "items").
  std::vector<Json> Records(const std::string& collection) const;
  // Every request received (the _stats/_faults/_reset ones excepted), oldest first.
  std::vector<FakeEffectorCall> calls() const;

 private:
  struct Stored {
    int status = 0;
    std::string body;
  };
  struct KeyState {
    bool done = false;
    std::string request_body;
    Stored answer;
  };
  struct Faults {
    int latency_ms = 0;
    int fail_next = 0;
    int fail_status = 503;
    int retry_after_s = -1;
    int timeout_next = 0;
    int timeout_ms = 0;
    int drop_next = 0;
    bool drop_as_500 = false;
    int fail_lookups_next = 0;
  };

  FakeEffectorServer();
  void Install();
  void Record(const httplib::Request& req);
  // Waits `ms` or until the server stops.
  void Sleep(int ms);
  // Applies latency and the "fail next" fault. True when the request was
  // answered by a fault.
  bool Preamble(bool mutating, httplib::Response& res, bool* delay_past_timeout,
                bool* drop_after_commit, bool* drop_as_500);
  void Create(const std::string& collection, const httplib::Request& req, httplib::Response& res);
  void Upsert(const std::string& key, const httplib::Request& req, httplib::Response& res);
  void Lookup(const std::string& collection, const httplib::Request& req, httplib::Response& res);
  void Search(const std::string& collection, const httplib::Request& req, httplib::Response& res);
  // Stores a new record; returns its JSON. REQUIRES: mu_ held.
  Json CommitLocked(const std::string& collection, const std::string& id, Json body,
                    const std::string& business_key);
  std::string BusinessKeyLocked(const Json& body) const;
  static void LoseAnswer(httplib::Response& res, bool as_500, const std::string& body);

  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;

  mutable std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  Faults faults_;
  std::string business_key_field_;
  int64_t next_id_ = 1;
  FakeEffectorStats stats_;
  std::map<std::string, int64_t> effects_by_key_;
  std::map<std::string, std::map<std::string, Json>> collections_;  // name -> id -> record
  std::map<std::string, KeyState> keys_;                            // Idempotency-Key -> state
  std::vector<FakeEffectorCall> calls_;
};

}  // namespace idem::fakes
