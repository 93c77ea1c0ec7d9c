// Two decide engines over one Store: two idem daemons sharing one database
// (issue 13), as far as the engine can tell. The RocksDB store stands in for
// the shared database; the engines coordinate only through its interfaces.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "daemon/core/crypto.h"
#include "daemon/core/env.h"
#include "daemon/decide/cost_ledger.h"
#include "daemon/decide/decide_engine.h"
#include "daemon/store/postgres/pg_client.h"

namespace idem {
namespace {

const Json kSchema = {{"type", "object"},
                      {"required", {"category"}},
                      {"properties", {{"category", {{"type", "string"}}}}}};

// A provider that takes a while to answer (so identical misses overlap) and
// counts every call across both daemons. Its answer is the test's `output`.
class SlowProvider final : public Provider {
 public:
  SlowProvider(std::atomic<int>& calls, const Json& output, int64_t delay_ms)
      : calls_(calls), output_(output), delay_ms_(delay_ms) {}
  StatusOr<ProviderResponse> Complete(const ProviderRequest&) override {
    calls_++;
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
    ProviderResponse r;
    r.output = output_;
    r.raw_text = output_.dump();
    r.input_tokens = 10;
    r.output_tokens = 5;
    r.finish_reason = "stop";
    return r;
  }
  std::string type() const override { return "slow"; }

 private:
  std::atomic<int>& calls_;
  const Json& output_;
  const int64_t delay_ms_;
};

// The meta store of a database a network away: each write takes a moment,
// as a PostgreSQL round trip does.
class RemoteMeta final : public MetaStore {
 public:
  explicit RemoteMeta(MetaStore& inner) : inner_(inner) {}
  StatusOr<std::optional<std::string>> Get(const std::string& key) override {
    return inner_.Get(key);
  }
  Status Put(const std::string& key, const std::string& value) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return inner_.Put(key, value);
  }

 private:
  MetaStore& inner_;
};

struct TwoDaemons {
  std::string dir;
  FakeEnv env;
  StableClock clock{env};
  Metrics metrics_a, metrics_b;
  Config config;
  std::unique_ptr<Store> store;
  std::atomic<int> calls{0};
  Json output = {{"category", "refund"}};
  std::unique_ptr<DecideEngine> a, b;

