#include "daemon/store/rocksdb/group_commit.h"

#include <chrono>
#include <utility>

#include "daemon/core/env.h"

namespace idem::rocks {
namespace {

// Re-stages the records of one caller's batch into the merged batch.
class MergeInto : public rocksdb::WriteBatch::Handler {
 public:
  MergeInto(rocksdb::WriteBatch& out, const std::vector<rocksdb::ColumnFamilyHandle*>& by_id)
      : out_(out), by_id_(by_id) {}

  rocksdb::Status PutCF(uint32_t id, const rocksdb::Slice& key,
                        const rocksdb::Slice& value) override {
    rocksdb::ColumnFamilyHandle* h = Handle(id);
    if (h == nullptr) return Unknown(id);
    return out_.Put(h, key, value);
  }
  rocksdb::Status DeleteCF(uint32_t id, const rocksdb::Slice& key) override {
    rocksdb::ColumnFamilyHandle* h = Handle(id);
    if (h == nullptr) return Unknown(id);
    return out_.Delete(h, key);
  }

 private:
  rocksdb::ColumnFamilyHandle* Handle(uint32_t id) const {
    return id < by_id_.size() ? by_id_[id] : nullptr;
  }
  static rocksdb::Status Unknown(uint32_t id) {
    return rocksdb::Status::InvalidArgument("group commit: unknown column family id " +
                                            std::to_string(id));
  }

  rocksdb::WriteBatch& out_;
  const std::vector<rocksdb::ColumnFamilyHandle*>& by_id_;
};

}  // namespace

GroupCommit::GroupCommit(rocksdb::DB& db, const std::vector<rocksdb::ColumnFamilyHandle*>& handles,
                         std::function<void(const rocksdb::Status&, int64_t micros)> on_write,
                         std::function<rocksdb::Status(size_t)> admit)
    : db_(db), on_write_(std::move(on_write)), admit_(std::move(admit)) {
  for (rocksdb::ColumnFamilyHandle* h : handles) {
    if (h == nullptr) continue;
    uint32_t id = h->GetID();
    if (by_id_.size() <= id) by_id_.resize(id + 1, nullptr);
    by_id_[id] = h;
  }
  committer_ = std::thread([this] {
    NameThread("commit");
    CommitterThread();
  });
}

GroupCommit::~GroupCommit() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  committer_cv_.notify_all();
  committer_.join();
}

rocksdb::Status GroupCommit::WriteGroup(Group& g) {
  rocksdb::WriteOptions wo;
  wo.sync = g.sync;
  size_t bytes = 0;
  for (const rocksdb::WriteBatch* b : g.batches) bytes += b->GetDataSize();
  if (admit_) {
    rocksdb::Status admitted = admit_(bytes);
    if (!admitted.ok()) return admitted;
  }
  if (g.batches.size() == 1) return db_.Write(wo, g.batches.front());
  rocksdb::WriteBatch merged(bytes);
  MergeInto merge(merged, by_id_);
  for (const rocksdb::WriteBatch* b : g.batches) {
    rocksdb::Status s = b->Iterate(&merge);
    if (!s.ok()) return s;
  }
  return db_.Write(wo, &merged);
}

std::shared_ptr<GroupCommit::Group> GroupCommit::Join(rocksdb::WriteBatch& batch, bool sync) {
  if (filling_ == nullptr) filling_ = std::make_shared<Group>();
  filling_->batches.push_back(&batch);
  filling_->sync = filling_->sync || sync;
  return filling_;
}

void GroupCommit::Lead(std::unique_lock<std::mutex>& lock, const std::shared_ptr<Group>& g) {
  // Take the whole group; writers arriving from now on start the next.
  writing_ = true;
  filling_ = nullptr;
  lock.unlock();
  const auto t0 = std::chrono::steady_clock::now();
  rocksdb::Status s = WriteGroup(*g);
  if (on_write_) {
    on_write_(s, std::chrono::duration_cast<std::chrono::microseconds>(
                     std::chrono::steady_clock::now() - t0)
                     .count());
  }
  lock.lock();
  ++writes_;
  batches_ += g->batches.size();
  g->status = s;
  g->done = true;
  g->settled = g->on_done.empty();
  writing_ = false;
  std::shared_ptr<Group> next = filling_;
  // The next group is led by one of its blocking callers, or else by the
  // committer thread. (A caller joining it later finds writing_ false and
  // leads at once.)
  const bool next_has_waiter = next != nullptr && next->waiters > 0;
  std::vector<std::function<void()>> on_done = std::move(g->on_done);
  lock.unlock();
  // Notified after unlocking so that woken writers do not block on mu_.
  g->cv.notify_all();
  if (next != nullptr) {
    if (next_has_waiter) {
      next->cv.notify_one();
    } else {
      committer_cv_.notify_one();
    }
  }
  for (const auto& f : on_done) f();
  lock.lock();
  if (!g->settled) {
    g->settled = true;
    g->cv.notify_all();
  }
}

rocksdb::Status GroupCommit::Commit(rocksdb::WriteBatch& batch, bool sync) {
  std::unique_lock<std::mutex> lock(mu_);
  std::shared_ptr<Group> g = Join(batch, sync);
  return AwaitOrLead(lock, g);
}

rocksdb::Status GroupCommit::AwaitOrLead(std::unique_lock<std::mutex>& lock,
                                         const std::shared_ptr<Group>& g) {
  // Followers wait here; the writer that ends a write hands the lead to one
  // waiter of the next group, which then finds writing_ false. A group not
  // done while nobody writes is still the filling group.
  ++g->waiters;
  g->cv.wait(lock, [&] { return g->done || !writing_; });
  --g->waiters;
  if (!g->done) Lead(lock, g);
  return g->status;
}

std::shared_ptr<GroupCommit::Ticket> GroupCommit::Submit(rocksdb::WriteBatch& batch, bool sync,
                                                         std::function<void()> on_done) {
  std::unique_lock<std::mutex> lock(mu_);
  std::shared_ptr<Group> g = Join(batch, sync);
  if (on_done) g->on_done.push_back(std::move(on_done));
  bool idle = !writing_;
  lock.unlock();
  if (idle) committer_cv_.notify_one();
  return std::shared_ptr<Ticket>(new Ticket(g, *this));
}

void GroupCommit::CommitterThread() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    committer_cv_.wait(lock, [&] { return stop_ || (filling_ != nullptr && !writing_); });
    if (filling_ != nullptr && !writing_) {
      std::shared_ptr<Group> g = filling_;
      Lead(lock, g);
      continue;
    }
    if (stop_) return;
  }
}

bool GroupCommit::Ticket::done() const {
  std::lock_guard<std::mutex> lock(owner_.mu_);
  return group_->done;
}

rocksdb::Status GroupCommit::Ticket::Wait() const {
  std::unique_lock<std::mutex> lock(owner_.mu_);
  rocksdb::Status s = owner_.AwaitOrLead(lock, group_);
  ++group_->waiters;
  group_->cv.wait(lock, [&] { return group_->settled; });
  --group_->waiters;
  return s;
}

uint64_t GroupCommit::writes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return writes_;
}

uint64_t GroupCommit::batches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return batches_;
}

}  // namespace idem::rocks
