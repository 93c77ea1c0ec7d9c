#include "daemon/decide/cost_ledger.h"

#include <doctest/doctest.h>

#include <atomic>
#include <map>
#include <thread>
#include <vector>

namespace idem {
namespace {

constexpr int64_t kDay = 86'400'000;
constexpr int64_t kNov30 = 1'764'460'800'000;  // 2025-11-30T00:00:00Z

class MemoryMeta final : public MetaStore {
 public:
  bool fail_puts = false;
  std::map<std::string, std::string> data;
  int puts = 0;
  StatusOr<std::optional<std::string>> Get(const std::string& key) override {
    auto it = data.find(key);
    if (it == data.end()) return std::optional<std::string>();
    return std::optional<std::string>(it->second);
  }
  Status Put(const std::string& key, const std::string& value) override {
    if (fail_puts) return Unavailable("disk full");
    ++puts;
    data[key] = value;
    return Status::Ok();
  }
};

}  // namespace

TEST_CASE("cost counts are kept per UTC day, step and model, and survive a new ledger") {
  MemoryMeta meta;
  {
    CostLedger ledger(meta);
    ledger.RecordCall(kNov30 + 1000, "triage", "m-1", 100, 20, 0.5);
    ledger.RecordCall(kNov30 + 2000, "triage", "m-1", 50, 10, 0.25);
    ledger.RecordHit(kNov30 + 3000, "triage", "m-1", 0.5);
    ledger.RecordCall(kNov30 + kDay - 1, "summarize", "m-2", 7, 3, 0.125);
    ledger.RecordHit(kNov30 + kDay, "triage", "m-1", 0.75);  // the next day
    REQUIRE(ledger.Flush().ok());
  }
  CHECK(meta.data.count("cost/day/2025-11-30") == 1);
  CHECK(meta.data.count("cost/day/2025-12-01") == 1);

  CostLedger later(meta);
  later.RecordHit(kNov30 + 5000, "triage", "m-1", 0.5);  // not flushed yet: Rows flushes
  auto rows = later.Rows(kNov30, kNov30 + kDay + 10);
  REQUIRE(rows.ok());
  REQUIRE(rows->size() == 3);
  const CostRow& summarize = (*rows)[0];  // day 1, ordered by step then model
  CHECK(summarize.day == "2025-11-30");
  CHECK(summarize.step == "summarize");
  CHECK(summarize.counts.calls == 1);
  const CostRow& triage = (*rows)[1];
  CHECK(triage.day == "2025-11-30");
  CHECK(triage.counts.calls == 2);
  CHECK(triage.counts.input_tokens == 150);
  CHECK(triage.counts.output_tokens == 30);
  CHECK(triage.counts.spent_usd == doctest::Approx(0.75));
  CHECK(triage.counts.hits == 2);
  CHECK(triage.counts.saved_usd == doctest::Approx(1.0));
  CHECK((*rows)[2].day == "2025-12-01");
  CHECK((*rows)[2].counts.hits == 1);

  auto first_day = later.Rows(kNov30, kNov30 + kDay - 1);
  REQUIRE(first_day.ok());
  CHECK(first_day->size() == 2);
}

TEST_CASE("a day keeps a bounded number of rows; models past it count under (other)") {
  // A replay may name any model: thousands of made-up names must not grow
  // the day's record, which every flush reads and rewrites.
  MemoryMeta meta;
  CostLedger ledger(meta);
  const size_t n = CostLedger::kMaxRowsPerDay + 50;
  for (size_t i = 0; i < n; ++i) {
    ledger.RecordCall(kNov30 + 1000, "triage", "made-up-" + std::to_string(i), 1, 1, 0.001);
    if (i % 400 == 0) REQUIRE(ledger.Flush().ok());  // across several flushes
  }
  REQUIRE(ledger.Flush().ok());
  auto rows = ledger.Rows(kNov30, kNov30 + kDay - 1);
  REQUIRE(rows.ok());
  CHECK(rows->size() == CostLedger::kMaxRowsPerDay + 1);  // the budget, and "(other)"
  int64_t calls = 0;
  int64_t other = 0;
  for (const CostRow& r : *rows) {
    calls += r.counts.calls;
    if (r.model == CostLedger::kOtherModel) other = r.counts.calls;
  }
  CHECK(calls == static_cast<int64_t>(n));  // nothing lost
  CHECK(other == 50);
}

TEST_CASE("counts a failed flush could not write stay pending for the next one") {
  MemoryMeta meta;
  CostLedger ledger(meta);
  ledger.RecordCall(kNov30, "triage", "m-1", 10, 1, 0.5);
  ledger.RecordCall(kNov30 + kDay, "triage", "m-1", 10, 1, 0.5);
  meta.fail_puts = true;
  CHECK(ledger.Flush().code() == Code::kUnavailable);
  meta.fail_puts = false;
  REQUIRE(ledger.Flush().ok());
  auto rows = ledger.Rows(kNov30, kNov30 + kDay);
  REQUIRE(rows.ok());
  REQUIRE(rows->size() == 2);
  CHECK((*rows)[0].counts.calls == 1);  // once each: nothing lost, nothing doubled
  CHECK((*rows)[1].counts.calls == 1);
  const int puts = meta.puts;
  REQUIRE(ledger.Flush().ok());
  CHECK(meta.puts == puts);  // nothing pending: nothing written
}

TEST_CASE("counts recorded from many threads at once all arrive") {
  MemoryMeta meta;
  CostLedger ledger(meta);
  std::vector<std::thread> threads;
  std::atomic<int> failed_flushes{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        ledger.RecordHit(kNov30, "triage", "m-1", 0.001);
        if (i % 100 == 0 && !ledger.Flush().ok()) failed_flushes++;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failed_flushes == 0);
  auto rows = ledger.Rows(kNov30, kNov30);
  REQUIRE(rows.ok());
  REQUIRE(rows->size() == 1);
  CHECK((*rows)[0].counts.hits == 4000);
}

TEST_CASE("a cost range must not end before it starts or span more than ten years") {
  MemoryMeta meta;
  CostLedger ledger(meta);
  CHECK(ledger.Rows(kNov30, kNov30 - kDay).status().field() == "query:since");
  CHECK(ledger.Rows(0, CostLedger::kMaxRangeDays * kDay).status().field() == "query:since");
  CHECK(ledger.Rows(0, (CostLedger::kMaxRangeDays - 1) * kDay).ok());
  CHECK(CostLedger::DayOf(kNov30 - 1) == "2025-11-29");
}

}  // namespace idem
