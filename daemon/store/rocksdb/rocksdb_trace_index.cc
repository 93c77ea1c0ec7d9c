#include "daemon/store/rocksdb/rocksdb_trace_index.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <random>
#include <utility>

#include "daemon/core/env.h"
#include "daemon/core/json.h"
#include "daemon/store/record_codec.h"

namespace idem::rocks {
namespace {

constexpr size_t kTraceIdSize = kTraceIdBytes;
constexpr char kSweptBeforeKey[] = "traces.swept_before";
constexpr size_t kFlushAt = 256;

// The stored text of an entry: what its key (trace_id | BE8(at_ms) |
// BE8(seq)) does not already hold, the JSON object {detail, ref, type}
// (members in name order, as Json::dump writes them; a fifth fewer bytes
// than with trace_id and at_ms), the detail's text copied as it is. False
// when some text is not UTF-8.
bool EncodeEntry(std::string_view trace_id, std::string_view type, std::string_view ref,
                 std::string_view detail, std::string& out) {
  if (!IsValidUtf8(trace_id) || !IsValidUtf8(type) || !IsValidUtf8(ref) || !IsValidUtf8(detail)) {
    return false;
  }
  out.assign("{\"detail\":");
  out += detail.empty() ? std::string_view("{}") : detail;
  out += ",\"ref\":\"";
  AppendJsonStringContent(ref, out);
  out += "\",\"type\":\"";
  AppendJsonStringContent(type, out);
  out += "\"}";
  return true;
}

}  // namespace

StatusOr<TraceEntry> TraceEntryFromStored(std::string_view key, const Json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string() ||
      key.size() < kTraceIdBytes + 8) {
    return Internal("stored trace entry is malformed");
  }
  TraceEntry e;
  e.trace_id = j.contains("trace_id") && j["trace_id"].is_string()
                   ? j["trace_id"].get<std::string>()
                   : std::string(key.substr(0, kTraceIdBytes));
  e.at_ms = j.contains("at_ms") && j["at_ms"].is_number_integer()
                ? j["at_ms"].get<int64_t>()
                : static_cast<int64_t>(ReadBigEndian8(key.substr(kTraceIdBytes, 8)));
  e.type = j["type"].get<std::string>();
  if (j.contains("ref") && j["ref"].is_string()) e.ref = j["ref"].get<std::string>();
  if (j.contains("detail")) e.detail = j["detail"].dump();
  return e;
}

RocksTraceIndex::RocksTraceIndex(RocksDatabase& db) : db_(db) {
  // Keys of one millisecond are told apart by seq; a random start keeps a
  // restarted process from reusing the last one's.
  std::random_device rd;
  seq_.store((static_cast<uint64_t>(rd()) << 32) ^ rd());
  // Unreadable: nothing is hidden, as before any sweep.
  if (StatusOr<int64_t> mark = TraceSweptBefore(db_); mark.ok()) swept_before_.store(*mark);
  thread_ = std::thread([this] {
    NameThread("trace");
    Loop();
  });
}

RocksTraceIndex::~RocksTraceIndex() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  (void)Flush();
}

Status RocksTraceIndex::Add(TraceEntry entry) {
  return Record(entry.trace_id, entry.at_ms, entry.type, entry.ref, std::move(entry.detail));
}

Status RocksTraceIndex::Record(std::string_view trace_id, int64_t at_ms, std::string_view type,
                               std::string_view ref, std::string detail) {
  if (trace_id.size() != kTraceIdSize) {
    return InvalidArgument("trace_id must be 32 characters", "/trace_id");
  }
  if (type.empty()) return InvalidArgument("trace entry type is empty", "/type");
  // Encoded here, outside the lock. An entry that cannot be stored (text
  // that is not UTF-8) is left out, as the writes of the others go on.
  std::string value;
  if (!EncodeEntry(trace_id, type, ref, detail, value)) return Status::Ok();
  std::string key;
  key.reserve(kTraceIdSize + 16);
  key.append(trace_id).append(BigEndian8(at_ms));
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_count_ >= kMaxQueued) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return Status::Ok();
    }
    // Taken under the lock: seqs rise in the pending batch's order.
    key.append(BigEndian8(seq_.fetch_add(1, std::memory_order_relaxed)));
    if (!pending_) pending_ = std::make_unique<RecordBatch>(db_);
    pending_->Put(Family::kTraceLog, key, value);
    wake = ++pending_count_ == kFlushAt;
  }
  if (wake) cv_.notify_all();
  return Status::Ok();
}

Status RocksTraceIndex::Flush() {
  std::lock_guard<std::mutex> writer(flush_mu_);
  std::unique_ptr<RecordBatch> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch = std::move(pending_);
    pending_count_ = 0;
  }
  if (!batch) return Status::Ok();
  return db_.Commit(*batch, /*durable=*/false);
}

void RocksTraceIndex::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  auto next_prune = std::chrono::steady_clock::now();
  while (!stopping_) {
    cv_.wait_for(lock, std::chrono::milliseconds(200),
                 [this] { return stopping_ || pending_count_ >= kFlushAt; });
    if (stopping_) break;
    const bool queued = pending_count_ > 0;
    const bool prune = std::chrono::steady_clock::now() >= next_prune;
    if (!queued && !prune) continue;
    lock.unlock();
    // Best effort: a failed write is retried by nobody, a failed prune by
    // the next one.
    if (queued) (void)Flush();
    if (prune) {
      (void)PruneLog();
      next_prune = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    }
    lock.lock();
  }
}

