#include "daemon/core/crypto.h"

#include <doctest/doctest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace idem {
namespace {

TEST_CASE("sha256 of abc is the FIPS 180-2 vector") {
  CHECK(Sha256Hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(HexEncode(Sha256Raw("abc")) == Sha256Hex("abc"));
  CHECK(Sha256Hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST_CASE("sha256 reuses its context without carrying state, on every thread") {
  // FIPS 180-2's long vectors: one million "a" (many blocks) and the
  // two-block message, hashed between short ones on the same context.
  const std::string million(1'000'000, 'a');
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  const std::string kMillion = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
  const std::string kTwoBlocks = "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1";
  const std::string kAbc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
  const std::string kEmpty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
  CHECK(Sha256Hex(million) == kMillion);
  CHECK(Sha256Hex("abc") == kAbc);
  CHECK(Sha256Hex(two_blocks) == kTwoBlocks);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const bool ok = (i + t) % 3 == 0   ? Sha256Hex("abc") == kAbc
                        : (i + t) % 3 == 1 ? Sha256Hex(two_blocks) == kTwoBlocks
                                           : Sha256Hex("") == kEmpty;
        if (!ok) wrong.fetch_add(1);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  CHECK(wrong.load() == 0);
  CHECK(Sha256Hex("") == kEmpty);
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
