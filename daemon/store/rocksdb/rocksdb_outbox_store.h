// The outbox (store.h, class OutboxStore) on RocksDB.
//
// Events are staged by the other stores into the batch of the state change
// they report (RecordBatch::AddOutboxEvent): "outbox" holds BE8(seq) ->
// event JSON, read in key order up to the database's outbox watermark
// (rocksdb_database.h). Subscribers' cursors are meta records
// "outbox.cursor/<name>"; their dead letters live in "outbox_dead" under
// LP(subscriber) | BE8(seq). Cursor moves and dead-letter changes hold the
// subscriber's lock stripe.
//
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "daemon/store/rocksdb/rocksdb_database.h"
#include "daemon/store/store.h"

namespace idem::rocks {

class RocksOutboxStore final : public OutboxStore {
 public:
  // `db` must outlive this object.
  explicit RocksOutboxStore(RocksDatabase& db) : db_(db) {}

  StatusOr<std::vector<OutboxEvent>> After(uint64_t after, size_t limit) override;
  StatusOr<uint64_t> Cursor(const std::string& subscriber) override;
  Status Advance(const std::string& subscriber, uint64_t seq) override;
  Status AddDeadLetter(const OutboxDeadLetter& dl) override;
  StatusOr<std::vector<OutboxDeadLetter>> DeadLetters(const std::string& subscriber,
                                                      uint64_t after_seq, size_t limit) override;
  StatusOr<OutboxDeadLetter> RequestReplay(const std::string& subscriber, uint64_t seq) override;
  Status FinishReplay(const std::string& subscriber, uint64_t seq, bool delivered,
                      const std::string& error, int64_t now_ms) override;
  StatusOr<size_t> Sweep(uint64_t through_seq, int64_t cutoff_ms, size_t limit) override;
  StatusOr<uint64_t> Head() override;
  StatusOr<uint64_t> SweptThrough() override;

 private:
  StatusOr<std::optional<OutboxDeadLetter>> LoadDead(const std::string& subscriber, uint64_t seq);
  RocksDatabase& db_;
};

}  // namespace idem::rocks
