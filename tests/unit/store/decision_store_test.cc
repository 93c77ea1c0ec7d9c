#include <doctest/doctest.h>
#include <rocksdb/perf_context.h>
#include <rocksdb/perf_level.h>

#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "daemon/store/rocksdb/rocksdb_database.h"
#include "daemon/store/rocksdb/rocksdb_decision_store.h"
#include "daemon/store/rocksdb/rocksdb_escalation_store.h"
#include "daemon/store/store.h"
#include "tests/unit/store/store_test_util.h"

namespace idem {
namespace {

using testing::OpenStore;
using testing::RawKeys;
using testing::TempDir;

constexpr int64_t kT0 = 1'700'000'000'000;

Decision MakeDecision(const std::string& id, const std::string& key, const std::string& step,
                      int64_t created_at_ms, int64_t expires_at_ms = 0) {
  Decision d;
  d.decision_id = id;
  d.decision_key = key;
  d.step = step;
  d.output = Json{{"label", id}};
  d.material = Json{{"v", 1}, {"input", key}};
  d.provider = "scripted";
  d.model = "m";
  d.prompt_version = "p1";
  d.created_at_ms = created_at_ms;
  d.expires_at_ms = expires_at_ms;
  return d;
}

TEST_CASE("PutIfAbsent stores the first decision and returns it to later callers") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  DecisionStore& s = store->decisions();
  StatusOr<Decision> first = s.PutIfAbsent(MakeDecision("dec_1", "key-a", "triage", kT0), kT0);
  REQUIRE(first.ok());
  CHECK(first->decision_id == "dec_1");
  StatusOr<Decision> second =
      s.PutIfAbsent(MakeDecision("dec_2", "key-a", "triage", kT0 + 1), kT0 + 1);
  REQUIRE(second.ok());
  CHECK(second->decision_id == "dec_1");
  CHECK(second->output == Json{{"label", "dec_1"}});
  CHECK(s.Get("dec_2").status().code() == Code::kNotFound);
  CHECK(s.GetByKey("key-a", kT0 + 2)->decision_id == "dec_1");
  CHECK(s.GetByKey("key-b", kT0 + 2).status().code() == Code::kNotFound);
}

TEST_CASE(
    "of many PutIfAbsent calls of one decision at once, exactly one says it stored it (an "
    "import's imported, the others' exists)") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  DecisionStore& s = store->decisions();
  for (int round = 0; round < 20; ++round) {
    const Decision d =
        MakeDecision("dec_r" + std::to_string(round), "key-r" + std::to_string(round), "t", kT0);
    std::atomic<int> stored_by{0};
    std::atomic<int> errors{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) {
      threads.emplace_back([&] {
        bool stored = false;
        StatusOr<Decision> got = s.PutIfAbsent(d, kT0, &stored);
        if (!got.ok() || got->decision_id != d.decision_id) ++errors;
        stored_by += stored;
      });
    }
    for (std::thread& t : threads) t.join();
    CHECK(errors.load() == 0);
    CHECK(stored_by.load() == 1);
  }
  bool stored = true;
  REQUIRE(s.PutIfAbsent(MakeDecision("dec_other", "key-r0", "t", kT0), kT0, &stored).ok());
  CHECK_FALSE(stored);
}

TEST_CASE("Replace makes the new decision current while the old stays readable by id") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  DecisionStore& s = store->decisions();
  REQUIRE(s.PutIfAbsent(MakeDecision("dec_1", "key-a", "triage", kT0), kT0).ok());
  REQUIRE(s.Replace(MakeDecision("dec_2", "key-a", "triage", kT0 + 5)).ok());
  CHECK(s.GetByKey("key-a", kT0 + 6)->decision_id == "dec_2");
  StatusOr<Decision> old = s.Get("dec_1");
  REQUIRE(old.ok());
  CHECK(old->output == Json{{"label", "dec_1"}});
  CHECK(s.PutIfAbsent(MakeDecision("dec_3", "key-a", "triage", kT0 + 7), kT0 + 7)->decision_id ==
        "dec_2");
}

