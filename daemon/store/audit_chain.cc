// The audit chain rule and its checker (store.h), shared by the RocksDB
// audit log and `idem audit verify`.
#include <string>
#include <utility>

#include "daemon/core/crypto.h"
#include "daemon/core/json.h"
#include "daemon/store/record_codec.h"
#include "daemon/store/store.h"

namespace idem {

Json AuditEvent::ToJson() const { return store_internal::AuditEventToJson(*this); }

StatusOr<AuditEvent> AuditEvent::FromJson(const Json& j) {
  return store_internal::AuditEventFromJson(j);
}

StatusOr<std::string> AuditChainHash(const AuditEvent& e) {
  ASSIGN_OR_RETURN(std::string canonical, CanonicalJson(store_internal::AuditEventBodyToJson(e)));
  return Sha256Hex(e.prev_hash + canonical);
}

void AuditChainCheck::Fail(uint64_t seq, std::string why) {
  if (broken_seq_ != 0) return;
  broken_seq_ = seq == 0 ? 1 : seq;
  detail_ = std::move(why);
}

bool AuditChainCheck::Add(const AuditEvent& e) {
  if (!ok()) return false;
  const uint64_t expected = checked_ + 1;
  if (e.seq != expected) {
    Fail(expected, e.seq > expected ? "event missing (the next stored event is seq " +
                                          std::to_string(e.seq) + ")"
                                    : "events out of order (found seq " + std::to_string(e.seq) +
                                          " where " + std::to_string(expected) + " belongs)");
    return false;
  }
  if (e.prev_hash != last_hash_) {
    Fail(expected, "prev_hash does not link to the previous event");
    return false;
  }
  StatusOr<std::string> hash = AuditChainHash(e);
  if (!hash.ok()) {
    Fail(expected, "cannot hash the event: " + hash.status().message());
    return false;
  }
  if (*hash != e.hash) {
    Fail(expected, "hash does not match the content (the event was modified)");
    return false;
  }
  last_hash_ = e.hash;
  checked_ = expected;
  return true;
}

bool AuditChainCheck::Finish(uint64_t head_seq, const std::string& head_hash) {
  if (!ok()) return false;
  if (checked_ < head_seq) {
    Fail(checked_ + 1, "chain ends at seq " + std::to_string(checked_) +
                           " but the last appended event is seq " + std::to_string(head_seq) +
                           " (events removed from the end)");
  } else if (checked_ > head_seq) {
    Fail(head_seq + 1, "events after the recorded head (seq " + std::to_string(head_seq) + ")");
  } else if (!head_hash.empty() && last_hash_ != head_hash) {
    Fail(head_seq == 0 ? 1 : head_seq, "the last event's hash is not the recorded head's");
  }
  return ok();
}

Status AuditChainCheck::ToStatus() const {
  if (ok()) return Status::Ok();
  return Internal("audit chain broken at seq " + std::to_string(broken_seq_) + ": " + detail_);
}

Status AuditLog::Verify() {
  ASSIGN_OR_RETURN(AuditVerification v, Check());
  if (v.ok) return Status::Ok();
  return Internal("audit chain broken at seq " + std::to_string(v.broken_seq) + ": " + v.detail);
}

}  // namespace idem
