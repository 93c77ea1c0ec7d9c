#include "providers/replay/replay_provider.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "daemon/core/identity.h"
#include "daemon/core/json.h"

namespace idem {

StatusOr<std::unique_ptr<ReplayProvider>> ReplayProvider::Create(const ProviderConfig& config) {
  std::ifstream in(config.file_path, std::ios::binary);
  if (!in) return InvalidArgument(config.file_path + ": cannot read the replay file");
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0 || static_cast<uint64_t>(size) > kMaxFileBytes) {
    return InvalidArgument(config.file_path + ": a replay file may hold at most " +
                           std::to_string(kMaxFileBytes >> 20) + " MiB");
  }
  in.seekg(0);
  std::ostringstream text;
  text << in.rdbuf();
  return FromText(text.str(), config.file_path);
}

StatusOr<std::unique_ptr<ReplayProvider>> ReplayProvider::FromText(std::string_view jsonl,
                                                                   std::string source) {
  if (jsonl.size() > kMaxFileBytes) {
    return InvalidArgument(source + ": a replay file may hold at most " +
                           std::to_string(kMaxFileBytes >> 20) + " MiB");
  }
  JsonLimits limits;
  limits.max_bytes = 16 << 20;
  limits.max_depth = 128;
  std::map<std::string, Json> outputs;
  size_t line_no = 0;
  while (!jsonl.empty()) {
    ++line_no;
    const size_t nl = jsonl.find('\n');
    std::string_view line = jsonl.substr(0, nl);
    jsonl = nl == std::string_view::npos ? std::string_view() : jsonl.substr(nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    const std::string at = source + ":" + std::to_string(line_no) + ": ";
    StatusOr<Json> parsed = ParseJson(line, limits);
    if (!parsed.ok()) return InvalidArgument(at + parsed.status().message());
    const Json& d = *parsed;
    if (!d.is_object() || !d.contains("decision_key") || !d["decision_key"].is_string() ||
        !d.contains("material") || !d.contains("output")) {
      return InvalidArgument(at + "not a decision (decision_key, material and output)");
    }
    StatusOr<KeyMaterial> key = DecisionKeyOfMaterial(d["material"]);
    if (!key.ok()) {
      return InvalidArgument(at + key.status().field() + ": " + key.status().message());
    }
    if (key->key != d["decision_key"].get<std::string>()) {
      return InvalidArgument(at + "/decision_key: does not match the key material (edited line?)");
    }
    outputs.emplace(key->key, d["output"]);  // the first line for a key wins
  }
  return std::unique_ptr<ReplayProvider>(new ReplayProvider(std::move(source), std::move(outputs)));
}

StatusOr<ProviderResponse> ReplayProvider::Complete(const ProviderRequest& request) {
  calls_.fetch_add(1);
  auto it = outputs_.find(request.decision_key);
  if (it == outputs_.end()) {
    return Status(Code::kFailedPrecondition,
                  "replay file " + source_ + " has no decision for step " + request.step +
                      " with key " + request.decision_key +
                      " (recorded under another provider name, model, prompt or input?)",
                  "", /*retryable=*/false);
  }
  ProviderResponse r;
  r.output = it->second;
  r.raw_text = it->second.dump();
  r.finish_reason = "replay";
  return r;
}

}  // namespace idem
