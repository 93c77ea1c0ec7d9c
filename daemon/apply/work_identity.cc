#include "daemon/apply/work_identity.h"

#include "daemon/core/crypto.h"

namespace idem {

StatusOr<Json> ExtractIdentity(const Json& args, const std::vector<std::string>& fields) {
  if (!args.is_object()) return InvalidArgument("args must be a JSON object", "/args");
  Json identity = Json::object();
  for (const std::string& field : fields) {
    Json::json_pointer ptr;
    try {
      ptr = Json::json_pointer(field);
    } catch (const Json::exception&) {
      return InvalidArgument("identity field '" + field + "' is not a JSON pointer");
    }
    if (!args.contains(ptr)) {
      return InvalidArgument("the identity field " + field + " is missing", "/args" + field);
    }
    // Checked here, where the pointer into args is known: JCS would turn
    // two such integers into one double, and so two effects into one.
    RETURN_IF_ERROR(CheckExactIntegers(args.at(ptr), "/args" + field));
    identity[field] = args.at(ptr);
  }
  return identity;
}

StatusOr<KeyMaterial> ActionWorkId(const ActionConfig& action, const Json& args) {
  ASSIGN_OR_RETURN(Json identity, ExtractIdentity(args, action.identity_fields));
  Normalizers trim;  // R5: " hello " and "hello" are the same work
  trim.trim_strings = true;
  ASSIGN_OR_RETURN(Json normalized, NormalizeInput(identity, trim));
  return ComputeWorkId(action.name, action.identity_version, normalized);
}

std::optional<std::string> ActionKind(const Json& action) {
  if (!action.is_object()) return std::nullopt;
  auto it = action.find("kind");
  if (it == action.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

std::string CallId(const std::string& caller, const std::string& idempotency_key) {
  if (idempotency_key.empty()) return "";
  return Sha256Hex(caller + "\n" + idempotency_key);
}

std::string ActionCallId(const Json& action) {
  if (!action.is_object()) return "";
  auto it = action.find("call_id");
  return it != action.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace idem
