#include "daemon/ui/ui.h"

namespace idem {

const UiFile* FindUiFile(std::string_view name) {
  for (const UiFile& f : UiFiles()) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

const std::vector<std::pair<std::string, std::string>>& UiHeaders() {
  static const auto* headers = new std::vector<std::pair<std::string, std::string>>{
      {"Cache-Control", "no-store"},
      {"Content-Security-Policy",
       "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"},
      {"X-Content-Type-Options", "nosniff"},
      {"X-Frame-Options", "DENY"},
      {"Referrer-Policy", "no-referrer"},
  };
  return *headers;
}

}  // namespace idem
