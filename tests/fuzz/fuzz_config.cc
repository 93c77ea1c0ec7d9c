// The YAML config loader (daemon/config): ParseYaml on arbitrary text, and
// LoadConfig on the same text written to a file (the loader reads files:
// paths in the config resolve against the file's directory). Invariants: no
// crash, no exception escaping (Status at the boundary), no leak.
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>

#include "daemon/config/config.h"
#include "daemon/config/yaml_document.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

void WriteFile(const std::string& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
}

// One private directory per fuzzing process, laid out as the unit tests'
// ConfigDir (tests/unit/config/config_test.cc) so that the seeds' file
// references (prompts/p.mustache, rules.yaml, checks.yaml,
// ../schemas/out.json) resolve and the fuzzer gets past them.
const std::string& ConfigPath() {
  static const std::string* path = [] {
    std::string root = "/tmp/idem_fuzz_config.XXXXXX";
    if (::mkdtemp(root.data()) == nullptr) std::abort();
    for (const char* dir : {"/conf", "/conf/prompts", "/schemas"}) {
      if (::mkdir((root + dir).c_str(), 0700) != 0) std::abort();
    }
    WriteFile(root + "/conf/prompts/p.mustache", "Ticket: {{{input.text}}}\n");
    WriteFile(root + "/conf/rules.yaml", "rules: []\n");
    WriteFile(root + "/conf/checks.yaml",
              "data: {max: 3}\nchecks:\n  - name: small\n"
              "    rule: {\"<=\": [{var: output.n}, {var: policy.max}]}\n"
              "    message: too big\n");
    WriteFile(root + "/schemas/out.json",
              R"({"type": "object", "properties": {"a": {"type": "string"}}})");
    return new std::string(root + "/conf/idem.yaml");
  }();
  return *path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 8192) return 0;
  std::string_view text = idem::fuzz::AsView(data, size);
  idem::StatusOr<idem::YamlDocument> doc = idem::ParseYaml(text, "fuzz.yaml");
  if (!doc.ok()) return 0;
  WriteFile(ConfigPath(), text);
  idem::StatusOr<idem::Config> config = idem::LoadConfig(ConfigPath());
  if (config.ok()) (void)idem::DescribeContracts(*config);
  return 0;
}
