// PostgreSQL TraceIndex (store.h): trace_id -> entries, one table.
//
// Add queues in memory; a background thread writes the queue every 200 ms or
// once 256 entries wait (List and Flush write it first), a few hundred rows
// per INSERT. Entries of one trace are listed by (at_ms, id): id is a
// bigserial taken in queue order, so entries of one millisecond keep their
// arrival order within a daemon. Best effort like on RocksDB: a batch whose
// write fails is not retried.
//
// Thread-safety: all methods may be called concurrently.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "daemon/core/env.h"
#include "daemon/core/json.h"
#include "daemon/store/postgres/pg_store.h"
#include "daemon/store/record_codec.h"

namespace idem::pg {

extern const std::string_view kSchemaTraces = R"sql(
CREATE TABLE traces (
  id       bigserial PRIMARY KEY,
  trace_id text NOT NULL,
  at_ms    bigint NOT NULL,
  type     text NOT NULL,
  ref      text NOT NULL,
  detail   jsonb NOT NULL
);
CREATE INDEX traces_by_trace ON traces (trace_id, at_ms, id);
CREATE INDEX traces_by_time ON traces (at_ms);
)sql";

namespace {

constexpr size_t kTraceIdSize = 32;
constexpr size_t kFlushAt = 256;
constexpr size_t kMaxQueued = 65'536;
constexpr size_t kRowsPerInsert = 500;
constexpr size_t kMaxLimit = 100'000;

class PgTraceIndex final : public TraceIndex {
 public:
  explicit PgTraceIndex(PgContext& ctx) : ctx_(ctx) {
    thread_ = std::thread([this] {
      NameThread("trace");
      Loop();
    });
  }
  ~PgTraceIndex() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    (void)Flush();
  }
  PgTraceIndex(const PgTraceIndex&) = delete;
  PgTraceIndex& operator=(const PgTraceIndex&) = delete;

  Status Add(TraceEntry entry) override {
    if (entry.trace_id.size() != kTraceIdSize) {
      return InvalidArgument("trace_id must be 32 characters", "/trace_id");
    }
    if (entry.type.empty()) return InvalidArgument("trace entry type is empty", "/type");
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.size() >= kMaxQueued) {
        dropped_.fetch_add(1, std::memory_order_relaxed);
        return Status::Ok();
      }
      queue_.push_back(std::move(entry));
      wake = queue_.size() == kFlushAt;
    }
    if (wake) cv_.notify_all();
    return Status::Ok();
  }

  Status Flush() override {
    std::lock_guard<std::mutex> writer(flush_mu_);  // one writer: ids in queue order
    std::vector<TraceEntry> batch;
    {
      std::lock_guard<std::mutex> lock(mu_);
      batch.swap(queue_);
    }
    Status first = Status::Ok();
    for (size_t from = 0; from < batch.size(); from += kRowsPerInsert) {
      // A JSON array of rows, the details' text copied as it is; an entry
      // with text that is not UTF-8 is left out rather than failing the others.
      std::string rows = "[";
      for (size_t i = from; i < std::min(batch.size(), from + kRowsPerInsert); ++i) {
        const TraceEntry& e = batch[i];
        if (!IsValidUtf8(e.detail)) continue;
        JsonObjectWriter row;
        row.Str("trace_id", e.trace_id)
            .Int("at_ms", e.at_ms)
            .Str("type", e.type)
            .Str("ref", e.ref)
            .Raw("detail", e.detail.empty() ? std::string_view("{}") : std::string_view(e.detail));
        if (!row.bad().empty()) continue;
        if (rows.size() > 1) rows += ',';
        rows += row.Take();
      }
      rows += ']';
      Status s = ctx_.pool
                     .Exec(
                         "INSERT INTO traces (trace_id, at_ms, type, ref, detail)"
                         " SELECT v->>'trace_id', (v->>'at_ms')::bigint, v->>'type',"
                         "        coalesce(v->>'ref', ''), coalesce(v->'detail', '{}'::jsonb)"
                         " FROM jsonb_array_elements($1::jsonb) WITH ORDINALITY AS e(v, ord)"
                         " ORDER BY ord",
                         {P(rows)})
                     .status();
      if (first.ok() && !s.ok()) first = s;
    }
    return first;
  }

  StatusOr<std::vector<TraceEntry>> List(const std::string& trace_id, size_t limit) override {
    if (trace_id.size() != kTraceIdSize) {
      return InvalidArgument("trace_id must be 32 characters", "/trace_id");
    }
    RETURN_IF_ERROR(Flush());
    std::vector<TraceEntry> out;
    if (limit == 0) return out;
    ASSIGN_OR_RETURN(
        Result r,
        ctx_.pool.Exec("SELECT at_ms, type, ref, detail::text FROM traces"
                       " WHERE trace_id = $1 ORDER BY at_ms, id LIMIT $2",
                       {P(trace_id), P(static_cast<int64_t>(std::min(limit, kMaxLimit)))}));
    for (int i = 0; i < r.rows(); ++i) {
      TraceEntry e;
      e.trace_id = trace_id;
      e.at_ms = r.i64(i, 0);
      e.type = r.str(i, 1);
      e.ref = r.str(i, 2);
      e.detail = r.str(i, 3);
      out.push_back(std::move(e));
    }
    return out;
  }

  StatusOr<size_t> SweepBefore(int64_t cutoff_ms, size_t limit) override {
    if (limit == 0) return size_t{0};
    RETURN_IF_ERROR(Flush());  // queued entries are swept too
    ASSIGN_OR_RETURN(
        Result r,
        ctx_.pool.Exec("DELETE FROM traces WHERE id IN ("
                       " SELECT id FROM traces WHERE at_ms <= $1"
                       " ORDER BY at_ms LIMIT $2)",
                       {P(cutoff_ms), P(static_cast<int64_t>(std::min(limit, kMaxLimit)))}));
    return static_cast<size_t>(r.affected());
  }

  uint64_t dropped() const override { return dropped_.load(std::memory_order_relaxed); }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      cv_.wait_for(lock, std::chrono::milliseconds(200),
                   [this] { return stopping_ || queue_.size() >= kFlushAt; });
      if (stopping_) break;
      if (queue_.empty()) continue;
      lock.unlock();
      (void)Flush();  // best effort: a failed write is not retried
      lock.lock();
    }
  }

  PgContext& ctx_;
  std::atomic<uint64_t> dropped_{0};
  std::mutex flush_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<TraceEntry> queue_;  // guarded by mu_
  bool stopping_ = false;          // guarded by mu_
  std::thread thread_;             // last: started once the rest is built
};

}  // namespace

std::unique_ptr<TraceIndex> MakePgTraceIndex(PgContext& ctx) {
  return std::make_unique<PgTraceIndex>(ctx);
}

}  // namespace idem::pg
