// Several idem daemons on one PostgreSQL database (issue 13): they behave as
// one idem. Each test gets a fresh schema on the server from
// IDEM_TEST_PG_URL (or the PG* variables, as pg_virtualenv sets them) and
// drops it at the end; the suite runs only in ctest's integration_postgres.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "daemon/apply/work_identity.h"
#include "daemon/config/config.h"
#include "daemon/core/crypto.h"
#include "daemon/store/postgres/pg_client.h"
#include "tests/fakes/fake_effector.h"
#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

using fakes::FakeEffectorServer;
using SteadyClock = std::chrono::steady_clock;

const char* kAgent = "agent-secret";
const char* kOperator = "op-secret";
const char* kOperator2 = "op2-secret";

std::string TestPgUrl() {
  const char* url = std::getenv("IDEM_TEST_PG_URL");
  return url != nullptr ? url : "";
}

// A TCP relay between daemons and the PostgreSQL server that a test can
// cut (every connection closed, new ones refused) and restore: the database
// "unreachable" without touching the shared server.
class CuttableRelay {
 public:
  CuttableRelay(std::string host, int port) : host_(std::move(host)), port_(port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    REQUIRE(bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    REQUIRE(listen(listen_fd_, 64) == 0);
    socklen_t len = sizeof(a);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    local_port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { AcceptLoop(); });
  }
  ~CuttableRelay() {
    stop_ = true;
    shutdown(listen_fd_, SHUT_RDWR);
    close(listen_fd_);
    acceptor_.join();
    Cut();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& t : pumps_) t.join();
  }
  int port() const { return local_port_; }
  void Cut() {
    cut_ = true;
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : open_) shutdown(fd, SHUT_RDWR);
  }
  void Restore() { cut_ = false; }

 private:
  void AcceptLoop() {
    while (!stop_) {
      int client = accept(listen_fd_, nullptr, nullptr);
      if (client < 0) continue;
      if (cut_) {
        close(client);
        continue;
      }
      int server = Connect();
      if (server < 0) {
        close(client);
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      open_.insert(client);
      open_.insert(server);
      pumps_.emplace_back([this, client, server] { Pump(client, server); });
    }
  }
  int Connect() {
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &res) != 0) return -1;
    int fd = -1;
    for (addrinfo* p = res; p != nullptr; p = p->ai_next) {
      fd = socket(p->ai_family, p->ai_socktype, p->ai_protocol);
      if (fd >= 0 && connect(fd, p->ai_addr, p->ai_addrlen) == 0) break;
      if (fd >= 0) close(fd);
      fd = -1;
    }
    freeaddrinfo(res);
    return fd;
  }
  void Pump(int a, int b) {
    char buf[16384];
    pollfd fds[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
    while (!stop_ && !cut_) {
      if (poll(fds, 2, 200) <= 0) continue;
      bool done = false;
      for (int i = 0; i < 2 && !done; ++i) {
        if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        ssize_t n = read(fds[i].fd, buf, sizeof(buf));
        if (n <= 0 || send(fds[1 - i].fd, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n) {
          done = true;
        }
      }
      if (done) break;
    }
    std::lock_guard<std::mutex> lock(mu_);
    open_.erase(a);
    open_.erase(b);
    close(a);
    close(b);
  }

  std::string host_;
  int port_;
  int listen_fd_ = -1;
  int local_port_ = 0;
  std::atomic<bool> stop_{false}, cut_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::set<int> open_;
  std::vector<std::thread> pumps_;
};

// A key=value conninfo's value for `key` ("" when absent).
std::string ConninfoValue(const std::string& conninfo, const std::string& key) {
  size_t at = 0;
  while ((at = conninfo.find(key + "=", at)) != std::string::npos) {
    if (at == 0 || conninfo[at - 1] == ' ') {
      size_t start = at + key.size() + 1;
      size_t end = conninfo.find(' ', start);
      return conninfo.substr(start, end == std::string::npos ? end : end - start);
    }
    at += key.size();
  }
  return "";
}

// N daemons sharing one fresh schema, with an operator's and an agent's
// tokens, the demo step, and `actions_yaml`.
struct Cluster {
  TempDir dir;
  std::string schema = "it_" + RandomHex(6);
  std::string url = TestPgUrl();
  std::string config;
  std::vector<std::unique_ptr<DaemonProcess>> daemons;

  Cluster(const std::string& rules, const std::string& actions_yaml) {
    auto token = [](const char* name, const char* secret, const char* roles) {
      return std::string("    - {name: ") + name + ", sha256: " + Sha256Hex(secret) + ", roles: [" +
             roles + "]}\n";
    };
    std::string extra = actions_yaml + "auth:\n  tokens:\n" + token("agent-1", kAgent, "agent") +
                        token("op-1", kOperator, "operator") +
                        token("op-2", kOperator2, "operator");
    config = OnPostgres(dir, WriteTestConfig(dir, rules, extra),
                        "  url_env: IDEM_PG_URL\n  schema: " + schema +
                            "\n  pool_size: 8\n  statement_timeout: 5s\n");
  }
  ~Cluster() {
    daemons.clear();  // SIGTERM each, then the schema goes
    pg::PoolOptions po;
    po.conninfo = url;
    po.schema = schema;
    po.size = 1;
    auto pool = pg::Pool::Open(po);
    if (pool.ok()) {
      (void)(*pool)->Exec("DROP SCHEMA IF EXISTS " + pg::QuoteIdent(schema) + " CASCADE");
    }
  }

  // Starts one more daemon on the schema; `env` adds to its environment.
  DaemonProcess& Start(std::map<std::string, std::string> env = {},
                       const std::string& conninfo_override = "") {
    env["IDEM_PG_URL"] = conninfo_override.empty() ? url : conninfo_override;
    std::string err;
    auto d = DaemonProcess::Start(
        {config, dir.path() + "/d" + std::to_string(daemons.size()), {}, env}, &err);
    REQUIRE_MESSAGE(d != nullptr, err);
    daemons.push_back(std::move(d));
    return *daemons.back();
  }
  void StartN(int n) {
    for (int i = 0; i < n; ++i) Start();
  }

  static httplib::Result Post(DaemonProcess& d, const std::string& path, const Json& body,
                              const char* token, const std::string& key = "") {
    auto c = d.Client();
    c->set_read_timeout(30, 0);
    httplib::Headers h = {{"Authorization", std::string("Bearer ") + token}};
    if (!key.empty()) h.emplace("Idempotency-Key", key);
    return c->Post(path.c_str(), h, body.dump(), "application/json");
  }
  static httplib::Result Get(DaemonProcess& d, const std::string& path,
                             const char* token = kOperator) {
    auto c = d.Client();
    return c->Get(path.c_str(), {{"Authorization", std::string("Bearer ") + token}});
  }
};

Json J(const httplib::Result& r) {
  REQUIRE(r);
  return Json::parse(r->body);
}

const char* kClaimActions = R"(actions:
  send_invoice:
    identity: {fields: [/invoice_id], version: v1}
    window: 24h
    on_duplicate: return_original
)";

