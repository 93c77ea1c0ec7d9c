// VisitRocksStore (store_copy.h): every record of a RocksDB store, read from
// one snapshot and decoded with the codecs the RocksDB stores use.
//
// Records come from the record families (a decision's trace, kept in a
// family of its own, joins its decision); the index families (by time, by
// step, due, expiry, in progress, ...) are derived from them and are not
// visited. Meta holds, besides the facts other components put there, the
// engine's own bookkeeping, which is visited as what it means:
//   "audit.head"             -> OnAuditHead
//   "outbox.cursor/<sub>"    -> OnOutboxCursor
//   "outbox.swept_through"   -> OnOutboxSweptThrough, and part of OnOutboxLastSeq
// and the keys that only make sense to this folder ("store.instance_id",
// "store.write_probe", "idem_keys.in_progress_indexed") are left out. The
// store's id ("store.id") is copied: the copy is the same store, and its
// outbox events keep their event_ids.
#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "daemon/store/record_codec.h"
#include "daemon/store/rocksdb/rocksdb_database.h"
#include "daemon/store/rocksdb/rocksdb_trace_index.h"
#include "daemon/store/store_copy.h"

namespace idem {
namespace {

using rocks::Family;
using rocks::RocksDatabase;

constexpr std::string_view kAuditHeadKey = "audit.head";
constexpr std::string_view kCursorPrefix = "outbox.cursor/";
constexpr std::string_view kEngineOnlyKeys[] = {
    "store.instance_id",     "store.write_probe",     "idem_keys.in_progress_indexed",
    "traces.swept_before",   "leases.expiry_indexed", "escalations.resolved_indexed",
    "plans.finished_indexed"};

std::string_view View(const rocksdb::Slice& s) { return {s.data(), s.size()}; }

// A record's key as an operator can read it (and find it with ldb): its
// printable bytes, others as \xNN, at most 120 characters.
std::string PrintableKey(std::string_view key) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : key) {
    if (out.size() >= 120) return out + "…";
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// Calls fn(key, value) for every entry of family f in the snapshot. An
// error names the family and the record's key: one bad record stops the
// copy, and the operator must be able to find it.
template <typename Fn>
Status ForEach(RocksDatabase& db, const rocksdb::Snapshot* snap, Family f, std::string_view what,
               Fn&& fn) {
  rocksdb::ReadOptions ro;
  ro.snapshot = snap;
  ro.total_order_seek = true;  // the whole family, whatever its prefix extractor
  std::unique_ptr<rocksdb::Iterator> it = db.NewIterator(f, ro);
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    Status s = fn(View(it->key()), View(it->value()));
    if (!s.ok()) {
      return s.Annotate(std::string(what) + " (family " + std::string(rocks::ColumnFamilyName(f)) +
                        ", key \"" + PrintableKey(View(it->key())) + "\")");
    }
  }
  return db.IteratorStatus(*it, what);
}

// A family of JSON records, each decoded with `decode`.
template <typename Decode, typename Visit>
Status ForEachJson(RocksDatabase& db, const rocksdb::Snapshot* snap, Family f,
                   std::string_view what, Decode&& decode, Visit&& visit) {
  return ForEach(db, snap, f, what, [&](std::string_view, std::string_view value) -> Status {
    ASSIGN_OR_RETURN(Json j, store_internal::DecodeJson(value, what));
    auto record = decode(j);
    RETURN_IF_ERROR(record.status());
    return visit(*record);
  });
}

}  // namespace

Status VisitRocksStore(const std::string& path, StoreRecordVisitor& visitor) {
  return VisitRocksStore(path, [&]() -> StatusOr<StoreRecordVisitor*> { return &visitor; });
}