TEST_CASE("an expired decision is not returned by GetByKey and may be replaced by PutIfAbsent") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  DecisionStore& s = store->decisions();
  REQUIRE(s.PutIfAbsent(MakeDecision("dec_1", "key-a", "triage", kT0, kT0 + 100), kT0).ok());
  CHECK(s.GetByKey("key-a", kT0 + 99).ok());
  CHECK(s.GetByKey("key-a", kT0 + 100).status().code() == Code::kNotFound);
  CHECK(s.Get("dec_1").ok());  // still readable by id
  StatusOr<Decision> fresh =
      s.PutIfAbsent(MakeDecision("dec_2", "key-a", "triage", kT0 + 100), kT0 + 100);
  REQUIRE(fresh.ok());
  CHECK(fresh->decision_id == "dec_2");
  CHECK(s.GetByKey("key-a", kT0 + 200)->decision_id == "dec_2");
}

// A trace as the decide engine writes it: attempts with the raw output, and totals.
Json LongTrace(const std::string& raw) {
  return Json{{"attempts", Json::array({Json{{"raw", raw}, {"tokens", 12}}})},
              {"input_tokens", 10},
              {"output_tokens", 2},
              {"cost_usd", 0.25},
              {"request_id", "req_1"}};
}
const Json kSummary = {
    {"input_tokens", 10}, {"output_tokens", 2}, {"cost_usd", 0.25}, {"request_id", "req_1"}};

TEST_CASE("a cache hit answers the trace's summary and a read by id the whole trace") {
  TempDir dir;
  const std::string raw(4000, 'r');
  {
    auto store = OpenStore(dir.path());
    DecisionStore& s = store->decisions();
    Decision d = MakeDecision("dec_1", "key-a", "triage", kT0);
    d.trace = LongTrace(raw);
    REQUIRE(s.PutIfAbsent(d, kT0).ok());
    StatusOr<Decision> hit = s.GetByKey("key-a", kT0);
    REQUIRE(hit.ok());
    CHECK(hit->trace == kSummary);
    CHECK_FALSE(hit->trace_whole);
    CHECK(hit->output == Json{{"label", "dec_1"}});
    // The existing decision a later PutIfAbsent answers is the cache hit's.
    StatusOr<Decision> existing =
        s.PutIfAbsent(MakeDecision("dec_2", "key-a", "triage", kT0 + 1), kT0 + 1);
    REQUIRE(existing.ok());
    CHECK(existing->decision_id == "dec_1");
    CHECK(existing->trace == kSummary);
    StatusOr<Decision> whole = s.Get("dec_1");
    REQUIRE(whole.ok());
    CHECK(whole->trace == LongTrace(raw));
    CHECK(whole->trace_whole);
    StatusOr<DecisionPage> page = s.List("", "", "", 10);
    REQUIRE(page.ok());
    REQUIRE(page->items.size() == 1);
    CHECK(page->items[0].trace == LongTrace(raw));
    // A trace without detail (a human's answer) is whole either way.
    Decision human = MakeDecision("dec_3", "key-b", "triage", kT0);
    human.trace = Json{{"escalation_id", "esc_1"}, {"cost_usd", 0}};
    REQUIRE(s.PutIfAbsent(human, kT0).ok());
    CHECK(s.GetByKey("key-b", kT0)->trace == human.trace);
    CHECK(s.Get("dec_3")->trace == human.trace);
  }
  // Read again from disk, not from any memory of the write.
  auto store = OpenStore(dir.path());
  DecisionStore& s = store->decisions();
  CHECK(s.GetByKey("key-a", kT0)->trace == kSummary);
  CHECK(s.Get("dec_1")->trace == LongTrace(raw));
  // Replace under the same id with a trace without detail: no trace stays behind.
  Decision plain = MakeDecision("dec_1", "key-a", "triage", kT0);
  plain.trace = Json{{"cost_usd", 0.5}};
  REQUIRE(s.Replace(plain).ok());
  CHECK(s.Get("dec_1")->trace == plain.trace);
  CHECK(s.GetByKey("key-a", kT0)->trace == plain.trace);
}

// Rewrites the value of `key` in `family` of a closed store.
void RawPut(const std::string& path, const std::string& family, const std::string& key,
            const std::string& value) {
  testing::WithRawDb(path, [&](rocksdb::DB& db, auto& cf) {
    REQUIRE(db.Put(rocksdb::WriteOptions(), cf.at(family), key, value).ok());
  });
}

