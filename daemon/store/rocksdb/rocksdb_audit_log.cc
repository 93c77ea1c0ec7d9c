#include "daemon/store/rocksdb/rocksdb_audit_log.h"

#include <optional>
#include <utility>

#include "daemon/core/crypto.h"
#include "daemon/core/json.h"
#include "daemon/store/record_codec.h"

namespace idem::rocks {
namespace {

StatusOr<std::string> ChainHash(const AuditEvent& e) {
  ASSIGN_OR_RETURN(std::string canonical, CanonicalJson(store_internal::AuditEventBodyToJson(e)));
  return Sha256Hex(e.prev_hash + canonical);
}

StatusOr<AuditEvent> DecodeEvent(const rocksdb::Slice& value) {
  ASSIGN_OR_RETURN(
      Json j, store_internal::DecodeJson(std::string_view(value.data(), value.size()), "audit"));
  return store_internal::AuditEventFromJson(j);
}

}  // namespace

StatusOr<std::unique_ptr<RocksAuditLog>> RocksAuditLog::Create(RocksDatabase& db) {
  std::unique_ptr<RocksAuditLog> log(new RocksAuditLog(db));
  std::unique_ptr<rocksdb::Iterator> it = db.NewIterator(Family::kAudit, rocksdb::ReadOptions());
  it->SeekToLast();
  if (it->Valid()) {
    ASSIGN_OR_RETURN(AuditEvent last, DecodeEvent(it->value()));
    MutexLock lock(log->mu_);
    log->last_seq_ = last.seq;
    log->last_hash_ = last.hash;
  }
  RETURN_IF_ERROR(RocksDatabase::IteratorStatus(*it, "reading the audit head"));
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
  ASSIGN_OR_RETURN(event.hash, ChainHash(event));
  RecordBatch batch(db_);
  if (also) RETURN_IF_ERROR(also(batch));
  batch.PutJson(Family::kAudit, BigEndian8(event.seq), store_internal::AuditEventToJson(event));
  RETURN_IF_ERROR(db_.Commit(batch, /*durable=*/true));
  last_seq_ = event.seq;
  last_hash_ = event.hash;
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
  RETURN_IF_ERROR(RocksDatabase::IteratorStatus(*it, "scanning the audit log"));
  return out;
}

Status RocksAuditLog::Verify() {
  uint64_t head_seq = 0;
  std::string head_hash;
  std::optional<ScopedSnapshot> snapshot;
  {
    // The snapshot and the head are taken together: every append up to the
    // head is in the snapshot, none after it.
    MutexLock lock(mu_);
    head_seq = last_seq_;
    head_hash = last_hash_;
    snapshot.emplace(db_.raw());
  }
  rocksdb::ReadOptions ro;
  ro.snapshot = snapshot->get();
  std::unique_ptr<rocksdb::Iterator> it = db_.NewIterator(Family::kAudit, ro);
  uint64_t expected = 1;
  std::string prev_hash;
  auto broken = [](uint64_t seq, const std::string& why) {
    return Internal("audit chain broken at seq " + std::to_string(seq) + ": " + why);
  };
  for (it->SeekToFirst(); it->Valid(); it->Next(), ++expected) {
    std::string_view key(it->key().data(), it->key().size());
    StatusOr<AuditEvent> e = DecodeEvent(it->value());
    if (!e.ok()) return broken(expected, e.status().message());
    if (key.size() != 8 || ReadBigEndian8(key) != expected || e->seq != expected) {
      return broken(expected, "event missing or out of order");
    }
    if (e->prev_hash != prev_hash) return broken(expected, "prev_hash does not link");
    ASSIGN_OR_RETURN(std::string hash, ChainHash(*e));
    if (e->hash != hash) return broken(expected, "hash does not match the content");
    prev_hash = e->hash;
  }
  RETURN_IF_ERROR(RocksDatabase::IteratorStatus(*it, "verifying the audit log"));
  if (expected - 1 != head_seq || prev_hash != head_hash) {
    return broken(expected, "chain ends before the last appended event");
  }
  return Status::Ok();
}

}  // namespace idem::rocks
