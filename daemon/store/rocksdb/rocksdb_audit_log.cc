#include "daemon/store/rocksdb/rocksdb_audit_log.h"

#include <optional>
#include <utility>

#include "daemon/core/json.h"
#include "daemon/store/record_codec.h"

namespace idem::rocks {
namespace {

constexpr char kHeadKey[] = "audit.head";

StatusOr<AuditEvent> DecodeEvent(const rocksdb::Slice& value) {
  ASSIGN_OR_RETURN(
      Json j, store_internal::DecodeJson(std::string_view(value.data(), value.size()), "audit"));
  return store_internal::AuditEventFromJson(j);
}

}  // namespace

StatusOr<std::unique_ptr<RocksAuditLog>> RocksAuditLog::Create(RocksDatabase& db) {
  std::unique_ptr<RocksAuditLog> log(new RocksAuditLog(db));
  ASSIGN_OR_RETURN(std::optional<std::string> head, db.Get(Family::kMeta, kHeadKey));
  MutexLock lock(log->mu_);
  if (head) {
    ASSIGN_OR_RETURN(Json j, store_internal::DecodeJson(*head, "audit head"));
    if (!j.is_object() || !j.contains("seq") || !j["seq"].is_number_unsigned() ||
        !j.contains("hash") || !j["hash"].is_string()) {
      return Internal("stored audit head is malformed");
    }
    log->last_seq_ = j["seq"].get<uint64_t>();
    log->last_hash_ = j["hash"].get<std::string>();
    return log;
  }
  // No head: the log must be empty. Otherwise continue after the last
  // event, and let Check report the missing head.
  std::unique_ptr<rocksdb::Iterator> it = db.NewIterator(Family::kAudit, rocksdb::ReadOptions());
  it->SeekToLast();
  if (it->Valid()) {
    ASSIGN_OR_RETURN(AuditEvent last, DecodeEvent(it->value()));
    log->last_seq_ = last.seq;
    log->last_hash_ = last.hash;
    log->head_missing_ = true;
  }
  RETURN_IF_ERROR(db.IteratorStatus(*it, "reading the audit head"));
  return log;
}

StatusOr<uint64_t> RocksAuditLog::Append(AuditEvent event) {
  return AppendWith(std::move(event), nullptr);
}

StatusOr<uint64_t> RocksAuditLog::AppendWith(AuditEvent event,
                                             const std::function<Status(RecordBatch&)>& also) {
  MutexLock lock(mu_);
  event.seq = last_seq_ + 1;
  event.prev_hash = last_hash_;
  ASSIGN_OR_RETURN(event.hash, AuditChainHash(event));
  RecordBatch batch(db_);
  if (also) RETURN_IF_ERROR(also(batch));
  batch.PutJson(Family::kAudit, BigEndian8(event.seq), store_internal::AuditEventToJson(event));
  batch.PutJson(Family::kMeta, kHeadKey, Json{{"seq", event.seq}, {"hash", event.hash}});
  RETURN_IF_ERROR(db_.Commit(batch, /*durable=*/true));
  last_seq_ = event.seq;
  last_hash_ = event.hash;
  head_missing_ = false;
  return event.seq;
}

StatusOr<std::vector<AuditEvent>> RocksAuditLog::Scan(uint64_t from_seq, size_t limit) {
  std::vector<AuditEvent> out;
  if (limit == 0) return out;
  std::unique_ptr<rocksdb::Iterator> it = db_.NewIterator(Family::kAudit, rocksdb::ReadOptions());
  for (it->Seek(BigEndian8(from_seq)); it->Valid() && out.size() < limit; it->Next()) {
    ASSIGN_OR_RETURN(AuditEvent e, DecodeEvent(it->value()));
    out.push_back(std::move(e));
  }
  RETURN_IF_ERROR(db_.IteratorStatus(*it, "scanning the audit log"));
  return out;
}

StatusOr<AuditVerification> RocksAuditLog::Check() {
  AuditVerification v;
  bool head_missing = false;
  std::optional<ScopedSnapshot> snapshot;
  {
    // The snapshot and the head are taken together: every append up to the
    // head is in the snapshot, none after it.
    MutexLock lock(mu_);
    v.head_seq = last_seq_;
    v.head_hash = last_hash_;
    head_missing = head_missing_;
    snapshot.emplace(db_.raw());
  }
  rocksdb::ReadOptions ro;
  ro.snapshot = snapshot->get();
  std::unique_ptr<rocksdb::Iterator> it = db_.NewIterator(Family::kAudit, ro);
  AuditChainCheck check;
  if (head_missing) check.Fail(1, "the log has events but no head record (it was removed)");
  for (it->SeekToFirst(); it->Valid() && check.ok(); it->Next()) {
    std::string_view key(it->key().data(), it->key().size());
    const uint64_t expected = check.checked() + 1;
    StatusOr<AuditEvent> e = DecodeEvent(it->value());
    if (!e.ok()) {
      check.Fail(expected, "undecodable event: " + e.status().message());
      break;
    }
    if (key.size() != 8 || ReadBigEndian8(key) != e->seq) {
      check.Fail(expected, "event seq " + std::to_string(e->seq) + " stored under another seq");
      break;
    }
    check.Add(*e);
  }
  RETURN_IF_ERROR(db_.IteratorStatus(*it, "verifying the audit log"));
  check.Finish(v.head_seq, v.head_hash);
  v.ok = check.ok();
  v.checked = check.checked();
  v.broken_seq = check.broken_seq();
  v.detail = check.detail();
  return v;
}

}  // namespace idem::rocks