TEST_CASE("a cache hit neither reads nor decodes the trace kept apart" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  {
    auto store = OpenStore(dir.path());
    Decision d = MakeDecision("dec_1", "key-a", "triage", kT0);
    d.trace = LongTrace("raw output");
    REQUIRE(store->decisions().PutIfAbsent(d, kT0).ok());
  }
  RawPut(dir.path(), "decision_traces", "dec_1", "not json");
  auto store = OpenStore(dir.path());
  DecisionStore& s = store->decisions();
  StatusOr<Decision> hit = s.GetByKey("key-a", kT0);
  REQUIRE_MESSAGE(hit.ok(), hit.status().ToString());
  CHECK(hit->trace == kSummary);
  // The read by id does read it (and finds it damaged).
  CHECK(s.Get("dec_1").status().code() == Code::kInternal);
}

TEST_CASE("a decision stored with its whole trace inside (before the split) still reads whole" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  { OpenStore(dir.path()); }  // the families
  Decision old = MakeDecision("dec_old", "key-a", "triage", kT0);
  old.trace = LongTrace("raw output");
  RawPut(dir.path(), "decisions", "dec_old", old.ToJson().dump());
  RawPut(dir.path(), "decision_keys", "key-a", "dec_old");
  RawPut(dir.path(), "decisions_by_time", rocks::InvertedBigEndian8(kT0) + "dec_old", "");
  auto store = OpenStore(dir.path());
  DecisionStore& s = store->decisions();
  StatusOr<Decision> whole = s.Get("dec_old");
  REQUIRE_MESSAGE(whole.ok(), whole.status().ToString());
  CHECK(whole->trace == LongTrace("raw output"));
  CHECK(whole->trace_whole);
  StatusOr<DecisionPage> page = s.List("", "", "", 10);
  REQUIRE(page.ok());
  REQUIRE(page->items.size() == 1);
  CHECK(page->items[0].trace == LongTrace("raw output"));
  StatusOr<Decision> hit = s.GetByKey("key-a", kT0);  // the same contract as new records
  REQUIRE(hit.ok());
  CHECK(hit->trace == kSummary);
  CHECK_FALSE(hit->trace_whole);
}

TEST_CASE("List pages through decisions newest first with a cursor and a step filter") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  DecisionStore& s = store->decisions();
  for (int i = 0; i < 7; ++i) {
    std::string step = i % 2 == 0 ? "triage" : "reply";
    REQUIRE(s.PutIfAbsent(MakeDecision("dec_" + std::to_string(i), "key-" + std::to_string(i), step,
                                       kT0 + i),
                          kT0 + i)
                .ok());
  }
  std::vector<std::string> seen;
  std::string cursor;
  int pages = 0;
  do {
    StatusOr<DecisionPage> page = s.List("", "", cursor, 3);
    REQUIRE(page.ok());
    for (const Decision& d : page->items) seen.push_back(d.decision_id);
    cursor = page->next_cursor;
    ++pages;
  } while (!cursor.empty() && pages < 10);
  CHECK(pages == 3);
  CHECK(seen ==
        std::vector<std::string>{"dec_6", "dec_5", "dec_4", "dec_3", "dec_2", "dec_1", "dec_0"});

  StatusOr<DecisionPage> triage = s.List("triage", "", "", 3);
  REQUIRE(triage.ok());
  REQUIRE(triage->items.size() == 3);
  CHECK(triage->items[0].decision_id == "dec_6");
  CHECK(triage->items[2].decision_id == "dec_2");
  REQUIRE(!triage->next_cursor.empty());
  StatusOr<DecisionPage> rest = s.List("triage", "", triage->next_cursor, 3);
  REQUIRE(rest.ok());
  REQUIRE(rest->items.size() == 1);
  CHECK(rest->items[0].decision_id == "dec_0");
  CHECK(rest->next_cursor.empty());

  StatusOr<DecisionPage> exact = s.List("reply", "", "", 3);
  CHECK(exact->items.size() == 3);
  CHECK(exact->next_cursor.empty());  // exactly one full page: no empty extra page

  CHECK(s.List("", "decided", "", 100)->items.size() == 7);
  CHECK(s.List("", "other", "", 100)->items.empty());
  CHECK(s.List("", "", "zz", 3).status().code() == Code::kInvalidArgument);
  CHECK(s.List("", "", "", 0).status().code() == Code::kInvalidArgument);
}

