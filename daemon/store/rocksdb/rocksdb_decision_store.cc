#include "daemon/store/rocksdb/rocksdb_decision_store.h"

#include <utility>

#include "daemon/core/crypto.h"
#include "daemon/store/record_codec.h"

namespace idem::rocks {
namespace {

bool Live(const Decision& d, int64_t now_ms) {
  return d.expires_at_ms == 0 || d.expires_at_ms > now_ms;
}

Status Validate(const Decision& d) {
  if (d.decision_id.empty()) return InvalidArgument("decision_id is empty", "/decision_id");
  if (d.decision_key.empty()) return InvalidArgument("decision_key is empty", "/decision_key");
  return Status::Ok();
}

// The part of an index key after the optional step prefix: BE8(~created) | id.
std::string Position(const Decision& d) {
  return InvertedBigEndian8(d.created_at_ms) + d.decision_id;
}

std::string ExpiryKey(const Decision& d) { return BigEndian8(d.expires_at_ms) + d.decision_id; }

StatusOr<std::string> DecodeCursor(const std::string& cursor) {
  std::optional<std::string> raw = HexDecode(cursor);
  if (!raw || raw->size() <= 8) return store_internal::BadCursor();
  return std::move(*raw);
}

// The heap a string owns beyond its own object (none within the small
// string buffer).
size_t HeapBytes(const std::string& s) { return s.capacity() > 15 ? s.capacity() + 1 : 0; }

// An estimate of the heap a JSON value owns beyond its own 16 bytes:
// nlohmann keeps strings, objects and arrays behind a pointer, and an
// object member is a std::map node (~48 bytes of links and colour, its key
// and its value).
size_t HeapBytes(const Json& j) {
  switch (j.type()) {
    case Json::value_t::string:
      return sizeof(std::string) + HeapBytes(j.get_ref<const std::string&>());
    case Json::value_t::object: {
      size_t n = 48;
      for (const auto& [k, v] : j.items())
        n += 48 + sizeof(std::string) + 16 + k.size() + HeapBytes(v);
      return n;
    }
    case Json::value_t::array: {
      size_t n = 24 + 16 * j.size();
      for (const Json& v : j) n += HeapBytes(v);
      return n;
    }
    default:
      return 0;
  }
}

// What one cache entry costs: the decision, its key in the map and the map
// node, and the shared_ptr's control block.
size_t ApproxBytes(const Decision& d) {
  size_t n = sizeof(Decision) + 64 + sizeof(std::string) + d.decision_key.size();
  for (const std::string* s : {&d.decision_id, &d.decision_key, &d.step, &d.status, &d.decided_by,
                               &d.provider, &d.model, &d.prompt_version}) {
    n += HeapBytes(*s);
  }
  return n + HeapBytes(d.output) + HeapBytes(d.material) + HeapBytes(d.trace);
}

}  // namespace

StatusOr<std::optional<Decision>> RocksDecisionStore::Load(const std::string& decision_id,
                                                           bool whole,
                                                           const rocksdb::Snapshot* snapshot,
                                                           bool* trace_apart) {
  // The hot record and its trace from one point in time: a sweep between
  // the two reads would otherwise leave a record without its trace.
  std::optional<ScopedSnapshot> own;
  if (whole && snapshot == nullptr) snapshot = own.emplace(db_.raw()).get();
  ASSIGN_OR_RETURN(std::optional<std::string> raw,
                   db_.Get(Family::kDecisions, decision_id, snapshot));
  if (!raw) return std::optional<Decision>();
  bool apart = false;
  ASSIGN_OR_RETURN(Decision d, store_internal::DecodeDecision(*raw, &apart));
  if (trace_apart != nullptr) *trace_apart = apart;
  if (whole && apart) {
    ASSIGN_OR_RETURN(std::optional<std::string> trace,
                     db_.Get(Family::kDecisionTraces, decision_id, snapshot));
    if (!trace) return Internal("the trace of decision " + decision_id + " is missing");
    RETURN_IF_ERROR(store_internal::AttachTrace(d, *trace));
  }
  return std::optional<Decision>(std::move(d));
}

RocksDecisionStore::CacheShard& RocksDecisionStore::ShardFor(const std::string& decision_key) {
  return cache_[std::hash<std::string>{}(decision_key) % kCacheShards];
}

void RocksDecisionStore::Insert(CacheShard& shard, std::shared_ptr<const Decision> d) {
  const size_t bytes = ApproxBytes(*d);
  auto existing = shard.by_key.find(d->decision_key);
  if (existing != shard.by_key.end()) {
    shard.bytes -= existing->second.bytes;
    shard.by_key.erase(existing);
  }
  if (bytes > shard_budget_) return;
  while (shard.bytes + bytes > shard_budget_ && !shard.by_key.empty()) {
    auto victim = shard.by_key.begin();
    shard.bytes -= victim->second.bytes;
    shard.by_key.erase(victim);
  }
  shard.bytes += bytes;
  std::string key = d->decision_key;
  shard.by_key.emplace(std::move(key), CacheEntry{std::move(d), bytes});
}

void RocksDecisionStore::Remember(const Decision& d) {
  auto hot = std::make_shared<Decision>(d);  // shared: readers copy out of it
  store_internal::CutTraceToSummary(*hot);
  std::shared_ptr<const Decision> shared = std::move(hot);
  CacheShard& shard = ShardFor(d.decision_key);
  MutexLock lock(shard.mu);
  shard.generation++;
  Insert(shard, std::move(shared));
}

void RocksDecisionStore::Forget(const std::string& decision_key) {
  CacheShard& shard = ShardFor(decision_key);
  MutexLock lock(shard.mu);
  shard.generation++;
  auto it = shard.by_key.find(decision_key);
  if (it == shard.by_key.end()) return;
  shard.bytes -= it->second.bytes;
  shard.by_key.erase(it);
}

size_t RocksDecisionStore::CachedBytes() {
  size_t total = 0;
  for (CacheShard& shard : cache_) {
    MutexLock lock(shard.mu);
    total += shard.bytes;
  }
  return total;
}

StatusOr<std::optional<Decision>> RocksDecisionStore::Current(const std::string& decision_key) {
  CacheShard& shard = ShardFor(decision_key);
  uint64_t generation = 0;
  {
    MutexLock lock(shard.mu);
    auto it = shard.by_key.find(decision_key);
    if (it != shard.by_key.end()) return std::optional<Decision>(*it->second.decision);
    generation = shard.generation;
  }
  ASSIGN_OR_RETURN(std::optional<std::string> id, db_.Get(Family::kDecisionKeys, decision_key));
  if (!id) return std::optional<Decision>();
  ASSIGN_OR_RETURN(std::optional<Decision> d, Load(*id, /*whole=*/false));
  if (d) {
    store_internal::CutTraceToSummary(*d);  // a record from before the split
    auto shared = std::make_shared<const Decision>(*d);
    MutexLock lock(shard.mu);
    if (shard.generation == generation) Insert(shard, std::move(shared));
  }
  return d;
}

StatusOr<Decision> RocksDecisionStore::GetByKey(const std::string& decision_key, int64_t now_ms) {
  ASSIGN_OR_RETURN(std::optional<Decision> d, Current(decision_key));
  if (!d || !Live(*d, now_ms)) return NotFound("no cached decision for key " + decision_key);
  return std::move(*d);
}

StatusOr<Decision> RocksDecisionStore::Get(const std::string& decision_id) {
  ASSIGN_OR_RETURN(std::optional<Decision> d, Load(decision_id, /*whole=*/true));
  if (!d) return NotFound("no such decision: " + decision_id);
  return std::move(*d);
}

Status RocksDecisionStore::Store(const Decision& d) {
  // Rewriting an id (same decision stored again) must not leave its old
  // index entries behind.
  bool previous_apart = false;
  ASSIGN_OR_RETURN(std::optional<Decision> previous,
                   Load(d.decision_id, /*whole=*/false, nullptr, &previous_apart));
  ASSIGN_OR_RETURN(store_internal::StoredDecision stored, store_internal::EncodeDecision(d));
  RecordBatch batch(db_);
  if (previous) {
    batch.Delete(Family::kDecisionsByTime, Position(*previous));
    batch.Delete(Family::kDecisionsByStep, LengthPrefixed(previous->step) + Position(*previous));
    if (previous->expires_at_ms != 0) {
      batch.Delete(Family::kDecisionsExpiry, ExpiryKey(*previous));
    }
  }
  if (d.expires_at_ms != 0) batch.Put(Family::kDecisionsExpiry, ExpiryKey(d), "");
  batch.Put(Family::kDecisions, d.decision_id, stored.hot);
  if (stored.trace) {
    batch.Put(Family::kDecisionTraces, d.decision_id, *stored.trace);
  } else if (previous_apart) {
    batch.Delete(Family::kDecisionTraces, d.decision_id);
  }
  batch.Put(Family::kDecisionKeys, d.decision_key, d.decision_id);
  batch.Put(Family::kDecisionsByTime, Position(d), "");
  batch.Put(Family::kDecisionsByStep, LengthPrefixed(d.step) + Position(d), "");
  batch.AddOutboxEvent(previous ? "decision.updated" : "decision.created", d.decision_id,
                       d.created_at_ms,
                       Json{{"decision_id", d.decision_id},
                            {"decision_key", d.decision_key},
                            {"step", d.step},
                            {"status", d.status},
                            {"decided_by", d.decided_by}});
  RETURN_IF_ERROR(db_.Commit(batch, /*durable=*/true));
  Remember(d);
  return Status::Ok();
}

StatusOr<Decision> RocksDecisionStore::PutIfAbsent(const Decision& d, int64_t now_ms,
                                                   bool* stored) {
  if (stored != nullptr) *stored = false;
  RETURN_IF_ERROR(Validate(d));
  MutexLock lock(db_.LockFor(Family::kDecisionKeys, d.decision_key));
  ASSIGN_OR_RETURN(std::optional<Decision> current, Current(d.decision_key));
  if (current && Live(*current, now_ms)) return std::move(*current);
  RETURN_IF_ERROR(Store(d));
  if (stored != nullptr) *stored = true;
  return d;
}

Status RocksDecisionStore::Replace(const Decision& d) {
  RETURN_IF_ERROR(Validate(d));
  MutexLock lock(db_.LockFor(Family::kDecisionKeys, d.decision_key));
  return Store(d);
}

StatusOr<DecisionPage> RocksDecisionStore::List(const std::string& step, const std::string& status,
                                                const std::string& cursor, size_t limit) {
  if (limit == 0) return InvalidArgument("limit must be positive", "/limit");
  std::string after;
  if (!cursor.empty()) {
    ASSIGN_OR_RETURN(after, DecodeCursor(cursor));
  }
  Family family = step.empty() ? Family::kDecisionsByTime : Family::kDecisionsByStep;
  std::string prefix = step.empty() ? "" : LengthPrefixed(step);

  ScopedSnapshot snapshot(db_.raw());
  rocksdb::ReadOptions ro;
  ro.snapshot = snapshot.get();
  std::unique_ptr<rocksdb::Iterator> it = db_.NewIterator(family, ro);
  it->Seek(prefix + after);
  if (!after.empty() && it->Valid() && it->key().ToString() == prefix + after) it->Next();

  DecisionPage page;
  std::string last_position;
  for (; it->Valid(); it->Next()) {
    std::string_view key(it->key().data(), it->key().size());
    if (!key.starts_with(prefix)) break;
    std::string_view position = key.substr(prefix.size());
    if (position.size() <= 8) continue;
    ASSIGN_OR_RETURN(std::optional<Decision> loaded,
                     Load(std::string(position.substr(8)), /*whole=*/false, snapshot.get()));
    if (!loaded) continue;
    Decision& d = *loaded;
    if (!status.empty() && d.status != status) continue;
    if (page.items.size() == limit) {
      // One more match exists: the page is full and another follows.
      page.next_cursor = HexEncode(last_position);
      break;
    }
    if (!d.trace_whole) {  // only the page's own items read their traces
      ASSIGN_OR_RETURN(std::optional<std::string> trace,
                       db_.Get(Family::kDecisionTraces, d.decision_id, snapshot.get()));
      if (!trace) return Internal("the trace of decision " + d.decision_id + " is missing");
      RETURN_IF_ERROR(store_internal::AttachTrace(d, *trace));
    }
    last_position.assign(position);
    page.items.push_back(std::move(d));
  }
  RETURN_IF_ERROR(db_.IteratorStatus(*it, "listing decisions"));
  return page;
}

StatusOr<size_t> RocksDecisionStore::SweepExpired(int64_t now_ms, size_t limit,
                                                  std::vector<std::string>* swept_ids) {
  if (limit == 0 || now_ms < 0) return size_t{0};
  ASSIGN_OR_RETURN(
      std::vector<std::string> candidates,
      db_.ExpiredIndexKeys(Family::kDecisionsExpiry, now_ms, limit, "expired decisions"));
  size_t swept = 0;
  ChunkedSweep sweep(db_);
  for (const std::string& index_key : candidates) {
    if (index_key.size() <= 8) continue;
    const std::string id = index_key.substr(8);
    ASSIGN_OR_RETURN(std::optional<Decision> seen, Load(id, /*whole=*/false));
    if (!seen) {
      sweep.batch().Delete(Family::kDecisionsExpiry, index_key);  // stale; not expected
      RETURN_IF_ERROR(sweep.Next());
      continue;
    }
    // The key's stripe, until the chunk is written: a PutIfAbsent or
    // Replace of the same key waits, so it never sees the key pointing at
    // a record that is gone. (Taking it may write the chunk: the batch is
    // looked up after.)
    RETURN_IF_ERROR(sweep.Lock(db_.LockFor(Family::kDecisionKeys, seen->decision_key)));
    RecordBatch& batch = sweep.batch();
    batch.Delete(Family::kDecisionsExpiry, index_key);
    bool apart = false;
    ASSIGN_OR_RETURN(std::optional<Decision> d, Load(id, /*whole=*/false, nullptr, &apart));
    if (d && d->expires_at_ms != 0 && d->expires_at_ms <= now_ms) {
      batch.Delete(Family::kDecisions, id);
      if (apart) batch.Delete(Family::kDecisionTraces, id);
      batch.Delete(Family::kDecisionsByTime, Position(*d));
      batch.Delete(Family::kDecisionsByStep, LengthPrefixed(d->step) + Position(*d));
      ASSIGN_OR_RETURN(std::optional<std::string> current,
                       db_.Get(Family::kDecisionKeys, d->decision_key));
      if (current && *current == id) {
        batch.Delete(Family::kDecisionKeys, d->decision_key);
        sweep.AfterWrite([this, key = d->decision_key] { Forget(key); });
      }
      if (swept_ids != nullptr) swept_ids->push_back(id);
      ++swept;
    }
    // Losing a sweep in a crash only brings back a decision that reads as expired.
    RETURN_IF_ERROR(sweep.Next());
  }
  RETURN_IF_ERROR(sweep.Flush());
  return swept;
}

}  // namespace idem::rocks
