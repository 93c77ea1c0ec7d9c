// CostLedger: what deciding cost and what the cache saved, per UTC day, step
// and model (GET /v1/stats/cost, `idem cost`).
//
// The decide engine records every provider answer (RecordCall: tokens and
// the USD price from config.prices) and every cache hit (RecordHit: the
// cached decision's own cost, trace.cost_usd, which the hit did not spend
// again). Recording is off the store's path: counts are added in memory
// (a few striped maps, one short lock per record), and Flush, called by the
// daemon's sweeper about once a second and at shutdown, merges them into the
// MetaStore, one record per day under "cost/day/YYYY-MM-DD". A crash loses
// at most the last second of counts; numbers are statistics, not a bill.
// Daemons sharing one store (issue 13) each keep their own pending counts;
// with CostLedgerSharing their flushes (read-modify-write of the day
// records) take turns under the named lease "cost:flush", so that no
// daemon's counts overwrite another's.
//
// Rows reads the days of a range (whole UTC days: a range is widened to the
// days it touches) from the MetaStore plus what is not flushed yet.
//
// Errors: Flush and Rows return the MetaStore's errors (Unavailable); counts
// a failed Flush could not write stay pending for the next one.
// InvalidArgument (field "query:since") for a range of more than
// kMaxRangeDays days or one that ends before it starts.
//
// Thread-safety: every method may be called concurrently.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "daemon/core/env.h"
#include "daemon/core/mutex.h"
#include "daemon/core/status.h"
#include "daemon/store/store.h"

namespace idem {

struct CostCounts {
  int64_t calls = 0;  // provider answers (a repair attempt is a call of its own)
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  double spent_usd = 0;
  int64_t hits = 0;  // decides answered from the cache
  double saved_usd = 0;

  void Add(const CostCounts& o);
  Json ToJson() const;
  static CostCounts FromJson(const Json& j);
};

struct CostRow {
  std::string day;  // YYYY-MM-DD (UTC)
  std::string step;
  std::string model;
  CostCounts counts;
};

// How the ledgers of daemons sharing one store take turns (null: alone).
struct CostLedgerSharing {
  LeaseStore* leases = nullptr;  // must outlive the ledger
  StableClock* clock = nullptr;  // required with leases
  std::string holder;            // "" : "cost-" + 16 random hex
  // How long a Flush waits for another daemon's flush before it leaves its
  // counts pending for the next one.
  int64_t wait_ms = 500;
};

class CostLedger {
 public:
  static constexpr int64_t kMaxRangeDays = 3660;

  // `meta` must outlive the ledger.
  explicit CostLedger(MetaStore& meta, CostLedgerSharing sharing = {});

  void RecordCall(int64_t now_ms, const std::string& step, const std::string& model,
                  int64_t input_tokens, int64_t output_tokens, double usd);
  void RecordHit(int64_t now_ms, const std::string& step, const std::string& model,
                 double saved_usd);

  // Writes pending counts to the MetaStore (nothing when none are pending).
  Status Flush();

  // Every (day, step, model) row of the days from since_ms to until_ms,
  // oldest day first.
  StatusOr<std::vector<CostRow>> Rows(int64_t since_ms, int64_t until_ms);

  // "YYYY-MM-DD" of the UTC day holding `ms`.
  static std::string DayOf(int64_t ms);

 private:
  using Key = std::tuple<int64_t, std::string, std::string>;  // day number, step, model
  struct Shard {
    Mutex mu;
    std::map<Key, CostCounts> pending GUARDED_BY(mu);
  };
  static constexpr size_t kShards = 8;

 public:
  // A day keeps at most this many (step, model) rows; past them a new
  // model's counts go to its step's kOtherModel row.
  static constexpr size_t kMaxRowsPerDay = 1'000;
  static constexpr char kOtherModel[] = "(other)";

 private:
  void Add(int64_t now_ms, const std::string& step, const std::string& model,
           const CostCounts& delta);
  std::map<Key, CostCounts> TakePending();
  void Restore(const std::map<Key, CostCounts>& counts);
  StatusOr<std::map<std::pair<std::string, std::string>, CostCounts>> ReadDay(int64_t day);

  // Writes `pending` into the day records (the caller holds the turn).
  Status WriteDays(std::map<Key, CostCounts> pending);

  MetaStore& meta_;
  const CostLedgerSharing sharing_;
  std::array<Shard, kShards> shards_;
  Mutex flush_mu_;  // one Flush (read-modify-write of day records) at a time
};

}  // namespace idem