TEST_CASE("decisions without an id or key are refused") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  CHECK(store->decisions().PutIfAbsent(MakeDecision("", "k", "s", kT0), kT0).status().code() ==
        Code::kInvalidArgument);
  CHECK(store->decisions().Replace(MakeDecision("d", "", "s", kT0)).code() ==
        Code::kInvalidArgument);
}

// RocksDB's own write-through cache (the PostgreSQL store keeps none: other
// daemons may replace a decision).
TEST_CASE("the in-memory decision cache stays within its byte budget, large decisions too" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  auto db = rocks::RocksDatabase::Open(StoreOptions{dir.path(), false});
  REQUIRE(db.ok());
  constexpr size_t kBudget = 256 << 10;
  rocks::RocksDecisionStore s(**db, kBudget);
  // Decisions with a long trace (a model's raw output): 2,000 of ~8 KB each
  // would be ~16 MB if the cache were bounded by count alone.
  const std::string raw(8 << 10, 'x');
  for (int i = 0; i < 2000; ++i) {
    Decision d = MakeDecision("dec_" + std::to_string(i), "key-" + std::to_string(i), "t", kT0);
    d.trace = Json{{"attempts", Json::array({Json{{"raw", raw}, {"n", i}}})}};
    REQUIRE(s.PutIfAbsent(d, kT0).ok());
    // Reads of evicted keys come from disk and go back into the cache.
    REQUIRE(s.GetByKey("key-" + std::to_string(i / 2), kT0).ok());
  }
  CHECK(s.CachedBytes() > 0);
  CHECK(s.CachedBytes() <= kBudget);
  for (int i = 0; i < 2000; i += 97) {
    StatusOr<Decision> got = s.GetByKey("key-" + std::to_string(i), kT0);
    REQUIRE(got.ok());
    CHECK(got->decision_id == "dec_" + std::to_string(i));
    StatusOr<Decision> whole = s.Get("dec_" + std::to_string(i));  // the trace is read by id
    REQUIRE(whole.ok());
    CHECK(whole->trace["attempts"][0]["n"] == i);
  }
  CHECK(s.CachedBytes() <= kBudget);
  // A decision larger than a shard's whole share is served but not kept.
  Decision huge = MakeDecision("dec_huge", "key-huge", "t", kT0);
  huge.trace = Json{{"raw", std::string(kBudget, 'y')}};
  REQUIRE(s.PutIfAbsent(huge, kT0).ok());
  CHECK(s.GetByKey("key-huge", kT0)->decision_id == "dec_huge");
  CHECK(s.CachedBytes() <= kBudget);
}

