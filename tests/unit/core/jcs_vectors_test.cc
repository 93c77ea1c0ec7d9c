// RFC 8785 reference vectors from tests/testdata/jcs (see its README for source and licence).
#include <doctest/doctest.h>

#include <bit>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "daemon/core/json.h"

namespace idem {
namespace {

const std::string kJcsDir = std::string(IDEM_SOURCE_DIR) + "/tests/testdata/jcs";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path);
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

TEST_CASE("every RFC 8785 input vector canonicalizes to its output byte for byte") {
  for (const char* name : {"arrays", "french", "structures", "unicode", "values", "weird"}) {
    CAPTURE(name);
    const std::string input = ReadFile(kJcsDir + "/input/" + name + ".json");
    const std::string expected = ReadFile(kJcsDir + "/output/" + name + ".json");
    StatusOr<Json> parsed = ParseJson(input);
    REQUIRE_MESSAGE(parsed.ok(), parsed.status().ToString());
    StatusOr<std::string> canonical = CanonicalJson(*parsed);
    REQUIRE_MESSAGE(canonical.ok(), canonical.status().ToString());
    CHECK(*canonical == expected);
  }
}

TEST_CASE("every double in numbers.txt formats as ECMAScript Number-to-String does") {
  std::ifstream in(kJcsDir + "/numbers.txt");
  REQUIRE(in.good());
  std::string line;
  int lines = 0;
  int mismatches = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const size_t comma = line.find(',');
    REQUIRE(comma != std::string::npos);
    const uint64_t bits = std::stoull(line.substr(0, comma), nullptr, 16);
    const std::string expected = line.substr(comma + 1);
    const std::string got = FormatJcsNumber(std::bit_cast<double>(bits));
    ++lines;
    // One CHECK per line would drown the report; show only the first few.
    if (got != expected && ++mismatches <= 10) {
      CHECK_MESSAGE(got == expected, "bits " << line.substr(0, comma));
    }
  }
  CHECK(lines == 20000);
  CHECK(mismatches == 0);
}

}  // namespace
}  // namespace idem
