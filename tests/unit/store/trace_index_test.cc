#include <doctest/doctest.h>

#include <string>

#include "daemon/store/store.h"
#include "tests/unit/store/store_test_util.h"

namespace idem {
namespace {

using testing::ClaimReq;
using testing::kT0;
using testing::OpenStore;
using testing::TempDir;

const std::string kTraceA = "4bf92f3577b34da6a3ce929d0e0e4736";
const std::string kTraceB = "4bf92f3577b34da6a3ce929d0e0e4737";  // A's neighbour in key order

TraceEntry Entry(const std::string& trace, int64_t at, const std::string& type,
                 const std::string& ref) {
  return TraceEntry{.trace_id = trace, .at_ms = at, .type = type, .ref = ref, .detail = {{"n", 1}}};
}

TEST_CASE("trace_entries_are_listed_by_trace_in_time_order_queued_ones_too") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  TraceIndex& t = store->traces();
  REQUIRE(t.Add(Entry(kTraceA, kT0 + 20, "plan", "plan_1")).ok());
  REQUIRE(t.Add(Entry(kTraceB, kT0 + 5, "request", "r-b")).ok());
  REQUIRE(t.Add(Entry(kTraceA, kT0 + 10, "decision", "dec_1")).ok());
  REQUIRE(t.Add(Entry(kTraceA, kT0 + 10, "request", "r-a")).ok());  // same ms: arrival order
  auto a = t.List(kTraceA, 100);  // not flushed yet: List writes the queue first
  REQUIRE(a.ok());
  REQUIRE(a->size() == 3);
  CHECK((*a)[0].ref == "dec_1");
  CHECK((*a)[1].ref == "r-a");
  CHECK((*a)[2].ref == "plan_1");
  CHECK((*a)[2].at_ms == kT0 + 20);
  CHECK((*a)[2].detail == Json{{"n", 1}});
  auto b = t.List(kTraceB, 100);
  REQUIRE(b.ok());
  REQUIRE(b->size() == 1);
  CHECK((*b)[0].type == "request");
  CHECK(t.List(kTraceA, 2)->size() == 2);
}

TEST_CASE("trace_entries_survive_a_reopen_and_are_swept_by_age") {
  TempDir dir;
  {
    auto store = OpenStore(dir.path());
    REQUIRE(store->traces().Add(Entry(kTraceA, kT0, "request", "old")).ok());
    REQUIRE(store->traces().Add(Entry(kTraceA, kT0 + 1'000, "request", "new")).ok());
    REQUIRE(store->traces().Flush().ok());
  }
  auto store = OpenStore(dir.path());
  TraceIndex& t = store->traces();
  REQUIRE(t.List(kTraceA, 10)->size() == 2);
  auto swept = t.SweepBefore(kT0 + 999, 100);
  REQUIRE(swept.ok());
  CHECK(*swept == 1);
  auto left = t.List(kTraceA, 10);
  REQUIRE(left->size() == 1);
  CHECK((*left)[0].ref == "new");
  CHECK(*t.SweepBefore(kT0 + 999, 100) == 0);
}

TEST_CASE("a_malformed_trace_entry_is_refused") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  CHECK(store->traces().Add(Entry("short", kT0, "request", "r")).code() == Code::kInvalidArgument);
  CHECK(store->traces().Add(Entry(kTraceA, kT0, "", "r")).code() == Code::kInvalidArgument);
  CHECK(store->traces().List("short", 10).status().code() == Code::kInvalidArgument);
}

TEST_CASE("a_trace_entry_whose_text_is_not_utf8_is_left_out_and_escaped_text_round_trips" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  TraceIndex& t = store->traces();
  TraceEntry odd = Entry(kTraceA, kT0, "request", "r \"q\"\n\\ \x01 \xc3\xa9");
  odd.detail = {{"path", "/v1/x?\"y\"\t\xe2\x82\xac"}, {"n", -3}, {"f", 1.5}, {"z", nullptr}};
  REQUIRE(t.Add(odd).ok());
  REQUIRE(t.Add(Entry(kTraceA, kT0 + 1, "request", "bad \xff")).ok());
  TraceEntry bad_detail = Entry(kTraceA, kT0 + 2, "request", "r2");
  bad_detail.detail = {{"x", "\xc3"}};
  REQUIRE(t.Add(bad_detail).ok());
  auto listed = t.List(kTraceA, 10);
  REQUIRE(listed.ok());
  REQUIRE(listed->size() == 1);
  CHECK((*listed)[0].ref == odd.ref);
  CHECK((*listed)[0].type == "request");
  CHECK((*listed)[0].at_ms == kT0);
  CHECK((*listed)[0].detail == odd.detail);
}

TEST_CASE("a_claim_stores_the_trace_id_of_the_request_that_created_the_work") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  ClaimRequest req = ClaimReq("w-1", kT0);
  req.trace_id = kTraceA;
  REQUIRE(store->journal().Claim(req).ok());
  CHECK(store->journal().Get("w-1")->trace_id == kTraceA);
  ClaimRequest later = ClaimReq("w-1", kT0 + 5'000);  // a retry from another trace
  later.trace_id = kTraceB;
  REQUIRE(store->journal().Claim(later).ok());
  CHECK(store->journal().Get("w-1")->trace_id == kTraceA);
}

}  // namespace
}  // namespace idem
