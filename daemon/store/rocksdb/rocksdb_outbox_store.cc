#include "daemon/store/rocksdb/rocksdb_outbox_store.h"

#include <algorithm>
#include <utility>

#include "daemon/store/record_codec.h"

namespace idem::rocks {
namespace {

std::string CursorKey(const std::string& subscriber) { return "outbox.cursor/" + subscriber; }

std::string DeadKey(const std::string& subscriber, uint64_t seq) {
  return LengthPrefixed(subscriber) + BigEndian8(seq);
}

}  // namespace

StatusOr<std::vector<OutboxEvent>> RocksOutboxStore::After(uint64_t after, size_t limit) {
  std::vector<OutboxEvent> out;
  // Taken before reading: everything at or below it is committed (or never will be).
  const uint64_t watermark = db_.OutboxWatermark();
  if (limit == 0 || after >= watermark) return out;
  std::string upper = BigEndian8(watermark + 1);
  rocksdb::Slice upper_slice(upper);
  rocksdb::ReadOptions ro;
  ro.iterate_upper_bound = &upper_slice;
  std::unique_ptr<rocksdb::Iterator> it = db_.NewIterator(Family::kOutbox, ro);
  for (it->Seek(BigEndian8(after + 1)); it->Valid() && out.size() < limit; it->Next()) {
    ASSIGN_OR_RETURN(
        Json j, store_internal::DecodeJson(std::string_view(it->value().data(), it->value().size()),
                                           "outbox event"));
    ASSIGN_OR_RETURN(OutboxEvent e, OutboxEvent::FromJson(j));
    out.push_back(std::move(e));
  }
  RETURN_IF_ERROR(db_.IteratorStatus(*it, "reading the outbox"));
  return out;
}

StatusOr<uint64_t> RocksOutboxStore::Cursor(const std::string& subscriber) {
  ASSIGN_OR_RETURN(std::optional<std::string> raw, db_.Get(Family::kMeta, CursorKey(subscriber)));
  if (!raw) return uint64_t{0};
  return ReadBigEndian8(*raw);
}

Status RocksOutboxStore::Advance(const std::string& subscriber, uint64_t seq) {
  if (subscriber.empty()) return InvalidArgument("subscriber is empty", "/subscriber");
  MutexLock lock(db_.LockFor(Family::kOutboxDead, subscriber));
  ASSIGN_OR_RETURN(uint64_t current, Cursor(subscriber));
  if (seq <= current) return Status::Ok();
  RecordBatch batch(db_);
  batch.Put(Family::kMeta, CursorKey(subscriber), BigEndian8(seq));
  return db_.Commit(batch, /*durable=*/true);
}

Status RocksOutboxStore::AddDeadLetter(const OutboxDeadLetter& dl) {
  if (dl.subscriber.empty()) return InvalidArgument("subscriber is empty", "/subscriber");
  MutexLock lock(db_.LockFor(Family::kOutboxDead, dl.subscriber));
  ASSIGN_OR_RETURN(uint64_t current, Cursor(dl.subscriber));
  RecordBatch batch(db_);
  batch.PutJson(Family::kOutboxDead, DeadKey(dl.subscriber, dl.event.seq), dl.ToJson());
  if (dl.event.seq > current) {
    batch.Put(Family::kMeta, CursorKey(dl.subscriber), BigEndian8(dl.event.seq));
  }
  return db_.Commit(batch, /*durable=*/true);
}

StatusOr<std::optional<OutboxDeadLetter>> RocksOutboxStore::LoadDead(const std::string& subscriber,
                                                                     uint64_t seq) {
  ASSIGN_OR_RETURN(std::optional<std::string> raw,
                   db_.Get(Family::kOutboxDead, DeadKey(subscriber, seq)));
  if (!raw) return std::optional<OutboxDeadLetter>();
  ASSIGN_OR_RETURN(Json j, store_internal::DecodeJson(*raw, "outbox dead letter"));
  ASSIGN_OR_RETURN(OutboxDeadLetter d, OutboxDeadLetter::FromJson(j));
  return std::optional<OutboxDeadLetter>(std::move(d));
}

StatusOr<std::vector<OutboxDeadLetter>> RocksOutboxStore::DeadLetters(const std::string& subscriber,
                                                                      uint64_t after_seq,
                                                                      size_t limit) {
  std::vector<OutboxDeadLetter> out;
  if (limit == 0) return out;
  // One subscriber's letters are in seq order under its prefix; all of
  // them (an operator's list, a copy) are read whole and sorted.
  const std::string prefix = subscriber.empty() ? "" : LengthPrefixed(subscriber);
  const std::string from = subscriber.empty() ? "" : DeadKey(subscriber, after_seq + 1);
  std::unique_ptr<rocksdb::Iterator> it = db_.NewIterator(Family::kOutboxDead, {});
  for (it->Seek(from); it->Valid() && (subscriber.empty() || out.size() < limit); it->Next()) {
    std::string_view key(it->key().data(), it->key().size());
    if (!key.starts_with(prefix)) break;
    ASSIGN_OR_RETURN(
        Json j, store_internal::DecodeJson(std::string_view(it->value().data(), it->value().size()),
                                           "outbox dead letter"));
    ASSIGN_OR_RETURN(OutboxDeadLetter d, OutboxDeadLetter::FromJson(j));
    if (d.event.seq > after_seq) out.push_back(std::move(d));
  }
  RETURN_IF_ERROR(db_.IteratorStatus(*it, "listing outbox dead letters"));
  if (subscriber.empty()) {
    std::stable_sort(out.begin(), out.end(),
                     [](const auto& a, const auto& b) { return a.event.seq < b.event.seq; });
    if (out.size() > limit) out.resize(limit);
  }
  return out;
}

// The watermark only grows, and at open it starts at the highest seq stored
// or swept, so every seq After() served is at or below it.
StatusOr<uint64_t> RocksOutboxStore::Head() { return db_.OutboxWatermark(); }

StatusOr<uint64_t> RocksOutboxStore::SweptThrough() {
  ASSIGN_OR_RETURN(std::optional<std::string> swept,
                   db_.Get(Family::kMeta, RocksDatabase::kOutboxSweptKey));
  return swept ? ReadBigEndian8(*swept) : uint64_t{0};
}

StatusOr<OutboxDeadLetter> RocksOutboxStore::RequestReplay(const std::string& subscriber,
                                                           uint64_t seq) {
  MutexLock lock(db_.LockFor(Family::kOutboxDead, subscriber));
  ASSIGN_OR_RETURN(std::optional<OutboxDeadLetter> d, LoadDead(subscriber, seq));
  if (!d) {
    return NotFound("no dead letter of subscriber " + subscriber + " for event " +
                    OutboxEvent::IdFor(db_.store_id(), seq));
  }
  if (d->state == "replaying") return std::move(*d);
  d->state = "replaying";
  RecordBatch batch(db_);
  batch.PutJson(Family::kOutboxDead, DeadKey(subscriber, seq), d->ToJson());
  RETURN_IF_ERROR(db_.Commit(batch, /*durable=*/true));
  return std::move(*d);
}

Status RocksOutboxStore::FinishReplay(const std::string& subscriber, uint64_t seq, bool delivered,
                                      const std::string& error, int64_t now_ms) {
  MutexLock lock(db_.LockFor(Family::kOutboxDead, subscriber));
  ASSIGN_OR_RETURN(std::optional<OutboxDeadLetter> d, LoadDead(subscriber, seq));
  if (!d) {
    return NotFound("no dead letter of subscriber " + subscriber + " for event " +
                    OutboxEvent::IdFor(db_.store_id(), seq));
  }
  RecordBatch batch(db_);
  if (delivered) {
    batch.Delete(Family::kOutboxDead, DeadKey(subscriber, seq));
  } else {
    d->state = "dead";
    d->attempts += 1;
    d->last_error = error;
    d->dead_at_ms = now_ms;
    batch.PutJson(Family::kOutboxDead, DeadKey(subscriber, seq), d->ToJson());
  }
  return db_.Commit(batch, /*durable=*/true);
}

StatusOr<size_t> RocksOutboxStore::Sweep(uint64_t through_seq, int64_t cutoff_ms, size_t limit) {
  if (limit == 0 || through_seq == 0) return size_t{0};
  std::string upper = BigEndian8(through_seq + 1);
  rocksdb::Slice upper_slice(upper);
  rocksdb::ReadOptions ro;
  ro.iterate_upper_bound = &upper_slice;
  std::unique_ptr<rocksdb::Iterator> it = db_.NewIterator(Family::kOutbox, ro);
  RecordBatch batch(db_);
  size_t swept = 0;
  uint64_t last = 0;
  for (it->SeekToFirst(); it->Valid() && swept < limit; it->Next()) {
    ASSIGN_OR_RETURN(
        Json j, store_internal::DecodeJson(std::string_view(it->value().data(), it->value().size()),
                                           "outbox event"));
    // Oldest first: the first one inside the window ends the sweep.
    if (j.value("at_ms", int64_t{0}) > cutoff_ms) break;
    last = ReadBigEndian8(std::string_view(it->key().data(), it->key().size()));
    batch.Delete(Family::kOutbox, std::string(it->key().data(), it->key().size()));
    ++swept;
  }
  RETURN_IF_ERROR(db_.IteratorStatus(*it, "sweeping the outbox"));
  if (swept == 0) return swept;
  {
    // Seqs are never reused: the next open continues after the highest one deleted.
    MutexLock lock(db_.LockFor(Family::kMeta, RocksDatabase::kOutboxSweptKey));
    ASSIGN_OR_RETURN(std::optional<std::string> prev,
                     db_.Get(Family::kMeta, RocksDatabase::kOutboxSweptKey));
    if (!prev || ReadBigEndian8(*prev) < last) {
      batch.Put(Family::kMeta, RocksDatabase::kOutboxSweptKey, BigEndian8(last));
    }
    RETURN_IF_ERROR(db_.Commit(batch, /*durable=*/true));
  }
  return swept;
}

}  // namespace idem::rocks
