#include "daemon/store/rocksdb/rocksdb_trace_index.h"

#include <chrono>
#include <limits>
#include <random>
#include <utility>

#include "daemon/core/json.h"
#include "daemon/store/record_codec.h"

namespace idem::rocks {
namespace {

constexpr size_t kTraceIdSize = 32;
constexpr size_t kFlushAt = 256;

// The stored text of an entry: the JSON object {at_ms, detail, ref,
// trace_id, type} (members in name order, as Json::dump writes them),
// written without building a Json copy of the detail. False when some text
// is not UTF-8.
bool EncodeEntry(const TraceEntry& e, std::string& out) {
  if (!IsValidUtf8(e.trace_id) || !IsValidUtf8(e.type) || !IsValidUtf8(e.ref)) return false;
  out.assign("{\"at_ms\":");
  out += std::to_string(e.at_ms);
  out += ",\"detail\":";
  try {
    out += e.detail.dump();
  } catch (const Json::exception&) {
    return false;  // dump() throws only for strings that are not UTF-8
  }
  out += ",\"ref\":\"";
  AppendJsonStringContent(e.ref, out);
  out += "\",\"trace_id\":\"";
  AppendJsonStringContent(e.trace_id, out);
  out += "\",\"type\":\"";
  AppendJsonStringContent(e.type, out);
  out += "\"}";
  return true;
}

}  // namespace

StatusOr<TraceEntry> TraceEntryFromJson(const Json& j) {
  if (!j.is_object() || !j.contains("trace_id") || !j["trace_id"].is_string() ||
      !j.contains("type") || !j["type"].is_string()) {
    return Internal("stored trace entry is malformed");
  }
  TraceEntry e;
  e.trace_id = j["trace_id"].get<std::string>();
  e.type = j["type"].get<std::string>();
  if (j.contains("at_ms") && j["at_ms"].is_number_integer()) e.at_ms = j["at_ms"].get<int64_t>();
  if (j.contains("ref") && j["ref"].is_string()) e.ref = j["ref"].get<std::string>();
  if (j.contains("detail")) e.detail = j["detail"];
  return e;
}

RocksTraceIndex::RocksTraceIndex(RocksDatabase& db) : db_(db) {
  // Keys of one millisecond are told apart by seq; a random start keeps a
  // restarted process from reusing the last one's.
  std::random_device rd;
  seq_.store((static_cast<uint64_t>(rd()) << 32) ^ rd());
  thread_ = std::thread([this] { Loop(); });
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

Status RocksTraceIndex::Flush() {
  std::lock_guard<std::mutex> writer(flush_mu_);
  std::vector<TraceEntry> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(queue_);
  }
  if (batch.empty()) return Status::Ok();
  RecordBatch rb(db_);
  std::string key;
  std::string value;
  for (const TraceEntry& e : batch) {
    // An entry that cannot be stored (text that is not UTF-8) is left out
    // rather than failing the others.
    if (!EncodeEntry(e, value)) continue;
    std::string seq = BigEndian8(seq_.fetch_add(1, std::memory_order_relaxed));
    std::string at = BigEndian8(e.at_ms);
    key.assign(e.trace_id).append(at).append(seq);
    rb.Put(Family::kTraces, key, value);
    key.assign(at).append(e.trace_id).append(seq);
    rb.Put(Family::kTracesByTime, key, "");
  }
  return db_.Commit(rb, /*durable=*/false);
}

void RocksTraceIndex::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, std::chrono::milliseconds(200),
                 [this] { return stopping_ || queue_.size() >= kFlushAt; });
    if (stopping_) break;
    if (queue_.empty()) continue;
    lock.unlock();
    (void)Flush();  // a failed write is retried by nobody: the index is best effort
    lock.lock();
  }
}

StatusOr<std::vector<TraceEntry>> RocksTraceIndex::List(const std::string& trace_id, size_t limit) {
  if (trace_id.size() != kTraceIdSize) {
    return InvalidArgument("trace_id must be 32 characters", "/trace_id");
  }
  RETURN_IF_ERROR(Flush());
  std::vector<TraceEntry> out;
  std::string upper = trace_id + std::string(16, '\xff') + '\xff';
  rocksdb::Slice upper_slice(upper);
  rocksdb::ReadOptions ro;
  ro.iterate_upper_bound = &upper_slice;
  std::unique_ptr<rocksdb::Iterator> it = db_.NewIterator(Family::kTraces, ro);
  for (it->Seek(trace_id); it->Valid() && out.size() < limit; it->Next()) {
    if (!it->key().starts_with(trace_id)) break;
    ASSIGN_OR_RETURN(
        Json j, store_internal::DecodeJson(std::string_view(it->value().data(), it->value().size()),
                                           "trace entry"));
    ASSIGN_OR_RETURN(TraceEntry e, TraceEntryFromJson(j));
    out.push_back(std::move(e));
  }
  RETURN_IF_ERROR(RocksDatabase::IteratorStatus(*it, "scanning traces"));
  return out;
}

StatusOr<size_t> RocksTraceIndex::SweepBefore(int64_t cutoff_ms, size_t limit) {
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

}  // namespace idem::rocks