Status VisitRocksStore(const std::string& path,
                       const std::function<StatusOr<StoreRecordVisitor*>()>& visitor_once_open) {
  std::error_code ec;
  if (path.empty() || !std::filesystem::exists(std::filesystem::path(path) / "CURRENT", ec)) {
    return NotFound("no RocksDB store at '" + path + "'");
  }
  StoreOptions options;
  options.path = path;
  options.sync = false;
  // A store a daemon holds: Open says so (Unavailable, "in use by another process").
  ASSIGN_OR_RETURN(std::unique_ptr<RocksDatabase> opened, RocksDatabase::Open(options));
  RocksDatabase& db = *opened;
  ASSIGN_OR_RETURN(StoreRecordVisitor * made, visitor_once_open());
  StoreRecordVisitor& v = *made;
  rocks::ScopedSnapshot snapshot(db.raw());
  const rocksdb::Snapshot* snap = snapshot.get();

  // Each decision whole: its trace, kept apart (rocksdb_decision_store.h), joins it.
  RETURN_IF_ERROR(
      ForEach(db, snap, Family::kDecisions, "decision",
              [&](std::string_view, std::string_view value) -> Status {
                bool apart = false;
                ASSIGN_OR_RETURN(Decision d, store_internal::DecodeDecision(value, &apart));
                if (apart) {
                  ASSIGN_OR_RETURN(std::optional<std::string> trace,
                                   db.Get(Family::kDecisionTraces, d.decision_id, snap));
                  if (!trace) {
                    return Internal("the trace of decision " + d.decision_id + " is missing");
                  }
                  RETURN_IF_ERROR(store_internal::AttachTrace(d, *trace));
                }
                return v.OnDecision(d);
              }));
  RETURN_IF_ERROR(ForEach(db, snap, Family::kDecisionKeys, "decision key",
                          [&](std::string_view key, std::string_view id) {
                            return v.OnCachedDecision(std::string(key), std::string(id));
                          }));
  RETURN_IF_ERROR(ForEachJson(
      db, snap, Family::kIdemKeys, "idempotency key",
      [](const Json& j) { return store_internal::IdemRecordFromJson(j); },
      [&](const IdemRecord& r) { return v.OnIdemRecord(r); }));
  RETURN_IF_ERROR(ForEach(db, snap, Family::kJournal, "journal",
                          [&](std::string_view, std::string_view value) -> Status {
                            ASSIGN_OR_RETURN(WorkItem w, store_internal::DecodeWorkItem(value));
                            return v.OnWorkItem(w);
                          }));
  RETURN_IF_ERROR(ForEachJson(
      db, snap, Family::kPlans, "plan", [](const Json& j) { return Plan::FromJson(j); },
      [&](const Plan& p) { return v.OnPlan(p); }));
  RETURN_IF_ERROR(ForEachJson(
      db, snap, Family::kAudit, "audit event",
      [](const Json& j) { return store_internal::AuditEventFromJson(j); },
      [&](const AuditEvent& e) { return v.OnAuditEvent(e); }));
  RETURN_IF_ERROR(ForEachJson(
      db, snap, Family::kEscalations, "escalation",
      [](const Json& j) { return Escalation::FromJson(j); },
      [&](const Escalation& e) { return v.OnEscalation(e); }));
  uint64_t last_seq = 0;
  RETURN_IF_ERROR(ForEachJson(
      db, snap, Family::kOutbox, "outbox event",
      [](const Json& j) { return OutboxEvent::FromJson(j); },
      [&](const OutboxEvent& e) {
        last_seq = std::max(last_seq, e.seq);
        return v.OnOutboxEvent(e);
      }));
  RETURN_IF_ERROR(ForEachJson(
      db, snap, Family::kOutboxDead, "outbox dead letter",
      [](const Json& j) { return OutboxDeadLetter::FromJson(j); },
      [&](const OutboxDeadLetter& dl) { return v.OnOutboxDeadLetter(dl); }));
  // Trace entries an older build wrote, then the log's; none a sweep hid.
  ASSIGN_OR_RETURN(const int64_t traces_hidden_through, rocks::TraceSweptBefore(db));
  for (Family f : {Family::kTraces, Family::kTraceLog}) {
    RETURN_IF_ERROR(ForEach(
        db, snap, f, "trace entry", [&](std::string_view key, std::string_view value) -> Status {
          ASSIGN_OR_RETURN(Json j, store_internal::DecodeJson(value, "trace entry"));
          ASSIGN_OR_RETURN(TraceEntry e, rocks::TraceEntryFromStored(key, j));
          return e.at_ms <= traces_hidden_through ? Status::Ok() : v.OnTrace(e);
        }));
  }
  RETURN_IF_ERROR(ForEachJson(
      db, snap, Family::kLeases, "lease",
      [](const Json& j) { return store_internal::NamedLeaseFromJson(j); },
      [&](const NamedLease& l) { return v.OnLease(l); }));

  RETURN_IF_ERROR(ForEach(
      db, snap, Family::kMeta, "meta", [&](std::string_view key, std::string_view value) -> Status {
        if (key == kAuditHeadKey) {
          ASSIGN_OR_RETURN(Json j, store_internal::DecodeJson(value, "audit head"));
          if (!j.is_object() || !j.contains("seq") || !j["seq"].is_number_unsigned() ||
              !j.contains("hash") || !j["hash"].is_string()) {
            return Internal("stored audit head is malformed");
          }
          return v.OnAuditHead(j["seq"].get<uint64_t>(), j["hash"].get<std::string>());
        }
        if (key.starts_with(kCursorPrefix)) {
          if (value.size() != 8) return Internal("stored outbox cursor is malformed");
          return v.OnOutboxCursor(std::string(key.substr(kCursorPrefix.size())),
                                  rocks::ReadBigEndian8(value));
        }
        if (key == RocksDatabase::kOutboxSweptKey) {
          if (value.size() != 8) return Internal("stored outbox retention mark is malformed");
          const uint64_t swept = rocks::ReadBigEndian8(value);
          last_seq = std::max(last_seq, swept);
          return swept == 0 ? Status::Ok() : v.OnOutboxSweptThrough(swept);
        }
        for (std::string_view engine_only : kEngineOnlyKeys) {
          if (key == engine_only) return Status::Ok();
        }
        return v.OnMeta(std::string(key), std::string(value));
      }));
  return v.OnOutboxLastSeq(last_seq);
}

}  // namespace idem
