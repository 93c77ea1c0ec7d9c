#include <doctest/doctest.h>
#include <fcntl.h>
#include <rocksdb/table_properties.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "daemon/store/store.h"
#include "tests/unit/stderr_capture.h"
#include "tests/unit/store/store_test_util.h"

namespace idem {
namespace {

using testing::OpenStore;
using testing::TempDir;

constexpr int64_t kT0 = 1'700'000'000'000;

TEST_CASE("records survive reopening the store") {
  TempDir dir;
  std::string running_token;
  {
    auto store = OpenStore(dir.path(), /*sync=*/true);
    Decision d;
    d.decision_id = "dec_1";
    d.decision_key = "key-a";
    d.step = "triage";
    d.output = Json{{"label", "spam"}};
    REQUIRE(store->decisions().PutIfAbsent(d, kT0).ok());

    REQUIRE(store->idem_keys().Begin("s", "k-done", "fp", "r1", kT0, 60'000, 1'000).ok());
    REQUIRE(
        store->idem_keys().Finish("s", "k-done", "fp", 201, "{}", "application/json", kT0).ok());
    REQUIRE(store->idem_keys().Begin("s", "k-open", "fp", "r2", kT0, 60'000, 1'000).ok());

    ClaimRequest r;
    r.work_id = "w-done";
    r.kind = "k";
    r.now_ms = kT0;
    r.run_id = "run-1";
    StatusOr<ClaimResult> c = store->journal().Claim(r);
    REQUIRE(c.ok());
    REQUIRE(store->journal().Complete("w-done", c->item.lease_token, 7, "ext-7", kT0).ok());
    r.work_id = "w-running";
    StatusOr<ClaimResult> c2 = store->journal().Claim(r);
    REQUIRE(c2.ok());
    running_token = c2->item.lease_token;

    Plan p;
    p.plan_id = "plan_1";
    p.state = "proposed";
    REQUIRE(store->plans().Put(p).ok());
    REQUIRE(store->leases().Acquire("cron", "run-1", "", 60'000, kT0).ok());
    REQUIRE(store->meta().Put("m", "v").ok());
  }
  auto store = OpenStore(dir.path(), /*sync=*/true);
  CHECK(store->decisions().GetByKey("key-a", kT0)->output == Json{{"label", "spam"}});
  CHECK(store->idem_keys().Begin("s", "k-done", "fp", "r3", kT0 + 1, 60'000, 1'000)->outcome ==
        BeginOutcome::kReplay);
  CHECK(store->idem_keys().Begin("s", "k-open", "fp", "r3", kT0 + 1, 60'000, 1'000)->outcome ==
        BeginOutcome::kInFlight);

  ClaimRequest r;
  r.work_id = "w-done";
  r.now_ms = kT0 + 1;
  StatusOr<ClaimResult> done = store->journal().Claim(r);
  REQUIRE(done.ok());
  CHECK(done->outcome == ClaimOutcome::kDone);
  CHECK(done->item.result == 7);
  CHECK(done->item.external_ref == "ext-7");
  CHECK(store->journal().ByRun("run-1", 10)->size() == 2);

  // The lease of the running item is still in force, and its holder's token still works.
  r.work_id = "w-running";
  CHECK(store->journal().Claim(r)->outcome == ClaimOutcome::kBusy);
  CHECK(store->journal().Due(kT0 + 30'000, 10)->size() == 1);
  CHECK(store->journal().Complete("w-running", running_token, 1, "", kT0 + 2).ok());

  CHECK(store->plans().Get("plan_1")->state == "proposed");
  CHECK(store->leases().Get("cron", kT0)->holder == "run-1");
  CHECK(store->meta().Get("m").value() == std::optional<std::string>("v"));
}

TEST_CASE("a store folder already open is refused as Unavailable" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  StatusOr<std::unique_ptr<Store>> second = OpenRocksStore(StoreOptions{dir.path(), false});
  CHECK(second.status().code() == Code::kUnavailable);
}

TEST_CASE("a clean close leaves no WAL for the next open to replay" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  {
    auto store = OpenStore(dir.path(), /*sync=*/true);
    for (int i = 0; i < 200; ++i) {
      Decision d;
      d.decision_id = "dec_" + std::to_string(i);
      d.decision_key = "key-" + std::to_string(i);
      d.step = "t";
      d.output = Json{{"n", i}};
      REQUIRE(store->decisions().PutIfAbsent(d, kT0).ok());
    }
    REQUIRE(store->meta().Put("k", "v").ok());
  }
  uintmax_t wal_bytes = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    if (entry.path().extension() == ".log") wal_bytes += entry.file_size();
  }
  CHECK(wal_bytes == 0);
  auto store = OpenStore(dir.path());
  CHECK(store->decisions().GetByKey("key-199", kT0)->decision_id == "dec_199");
  CHECK(store->meta().Get("k").value() == std::optional<std::string>("v"));
}

// What a clean close flushed: each family's level-0 files. Point-lookup
// families carry a bloom filter and scan-only ones none (rocksdb_database.h,
// kScanOnlyFamilies); level 0 is not compressed, except the trace log, whose
// files never leave it.
TEST_CASE("flushed_tables_have_filters_only_where_keys_are_looked_up_and_level0_is_uncompressed" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  {
    auto store = OpenStore(dir.path(), /*sync=*/true);
    ClaimRequest r;
    r.work_id = "w-1";
    r.kind = "k";
    r.now_ms = kT0;
    r.window_ms = 60'000;
    StatusOr<ClaimResult> c = store->journal().Claim(r);
    REQUIRE(c.ok());
    REQUIRE(store->journal().Complete("w-1", c->item.lease_token, 7, "ext-7", kT0).ok());
    REQUIRE(store->traces()
                .Add(TraceEntry{.trace_id = std::string(32, 'a'), .at_ms = kT0, .type = "request"})
                .ok());
    REQUIRE(store->traces().Flush().ok());
  }
  testing::WithRawDb(dir.path(), [](rocksdb::DB& db, auto& cfs) {
    auto tables = [&](const std::string& family) {
      rocksdb::TablePropertiesCollection props;
      REQUIRE(db.GetPropertiesOfAllTables(cfs.at(family), &props).ok());
      REQUIRE_MESSAGE(!props.empty(), family);
      return props;
    };
    for (const auto& [file, p] : tables("journal")) {
      CHECK(p->filter_size > 0);
      CHECK(p->compression_name == "NoCompression");
    }
    for (const std::string family : {"outbox", "journal_expiry", "journal_done_ref"}) {
      for (const auto& [file, p] : tables(family)) {
        CHECK_MESSAGE(p->filter_size == 0, family);
        CHECK(p->compression_name == "NoCompression");
      }
    }
    for (const auto& [file, p] : tables("trace_log")) {
      CHECK(p->filter_size > 0);
      CHECK(p->compression_name == "LZ4");
    }
  });
}

TEST_CASE("the_journal_is_merged_universally_and_its_records_survive_a_move_to_levels_and_back" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  // Three opens, each closed with its records flushed: three table files.
  auto work_id = [](int i) { return "w-" + std::to_string(i); };
  for (int round = 0; round < 3; ++round) {
    auto store = OpenStore(dir.path(), /*sync=*/false);
    for (int i = round * 100; i < (round + 1) * 100; ++i) {
      ClaimRequest r;
      r.work_id = work_id(i);
      r.kind = "k";
      r.now_ms = kT0;
      StatusOr<ClaimResult> c = store->journal().Claim(r);
      REQUIRE(c.ok());
      REQUIRE(store->journal().Complete(r.work_id, c->item.lease_token, i, "", kT0).ok());
    }
  }
  // The style the store chose is in its options file.
  std::string options_text;
  for (const auto& f : std::filesystem::directory_iterator(dir.path())) {
    if (f.path().filename().string().rfind("OPTIONS-", 0) == 0) {
      std::ifstream in(f.path());
      options_text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
  }
  const size_t journal_at = options_text.find("[CFOptions \"journal\"]");
  REQUIRE(journal_at != std::string::npos);
  const std::string journal_section =
      options_text.substr(journal_at, options_text.find("[CFOptions", journal_at + 1) - journal_at);
  CHECK(journal_section.find("compaction_style=kCompactionStyleUniversal") != std::string::npos);
  // An older build opens it with levels (RocksDB's default) and compacts it
  // its way: every record is still there.
  testing::WithRawDb(dir.path(), [](rocksdb::DB& db, auto& cfs) {
    REQUIRE(
        db.CompactRange(rocksdb::CompactRangeOptions(), cfs.at("journal"), nullptr, nullptr).ok());
    std::unique_ptr<rocksdb::Iterator> it(
        db.NewIterator(rocksdb::ReadOptions(), cfs.at("journal")));
    int n = 0;
    for (it->SeekToFirst(); it->Valid(); it->Next()) ++n;
    CHECK(n == 300);
  });
  // And this build takes the levelled store back.
  auto store = OpenStore(dir.path(), /*sync=*/false);
  for (int i = 0; i < 300; i += 37) {
    StatusOr<WorkItem> w = store->journal().Get(work_id(i));
    REQUIRE_MESSAGE(w.ok(), w.status().ToString());
    CHECK(w->state == WorkState::kDone);
    CHECK(w->result == i);
  }
}

TEST_CASE("the_rocksdb_store_reports_its_memory_by_part" * doctest::test_suite("rocksdb")) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  auto bytes = [&](const std::string& name) -> uint64_t {
    for (const Store::SizePart& p : store->MemoryUsage()) {
      if (p.name == name) return p.bytes;
    }
    FAIL("no part " << name);
    return 0;
  };
  const uint64_t memtables_before = bytes("memtables");
  CHECK(bytes("decision_cache") == 0);
  Decision d;
  d.decision_id = "dec_1";
  d.decision_key = "key-a";
  d.step = "t";
  d.output = Json{{"text", std::string(4096, 'x')}};
  REQUIRE(store->decisions().PutIfAbsent(d, kT0).ok());
  REQUIRE(store->decisions().GetByKey("key-a", kT0).ok());
  CHECK(bytes("memtables") > memtables_before);
  CHECK(bytes("decision_cache") > 4096);
  CHECK(bytes("block_cache_pinned") <= bytes("block_cache"));
  bytes("table_readers");
}

// The size of each part, by name, from Store::DiskUsage.
std::map<std::string, uint64_t> DiskParts(Store& store) {
  StatusOr<std::vector<Store::SizePart>> parts = store.DiskUsage();
  REQUIRE_MESSAGE(parts.ok(), parts.status().ToString());
  std::map<std::string, uint64_t> out;
  for (const Store::SizePart& p : *parts) {
    CHECK_MESSAGE(out.emplace(p.name, p.bytes).second, "part named twice: " << p.name);
  }
  return out;
}

void PutDecisions(Store& store, int n) {
  for (int i = 0; i < n; ++i) {
    Decision d;
    d.decision_id = "dec_" + std::to_string(i);
    d.decision_key = "key-" + std::to_string(i);
    d.step = "t";
    d.output = Json{{"text", std::string(512, 'x')}};
    REQUIRE(store.decisions().PutIfAbsent(d, kT0).ok());
  }
}

TEST_CASE("the_rocksdb_store_reports_its_disk_by_family_and_the_parts_add_up_to_its_folder" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  {
    auto store = OpenStore(dir.path(), /*sync=*/true);
    PutDecisions(*store, 200);
    const std::map<std::string, uint64_t> open = DiskParts(*store);
    CHECK(open.at("wal") > 200 * 512);  // the writes, not yet in any table
    CHECK(open.at("decisions") == 0);
    CHECK(open.contains("journal"));
    CHECK(open.contains("other"));
    REQUIRE(store->DiskFreeBytes().has_value());
    CHECK(*store->DiskFreeBytes() > 0);
  }
  // A clean close flushed them into the decisions family's tables.
  auto store = OpenStore(dir.path());
  const std::map<std::string, uint64_t> reopened = DiskParts(*store);
  CHECK(reopened.at("decisions") > 0);
  // The parts add up to the folder, read while no file came or went
  // (RocksDB may still delete an obsolete file after the open).
  auto folder_bytes = [&] {
    uint64_t n = 0;
    for (const auto& f : std::filesystem::recursive_directory_iterator(dir.path())) {
      if (f.is_regular_file()) n += f.file_size();
    }
    return n;
  };
  uint64_t parts = 0, folder = 1;
  for (int attempt = 0; attempt < 20 && parts != folder; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const uint64_t before = folder_bytes();
    parts = 0;
    for (const auto& [name, bytes] : DiskParts(*store)) parts += bytes;
    folder = folder_bytes() == before ? before : 0;
  }
  CHECK(parts == folder);
}

TEST_CASE("the_postgres_store_reports_its_disk_by_table" * doctest::test_suite("postgres")) {
  if (!testing::OnPostgres()) return;
  TempDir dir;
  auto store = OpenStore(dir.path());
  PutDecisions(*store, 20);
  const std::map<std::string, uint64_t> tables = DiskParts(*store);
  for (const char* table : {"decisions", "journal", "plans", "traces", "outbox"}) {
    CAPTURE(table);
    CHECK(tables.contains(table));
  }
  CHECK(tables.at("decisions") > 0);
  CHECK_FALSE(store->DiskFreeBytes().has_value());  // the server's disk, not ours
}

TEST_CASE("a_store_another_process_holds_is_refused_with_a_message_that_says_what_to_do") {
  TempDir dir;
  StoreOptions options;
  options.path = dir.path();
  REQUIRE(OpenRocksStore(options).ok());  // the store and its LOCK file exist

  // A child process takes the LOCK file's lock the way RocksDB does (a
  // POSIX write lock), as a running daemon holds it.
  int ready[2], done[2];
  REQUIRE(pipe(ready) == 0);
  REQUIRE(pipe(done) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    const int fd = open((dir.path() + "/LOCK").c_str(), O_RDWR);
    struct flock lock = {};
    lock.l_type = F_WRLCK;
    lock.l_whence = SEEK_SET;
    char c = fd >= 0 && fcntl(fd, F_SETLK, &lock) == 0 ? 'y' : 'n';
    if (write(ready[1], &c, 1) != 1 || read(done[0], &c, 1) != 1) _exit(1);
    _exit(0);
  }
  char c = 0;
  REQUIRE(read(ready[0], &c, 1) == 1);
  REQUIRE(c == 'y');

  auto held = OpenRocksStore(options);
  CHECK(held.status().code() == Code::kUnavailable);
  CHECK(held.status().message() ==
        "the store at " + dir.path() +
            " is in use by another process (a running idem daemon, or idem store copy): stop "
            "it, or give this one another --data folder");

  REQUIRE(write(done[1], "x", 1) == 1);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  for (int fd : {ready[0], ready[1], done[0], done[1]}) close(fd);
  CHECK(OpenRocksStore(options).ok());  // free again once the holder is gone
}

// Stores decision "dec_1" whose output is a summary of `summary_bytes`.
void PutDecision(Store& store, size_t summary_bytes) {
  Decision d;
  d.decision_id = "dec_1";
  d.decision_key = "key-a";
  d.step = "triage";
  d.output = Json{{"summary", std::string(summary_bytes, 'x')}};
  REQUIRE(store.decisions().PutIfAbsent(d, kT0).ok());
}

TEST_CASE("a_corrupted_table_file_is_an_internal_error_not_a_retryable_outage" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  {
    auto store = OpenStore(dir.path(), /*sync=*/true);
    PutDecision(*store, 64 << 10);
  }  // a clean stop flushes the record into a table file
  // Flip bytes in the middle of every table file: a checksum no longer
  // matches, as after a bad sector or a torn copy.
  int corrupted = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    if (e.path().extension() != ".sst" || e.file_size() < 4096) continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(e.file_size() / 3));
    f.write("\xde\xad\xbe\xef\xde\xad\xbe\xef", 8);
    ++corrupted;
  }
  REQUIRE(corrupted > 0);
  StatusOr<std::unique_ptr<Store>> store = OpenRocksStore(StoreOptions{dir.path(), true, 0});
  REQUIRE_MESSAGE(store.ok(), store.status().ToString());
  CHECK((*store)->Corruptions() == std::optional<uint64_t>(0));
  testing::StderrCapture logs;
  StatusOr<Decision> got = (*store)->decisions().Get("dec_1");
  REQUIRE_FALSE(got.ok());
  CAPTURE(got.status().ToString());
  // Retrying cannot mend it: 500, not 503, and the message says what.
  CHECK(got.status().code() == Code::kInternal);
  CHECK(got.status().message().find("Corruption") != std::string::npos);
  // The operator hears of it before a client does: a count for alerts, and
  // one error line, not one per read of the damaged block.
  CHECK_FALSE((*store)->decisions().Get("dec_1").ok());
  CHECK((*store)->Corruptions() == std::optional<uint64_t>(2));
  const std::string text = logs.Finish();
  CAPTURE(text);
  size_t lines = 0;
  for (size_t at = text.find("\"store.corruption\""); at != std::string::npos;
       at = text.find("\"store.corruption\"", at + 1)) {
    ++lines;
  }
  CHECK(lines == 1);
  CHECK(text.find("\"level\":\"error\"") != std::string::npos);
  CHECK(text.find("reading decisions") != std::string::npos);
}

TEST_CASE("a_store_without_damage_counts_no_corruption_after_reads_writes_and_errors" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  auto store = OpenStore(dir.path(), /*sync=*/true);
  PutDecision(*store, 16);
  CHECK(store->decisions().Get("dec_1").ok());
  CHECK(store->decisions().Get("dec_missing").status().code() == Code::kNotFound);
  CHECK(store->Corruptions() == std::optional<uint64_t>(0));
}

}  // namespace
}  // namespace idem