  TwoDaemons() {
    char tmpl[] = "/tmp/idem-multi-XXXXXX";
    dir = mkdtemp(tmpl);
    StoreOptions so;
    so.path = dir;
    so.sync = false;
    store = std::move(OpenRocksStore(so)).value();
    ProviderConfig p;
    p.name = "main";
    p.type = "slow";
    config.providers["main"] = p;
    StepConfig s;
    s.name = "triage";
    s.provider = "main";
    s.model = "m-1";
    s.prompt.text = "Triage {{input.text}}";
    s.prompt.version = "v1";
    s.output_schema = kSchema;
    s.attempts = 1;
    s.timeout_ms = 30'000;
    s.fallback = Json::array({"escalate"});
    config.steps["triage"] = s;
  }
  ~TwoDaemons() {
    a.reset();
    b.reset();
    store.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::unique_ptr<DecideEngine> Engine(Metrics& metrics, bool guard, bool shared,
                                       int64_t delay_ms) {
    std::map<std::string, std::unique_ptr<Provider>> providers;
    providers["main"] = std::make_unique<SlowProvider>(calls, output, delay_ms);
    DecideCoordination c;
    c.leases = guard ? &store->leases() : nullptr;
    c.shared_store = shared;
    c.recheck_ms = 1'000;
    return std::move(DecideEngine::Create(config, store->decisions(), store->escalations(),
                                          std::move(providers), clock, metrics, nullptr, nullptr,
                                          c))
        .value();
  }
  void Build(bool guard, bool shared, int64_t delay_ms = 100) {
    a = Engine(metrics_a, guard, shared, delay_ms);
    b = Engine(metrics_b, guard, shared, delay_ms);
  }
  static StatusOr<DecideResult> Decide(DecideEngine& e, CacheMode cache = CacheMode::kDefault) {
    DecideRequest r;
    r.step = "triage";
    r.input = {{"text", "refund please"}};
    r.cache = cache;
    return e.Decide(r);
  }
};

}  // namespace

TEST_CASE("identical concurrent misses on two daemons make one provider call") {
  TwoDaemons t;
  t.Build(/*guard=*/true, /*shared=*/true);
  std::vector<std::thread> threads;
  std::vector<std::string> ids(100);
  std::atomic<int> ok{0};
  for (int i = 0; i < 100; ++i) {
    threads.emplace_back([&, i] {
      auto r = TwoDaemons::Decide(i % 2 == 0 ? *t.a : *t.b);
      if (r.ok() && !r->escalated) {
        ids[i] = r->decision.decision_id;
        ok++;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(ok == 100);
  CHECK(t.calls == 1);
  for (const auto& id : ids) CHECK(id == ids[0]);
  // The lease was released with the decision stored: nothing is left held.
  CHECK(
      t.store->leases()
          .Get("decide:" + t.store->decisions().List("triage", "", "", 1)->items.at(0).decision_key,
               t.clock.NowMillis())
          .status()
          .code() == Code::kNotFound);
}

TEST_CASE("a miss whose decide lease another daemon holds takes it over once it expires") {
  TwoDaemons t;
  t.Build(/*guard=*/true, /*shared=*/true, /*delay_ms=*/1);
  auto key = t.a->KeyFor("triage", {{"text", "refund please"}});
  REQUIRE(key.ok());
  // A daemon that took the lease and died: nobody releases it.
  auto dead = t.store->leases().Acquire("decide:" + key->key.key, "dead-daemon", "", 31'000,
                                        t.clock.NowMillis());
  REQUIRE(dead.ok());
  std::atomic<bool> done{false};
  StatusOr<DecideResult> r = Unavailable("not yet");
  std::thread waiter([&] {
    r = TwoDaemons::Decide(*t.a);
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK_FALSE(done.load());  // waiting on the holder, not calling the provider
  CHECK(t.calls == 0);
  t.env.Advance(31'000);  // the dead holder's lease expires
  waiter.join();
  REQUIRE(r.ok());
  CHECK_FALSE(r->escalated);
  CHECK(t.calls == 1);
}

TEST_CASE("a decision refreshed on another daemon is served within the recheck bound") {
  TwoDaemons t;
  t.Build(/*guard=*/true, /*shared=*/true, /*delay_ms=*/1);
  auto first = TwoDaemons::Decide(*t.a);
  REQUIRE(first.ok());
  auto hit = TwoDaemons::Decide(*t.a);
  REQUIRE(hit.ok());
  CHECK(hit->cache_hit);
  // Daemon B decides the same key again (cache: refresh).
  t.output = {{"category", "bug"}};
  auto refreshed = TwoDaemons::Decide(*t.b, CacheMode::kRefresh);
  REQUIRE(refreshed.ok());
  REQUIRE(refreshed->decision.decision_id != first->decision.decision_id);
  // B serves its own refresh at once.
  CHECK(TwoDaemons::Decide(*t.b)->decision.decision_id == refreshed->decision.decision_id);
  // A may serve what it read for up to recheck_ms (the documented bound) ...
  t.env.Advance(999);
  CHECK(TwoDaemons::Decide(*t.a)->decision.decision_id == first->decision.decision_id);
  // ... and never longer.
  t.env.Advance(1);
  auto after = TwoDaemons::Decide(*t.a);
  REQUIRE(after.ok());
  CHECK(after->cache_hit);
  CHECK(after->decision.decision_id == refreshed->decision.decision_id);
  CHECK(after->decision.output == Json{{"category", "bug"}});
  CHECK(t.calls == 2);
}

TEST_CASE("a human's answer given on another daemon is served at once") {
  TwoDaemons t;
  t.Build(/*guard=*/true, /*shared=*/true, /*delay_ms=*/1);
  t.output = {{"no_category", true}};  // fails the schema: the chain escalates
  auto esc = TwoDaemons::Decide(*t.a);
  REQUIRE(esc.ok());
  REQUIRE(esc->escalated);
  auto promoted = t.b->ResolveEscalation(esc->escalation.escalation_id, {{"category", "refund"}},
                                         "ops", "checked by hand");
  REQUIRE(promoted.ok());
  // An open escalation is never remembered: A looks it up again.
  auto after = TwoDaemons::Decide(*t.a);
  REQUIRE(after.ok());
  CHECK_FALSE(after->escalated);
  CHECK(after->decision.decision_id == promoted->decision_id);
  CHECK(after->decision.decided_by == "human");
}

TEST_CASE("engines on a store no other process shares keep no memory of their own") {
  TwoDaemons t;
  t.Build(/*guard=*/true, /*shared=*/false, /*delay_ms=*/1);
  auto first = TwoDaemons::Decide(*t.a);
  REQUIRE(first.ok());
  REQUIRE(TwoDaemons::Decide(*t.a)->cache_hit);
  t.output = {{"category", "bug"}};
  auto refreshed = TwoDaemons::Decide(*t.b, CacheMode::kRefresh);
  REQUIRE(refreshed.ok());
  // No time passes: A reads the store's own (exact) cache on every hit.
  CHECK(TwoDaemons::Decide(*t.a)->decision.decision_id == refreshed->decision.decision_id);
}

TEST_CASE("two daemons' cost flushes on one store lose none of each other's counts") {
  TwoDaemons t;
  RemoteMeta meta(t.store->meta());
  auto ledger = [&](const std::string& holder) {
    CostLedgerSharing sharing;
    sharing.leases = &t.store->leases();
    sharing.clock = &t.clock;
    sharing.holder = holder;
    sharing.wait_ms = 10'000;
    return std::make_unique<CostLedger>(meta, sharing);
  };
  auto a = ledger("daemon-a");
  auto b = ledger("daemon-b");
  constexpr int kRounds = 100;
  std::atomic<int> failed{0};
  auto run = [&](CostLedger& l) {
    for (int i = 0; i < kRounds; ++i) {
      l.RecordCall(t.clock.NowMillis(), "triage", "m-1", 10, 1, 0.5);
      if (!l.Flush().ok()) failed++;
    }
  };
  std::thread ta([&] { run(*a); });
  std::thread tb([&] { run(*b); });
  ta.join();
  tb.join();
  CHECK(failed == 0);
  auto rows = a->Rows(t.clock.NowMillis(), t.clock.NowMillis());
  REQUIRE(rows.ok());
  REQUIRE(rows->size() == 1);
  CHECK((*rows)[0].counts.calls == 2 * kRounds);
  CHECK((*rows)[0].counts.input_tokens == 2 * kRounds * 10);
}

// The same with two real daemons' stores: two PostgreSQL pools on one
// schema. Suite "postgres": run by ctest unit_decide_postgres, on the server
// IDEM_TEST_PG_URL names ("" : the PG* variables).
TEST_CASE("on PostgreSQL, identical misses on two daemons' own stores make one provider call" *
          doctest::test_suite("postgres")) {
  const char* env_url = std::getenv("IDEM_TEST_PG_URL");
  const std::string url = env_url != nullptr ? env_url : "";
  const std::string schema = "t_multi_" + RandomHex(8);
  auto open = [&]() {
    PgStoreOptions o;
    o.conninfo = url;
    o.schema = schema;
    o.pool_size = 8;
    auto store = OpenPostgresStore(o);
    REQUIRE_MESSAGE(store.ok(), store.status().ToString());
    return std::move(store).value();
  };
  TwoDaemons t;  // its config, clock and provider; its RocksDB store stays unused
  std::unique_ptr<Store> store_a = open();
  std::unique_ptr<Store> store_b = open();
  CHECK(store_a->shared());
  auto engine = [&](Store& store, Metrics& metrics) {
    std::map<std::string, std::unique_ptr<Provider>> providers;
    providers["main"] = std::make_unique<SlowProvider>(t.calls, t.output, 100);
    DecideCoordination c;
    c.leases = &store.leases();
    c.shared_store = store.shared();
    return std::move(DecideEngine::Create(t.config, store.decisions(), store.escalations(),
                                          std::move(providers), t.clock, metrics, nullptr, nullptr,
                                          c))
        .value();
  };
  auto a = engine(*store_a, t.metrics_a);
  auto b = engine(*store_b, t.metrics_b);
  std::vector<std::thread> threads;
  std::vector<std::string> ids(40);
  std::atomic<int> ok{0};
  for (int i = 0; i < 40; ++i) {
    threads.emplace_back([&, i] {
      auto r = TwoDaemons::Decide(i % 2 == 0 ? *a : *b);
      if (r.ok() && !r->escalated) {
        ids[i] = r->decision.decision_id;
        ok++;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(ok == 40);
  CHECK(t.calls == 1);
  for (const auto& id : ids) CHECK(id == ids[0]);
  // B refreshes; A serves the new decision within recheck_ms.
  t.output = {{"category", "bug"}};
  auto refreshed = TwoDaemons::Decide(*b, CacheMode::kRefresh);
  REQUIRE(refreshed.ok());
  t.env.Advance(1'000);
  CHECK(TwoDaemons::Decide(*a)->decision.decision_id == refreshed->decision.decision_id);
  a.reset();
  b.reset();
  store_a.reset();
  store_b.reset();
  auto pool = pg::Pool::Open(pg::PoolOptions{url, "public", 1});
  REQUIRE(pool.ok());
  CHECK((*pool)->Exec("DROP SCHEMA IF EXISTS " + pg::QuoteIdent(schema) + " CASCADE").ok());
}

}  // namespace idem