StatusOr<size_t> RocksTraceIndex::PruneLog() {
  std::lock_guard<std::mutex> lock(sweep_mu_);
  rocksdb::ColumnFamilyMetaData meta;
  db_.raw().GetColumnFamilyMetaData(db_.handle(Family::kTraceLog), &meta);
  // Every file is in level 0 (the family is never compacted); the oldest
  // holds the smallest sequence numbers.
  std::vector<const rocksdb::SstFileMetaData*> files;
  uint64_t total = 0;
  for (const rocksdb::LevelMetaData& level : meta.levels) {
    for (const rocksdb::SstFileMetaData& f : level.files) {
      files.push_back(&f);
      total += f.size;
    }
  }
  std::sort(files.begin(), files.end(),
            [](const auto* a, const auto* b) { return a->smallest_seqno < b->smallest_seqno; });
  const StoreOptions& options = db_.options();
  const int64_t now_s = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  const int64_t retention_s = options.trace_retention_ms / 1000;
  size_t dropped = 0;
  for (const rocksdb::SstFileMetaData* f : files) {
    // file_creation_time: when it was flushed, so no later than its newest entry.
    const bool over_budget = total > options.trace_budget_bytes;
    const bool expired = f->file_creation_time > 0 &&
                         static_cast<int64_t>(f->file_creation_time) + retention_s < now_s;
    if (!over_budget && !expired) break;
    rocksdb::Status s = db_.raw().DeleteFile(f->relative_filename);
    if (!s.ok()) return db_.Translate(s, "dropping the oldest trace log file");
    total -= f->size;
    ++dropped;
  }
  return dropped;
}

StatusOr<std::vector<TraceEntry>> RocksTraceIndex::List(const std::string& trace_id, size_t limit) {
  if (trace_id.size() != kTraceIdSize) {
    return InvalidArgument("trace_id must be 32 characters", "/trace_id");
  }
  RETURN_IF_ERROR(Flush());
  const int64_t hidden_through = swept_before_.load();
  std::vector<TraceEntry> out;
  std::string upper = trace_id + std::string(16, '\xff') + '\xff';
  rocksdb::Slice upper_slice(upper);
  // Entries an older build wrote come first: they are older than any
  // entry of the log.
  for (Family f : {Family::kTraces, Family::kTraceLog}) {
    rocksdb::ReadOptions ro;
    ro.iterate_upper_bound = &upper_slice;
    ro.prefix_same_as_start = f == Family::kTraceLog;
    std::unique_ptr<rocksdb::Iterator> it = db_.NewIterator(f, ro);
    for (it->Seek(trace_id); it->Valid() && out.size() < limit; it->Next()) {
      if (!it->key().starts_with(trace_id)) break;
      ASSIGN_OR_RETURN(
          Json j, store_internal::DecodeJson(
                      std::string_view(it->value().data(), it->value().size()), "trace entry"));
      ASSIGN_OR_RETURN(TraceEntry e, TraceEntryFromStored(
                                         std::string_view(it->key().data(), it->key().size()), j));
      if (e.at_ms <= hidden_through) continue;
      out.push_back(std::move(e));
    }
    RETURN_IF_ERROR(db_.IteratorStatus(*it, "scanning traces"));
  }
  return out;
}

StatusOr<size_t> RocksTraceIndex::SweepBefore(int64_t cutoff_ms, size_t limit) {
  // The log's entries are hidden at once and their space freed with their
  // table file (by the budget or the retention); an older build's entries
  // are deleted one by one, through their time index.
  RETURN_IF_ERROR(HideThrough(cutoff_ms));
  RETURN_IF_ERROR(PruneLog().status());
  ASSIGN_OR_RETURN(std::vector<std::string> keys,
                   db_.ExpiredIndexKeys(Family::kTracesByTime, cutoff_ms, limit, "traces_by_time"));
  if (keys.empty()) return size_t{0};
  RecordBatch rb(db_);
  for (const std::string& k : keys) {
    if (k.size() != 8 + kTraceIdSize + 8) {
      rb.Delete(Family::kTracesByTime, k);
      continue;
    }
    std::string at = k.substr(0, 8), trace = k.substr(8, kTraceIdSize), seq = k.substr(8 + 32);
    rb.Delete(Family::kTraces, trace + at + seq);
    rb.Delete(Family::kTracesByTime, k);
  }
  RETURN_IF_ERROR(db_.Commit(rb, /*durable=*/false));
  return keys.size();
}

Status RocksTraceIndex::HideThrough(int64_t cutoff_ms) {
  std::lock_guard<std::mutex> lock(sweep_mu_);
  if (cutoff_ms <= swept_before_.load()) return Status::Ok();
  RecordBatch rb(db_);
  rb.Put(Family::kMeta, kSweptBeforeKey, BigEndian8(cutoff_ms));
  RETURN_IF_ERROR(db_.Commit(rb, /*durable=*/false));
  swept_before_.store(cutoff_ms);
  return Status::Ok();
}

StatusOr<int64_t> TraceSweptBefore(RocksDatabase& db) {
  ASSIGN_OR_RETURN(std::optional<std::string> v, db.Get(Family::kMeta, kSweptBeforeKey));
  if (!v) return int64_t{0};
  if (v->size() != 8) return Internal("stored trace sweep mark is malformed");
  return static_cast<int64_t>(ReadBigEndian8(*v));
}

}  // namespace idem::rocks
