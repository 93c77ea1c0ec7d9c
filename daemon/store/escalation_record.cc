// The JSON form of an Escalation (store.h).
#include "daemon/store/store.h"

namespace idem {

Json Escalation::ToJson() const {
  Json j = {{"escalation_id", escalation_id},
            {"decision_key", decision_key},
            {"step", step},
            {"state", state},
            {"input", input},
            {"material", material},
            {"context", context},
            {"created_at_ms", created_at_ms}};
  if (!decision_id.empty()) j["decision_id"] = decision_id;
  if (!resolved_by.empty()) j["resolved_by"] = resolved_by;
  if (resolved_at_ms != 0) j["resolved_at_ms"] = resolved_at_ms;
  return j;
}

StatusOr<Escalation> Escalation::FromJson(const Json& j) {
  if (!j.is_object()) return Internal("stored escalation is not an object");
  Escalation e;
  try {
    e.escalation_id = j.at("escalation_id").get<std::string>();
    e.decision_key = j.at("decision_key").get<std::string>();
    e.step = j.value("step", "");
    e.state = j.value("state", "open");
    e.input = j.value("input", Json::object());
    e.material = j.value("material", Json());
    e.context = j.value("context", Json::object());
    e.decision_id = j.value("decision_id", "");
    e.resolved_by = j.value("resolved_by", "");
    e.created_at_ms = j.value("created_at_ms", int64_t{0});
    e.resolved_at_ms = j.value("resolved_at_ms", int64_t{0});
  } catch (const Json::exception& ex) {
    return Internal(std::string("stored escalation is malformed: ") + ex.what());
  }
  return e;
}

}  // namespace idem
