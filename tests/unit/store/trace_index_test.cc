#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "daemon/core/failpoints.h"
#include "daemon/store/rocksdb/rocksdb_trace_index.h"
#include "daemon/store/store.h"
#include "tests/unit/store/store_test_util.h"

namespace idem {
namespace {

using testing::ClaimReq;
using testing::kT0;
using testing::OpenStore;
using testing::TempDir;

const std::string kTraceA = "4bf92f3577b34da6a3ce929d0e0e4736";
const std::string kTraceB = "4bf92f3577b34da6a3ce929d0e0e4737";  // A's neighbour in key order

TraceEntry Entry(const std::string& trace, int64_t at, const std::string& type,
                 const std::string& ref) {
  return TraceEntry{
      .trace_id = trace, .at_ms = at, .type = type, .ref = ref, .detail = R"({"n":1})"};
}

TEST_CASE("trace_entries_are_listed_by_trace_in_time_order_queued_ones_too") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  TraceIndex& t = store->traces();
  REQUIRE(t.Add(Entry(kTraceA, kT0 + 20, "plan", "plan_1")).ok());
  REQUIRE(t.Add(Entry(kTraceB, kT0 + 5, "request", "r-b")).ok());
  REQUIRE(t.Add(Entry(kTraceA, kT0 + 10, "decision", "dec_1")).ok());
  REQUIRE(t.Add(Entry(kTraceA, kT0 + 10, "request", "r-a")).ok());  // same ms: arrival order
  auto a = t.List(kTraceA, 100);  // not flushed yet: List writes the queue first
  REQUIRE(a.ok());
  REQUIRE(a->size() == 3);
  CHECK((*a)[0].ref == "dec_1");
  CHECK((*a)[1].ref == "r-a");
  CHECK((*a)[2].ref == "plan_1");
  CHECK((*a)[2].at_ms == kT0 + 20);
  CHECK(Json::parse((*a)[2].detail) == Json{{"n", 1}});
  auto b = t.List(kTraceB, 100);
  REQUIRE(b.ok());
  REQUIRE(b->size() == 1);
  CHECK((*b)[0].type == "request");
  CHECK(t.List(kTraceA, 2)->size() == 2);
}

TEST_CASE("entries_recorded_from_views_list_as_entries_added_whole_in_arrival_order") {
  // The daemon's sink records from views (TraceIndex::Record); tests and
  // tools add whole entries. Both land in one order, with the same fields.
  TempDir dir;
  auto store = OpenStore(dir.path());
  TraceIndex& t = store->traces();
  const std::string detail = R"({"method":"POST","status":201})";
  REQUIRE(t.Record(kTraceA, kT0, "request", "req_1", detail).ok());
  REQUIRE(t.Add(Entry(kTraceA, kT0, "work", "w_1")).ok());
  REQUIRE(t.Record(kTraceA, kT0, "attempt", "w_1", "{}").ok());
  REQUIRE(t.Record(kTraceB, kT0 - 5, "request", "req_b", "{}").ok());
  CHECK(t.Record("short", kT0, "request", "r", "{}").code() == Code::kInvalidArgument);
  CHECK(t.Record(kTraceA, kT0, "", "r", "{}").code() == Code::kInvalidArgument);
  auto a = t.List(kTraceA, 10);
  REQUIRE(a.ok());
  REQUIRE(a->size() == 3);
  CHECK((*a)[0].type == "request");
  CHECK((*a)[0].ref == "req_1");
  CHECK((*a)[0].trace_id == kTraceA);
  CHECK((*a)[0].at_ms == kT0);
  CHECK(Json::parse((*a)[0].detail) == Json::parse(detail));
  CHECK((*a)[1].type == "work");
  CHECK(Json::parse((*a)[1].detail) == Json{{"n", 1}});
  CHECK((*a)[2].type == "attempt");
  CHECK(Json::parse((*a)[2].detail) == Json::object());
  auto b = t.List(kTraceB, 10);
  REQUIRE(b.ok());
  REQUIRE(b->size() == 1);
  CHECK((*b)[0].at_ms == kT0 - 5);
}

TEST_CASE(
    "entries_recorded_from_many_threads_while_others_flush_are_all_listed_in_each_threads_order") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  TraceIndex& t = store->traces();
  constexpr int kThreads = 4;
  const int per_thread = testing::OnPostgres() ? 100 : 2'000;
  // One trace per thread, every entry at the same millisecond: the order
  // listed is the order recorded.
  auto trace_of = [](int thread) { return std::string(31, 'c') + static_cast<char>('0' + thread); };
  std::atomic<bool> done{false};
  std::atomic<int> flush_errors{0};  // or refused records
  std::thread flusher([&] {
    while (!done.load()) flush_errors += !t.Flush().ok();
  });
  std::vector<std::thread> writers;
  for (int w = 0; w < kThreads; ++w) {
    writers.emplace_back([&, w] {
      for (int i = 0; i < per_thread; ++i) {
        if (!t.Record(trace_of(w), kT0, "request", std::to_string(i), "{}").ok()) ++flush_errors;
      }
    });
  }
  for (std::thread& th : writers) th.join();
  done.store(true);
  flusher.join();
  CHECK(flush_errors.load() == 0);
  for (int w = 0; w < kThreads; ++w) {
    auto listed = t.List(trace_of(w), 10'000);
    REQUIRE(listed.ok());
    REQUIRE(listed->size() == static_cast<size_t>(per_thread));
    int out_of_order = 0;
    for (int i = 0; i < per_thread; ++i) out_of_order += (*listed)[i].ref != std::to_string(i);
    CHECK(out_of_order == 0);
  }
  CHECK(t.dropped() == 0);
}

TEST_CASE("trace_entries_survive_a_reopen_and_are_swept_by_age") {
  TempDir dir;
  {
    auto store = OpenStore(dir.path());
    REQUIRE(store->traces().Add(Entry(kTraceA, kT0, "request", "old")).ok());
    REQUIRE(store->traces().Add(Entry(kTraceA, kT0 + 1'000, "request", "new")).ok());
    REQUIRE(store->traces().Flush().ok());
  }
  auto store = OpenStore(dir.path());
  TraceIndex& t = store->traces();
  REQUIRE(t.List(kTraceA, 10)->size() == 2);
  auto swept = t.SweepBefore(kT0 + 999, 100);
  REQUIRE(swept.ok());
  // PostgreSQL deletes the row; RocksDB hides the entry and frees its
  // space with its table file (budget or retention).
  CHECK(*swept == (testing::OnPostgres() ? 1 : 0));
  auto left = t.List(kTraceA, 10);
  REQUIRE(left->size() == 1);
  CHECK((*left)[0].ref == "new");
  CHECK(*t.SweepBefore(kT0 + 999, 100) == 0);
}

TEST_CASE("a_malformed_trace_entry_is_refused") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  CHECK(store->traces().Add(Entry("short", kT0, "request", "r")).code() == Code::kInvalidArgument);
  CHECK(store->traces().Add(Entry(kTraceA, kT0, "", "r")).code() == Code::kInvalidArgument);
  CHECK(store->traces().List("short", 10).status().code() == Code::kInvalidArgument);
}

TEST_CASE("a_trace_entry_whose_text_is_not_utf8_is_left_out_and_escaped_text_round_trips" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  TraceIndex& t = store->traces();
  TraceEntry odd = Entry(kTraceA, kT0, "request", "r \"q\"\n\\ \x01 \xc3\xa9");
  const Json odd_detail = {
      {"path", "/v1/x?\"y\"\t\xe2\x82\xac"}, {"n", -3}, {"f", 1.5}, {"z", nullptr}};
  odd.detail = odd_detail.dump();
  REQUIRE(t.Add(odd).ok());
  REQUIRE(t.Add(Entry(kTraceA, kT0 + 1, "request", "bad \xff")).ok());
  TraceEntry bad_detail = Entry(kTraceA, kT0 + 2, "request", "r2");
  bad_detail.detail = "{\"x\":\"\xc3\"}";
  REQUIRE(t.Add(bad_detail).ok());
  auto listed = t.List(kTraceA, 10);
  REQUIRE(listed.ok());
  REQUIRE(listed->size() == 1);
  CHECK((*listed)[0].ref == odd.ref);
  CHECK((*listed)[0].type == "request");
  CHECK((*listed)[0].at_ms == kT0);
  CHECK(Json::parse((*listed)[0].detail) == odd_detail);
}

TEST_CASE("a_claim_stores_the_trace_id_of_the_request_that_created_the_work") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  ClaimRequest req = ClaimReq("w-1", kT0);
  req.trace_id = kTraceA;
  REQUIRE(store->journal().Claim(req).ok());
  CHECK(store->journal().Get("w-1")->trace_id == kTraceA);
  ClaimRequest later = ClaimReq("w-1", kT0 + 5'000);  // a retry from another trace
  later.trace_id = kTraceB;
  REQUIRE(store->journal().Claim(later).ok());
  CHECK(store->journal().Get("w-1")->trace_id == kTraceA);
}

TEST_CASE("entries_past_the_trace_queue_bound_are_dropped_counted_and_missing_from_the_trace" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  TraceIndex& t = store->traces();
  constexpr size_t kBound = rocks::RocksTraceIndex::kMaxQueued;
  constexpr size_t kPast = 10;
  // Writes stall: the background writer takes at most one batch (at most
  // the bound) and sleeps in its write, so of 2 * bound + kPast entries
  // added meanwhile at least kPast find the queue full.
  REQUIRE(Failpoints::Set("store.write=delay(5000)").ok());
  size_t refused = 0;
  for (size_t i = 0; i < 2 * kBound + kPast; ++i) {
    refused += !t.Add(Entry(kTraceA, kT0 + static_cast<int64_t>(i), "request", "r")).ok();
  }
  const uint64_t dropped = t.dropped();
  Failpoints::Clear();
  CHECK(refused == 0);  // the caller is never failed for it
  CHECK(dropped >= kPast);
  CHECK(dropped <= kBound + kPast);
  // What was kept is written once the disk is back; the dropped ones are
  // simply not in the trace.
  auto listed = t.List(kTraceA, 3 * kBound);
  REQUIRE(listed.ok());
  CHECK(listed->size() == 2 * kBound + kPast - dropped);
  CHECK(t.dropped() == dropped);
}

// A detail of `bytes` random hex digits, which LZ4 barely compresses.
std::string RandomDetail(std::mt19937& rng, size_t bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex(bytes, '0');
  for (char& c : hex) c = kHex[rng() % 16];
  return R"({"pad":")" + hex + R"("})";
}

// The trace log's table files, flushed from the memtable now.
void FlushTraceLog(rocks::RocksDatabase& db, rocks::RocksTraceIndex& t) {
  REQUIRE(t.Flush().ok());
  REQUIRE(db.raw().Flush(rocksdb::FlushOptions(), db.handle(rocks::Family::kTraceLog)).ok());
}

size_t TraceLogFiles(rocks::RocksDatabase& db) {
  rocksdb::ColumnFamilyMetaData meta;
  db.raw().GetColumnFamilyMetaData(db.handle(rocks::Family::kTraceLog), &meta);
  return meta.file_count;
}

TEST_CASE("the_trace_log_drops_its_oldest_file_past_its_budget" * doctest::test_suite("rocksdb")) {
  TempDir dir;
  StoreOptions options{dir.path(), false};
  options.trace_budget_bytes = 1 << 20;
  auto db = rocks::RocksDatabase::Open(options);
  REQUIRE(db.ok());
  rocks::RocksTraceIndex t(**db);
  std::mt19937 rng(7);
  // Two files of ~600 KiB each: together over the 1 MiB budget.
  for (int i = 0; i < 300; ++i) {
    TraceEntry e = Entry(kTraceA, kT0 + i, "request", "old");
    e.detail = RandomDetail(rng, 2'000);
    REQUIRE(t.Add(std::move(e)).ok());
  }
  FlushTraceLog(**db, t);
  for (int i = 0; i < 300; ++i) {
    TraceEntry e = Entry(kTraceB, kT0 + 1'000 + i, "request", "new");
    e.detail = RandomDetail(rng, 2'000);
    REQUIRE(t.Add(std::move(e)).ok());
  }
  FlushTraceLog(**db, t);
  REQUIRE(TraceLogFiles(**db) == 2);
  REQUIRE(t.List(kTraceA, 1'000)->size() == 300);

  REQUIRE(t.SweepBefore(0, 100).ok());  // prunes the log (as the background thread does)
  CHECK(TraceLogFiles(**db) == 1);
  CHECK(t.List(kTraceA, 1'000)->empty());
  CHECK(t.List(kTraceB, 1'000)->size() == 300);
}

TEST_CASE("the_trace_log_drops_files_past_its_retention" * doctest::test_suite("rocksdb")) {
  TempDir dir;
  StoreOptions options{dir.path(), false};
  options.trace_retention_ms = 1'000;
  auto db = rocks::RocksDatabase::Open(options);
  REQUIRE(db.ok());
  rocks::RocksTraceIndex t(**db);
  REQUIRE(t.Add(Entry(kTraceA, kT0, "request", "r")).ok());
  FlushTraceLog(**db, t);
  REQUIRE(t.List(kTraceA, 10)->size() == 1);
  // A file's age is counted in whole seconds from its flush.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (TraceLogFiles(**db) > 0 && std::chrono::steady_clock::now() < deadline) {
    REQUIRE(t.SweepBefore(0, 100).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  CHECK(TraceLogFiles(**db) == 0);
  CHECK(t.List(kTraceA, 10)->empty());
}

TEST_CASE("many_trace_log_files_never_stall_the_other_writes" * doctest::test_suite("rocksdb")) {
  TempDir dir;
  auto db = rocks::RocksDatabase::Open(StoreOptions{dir.path(), false});
  REQUIRE(db.ok());
  rocks::RocksTraceIndex t(**db);
  // More level-0 files than RocksDB's default stop trigger (36): with it,
  // the next write would wait for a compaction that never comes.
  for (int i = 0; i < 40; ++i) {
    REQUIRE(t.Add(Entry(kTraceA, kT0 + i, "request", "r" + std::to_string(i))).ok());
    FlushTraceLog(**db, t);
  }
  // Compaction would have moved them out of level 0 (or merged them).
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  rocksdb::ColumnFamilyMetaData meta;
  (*db)->raw().GetColumnFamilyMetaData((*db)->handle(rocks::Family::kTraceLog), &meta);
  REQUIRE(!meta.levels.empty());
  CHECK(meta.levels[0].files.size() == 40);
  CHECK(TraceLogFiles(**db) == 40);
  rocks::RecordBatch rb(**db);
  rb.Put(rocks::Family::kMeta, "probe", "1");
  CHECK((*db)->Commit(rb, /*durable=*/true).ok());
  CHECK(t.List(kTraceA, 100)->size() == 40);
}

TEST_CASE("a_trace_sweep_stays_in_force_after_a_reopen") {
  TempDir dir;
  {
    auto store = OpenStore(dir.path());
    REQUIRE(store->traces().Add(Entry(kTraceA, kT0, "request", "old")).ok());
    REQUIRE(store->traces().Add(Entry(kTraceA, kT0 + 1'000, "request", "new")).ok());
    REQUIRE(store->traces().SweepBefore(kT0 + 999, 100).ok());
  }
  auto store = OpenStore(dir.path());
  auto left = store->traces().List(kTraceA, 10);
  REQUIRE(left.ok());
  REQUIRE(left->size() == 1);
  CHECK((*left)[0].ref == "new");
}

TEST_CASE("a_log_entry_keeps_its_trace_id_and_time_only_in_its_key_and_old_entries_still_list" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  {
    auto store = OpenStore(dir.path());
    REQUIRE(store->traces().Add(Entry(kTraceA, kT0 + 5, "request", "new")).ok());
  }
  testing::WithRawDb(dir.path(), [](rocksdb::DB& db, auto& cfs) {
    std::unique_ptr<rocksdb::Iterator> it(
        db.NewIterator(rocksdb::ReadOptions(), cfs.at("trace_log")));
    it->SeekToFirst();
    REQUIRE(it->Valid());
    CHECK(it->value().ToString() == R"({"detail":{"n":1},"ref":"new","type":"request"})");
    // An entry as an older build wrote it, in the family it wrote.
    const std::string old_key =
        kTraceA + rocks::BigEndian8(int64_t{kT0}) + rocks::BigEndian8(uint64_t{1});
    const std::string old_value = Json{
        {"at_ms", kT0},
        {"detail", {{"n", 0}}},
        {"ref", "old"},
        {"trace_id", kTraceA},
        {"type", "request"}}.dump();
    REQUIRE(db.Put(rocksdb::WriteOptions(), cfs.at("traces"), old_key, old_value).ok());
  });
  auto store = OpenStore(dir.path());
  auto listed = store->traces().List(kTraceA, 10);
  REQUIRE(listed.ok());
  REQUIRE(listed->size() == 2);
  CHECK((*listed)[0].ref == "old");
  CHECK((*listed)[0].at_ms == kT0);
  CHECK((*listed)[0].detail == R"({"n":0})");
  CHECK((*listed)[1].ref == "new");
  CHECK((*listed)[1].trace_id == kTraceA);
  CHECK((*listed)[1].at_ms == kT0 + 5);
  CHECK((*listed)[1].detail == R"({"n":1})");
}

}  // namespace
}  // namespace idem
