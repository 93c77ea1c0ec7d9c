#include "daemon/http/decision_fallback.h"

#include <list>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "daemon/core/mutex.h"

namespace idem {
namespace {

// The last decisions seen, by id, with an index by key for the current one.
class DecisionMemory {
 public:
  explicit DecisionMemory(size_t capacity) : capacity_(capacity) {}

  void Remember(const Decision& d, bool current) {
    MutexLock lock(mu_);
    auto it = by_id_.find(d.decision_id);
    if (it != by_id_.end()) {
      lru_.erase(it->second);
      by_id_.erase(it);
    }
    lru_.push_front(d);
    by_id_[d.decision_id] = lru_.begin();
    if (current) current_[d.decision_key] = d.decision_id;
    while (lru_.size() > capacity_) {
      const Decision& old = lru_.back();
      auto cur = current_.find(old.decision_key);
      if (cur != current_.end() && cur->second == old.decision_id) current_.erase(cur);
      by_id_.erase(old.decision_id);
      lru_.pop_back();
    }
  }
  std::optional<Decision> ById(const std::string& id) {
    MutexLock lock(mu_);
    auto it = by_id_.find(id);
    // One remembered from GetByKey has only its trace's summary; Get promises it whole.
    if (it == by_id_.end() || !it->second->trace_whole) return std::nullopt;
    return *it->second;
  }
  std::optional<Decision> ByKey(const std::string& key, int64_t now_ms) {
    MutexLock lock(mu_);
    auto cur = current_.find(key);
    if (cur == current_.end()) return std::nullopt;
    auto it = by_id_.find(cur->second);
    if (it == by_id_.end()) return std::nullopt;
    const Decision& d = *it->second;
    if (d.expires_at_ms != 0 && d.expires_at_ms <= now_ms) return std::nullopt;
    return d;
  }

 private:
  const size_t capacity_;
  Mutex mu_;
  std::list<Decision> lru_ GUARDED_BY(mu_);
  std::unordered_map<std::string, std::list<Decision>::iterator> by_id_ GUARDED_BY(mu_);
  std::unordered_map<std::string, std::string> current_ GUARDED_BY(mu_);  // key -> id
};

class FallbackDecisions final : public DecisionStore {
 public:
  FallbackDecisions(DecisionStore& inner, size_t capacity) : inner_(inner), memory_(capacity) {}

  StatusOr<Decision> GetByKey(const std::string& decision_key, int64_t now_ms) override {
    StatusOr<Decision> d = inner_.GetByKey(decision_key, now_ms);
    if (d.ok()) {
      memory_.Remember(*d, true);
    } else if (d.status().code() == Code::kUnavailable) {
      if (auto kept = memory_.ByKey(decision_key, now_ms)) return *std::move(kept);
    }
    return d;
  }
  StatusOr<Decision> Get(const std::string& decision_id) override {
    StatusOr<Decision> d = inner_.Get(decision_id);
    if (d.ok()) {
      memory_.Remember(*d, false);
    } else if (d.status().code() == Code::kUnavailable) {
      if (auto kept = memory_.ById(decision_id)) return *std::move(kept);
    }
    return d;
  }
  StatusOr<Decision> PutIfAbsent(const Decision& d, int64_t now_ms,
                                 bool* written = nullptr) override {
    StatusOr<Decision> stored = inner_.PutIfAbsent(d, now_ms, written);
    if (stored.ok()) memory_.Remember(*stored, true);
    return stored;
  }
  Status Replace(const Decision& d) override {
    Status s = inner_.Replace(d);
    if (s.ok()) memory_.Remember(d, true);
    return s;
  }
  StatusOr<DecisionPage> List(const std::string& step, const std::string& status,
                              const std::string& cursor, size_t limit) override {
    return inner_.List(step, status, cursor, limit);
  }
  StatusOr<size_t> SweepExpired(int64_t now_ms, size_t limit,
                                std::vector<std::string>* swept_ids) override {
    return inner_.SweepExpired(now_ms, limit, swept_ids);
  }

 private:
  DecisionStore& inner_;
  DecisionMemory memory_;
};

class FallbackStore final : public Store {
 public:
  FallbackStore(std::unique_ptr<Store> inner, size_t capacity)
      : inner_(std::move(inner)), decisions_(inner_->decisions(), capacity) {}

  DecisionStore& decisions() override { return decisions_; }
  IdemKeyStore& idem_keys() override { return inner_->idem_keys(); }
  Journal& journal() override { return inner_->journal(); }
  PlanStore& plans() override { return inner_->plans(); }
  AuditLog& audit() override { return inner_->audit(); }
  LeaseStore& leases() override { return inner_->leases(); }
  MetaStore& meta() override { return inner_->meta(); }
  EscalationStore& escalations() override { return inner_->escalations(); }
  OutboxStore& outbox() override { return inner_->outbox(); }
  TraceIndex& traces() override { return inner_->traces(); }
  Status WriteHealth() const override { return inner_->WriteHealth(); }
  StatusOr<int64_t> ClockMillis() override { return inner_->ClockMillis(); }
  bool shared() const override { return inner_->shared(); }
  std::vector<SizePart> MemoryUsage() override { return inner_->MemoryUsage(); }
  StatusOr<std::vector<SizePart>> DiskUsage() override { return inner_->DiskUsage(); }
  std::optional<uint64_t> DiskFreeBytes() override { return inner_->DiskFreeBytes(); }

 private:
  std::unique_ptr<Store> inner_;
  FallbackDecisions decisions_;
};

}  // namespace

std::unique_ptr<Store> WithDecisionFallback(std::unique_ptr<Store> inner, size_t capacity) {
  return std::make_unique<FallbackStore>(std::move(inner), capacity);
}

}  // namespace idem
