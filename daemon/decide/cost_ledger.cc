#include "daemon/decide/cost_ledger.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>

#include "daemon/core/crypto.h"
#include "daemon/core/json.h"

namespace idem {
namespace {

constexpr int64_t kDayMs = 86'400'000;

int64_t DayNumber(int64_t ms) { return ms >= 0 ? ms / kDayMs : (ms - kDayMs + 1) / kDayMs; }

std::string DayName(int64_t day) {
  using namespace std::chrono;
  const year_month_day ymd{sys_days{days{day}}};
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04d-%02u-%02u", static_cast<int>(ymd.year()),
                static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()));
  return buf;
}

std::string MetaKey(int64_t day) { return "cost/day/" + DayName(day); }

}  // namespace

void CostCounts::Add(const CostCounts& o) {
  calls += o.calls;
  input_tokens += o.input_tokens;
  output_tokens += o.output_tokens;
  spent_usd += o.spent_usd;
  hits += o.hits;
  saved_usd += o.saved_usd;
}

Json CostCounts::ToJson() const {
  return {{"calls", calls},
          {"input_tokens", input_tokens},
          {"output_tokens", output_tokens},
          {"spent_usd", spent_usd},
          {"hits", hits},
          {"saved_usd", saved_usd}};
}

CostCounts CostCounts::FromJson(const Json& j) {
  CostCounts c;
  if (!j.is_object()) return c;
  c.calls = j.value("calls", int64_t{0});
  c.input_tokens = j.value("input_tokens", int64_t{0});
  c.output_tokens = j.value("output_tokens", int64_t{0});
  c.spent_usd = j.value("spent_usd", 0.0);
  c.hits = j.value("hits", int64_t{0});
  c.saved_usd = j.value("saved_usd", 0.0);
  return c;
}

std::string CostLedger::DayOf(int64_t ms) { return DayName(DayNumber(ms)); }

void CostLedger::RecordCall(int64_t now_ms, const std::string& step, const std::string& model,
                            int64_t input_tokens, int64_t output_tokens, double usd) {
  CostCounts d;
  d.calls = 1;
  d.input_tokens = input_tokens;
  d.output_tokens = output_tokens;
  d.spent_usd = usd;
  Add(now_ms, step, model, d);
}

void CostLedger::RecordHit(int64_t now_ms, const std::string& step, const std::string& model,
                           double saved_usd) {
  CostCounts d;
  d.hits = 1;
  d.saved_usd = saved_usd;
  Add(now_ms, step, model, d);
}

void CostLedger::Add(int64_t now_ms, const std::string& step, const std::string& model,
                     const CostCounts& delta) {
  // Threads spread over the shards, so concurrent hits rarely share a lock.
  Shard& shard = shards_[std::hash<std::thread::id>{}(std::this_thread::get_id()) % kShards];
  MutexLock lock(shard.mu);
  shard.pending[Key{DayNumber(now_ms), step, model}].Add(delta);
}

std::map<CostLedger::Key, CostCounts> CostLedger::TakePending() {
  std::map<Key, CostCounts> all;
  for (Shard& shard : shards_) {
    std::map<Key, CostCounts> taken;
    {
      MutexLock lock(shard.mu);
      taken.swap(shard.pending);
    }
    for (auto& [key, counts] : taken) all[key].Add(counts);
  }
  return all;
}

void CostLedger::Restore(const std::map<Key, CostCounts>& counts) {
  Shard& shard = shards_[0];
  MutexLock lock(shard.mu);
  for (const auto& [key, c] : counts) shard.pending[key].Add(c);
}

StatusOr<std::map<std::pair<std::string, std::string>, CostCounts>> CostLedger::ReadDay(
    int64_t day) {
  std::map<std::pair<std::string, std::string>, CostCounts> rows;
  ASSIGN_OR_RETURN(std::optional<std::string> raw, meta_.Get(MetaKey(day)));
  if (!raw) return rows;
  StatusOr<Json> j = ParseJson(*raw, JsonLimits{.max_bytes = 64 << 20, .max_depth = 8});
  if (!j.ok()) return Internal("cost record " + MetaKey(day) + ": " + j.status().message());
  for (const Json& r : j->value("rows", Json::array())) {
    rows[{r.value("step", ""), r.value("model", "")}].Add(CostCounts::FromJson(r));
  }
  return rows;
}

