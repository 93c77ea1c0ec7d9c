// Private to daemon/store/rocksdb: our own group commit in front of
// rocksdb::DB::Write.
//
// Writers that arrive while a write is in flight wait together; when it
// ends, one of them becomes the leader, merges every waiting batch into one
// WriteBatch and writes it with one WAL append and one fsync, then wakes the
// others with the shared result. A lone writer writes its own batch inline,
// with no hand-off. This replaces RocksDB's write-group machinery for our
// writes (see the README's design notes for the measurements): on a machine
// with few cores, its spinning waiters and per-follower parallel memtable
// inserts cost more CPU than the fsync they share.
//
// Submit is the asynchronous form for a caller that must not block (an
// event loop): the batch joins the next group and a committer thread leads
// that group if no blocking writer does.
//
// Atomicity: each caller's batch is applied all-or-nothing as part of the
// merged batch; if the merged write fails, every caller in it gets the error
// and none of their records is written.
//
// Thread-safety: Commit may be called from any number of threads.
#pragma once

#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace idem::rocks {

class GroupCommit {
  struct Group;

 public:
  // The group a submitted batch went into.
  class Ticket {
   public:
    // True once the group is written (successfully or not).
    bool done() const;
    // Blocks until done and its on_done has returned; the write's status.
    // (So a caller that waited may free what on_done touches.)
    rocksdb::Status Wait() const;

   private:
    friend class GroupCommit;
    explicit Ticket(std::shared_ptr<Group> g, GroupCommit& owner)
        : group_(std::move(g)), owner_(owner) {}
    std::shared_ptr<Group> group_;
    GroupCommit& owner_;
  };

  // `handles`: every column family a batch may name (the merge maps a
  // family id back to its handle).
  // `on_write` (may be empty) sees the status and duration (microseconds)
  // of every DB::Write, on the writing thread with no lock held, before any
  // caller of that write is woken (the database's health flag and
  // StoreOptions::on_write_micros, rocksdb_database.h).
  // `admit` (may be empty) runs on the writing thread before each DB::Write
  // with the bytes it will write; a status it returns fails the write
  // instead (the free-space check, rocksdb_database.h).
  GroupCommit(rocksdb::DB& db, const std::vector<rocksdb::ColumnFamilyHandle*>& handles,
              std::function<void(const rocksdb::Status&, int64_t micros)> on_write = {},
              std::function<rocksdb::Status(size_t bytes)> admit = {});
  ~GroupCommit();  // joins the committer thread; no Submit may be pending

  // Writes `batch` (synced when `sync`), sharing the write with concurrent
  // callers. Returns when the batch is in the memtable and, if `sync`, on disk.
  rocksdb::Status Commit(rocksdb::WriteBatch& batch, bool sync);

  // Queues `batch` for the next group and returns at once. `on_done` (may
  // be empty) runs on the writing thread after the group is written; it must
  // be quick and must not call into this object. `batch` must stay alive
  // until the ticket is done.
  std::shared_ptr<Ticket> Submit(rocksdb::WriteBatch& batch, bool sync,
                                 std::function<void()> on_done);

  // Counters for tests and benchmarks: how many DB::Write calls were made and
  // how many caller batches they carried.
  uint64_t writes() const;
  uint64_t batches() const;

 private:
  struct Group {
    std::vector<rocksdb::WriteBatch*> batches;
    std::vector<std::function<void()>> on_done;
    bool sync = false;
    bool done = false;
    bool settled = false;  // done, and every on_done has returned
    int waiters = 0;       // blocking callers in this group
    rocksdb::Status status;
    std::condition_variable cv;
  };

  std::shared_ptr<Group> Join(rocksdb::WriteBatch& batch, bool sync);
  // Writes `g` (the filling group) as its leader; `lock` is held on entry
  // and on return.
  void Lead(std::unique_lock<std::mutex>& lock, const std::shared_ptr<Group>& g);
  // Waits until `g` is written, leading it if no write is in progress.
  rocksdb::Status AwaitOrLead(std::unique_lock<std::mutex>& lock, const std::shared_ptr<Group>& g);
  rocksdb::Status WriteGroup(Group& g);
  void CommitterThread();

  rocksdb::DB& db_;
  std::vector<rocksdb::ColumnFamilyHandle*> by_id_;  // family id -> handle
  std::function<void(const rocksdb::Status&, int64_t micros)> on_write_;
  std::function<rocksdb::Status(size_t)> admit_;

  mutable std::mutex mu_;
  std::shared_ptr<Group> filling_;  // the group new writers join; null if none
  bool writing_ = false;            // a leader is inside DB::Write
  uint64_t writes_ = 0;
  uint64_t batches_ = 0;
  std::condition_variable committer_cv_;  // a group with no blocking caller needs a leader
  bool stop_ = false;
  std::thread committer_;
};

}  // namespace idem::rocks