// The actions: section of a kind "wire" that posts to `target` with the
// Idempotency-Key header and the given `approval` policy.
std::string WireKind(const FakeEffectorServer& target, const std::string& approval) {
  return "actions:\n"
         "  wire:\n"
         "    identity: {fields: [/wire_id], version: v1}\n"
         "    window: forever\n"
         "    on_duplicate: return_original\n"
         "    effector: {http: {method: POST, url: \"" +
         target.base_url() +
         "/records\", idempotency: header}}\n"
         "    approval: " +
         approval + "\n";
}

}  // namespace

TEST_SUITE("postgres") {
  TEST_CASE("64_claims_of_one_work_item_spread_over_three_daemons_have_one_winner") {
    Cluster cluster(kQuestionRules, kClaimActions);
    cluster.StartN(3);
    Json claim = {{"kind", "send_invoice"}, {"identity", {{"invoice_id", "INV-64"}}}};
    std::atomic<int> won{0}, busy{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 64; ++i) {
      threads.emplace_back([&, i] {
        auto r = Cluster::Post(*cluster.daemons[i % 3], "/v1/work/claim", claim, kAgent);
        if (r && r->status == 201) won++;
        if (r && r->status == 409) busy++;
      });
    }
    for (auto& t : threads) t.join();
    CHECK(won == 1);
    CHECK(busy == 63);
  }

  TEST_CASE("100_identical_decide_misses_spread_over_three_daemons_make_one_provider_call") {
    // The provider answers after 300 ms, so the misses on the three daemons
    // overlap: only the cross-daemon lease keeps them to one call.
    Cluster cluster(R"(default:
  output: '{"category":"question","priority":"normal","summary":"q","actions":[]}'
  delay_ms: 300
)",
                    "");
    cluster.StartN(3);
    const Json body = {{"step", "triage_ticket"},
                       {"input", {{"ticket_id", 100}, {"text", "one decision"}}}};
    std::vector<std::string> ids(100);
    std::atomic<int> ok{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 100; ++i) {
      threads.emplace_back([&, i] {
        auto r = Cluster::Post(*cluster.daemons[i % 3], "/v1/decide", body, kAgent);
        if (r && r->status == 200) {
          ids[i] = Json::parse(r->body).value("decision_id", "");
          ok++;
        } else if (r) {
          MESSAGE("status " << r->status << " " << r->body);
        }
      });
    }
    for (auto& t : threads) t.join();
    CHECK(ok == 100);
    for (const std::string& id : ids) CHECK(id == ids[0]);
    long calls = 0;
    for (auto& d : cluster.daemons) {
      auto c = d->Client();
      c->set_default_headers({{"Authorization", std::string("Bearer ") + kAgent}});
      const long n = MetricValue(*c, "idem_provider_calls_total");
      REQUIRE(n >= 0);
      calls += n;
    }
    CHECK(calls == 1);
  }

  TEST_CASE("a_retry_with_the_same_idempotency_key_on_another_daemon_replays_the_response") {
    Cluster cluster(kQuestionRules, "");
    cluster.StartN(3);
    const Json body = {{"step", "triage_ticket"}, {"input", {{"ticket_id", 7}, {"text", "hi"}}}};
    auto first = Cluster::Post(*cluster.daemons[0], "/v1/decide", body, kAgent, "\"k-7\"");
    REQUIRE(first);
    REQUIRE_MESSAGE(first->status == 200, first->body);
    CHECK(first->get_header_value("Idempotent-Replayed") == "");
    auto again = Cluster::Post(*cluster.daemons[1], "/v1/decide", body, kAgent, "\"k-7\"");
    REQUIRE(again);
    CHECK(again->status == 200);
    CHECK(again->get_header_value("Idempotent-Replayed") == "true");
    CHECK(again->body == first->body);
    // The same key with another payload, on the third: 422, nothing run.
    Json other = body;
    other["input"]["text"] = "something else";
    auto mismatch = Cluster::Post(*cluster.daemons[2], "/v1/decide", other, kAgent, "\"k-7\"");
    REQUIRE(mismatch);
    CHECK(mismatch->status == 422);
  }

  TEST_CASE("a_plan_approved_on_two_daemons_at_once_is_approved_and_applied_once") {
    auto target = FakeEffectorServer::Start();
    REQUIRE(target != nullptr);
    Cluster cluster(kQuestionRules, WireKind(*target, "{require: always, reason: every wire}"));
    cluster.StartN(2);
    auto gated = Cluster::Post(*cluster.daemons[0], "/v1/actions/wire",
                               {{"args", {{"wire_id", "W-1"}}}}, kAgent, "\"w-1\"");
    REQUIRE(gated);
    REQUIRE_MESSAGE(gated->status == 202, gated->body);
    const std::string id = J(gated)["plan_id"];
    std::atomic<int> ok{0}, conflict{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 8; ++i) {
      threads.emplace_back([&, i] {
        auto r = Cluster::Post(*cluster.daemons[i % 2], "/v1/plans/" + id + "/approve",
                               Json::object(), i % 4 < 2 ? kOperator : kOperator2);
        if (r && r->status == 200) ok++;
        if (r && r->status == 409) conflict++;
      });
    }
    for (auto& t : threads) t.join();
    CHECK(ok == 1);
    CHECK(conflict == 7);
    const auto deadline = SteadyClock::now() + std::chrono::seconds(20);
    while (target->stats().effects < 1 && SteadyClock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    CHECK(target->stats().effects == 1);
    CHECK(target->stats().duplicates_by_key == 0);
    // Both daemons see the one approval.
    for (auto& d : cluster.daemons) {
      Json plan = J(Cluster::Get(*d, "/v1/plans/" + id));
      CHECK(plan["state"] != "awaiting_approval");
    }
  }

  TEST_CASE("a_plan_poll_and_a_prefer_wait_on_one_daemon_are_answered_by_what_another_daemon_did") {
    auto target = FakeEffectorServer::Start();
    REQUIRE(target != nullptr);
    Cluster cluster(
        kQuestionRules,
        WireKind(*target, R"({when: {">": [{"var": "args.amount"}, 100]}, reason: big wires})"));
    cluster.StartN(2);
    // A long poll on daemon 1; the approval on daemon 0.
    auto gated =
        Cluster::Post(*cluster.daemons[0], "/v1/actions/wire",
                      {{"args", {{"wire_id", "W-9"}, {"amount", 500}}}}, kAgent, "\"w-9\"");
    REQUIRE(gated);
    REQUIRE_MESSAGE(gated->status == 202, gated->body);
    const std::string id = J(gated)["plan_id"];
    std::optional<httplib::Result> polled;
    const auto asked = SteadyClock::now();
    std::thread poller([&] {
      auto c = cluster.daemons[1]->Client();
      c->set_read_timeout(30, 0);
      polled.emplace(c->Get(("/v1/plans/" + id + "?wait=20s").c_str(),
                            {{"Authorization", std::string("Bearer ") + kOperator}}));
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    auto approved = Cluster::Post(*cluster.daemons[0], "/v1/plans/" + id + "/approve",
                                  Json::object(), kOperator);
    poller.join();
    REQUIRE(approved);
    CHECK(approved->status == 200);
    REQUIRE(polled.has_value());
    CHECK(J(*polled)["state"] != "awaiting_approval");
    CHECK(SteadyClock::now() - asked < std::chrono::seconds(5));

    // A slow effect under one key on daemon 0; the same key with Prefer:
    // wait on daemon 1 gets its answer when it lands, not a 409 at the end.
    target->TimeoutNext(1, 1'500);
    const Json small = {{"args", {{"wire_id", "W-10"}, {"amount", 5}}}};
    std::optional<httplib::Result> first;
    std::thread slow([&] {
      first.emplace(
          Cluster::Post(*cluster.daemons[0], "/v1/actions/wire", small, kAgent, "\"w-10\""));
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto c = cluster.daemons[1]->Client();
    c->set_read_timeout(30, 0);
    const auto waited = SteadyClock::now();
    auto second = c->Post("/v1/actions/wire",
                          {{"Authorization", std::string("Bearer ") + kAgent},
                           {"Idempotency-Key", "\"w-10\""},
                           {"Prefer", "wait=8"}},
                          small.dump(), "application/json");
    slow.join();
    REQUIRE(first.has_value());
    REQUIRE(*first);
    REQUIRE(second);
    CHECK((*first)->status == 201);
    CHECK_MESSAGE(second->status == 201, second->body);
    CHECK(second->get_header_value("Idempotent-Replayed") == "true");
    CHECK(SteadyClock::now() - waited < std::chrono::seconds(5));
    CHECK(target->stats().effects == 2);
  }

  TEST_CASE("a_daemon_killed_while_holding_leases_loses_nothing_the_others_finish_its_work") {
    constexpr int kItems = 24;
    auto target = FakeEffectorServer::Start(0, 64);
    REQUIRE(target != nullptr);
    // Effects take 1.5 s, so the kill lands while every one is in flight.
    target->SetLatencyMs(1'500);
    Cluster cluster(kQuestionRules,
                    "actions:\n"
                    "  pay:\n"
                    "    identity: {fields: [/n], version: v1}\n"
                    "    window: forever\n"
                    "    on_duplicate: return_original\n"
                    "    effector: {http: {method: POST, url: \"" +
                        target->base_url() +
                        "/records\", idempotency: header}}\n"
                        "    retry: {attempts: 100, base: 50ms, cap: 400ms, timeout: 3s}\n");
    cluster.StartN(3);
    auto config = LoadConfig(cluster.config);
    REQUIRE(config.ok());
    std::vector<std::string> work_ids;
    for (int i = 0; i < kItems; ++i) {
      auto id = ActionWorkId(config->actions.at("pay"), Json{{"n", i}});
      REQUIRE(id.ok());
      work_ids.push_back(id->key);
    }

    DaemonProcess& victim = *cluster.daemons[0];
    std::vector<std::thread> clients;
    for (int i = 0; i < kItems; ++i) {
      clients.emplace_back([&victim, i] {
        (void)Cluster::Post(victim, "/v1/actions/pay", {{"args", {{"n", i}}}}, kAgent,
                            "\"pay-" + std::to_string(i) + "\"");
      });
    }
    // Every item claimed and its effect under way: the victim holds 24 leases.
    const auto started = SteadyClock::now();
    while (target->stats().raw_calls < kItems &&
           SteadyClock::now() < started + std::chrono::seconds(30)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    REQUIRE(target->stats().raw_calls == kItems);
    victim.Kill9();
    for (auto& t : clients) t.join();
    // Nobody retries: the survivors' workers take the work over after the
    // lease (3 s + margin) and finish it.
    std::set<std::string> done;
    const auto deadline = SteadyClock::now() + std::chrono::seconds(60);
    while (done.size() < work_ids.size() && SteadyClock::now() < deadline) {
      for (size_t i = 0; i < work_ids.size(); ++i) {
        if (done.count(work_ids[i]) != 0) continue;
        auto r = Cluster::Get(*cluster.daemons[1 + i % 2], "/v1/work/" + work_ids[i], kAgent);
        if (r && r->status == 200 && Json::parse(r->body)["state"] == "done") {
          done.insert(work_ids[i]);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    CHECK(done.size() == static_cast<size_t>(kItems));  // 0 lost
    const fakes::FakeEffectorStats stats = target->stats();
    CHECK(stats.effects == kItems);
    CHECK(stats.duplicates_by_key == 0);  // 0 duplicate effects
    MESSAGE("effector calls ", stats.raw_calls, ", replayed by key ", stats.replays);
  }

  TEST_CASE("a_daemon_with_a_clock_an_hour_ahead_computes_leases_from_the_database_clock") {
    Cluster cluster(kQuestionRules, kClaimActions);
    DaemonProcess& skewed = cluster.Start({{"IDEM_FAILPOINTS", "clock.local_plus_1h=error"}});
    DaemonProcess& plain = cluster.Start();
    pg::PoolOptions po;
    po.conninfo = cluster.url;
    po.schema = cluster.schema;
    po.size = 1;
    auto pool = pg::Pool::Open(po);
    REQUIRE(pool.ok());

    auto claim_until = [&](DaemonProcess& d, const std::string& invoice) -> int64_t {
      Json claim = {
          {"kind", "send_invoice"}, {"identity", {{"invoice_id", invoice}}}, {"lease", "60s"}};
      auto r = Cluster::Post(d, "/v1/work/claim", claim, kAgent);
      REQUIRE(r);
      REQUIRE_MESSAGE(r->status == 201, r->body);
      return J(r)["locked_until_ms"].get<int64_t>();
    };
    auto db_now = (*pool)->ServerNowMillis();
    REQUIRE(db_now.ok());
    const int64_t skewed_until = claim_until(skewed, "INV-S");
    const int64_t plain_until = claim_until(plain, "INV-P");
    // Both leases end 60 s after the database's now (give or take the
    // test's own latency), not an hour later on the skewed daemon.
    CHECK(skewed_until >= *db_now + 60'000 - 2'000);
    CHECK(skewed_until <= *db_now + 60'000 + 10'000);
    CHECK(plain_until - skewed_until < 10'000);
    CHECK(skewed_until - plain_until < 10'000);
    // A named lease's expiry too.
    auto lease = Cluster::Post(skewed, "/v1/leases/nightly-report",
                               {{"holder", "worker-1"}, {"ttl", "30s"}}, kAgent);
    REQUIRE(lease);
    REQUIRE_MESSAGE(lease->status == 201, lease->body);
    const int64_t expires = J(lease)["expires_at_ms"].get<int64_t>();
    CHECK(expires <= *db_now + 30'000 + 10'000);
    CHECK(expires >= *db_now + 30'000 - 2'000);
  }

  TEST_CASE(
      "while_the_database_is_unreachable_readyz_and_writes_are_503_and_seen_decisions_are_served") {
    const std::string url = TestPgUrl();
    if (!url.empty() && url.find("://") != std::string::npos) {
      MESSAGE("IDEM_TEST_PG_URL is a URL; this test needs the key=value form");
      return;
    }
    std::string host = ConninfoValue(url, "host");
    std::string port = ConninfoValue(url, "port");
    if (host.empty()) host = std::getenv("PGHOST") != nullptr ? std::getenv("PGHOST") : "";
    if (port.empty()) port = std::getenv("PGPORT") != nullptr ? std::getenv("PGPORT") : "5432";
    if (host.empty() || host[0] == '/') host = "localhost";  // a socket dir: TCP on localhost
    CuttableRelay relay(host, std::stoi(port));
    // The step makes plans, and the model's answer has an action: a cached
    // decision is answered with its plan's id, the plan itself unknown.
    Cluster cluster(
        R"(default:
  output: '{"category":"question","priority":"low","summary":"s","actions":[{"kind":"send_reply","args":{"ticket_id":"{{input.ticket_id}}","text":"hi"}}]}'
)",
        std::string("    plan: {pointer: /actions}\n") + kClaimActions +
            "  send_reply:\n    identity: {fields: [/ticket_id], version: v1}\n"
            "    window: 24h\n    on_duplicate: return_original\n");
    // libpq: a later key overrides an earlier one.
    DaemonProcess& d = cluster.Start(
        {}, url + " host=127.0.0.1 port=" + std::to_string(relay.port()) + " connect_timeout=2");
    auto ready = Cluster::Get(d, "/readyz");
    REQUIRE(ready);
    CHECK(ready->status == 200);
    const Json decide = {{"step", "triage_ticket"},
                         {"input", {{"ticket_id", 11}, {"text", "seen before"}}}};
    auto decided = Cluster::Post(d, "/v1/decide", decide, kAgent);
    REQUIRE(decided);
    REQUIRE_MESSAGE(decided->status == 200, decided->body);
    const std::string decision_id = J(decided)["decision_id"];
    const std::string plan_id = J(decided)["plan"]["plan_id"];

    relay.Cut();
    const std::string relay_port = std::to_string(relay.port());
    ready = Cluster::Get(d, "/readyz");
    REQUIRE(ready);
    CHECK(ready->status == 503);
    // /readyz is public: it names no host or port either.
    CHECK_MESSAGE(ready->body.find("127.0.0.1") == std::string::npos, ready->body);
    CHECK(ready->body.find(relay_port) == std::string::npos);
    CHECK(ready->body.find("http.store_error") != std::string::npos);
    // The first scrape since the start, with the database down: the store
    // counts are unknown (NaN), not a 0 that says "no dead letters".
    auto metrics = Cluster::Get(d, "/metrics", kAgent);
    REQUIRE(metrics);
    CHECK(metrics->status == 200);
    CHECK_MESSAGE(metrics->body.find("\nidem_dead_letters NaN\n") != std::string::npos,
                  metrics->body);
    CHECK(metrics->body.find("\nidem_escalations_open NaN\n") != std::string::npos);
    CHECK(metrics->body.find("idem_plans{state=\"awaiting_approval\"} NaN\n") != std::string::npos);
    Json claim = {{"kind", "send_invoice"}, {"identity", {{"invoice_id", "INV-DOWN"}}}};
    auto write = Cluster::Post(d, "/v1/work/claim", claim, kAgent);
    REQUIRE(write);
    CHECK(write->status == 503);
    CHECK(write->body.find("password") == std::string::npos);
    // Nor the database's host, port or statement: those are in the log.
    CHECK(write->body.find("127.0.0.1") == std::string::npos);
    CHECK(write->body.find("[") == std::string::npos);
    CHECK(write->body.find("request_id") != std::string::npos);
    // A decision this daemon has seen is still answered, by key and by id;
    // a new one cannot be stored.
    auto cached = Cluster::Post(d, "/v1/decide", decide, kAgent);
    REQUIRE(cached);
    CHECK_MESSAGE(cached->status == 200, cached->body);
    if (cached->status == 200) {
      CHECK(J(cached)["decision_id"] == decision_id);
      CHECK(J(cached)["plan"]["plan_id"] == plan_id);
      CHECK(J(cached)["plan"]["state"] == "unknown");
      const std::string plan_error = J(cached)["plan"]["error"];
      CHECK(plan_error.find("once the store is back") != std::string::npos);
      CHECK_MESSAGE(plan_error.find("127.0.0.1") == std::string::npos, plan_error);
      CHECK(plan_error.find(relay_port) == std::string::npos);
      CHECK(plan_error.find("http.store_error") != std::string::npos);
    }
    auto by_id = Cluster::Get(d, "/v1/decisions/" + decision_id, kAgent);
    REQUIRE(by_id);
    CHECK(by_id->status == 200);
    Json fresh = decide;
    fresh["input"]["ticket_id"] = 12;
    auto miss = Cluster::Post(d, "/v1/decide", fresh, kAgent);
    REQUIRE(miss);
    CHECK(miss->status == 503);

    relay.Restore();
    const auto deadline = SteadyClock::now() + std::chrono::seconds(20);
    int status = 0;
    while (status != 200 && SteadyClock::now() < deadline) {
      auto r = Cluster::Get(d, "/readyz");
      status = r ? r->status : 0;
      if (status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    CHECK(status == 200);
    auto after = Cluster::Post(d, "/v1/work/claim", claim, kAgent);
    REQUIRE(after);
    CHECK(after->status == 201);
  }

  TEST_CASE("idem_migrate_applies_the_schema_once_and_then_reports_it_up_to_date") {
    Cluster cluster(kQuestionRules, "");
    std::map<std::string, std::string> env = {{"IDEM_PG_URL", cluster.url}};
    CliResult first = RunCli({"migrate", "--config", cluster.config}, "", env);
    CHECK_MESSAGE(first.exit_code == 0, first.err);
    CHECK(first.out.find("applied migrations 1, 2") != std::string::npos);
    CliResult again = RunCli({"migrate", "--config", cluster.config}, "", env);
    CHECK_MESSAGE(again.exit_code == 0, again.err);
    CHECK(again.out.find("up to date") != std::string::npos);
    // A daemon then starts on the migrated schema.
    cluster.Start();
  }
}

TEST_CASE("idem_migrate_with_engine_rocksdb_says_there_is_nothing_to_migrate") {
  TempDir dir;
  std::string config = WriteTestConfig(dir, kQuestionRules);
  CliResult r = RunCli({"migrate", "--config", config});
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("nothing to migrate") != std::string::npos);
}

}  // namespace idem::testing