// Keys left in a family of a closed store.
TEST_CASE(
    "the sweep deletes decisions past their window, superseded ones too, and keeps the rest") {
  TempDir dir;
  {
    auto store = OpenStore(dir.path());
    DecisionStore& s = store->decisions();
    auto traced = [](Decision d) {  // with a trace kept apart, which goes with it
      d.trace = LongTrace("raw of " + d.decision_id);
      return d;
    };
    REQUIRE(s.PutIfAbsent(traced(MakeDecision("dec_old", "key-a", "t", kT0, kT0 + 100)), kT0).ok());
    REQUIRE(s.Replace(traced(MakeDecision("dec_new", "key-a", "t", kT0 + 1, kT0 + 1'000))).ok());
    REQUIRE(s.PutIfAbsent(traced(MakeDecision("dec_forever", "key-b", "t", kT0)), kT0).ok());
    REQUIRE(
        s.PutIfAbsent(traced(MakeDecision("dec_short", "key-c", "t", kT0, kT0 + 100)), kT0).ok());
    CHECK(s.GetByKey("key-c", kT0).ok());  // in the in-memory cache
    CHECK(s.SweepExpired(kT0 + 99, 100).value() == 0);
    CHECK(s.SweepExpired(kT0 + 100, 100).value() == 2);  // dec_old (superseded), dec_short
    CHECK(s.SweepExpired(kT0 + 100, 100).value() == 0);
    CHECK(s.Get("dec_old").status().code() == Code::kNotFound);
    CHECK(s.GetByKey("key-c", kT0).status().code() == Code::kNotFound);  // not from memory
    CHECK(s.GetByKey("key-a", kT0 + 100)->decision_id == "dec_new");
    // The key is free again: a new decision takes it.
    REQUIRE(s.PutIfAbsent(MakeDecision("dec_short2", "key-c", "t", kT0 + 101), kT0 + 101).ok());
    CHECK(s.GetByKey("key-c", kT0 + 102)->decision_id == "dec_short2");
    CHECK(s.SweepExpired(kT0 + 5'000, 100).value() == 1);  // dec_new
    StatusOr<DecisionPage> page = s.List("", "", "", 10);
    REQUIRE(page.ok());
    CHECK(page->items.size() == 2);  // dec_forever, dec_short2
    CHECK(s.Get("dec_forever")->trace == LongTrace("raw of dec_forever"));
  }
  if (testing::OnPostgres()) return;  // RocksDB's index families below
  CHECK(RawKeys(dir.path(), "decisions") == std::vector<std::string>{"dec_forever", "dec_short2"});
  CHECK(RawKeys(dir.path(), "decision_traces") == std::vector<std::string>{"dec_forever"});
  CHECK(RawKeys(dir.path(), "decision_keys") == std::vector<std::string>{"key-b", "key-c"});
  CHECK(RawKeys(dir.path(), "decisions_by_time").size() == 2);
  CHECK(RawKeys(dir.path(), "decisions_by_step").size() == 2);
  CHECK(RawKeys(dir.path(), "decisions_expiry").empty());
}

Escalation OpenEscalation(const std::string& id, const std::string& key, int64_t created_at_ms) {
  Escalation e;
  e.escalation_id = id;
  e.decision_key = key;
  e.step = "t";
  e.created_at_ms = created_at_ms;
  return e;
}

Escalation OpenEscalation(int i, int64_t created_at_ms) {
  return OpenEscalation("esc_" + std::to_string(i), "key-" + std::to_string(i), created_at_ms);
}

TEST_CASE("the sweep deletes escalations resolved before the cutoff and keeps open ones") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  EscalationStore& s = store->escalations();
  REQUIRE(s.Put(OpenEscalation("esc_old", "key-a", kT0)).ok());
  REQUIRE(s.Put(OpenEscalation("esc_open", "key-b", kT0)).ok());
  REQUIRE(s.Put(OpenEscalation("esc_late", "key-c", kT0)).ok());
  REQUIRE(s.Put(OpenEscalation("esc_new", "key-d", kT0 + 500)).ok());
  REQUIRE(s.Resolve("esc_old", "dec_1", "human", kT0 + 10).ok());
  REQUIRE(s.Resolve("esc_late", "dec_2", "human", kT0 + 200).ok());
  REQUIRE(s.Resolve("esc_new", "dec_3", "human", kT0 + 600).ok());
  CHECK(s.SweepResolved(kT0 + 9, 100).value() == 0);
  CHECK(s.SweepResolved(kT0 + 100, 100).value() == 1);
  CHECK(s.SweepResolved(kT0 + 100, 100).value() == 0);
  CHECK(s.Get("esc_old").status().code() == Code::kNotFound);
  CHECK(s.Get("esc_late")->state == "resolved");
  CHECK(s.OpenByKey("key-b")->escalation_id == "esc_open");
  CHECK(s.SweepResolved(kT0 + 10'000, 100).value() == 2);
  StatusOr<std::vector<Escalation>> left = s.List("", 10);
  REQUIRE(left.ok());
  REQUIRE(left->size() == 1);
  CHECK(left->front().escalation_id == "esc_open");
}

TEST_CASE("the sweep finds resolved escalations behind many open ones") {
  TempDir dir;
  {
    auto store = OpenStore(dir.path());
    EscalationStore& s = store->escalations();
    for (int i = 0; i < 20; ++i) {
      REQUIRE(s.Put(OpenEscalation(i, kT0)).ok());
      REQUIRE(s.Resolve("esc_" + std::to_string(i), "dec_1", "human", kT0 + 10).ok());
    }
    for (int i = 100; i < 250; ++i) REQUIRE(s.Put(OpenEscalation(i, kT0 + 100)).ok());  // newer
    Escalation copied = OpenEscalation(99, kT0);  // as `idem store copy` writes one
    copied.state = "resolved";
    copied.decision_id = "dec_2";
    copied.resolved_by = "human";
    copied.resolved_at_ms = kT0 + 20;
    REQUIRE(s.Put(copied).ok());
    CHECK(s.SweepResolved(kT0 + 1'000, 100).value() == 21);
    CHECK(s.SweepResolved(kT0 + 1'000, 100).value() == 0);
    CHECK(s.Get("esc_249")->state == "open");
  }
  if (testing::OnPostgres()) return;  // RocksDB's index families below
  CHECK(RawKeys(dir.path(), "escalations").size() == 150);
  CHECK(RawKeys(dir.path(), "escalations_by_time").size() == 150);
  CHECK(RawKeys(dir.path(), "escalations_resolved").empty());
}

// RocksDB's "escalations_resolved" index and its upgrade path.
TEST_CASE("a store from before the resolved-escalation index has them indexed once, then swept" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  {
    auto store = OpenStore(dir.path());
    EscalationStore& s = store->escalations();
    for (int i = 0; i < 3; ++i) {
      REQUIRE(s.Put(OpenEscalation(i, kT0)).ok());
      REQUIRE(s.Resolve("esc_" + std::to_string(i), "dec_1", "human", kT0 + 10 * i).ok());
    }
    REQUIRE(s.Put(OpenEscalation(3, kT0)).ok());
  }
  // As an older idem left it: no index entries and no marker.
  CHECK(testing::ForgetIndex(dir.path(), rocks::Family::kEscalationsResolved,
                             rocks::RocksEscalationStore::kIndexedMarker) == 3);
  {
    auto store = OpenStore(dir.path());
    CHECK(store->escalations().SweepResolved(kT0 + 10, 100).value() == 2);  // resolved by then
    CHECK(store->escalations().Get("esc_2")->state == "resolved");
  }
  CHECK(RawKeys(dir.path(), "escalations_resolved").size() == 1);  // esc_2's
}

TEST_CASE("open escalations are listed newest first without reading the resolved ones") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  EscalationStore& s = store->escalations();
  auto put = [&](const std::string& id, int64_t at) {
    Escalation e;
    e.escalation_id = id;
    e.decision_key = "key-" + id;
    e.step = "t";
    e.created_at_ms = at;
    REQUIRE(s.Put(e).ok());
  };
  // Two open ones, older than 2,000 resolved ones.
  put("esc_open_a", kT0);
  put("esc_open_b", kT0 + 1);
  for (int i = 0; i < 2000; ++i) {
    const std::string id = "esc_r" + std::to_string(i);
    put(id, kT0 + 10 + i);
    REQUIRE(s.Resolve(id, "dec", "human", kT0 + 5000).ok());
  }
  // Point reads of records, counted by RocksDB on this thread: the scan of
  // the time index would read all 2,002 records to find the two.
  rocksdb::SetPerfLevel(rocksdb::PerfLevel::kEnableCount);
  rocksdb::get_perf_context()->Reset();
  StatusOr<std::vector<Escalation>> open = s.List("open", 100);
  const uint64_t reads = rocksdb::get_perf_context()->get_from_memtable_count;
  rocksdb::SetPerfLevel(rocksdb::PerfLevel::kDisable);
  REQUIRE(open.ok());
  REQUIRE(open->size() == 2);
  CHECK(open->at(0).escalation_id == "esc_open_b");
  CHECK(open->at(1).escalation_id == "esc_open_a");
  CHECK(reads <= 4);
  // Counted from the open index alone: no record read.
  rocksdb::SetPerfLevel(rocksdb::PerfLevel::kEnableCount);
  rocksdb::get_perf_context()->Reset();
  CHECK(s.CountOpen(100).value() == 2);
  CHECK(s.CountOpen(1).value() == 1);
  CHECK(rocksdb::get_perf_context()->get_from_memtable_count == 0);
  rocksdb::SetPerfLevel(rocksdb::PerfLevel::kDisable);
  // One of them, the newest.
  StatusOr<std::vector<Escalation>> one = s.List("open", 1);
  REQUIRE(one.ok());
  REQUIRE(one->size() == 1);
  CHECK(one->front().escalation_id == "esc_open_b");
  // The resolved ones, newest first, and all of them together.
  StatusOr<std::vector<Escalation>> resolved = s.List("resolved", 3);
  REQUIRE(resolved.ok());
  REQUIRE(resolved->size() == 3);
  CHECK(resolved->front().escalation_id == "esc_r1999");
  StatusOr<std::vector<Escalation>> all = s.List("", 3000);
  REQUIRE(all.ok());
  CHECK(all->size() == 2002);
  CHECK(all->back().escalation_id == "esc_open_a");
}

}  // namespace
}  // namespace idem
