// JsonSchema's direct check (daemon/core/json_schema.h), the hand-written
// fast path in front of valijson for the API's request schemas, against
// valijson itself. The input is a document, or a schema and a document
// split at "\n----\n" (fuzz_util.h). Invariants:
//   - for every API schema with a direct check, and for the input's own
//     schema when it has one: if the direct check accepts the document,
//     valijson accepts it too (the direct check answers only "valid");
//   - Errors is empty exactly when valijson accepts the document.
// valijson's verdict alone comes from the same schema under "allOf",
// a keyword the direct check does not take: the same documents are valid.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/core/json.h"
#include "daemon/core/json_schema.h"
#include "daemon/http/api_schemas.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using idem::Json;
using idem::JsonSchema;

struct Pair {
  std::unique_ptr<JsonSchema> direct;    // with its direct check
  std::unique_ptr<JsonSchema> valijson;  // the same, checked by valijson alone
};

// Null when the schema does not compile or has no direct check.
std::unique_ptr<Pair> Compile(const Json& schema) {
  auto direct = JsonSchema::Create(schema);
  if (!direct.ok() || !(*direct)->HasDirectCheck()) return nullptr;
  auto alone = JsonSchema::Create(Json{{"allOf", Json::array({schema})}});
  FUZZ_CHECK(alone.ok() && !(*alone)->HasDirectCheck());
  auto pair = std::make_unique<Pair>();
  pair->direct = std::move(*direct);
  pair->valijson = std::move(*alone);
  return pair;
}

const std::vector<std::unique_ptr<Pair>>& ApiSchemas() {
  static const auto* schemas = [] {
    auto* out = new std::vector<std::unique_ptr<Pair>>();
    for (const auto& [name, text] : idem::ApiSchemaTexts()) {
      if (auto pair = Compile(Json::parse(text)); pair != nullptr) out->push_back(std::move(pair));
    }
    FUZZ_CHECK(out->size() >= 3);  // the work claim, complete and fail bodies at least
    return out;
  }();
  return *schemas;
}

void Check(const Pair& pair, const Json& doc) {
  const bool valid = pair.valijson->Errors(doc).empty();
  if (pair.direct->DirectlyAccepts(doc)) FUZZ_CHECK(valid);
  FUZZ_CHECK(pair.direct->Errors(doc).empty() == valid);
  FUZZ_CHECK(pair.direct->Validate(doc).ok() == valid);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;
  std::string_view first, second;
  idem::fuzz::SplitTwo(idem::fuzz::AsView(data, size), first, second);
  const idem::JsonLimits limits{.max_depth = 32};
  if (second.empty()) {
    auto doc = idem::ParseJson(first, limits);
    if (!doc.ok()) return 0;
    for (const auto& pair : ApiSchemas()) Check(*pair, *doc);
    return 0;
  }
  auto schema = idem::ParseJson(first, limits);
  auto doc = idem::ParseJson(second, limits);
  if (!schema.ok() || !doc.ok()) return 0;
  if (auto pair = Compile(*schema); pair != nullptr) Check(*pair, *doc);
  for (const auto& api : ApiSchemas()) Check(*api, *doc);
  return 0;
}
