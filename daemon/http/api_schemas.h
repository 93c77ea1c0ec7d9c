// The JSON Schemas of every request and response body (schemas/api/*.json,
// embedded at build time), by file name without ".json".
#pragma once

#include <map>
#include <string>

namespace idem {

const std::map<std::string, std::string>& ApiSchemaTexts();

}  // namespace idem
