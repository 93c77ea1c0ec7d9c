// What a failed PostgreSQL connection says about its connection string: the
// password never, whatever libpq quotes. No server is needed: a string
// libpq cannot parse fails before any connection is tried.
#include <doctest/doctest.h>

#include <string>

#include "daemon/store/postgres/pg_client.h"

namespace idem::pg {
namespace {

std::string OpenError(const std::string& conninfo) {
  auto pool = Pool::Open(PoolOptions{conninfo, "idem", 1});
  REQUIRE_FALSE(pool.ok());
  CHECK(pool.status().code() == Code::kUnavailable);
  return pool.status().message();
}

}  // namespace

TEST_CASE("a URL with a bad percent-encoding in its password is refused without the password") {
  const std::string message =
      OpenError("postgresql://idemp:p%ssw0rd-SECRET@127.0.0.1:1/idemdb?connect_timeout=1");
  CAPTURE(message);
  CHECK(message.find("postgres: cannot connect: invalid percent-encoded token") !=
        std::string::npos);
  CHECK(message.find("SECRET") == std::string::npos);
  CHECK(message.find("ssw0rd") == std::string::npos);
}

TEST_CASE("a key=value string with a word that is not an option is refused without that word") {
  const std::string message = OpenError("host=127.0.0.1 port=1 DBPASSWORD999");
  CAPTURE(message);
  CHECK(message.find("missing \"=\" after") != std::string::npos);
  CHECK(message.find("DBPASSWORD999") == std::string::npos);
}

TEST_CASE("libpq's quoted text from the connection string is hidden, option names are kept") {
  CHECK(ConninfoFreeMessage("invalid integer value \"x9q7\" for connection option \"port\"",
                            "host=h port=x9q7") ==
        "invalid integer value \"…\" for connection option \"port\"");
  // Quoted text that is not in the connection string stays.
  CHECK(ConninfoFreeMessage("could not open \"/etc/none\"", "host=h") ==
        "could not open \"/etc/none\"");
  // Percent-decoded, as libpq reports a URL's parts.
  CHECK(ConninfoFreeMessage("invalid value: \"a b!c\"", "postgresql://h/d?x=a%20b%21c") ==
        "invalid value: \"…\"");
}

TEST_CASE("the password is hidden wherever libpq's message has it, in every form of the string") {
  CHECK(ConninfoFreeMessage("oops pw-in-url rest", "postgresql://u:pw-in-url@h/d") ==
        "oops … rest");
  CHECK(ConninfoFreeMessage("oops sec ret! rest", "postgresql://u:sec%20ret%21@h/d") ==
        "oops … rest");
  CHECK(ConninfoFreeMessage("oops pw-in-query", "postgresql://u@h/d?password=pw-in-query") ==
        "oops …");
  CHECK(ConninfoFreeMessage("oops it's secret", "host=h password = 'it\\'s secret' port=1") ==
        "oops …");
  CHECK(ConninfoFreeMessage("oops plainpw", "host=h password=plainpw") == "oops …");
  // Too short to hide without hiding noise.
  CHECK(ConninfoFreeMessage("oops abc", "host=h password=abc") == "oops abc");
}

}  // namespace idem::pg
