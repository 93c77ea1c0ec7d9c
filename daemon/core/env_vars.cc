#include "daemon/core/env_vars.h"

#include <cstdlib>

namespace idem {

StatusOr<std::string> ExpandEnv(const std::string& value, const std::string& field,
                                std::vector<std::string>* used) {
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t start = value.find("${", pos);
    if (start == std::string::npos) break;
    const size_t end = value.find('}', start);
    if (end == std::string::npos) return InvalidArgument("unclosed '${' in a header value", field);
    out += value.substr(pos, start - pos);
    const std::string var = value.substr(start + 2, end - start - 2);
    const char* v = var.empty() ? nullptr : std::getenv(var.c_str());
    if (v == nullptr || *v == '\0') {
      return Status(Code::kFailedPrecondition,
                    "the environment variable " + var + " (named in a header) is not set", field);
    }
    out += v;
    if (used != nullptr) used->emplace_back(v);
    pos = end + 1;
  }
  out += value.substr(pos);
  return out;
}

}  // namespace idem
