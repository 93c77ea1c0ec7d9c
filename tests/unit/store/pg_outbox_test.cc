// The outbox on PostgreSQL (pg_outbox_store.cc) with several daemons on one
// database: events staged in transactions that commit in any order are read
// in seq order without one ever being skipped, and two stores sequencing at
// once never give one seq twice. Suite "postgres": run only by ctest
// unit_store_postgres (on a real server).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "daemon/store/postgres/pg_store.h"
#include "tests/unit/store/store_test_util.h"

namespace idem {
namespace {

using testing::kT0;
using testing::OpenStore;
using testing::PgConninfo;
using testing::PgSchemaFor;
using testing::TempDir;

std::unique_ptr<pg::Pool> PoolFor(const std::string& path, int size) {
  auto pool = pg::Pool::Open(pg::PoolOptions{PgConninfo(), PgSchemaFor(path), size});
  REQUIRE_MESSAGE(pool.ok(), pool.status().ToString());
  return std::move(pool).value();
}

Status Stage(pg::Conn& c, const std::string& key) {
  return pg::StageOutboxEvent(c, "plan.proposed", key, kT0, Json{{"plan_id", key}});
}

std::vector<std::string> Keys(const std::vector<OutboxEvent>& events) {
  std::vector<std::string> out;
  for (const auto& e : events) out.push_back(e.key);
  return out;
}

TEST_SUITE("postgres") {
  TEST_CASE("an event whose transaction commits late is read after the events that passed it") {
    TempDir dir;
    auto store = OpenStore(dir.path());  // creates the schema
    auto pool = PoolFor(dir.path(), 2);
    // The slow writer stages first (the smaller id) and stays open.
    auto slow = pool->Acquire();
    REQUIRE(slow.ok());
    REQUIRE((*slow)->ExecScript("BEGIN").ok());
    REQUIRE(Stage(**slow, "plan_slow").ok());
    // A later writer commits meanwhile.
    REQUIRE(pool->Tx([](pg::Conn& c) { return Stage(c, "plan_fast"); }).ok());

    auto early = store->outbox().After(0, 100);
    REQUIRE_MESSAGE(early.ok(), early.status().ToString());
    REQUIRE(Keys(*early) == std::vector<std::string>{"plan_fast"});
    const uint64_t cursor = (*early)[0].seq;
    CHECK((*early)[0].event_id == OutboxEvent::IdFor(**store->meta().Get(kStoreIdKey), cursor));

    REQUIRE((*slow)->ExecScript("COMMIT").ok());
    // The reader continues after the last seq it saw and still gets it.
    auto rest = store->outbox().After(cursor, 100);
    REQUIRE_MESSAGE(rest.ok(), rest.status().ToString());
    REQUIRE(Keys(*rest) == std::vector<std::string>{"plan_slow"});
    CHECK((*rest)[0].seq > cursor);
    CHECK((*rest)[0].data == Json{{"plan_id", "plan_slow"}});
    CHECK(Keys(*store->outbox().After(0, 100)) ==
          std::vector<std::string>{"plan_fast", "plan_slow"});
  }

  TEST_CASE("a rolled back event never appears and holds back no later one") {
    TempDir dir;
    auto store = OpenStore(dir.path());
    auto pool = PoolFor(dir.path(), 1);
    Status s = pool->Tx([](pg::Conn& c) -> Status {
      RETURN_IF_ERROR(Stage(c, "plan_lost"));
      return FailedPrecondition("the state change was refused");
    });
    CHECK(s.code() == Code::kFailedPrecondition);
    REQUIRE(pool->Tx([](pg::Conn& c) { return Stage(c, "plan_kept"); }).ok());
    CHECK(Keys(*store->outbox().After(0, 100)) == std::vector<std::string>{"plan_kept"});
  }

  TEST_CASE("two daemons reading at once never give one seq to two events or two to one") {
    TempDir dir;
    auto first = OpenStore(dir.path());
    auto second = OpenStore(dir.path());  // another daemon on the same database
    auto pool = PoolFor(dir.path(), 4);
    constexpr int kWriters = 4, kPerWriter = 40;
    constexpr size_t kTotal = size_t{kWriters} * kPerWriter * 2;  // two events per transaction
    std::atomic<int> writing{kWriters};
    std::vector<std::thread> writers;
    for (int t = 0; t < kWriters; ++t) {
      writers.emplace_back([&, t] {
        std::mt19937 rng(static_cast<unsigned>(t));
        for (int i = 0; i < kPerWriter; ++i) {
          const std::string id = "plan_" + std::to_string(t) + "_" + std::to_string(i);
          const int pause_us = static_cast<int>(rng() % 2'000);
          // Commits land out of staging order: a pause between insert and commit.
          Status s = pool->Tx([&](pg::Conn& c) -> Status {
            RETURN_IF_ERROR(Stage(c, id + "_a"));
            std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
            return Stage(c, id + "_b");
          });
          CHECK_MESSAGE(s.ok(), s.ToString());
        }
        writing.fetch_sub(1);
      });
    }
    struct Seen {
      std::vector<std::pair<uint64_t, std::string>> events;
      bool ordered = true;
    };
    auto read_all = [&](Store& store, Seen& seen) {
      uint64_t cursor = 0;
      while (true) {
        const bool last_round = writing.load() == 0;
        auto page = store.outbox().After(cursor, 7);
        CHECK_MESSAGE(page.ok(), page.status().ToString());
        if (!page.ok()) return;
        for (const OutboxEvent& e : *page) {
          if (e.seq <= cursor) seen.ordered = false;
          seen.events.emplace_back(e.seq, e.key);
          cursor = e.seq;
        }
        if (last_round && page->empty()) break;
        if (page->empty()) std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    };
    Seen a, b;
    std::thread reader_a([&] { read_all(*first, a); });
    std::thread reader_b([&] { read_all(*second, b); });
    for (auto& w : writers) w.join();
    reader_a.join();
    reader_b.join();

    std::map<uint64_t, std::string> key_of;
    std::map<std::string, uint64_t> seq_of;
    for (const Seen* seen : {&a, &b}) {
      CHECK(seen->ordered);
      // Every event, once: nothing skipped, nothing repeated.
      CHECK(seen->events.size() == kTotal);
      std::set<std::string> keys;
      for (const auto& event : seen->events) {
        const uint64_t seq = event.first;
        const std::string& key = event.second;
        keys.insert(key);
        auto [k, new_seq] = key_of.emplace(seq, key);
        if (!new_seq) CHECK_MESSAGE(k->second == key, "seq " << seq << " given to two events");
        auto [s, new_key] = seq_of.emplace(key, seq);
        if (!new_key) CHECK_MESSAGE(s->second == seq, key << " given two seqs");
      }
      CHECK(keys.size() == kTotal);
    }
    CHECK(key_of.size() == kTotal);
    CHECK(seq_of.size() == kTotal);
    // Both events of a transaction are numbered in the order they were staged.
    for (const auto& numbered : seq_of) {
      const std::string& key = numbered.first;
      if (key.ends_with("_a")) {
        CHECK(seq_of.at(key.substr(0, key.size() - 2) + "_b") > numbered.second);
      }
    }
  }

  TEST_CASE("two daemons advancing one subscriber's cursor never move it back") {
    TempDir dir;
    auto first = OpenStore(dir.path());
    auto second = OpenStore(dir.path());
    // One daemon moves up, the other (late, stale) down over the same seqs:
    // after each Advance(s) of either, the cursor is at least s.
    auto advance = [](Store& store, uint64_t from, int64_t step, int& behind) {
      for (uint64_t s = from; s >= 1 && s <= 300; s += step) {
        CHECK(store.outbox().Advance("billing", s).ok());
        if (*store.outbox().Cursor("billing") < s) ++behind;
      }
    };
    int behind_up = 0, behind_down = 0;
    std::thread up([&] { advance(*first, 1, 1, behind_up); });
    std::thread down([&] { advance(*second, 300, -1, behind_down); });
    up.join();
    down.join();
    CHECK(behind_up == 0);
    CHECK(behind_down == 0);
    CHECK(*first->outbox().Cursor("billing") == 300);
    CHECK(*second->outbox().Cursor("billing") == 300);
  }
}

}  // namespace
}  // namespace idem