CostLedger::CostLedger(MetaStore& meta, CostLedgerSharing sharing)
    : meta_(meta), sharing_([&] {
        if (sharing.holder.empty()) sharing.holder = "cost-" + RandomHex(8);
        if (sharing.clock == nullptr) sharing.leases = nullptr;
        return std::move(sharing);
      }()) {}

Status CostLedger::Flush() {
  MutexLock flush(flush_mu_);
  std::map<Key, CostCounts> pending = TakePending();
  if (pending.empty()) return Status::Ok();
  if (sharing_.leases == nullptr) return WriteDays(std::move(pending));
  // Another daemon's flush holds the turn for the few milliseconds of its
  // read-modify-write: wait for it, briefly.
  constexpr char kLease[] = "cost:flush";
  constexpr int64_t kTtlMs = 10'000;
  const auto give_up =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(sharing_.wait_ms);
  int64_t backoff_ms = 2;
  while (true) {
    StatusOr<LeaseResult> turn =
        sharing_.leases->Acquire(kLease, sharing_.holder, "", kTtlMs, sharing_.clock->NowMillis());
    if (!turn.ok()) {
      Restore(pending);
      return turn.status();
    }
    if (turn->outcome != LeaseOutcome::kHeld) {
      Status written = WriteDays(std::move(pending));
      (void)sharing_.leases->Release(kLease, sharing_.holder, turn->lease.token);
      return written;
    }
    if (std::chrono::steady_clock::now() >= give_up) {
      Restore(pending);
      return Status::Ok();  // pending until the next flush
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
    backoff_ms = std::min<int64_t>(backoff_ms * 2, 50);
  }
}

Status CostLedger::WriteDays(std::map<Key, CostCounts> pending) {
  std::map<int64_t, std::map<std::pair<std::string, std::string>, CostCounts>> by_day;
  for (const auto& [key, counts] : pending) {
    by_day[std::get<0>(key)][{std::get<1>(key), std::get<2>(key)}].Add(counts);
  }
  for (auto dit = by_day.begin(); dit != by_day.end(); ++dit) {
    StatusOr<std::map<std::pair<std::string, std::string>, CostCounts>> stored =
        ReadDay(dit->first);
    Status written = stored.status();
    if (stored.ok()) {
      for (const auto& [sm, counts] : dit->second) {
        // Models are named by callers (a replay picks any): past the day's
        // row budget a new (step, model) counts under the step's "(other)"
        // model, so the record stays small enough to read and rewrite.
        auto row = stored->find(sm);
        if (row == stored->end() && stored->size() >= kMaxRowsPerDay) {
          (*stored)[{sm.first, kOtherModel}].Add(counts);
        } else {
          (*stored)[sm].Add(counts);
        }
      }
      Json rows = Json::array();
      for (const auto& [sm, counts] : *stored) {
        Json r = counts.ToJson();
        r["step"] = sm.first;
        r["model"] = sm.second;
        rows.push_back(std::move(r));
      }
      written = meta_.Put(MetaKey(dit->first), Json{{"rows", rows}}.dump());
    }
    if (!written.ok()) {
      // This day and the ones after it stay pending for the next flush.
      std::map<Key, CostCounts> left;
      for (auto rit = dit; rit != by_day.end(); ++rit) {
        for (const auto& [sm, counts] : rit->second) {
          left[Key{rit->first, sm.first, sm.second}].Add(counts);
        }
      }
      Restore(left);
      return written;
    }
  }
  return Status::Ok();
}

StatusOr<std::vector<CostRow>> CostLedger::Rows(int64_t since_ms, int64_t until_ms) {
  const int64_t first = DayNumber(since_ms), last = DayNumber(until_ms);
  if (last < first) return InvalidArgument("the range ends before it starts", "query:since");
  if (last - first + 1 > kMaxRangeDays) {
    return InvalidArgument("a range covers at most " + std::to_string(kMaxRangeDays) + " days",
                           "query:since");
  }
  // Flush first: the pending counts then are in the day records, read once.
  RETURN_IF_ERROR(Flush());
  std::vector<CostRow> out;
  for (int64_t day = first; day <= last; ++day) {
    ASSIGN_OR_RETURN(auto rows, ReadDay(day));
    for (const auto& [sm, counts] : rows) {
      out.push_back(CostRow{DayName(day), sm.first, sm.second, counts});
    }
  }
  return out;
}

}  // namespace idem
