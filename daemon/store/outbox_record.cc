// The JSON form of an OutboxEvent and an OutboxDeadLetter (store.h): the
// stored form and the wire form (GET /v1/events, webhook bodies) alike.
#include <cstdio>

#include "daemon/core/crypto.h"
#include "daemon/store/store.h"

namespace idem {

std::string OutboxEvent::IdFor(std::string_view store_id, uint64_t seq) {
  char digits[24];
  std::snprintf(digits, sizeof(digits), "%020llu", static_cast<unsigned long long>(seq));
  std::string id = "evt_";
  if (!store_id.empty()) {
    id.append(store_id);
    id.push_back('_');
  }
  id.append(digits);
  return id;
}

std::string NewStoreId() { return RandomHex(8); }

Json OutboxEvent::ToJson() const {
  return Json{{"seq", seq}, {"event_id", event_id}, {"type", type},
              {"key", key}, {"at_ms", at_ms},       {"data", data}};
}

StatusOr<OutboxEvent> OutboxEvent::FromJson(const Json& j) {
  if (!j.is_object()) return Internal("stored outbox event is not an object");
  OutboxEvent e;
  try {
    e.seq = j.at("seq").get<uint64_t>();
    e.event_id = j.at("event_id").get<std::string>();
    e.type = j.at("type").get<std::string>();
    e.key = j.value("key", "");
    e.at_ms = j.value("at_ms", int64_t{0});
    e.data = j.value("data", Json::object());
  } catch (const Json::exception& ex) {
    return Internal(std::string("stored outbox event is malformed: ") + ex.what());
  }
  return e;
}

Json OutboxDeadLetter::ToJson() const {
  return Json{{"subscriber", subscriber}, {"event", event.ToJson()}, {"attempts", attempts},
              {"last_error", last_error}, {"state", state},          {"dead_at_ms", dead_at_ms}};
}

StatusOr<OutboxDeadLetter> OutboxDeadLetter::FromJson(const Json& j) {
  if (!j.is_object()) return Internal("stored outbox dead letter is not an object");
  OutboxDeadLetter d;
  try {
    d.subscriber = j.at("subscriber").get<std::string>();
    StatusOr<OutboxEvent> e = OutboxEvent::FromJson(j.at("event"));
    if (!e.ok()) return e.status();
    d.event = std::move(e).value();
    d.attempts = j.value("attempts", 0);
    d.last_error = j.value("last_error", "");
    d.state = j.value("state", "dead");
    d.dead_at_ms = j.value("dead_at_ms", int64_t{0});
  } catch (const Json::exception& ex) {
    return Internal(std::string("stored outbox dead letter is malformed: ") + ex.what());
  }
  return d;
}

}  // namespace idem
