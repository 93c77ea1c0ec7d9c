#include "daemon/core/crypto.h"

#include <doctest/doctest.h>

namespace idem {
namespace {

TEST_CASE("sha256 of abc is the FIPS 180-2 vector") {
  CHECK(Sha256Hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(HexEncode(Sha256Raw("abc")) == Sha256Hex("abc"));
  CHECK(Sha256Hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST_CASE("hmac-sha256 matches RFC 4231 test case 2") {
  CHECK(HmacSha256Hex("Jefe", "what do ya want for nothing?") ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST_CASE("constant-time comparison tells equal from different strings") {
  CHECK(ConstantTimeEquals("token-123", "token-123"));
  CHECK(ConstantTimeEquals("", ""));
  CHECK_FALSE(ConstantTimeEquals("token-123", "token-124"));
  CHECK_FALSE(ConstantTimeEquals("token-123", "token-12"));
  CHECK_FALSE(ConstantTimeEquals("", "x"));
}

TEST_CASE("random hex has two characters per byte and differs between calls") {
  const std::string a = RandomHex(16);
  CHECK(a.size() == 32);
  CHECK(a.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(a != RandomHex(16));
}

}  // namespace
}  // namespace idem
