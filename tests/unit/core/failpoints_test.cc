#include "daemon/core/failpoints.h"

#include <doctest/doctest.h>

namespace idem {
namespace {

// Failpoints are process-wide; every case leaves them cleared.
struct ClearFailpoints {
  ~ClearFailpoints() { Failpoints::Clear(); }
};

TEST_CASE("an error failpoint makes every hit fail as Unavailable") {
  ClearFailpoints guard;
  REQUIRE(Failpoints::Set("x=error").ok());
  Status s = Failpoints::Hit("x");
  CHECK(s.code() == Code::kUnavailable);
  CHECK(Failpoints::Hit("x").code() == Code::kUnavailable);
  CHECK(Failpoints::Hit("y").ok());
}

TEST_CASE("an Nth-hit failpoint fires on that hit only") {
  ClearFailpoints guard;
  REQUIRE(Failpoints::Set("x=2*error").ok());
  CHECK(Failpoints::Hit("x").ok());
  CHECK_FALSE(Failpoints::Hit("x").ok());
  CHECK(Failpoints::Hit("x").ok());
}

TEST_CASE("a failpoint over a range of hits fires on each of them and then stops") {
  ClearFailpoints guard;
  REQUIRE(Failpoints::Set("x=2-3*error").ok());
  CHECK(Failpoints::Hit("x").ok());
  CHECK_FALSE(Failpoints::Hit("x").ok());
  CHECK_FALSE(Failpoints::Hit("x").ok());
  CHECK(Failpoints::Hit("x").ok());
  CHECK(Failpoints::Set("x=3-2*error").code() == Code::kInvalidArgument);
  CHECK(Failpoints::Set("x=0*error").code() == Code::kInvalidArgument);
}

TEST_CASE("a malformed failpoint spec is rejected") {
  ClearFailpoints guard;
  CHECK(Failpoints::Set("x").code() == Code::kInvalidArgument);
  CHECK(Failpoints::Set("=error").code() == Code::kInvalidArgument);
  CHECK(Failpoints::Set("x=explode").code() == Code::kInvalidArgument);
}

TEST_CASE("clearing failpoints makes hits succeed again") {
  ClearFailpoints guard;
  REQUIRE(Failpoints::Set("x=error").ok());
  Failpoints::Clear();
  CHECK(Failpoints::Hit("x").ok());
}

}  // namespace
}  // namespace idem
