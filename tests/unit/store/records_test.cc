#include <doctest/doctest.h>

#include <string>

#include "daemon/store/record_codec.h"
#include "daemon/store/store.h"

namespace idem {
namespace {

TEST_CASE("records round-trip through their JSON form") {
  WorkItem w;
  w.work_id = "w1";
  w.kind = "send";
  w.state = WorkState::kFailed;
  w.attempt = 2;
  w.args = Json{{"a", 1}};
  w.result = Json::array({1, 2});
  w.window_ms = 5'000;
  w.last_error = "e";
  StatusOr<WorkItem> back = WorkItem::FromJson(w.ToJson());
  REQUIRE(back.ok());
  CHECK(back->ToJson() == w.ToJson());
  CHECK(w.ToJson()["state"] == "failed");

  Decision d;
  d.decision_id = "dec_1";
  d.decision_key = "k";
  d.output = Json{{"x", "y"}};
  d.expires_at_ms = 9;
  d.trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
  REQUIRE(Decision::FromJson(d.ToJson()).ok());
  CHECK(Decision::FromJson(d.ToJson())->trace_id == d.trace_id);
  CHECK(Decision::FromJson(d.ToJson())->ToJson() == d.ToJson());

  Plan p;
  p.plan_id = "plan_1";
  p.state = "approved";
  p.history.push_back(Json{{"from", "proposed"}});
  p.trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
  REQUIRE(Plan::FromJson(p.ToJson()).ok());
  CHECK(Plan::FromJson(p.ToJson())->trace_id == p.trace_id);
  CHECK(Plan::FromJson(p.ToJson())->ToJson() == p.ToJson());
}

TEST_CASE("malformed stored records decode as Internal, never as an exception") {
  CHECK(WorkItem::FromJson(Json::array()).status().code() == Code::kInternal);
  CHECK(WorkItem::FromJson(Json{{"work_id", "w"}}).status().code() == Code::kInternal);
  CHECK(WorkItem::FromJson(Json{{"work_id", "w"}, {"state", "sleeping"}}).status().code() ==
        Code::kInternal);
  CHECK(WorkItem::FromJson(Json{{"work_id", "w"}, {"state", "done"}, {"attempt", "2"}})
            .status()
            .code() == Code::kInternal);
  CHECK(WorkItem::FromJson(
            Json{{"work_id", "w"}, {"state", "done"}, {"attempt", int64_t{1'000'000'000'000}}})
            .status()
            .code() == Code::kInternal);
  CHECK(Decision::FromJson(Json{{"decision_id", 5}, {"decision_key", "k"}}).status().code() ==
        Code::kInternal);
  CHECK(Decision::FromJson(nullptr).status().code() == Code::kInternal);
  CHECK(Plan::FromJson(Json{{"plan_id", "p"}, {"state", "s"}, {"history", "no"}}).status().code() ==
        Code::kInternal);
  CHECK(Plan::FromJson(Json{{"plan_id", "p"}}).status().code() == Code::kInternal);
}

TEST_CASE("records written before a field existed still decode") {
  StatusOr<WorkItem> w = WorkItem::FromJson(Json{{"work_id", "w"}, {"state", "done"}});
  REQUIRE(w.ok());
  CHECK(w->window_ms == 0);
  CHECK(w->max_attempts == 5);
  CHECK(w->trace_id.empty());
  CHECK(w->call_id.empty());
  CHECK(store_internal::DecodeWorkItem(R"({"work_id":"w","state":"done"})")->trace_id.empty());
  CHECK(store_internal::DecodeWorkItem(R"({"work_id":"w","state":"done"})")->call_id.empty());
  CHECK(Decision::FromJson(Json{{"decision_id", "d"}, {"decision_key", "k"}})->trace_id.empty());
  CHECK(Plan::FromJson(Json{{"plan_id", "p"}, {"state", "applied"}})->trace_id.empty());
}

TEST_CASE("a_work_record_leaves_out_members_at_their_default_and_decodes_them_back") {
  WorkItem w;
  w.work_id = "w1";
  w.kind = "send";
  w.state = WorkState::kRunning;
  w.attempt = 1;
  w.identity = Json{{"id", 5}};
  w.created_at_ms = 13;
  w.updated_at_ms = 13;
  StatusOr<std::string> encoded = store_internal::EncodeWorkItem(w);
  REQUIRE(encoded.ok());
  Json stored = Json::parse(*encoded);
  for (const char* left_out : {"lease_token", "locked_until_ms", "args", "result", "external_ref",
                               "last_error", "next_attempt_at_ms", "expires_at_ms", "run_id",
                               "request_id", "trace_id", "window_ms", "call_id"}) {
    CHECK_MESSAGE(!stored.contains(left_out), left_out);
  }
  CHECK(stored.size() == 8);
  StatusOr<WorkItem> decoded = store_internal::DecodeWorkItem(*encoded);
  REQUIRE(decoded.ok());
  CHECK(decoded->ToJson() == w.ToJson());
  CHECK(decoded->args == Json::object());
  CHECK(decoded->result.is_null());
}

TEST_CASE("the journal's streaming decoder agrees with WorkItem::FromJson") {
  WorkItem w;
  w.work_id = "w1";
  w.kind = "send";
  w.state = WorkState::kDone;
  w.attempt = 3;
  w.max_attempts = 7;
  w.lease_token = "tok";
  w.locked_until_ms = 11;
  w.args = Json{{"to", "x"}, {"list", Json::array({1, Json{{"deep", Json::array({})}}, "s"})}};
  w.identity = Json{{"id", 5}, {"nested", Json{{"a", nullptr}, {"b", true}, {"c", 1.5}}}};
  w.result = Json::array({Json::object(), -3, 18446744073709551615ull});
  w.external_ref = "ref";
  w.last_error = "err";
  w.next_attempt_at_ms = 12;
  w.created_at_ms = 13;
  w.updated_at_ms = 14;
  w.expires_at_ms = 15;
  w.run_id = "run";
  w.request_id = "req";
  w.trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
  w.window_ms = 16;
  w.call_id = std::string(64, 'c');
  Json j = w.ToJson();
  j["future_field"] = Json{{"x", Json::array({1, 2})}};
  StatusOr<WorkItem> streamed = store_internal::DecodeWorkItem(j.dump());
  REQUIRE_MESSAGE(streamed.ok(), streamed.status().ToString());
  CHECK(streamed->ToJson() == w.ToJson());

  // The direct encoder writes the same members; the decoder reads them back.
  StatusOr<std::string> encoded = store_internal::EncodeWorkItem(w);
  REQUIRE(encoded.ok());
  CHECK(Json::parse(*encoded) == w.ToJson());
  StatusOr<WorkItem> decoded = store_internal::DecodeWorkItem(*encoded);
  REQUIRE(decoded.ok());
  CHECK(decoded->ToJson() == w.ToJson());
  WorkItem odd = w;
  odd.last_error = "quote \" backslash \\ newline \n tab \t ctrl \x01 caf\xc3\xa9";
  StatusOr<std::string> odd_text = store_internal::EncodeWorkItem(odd);
  REQUIRE(odd_text.ok());
  CHECK(store_internal::DecodeWorkItem(*odd_text)->last_error == odd.last_error);
  odd.external_ref = "bad \xff byte";
  CHECK(store_internal::EncodeWorkItem(odd).status().code() == Code::kInvalidArgument);

  Json scalar_result = w.ToJson();
  scalar_result["result"] = 7;
  CHECK(store_internal::DecodeWorkItem(scalar_result.dump())->result == 7);

  for (const char* bad :
       {"", "[]", "5", "{", R"({"work_id":"w"})", R"({"state":"done"})",
        R"({"work_id":"w","state":"sleeping"})", R"({"work_id":"w","state":"done","attempt":"1"})",
        R"({"work_id":"w","state":"done","attempt":{}})",
        R"({"work_id":"w","state":"done","attempt":1e3})",
        R"({"work_id":"w","state":"done","max_attempts":99999999999})",
        R"({"work_id":7,"state":"done"})", R"({"work_id":"w","state":"done"} x)"}) {
    StatusOr<WorkItem> r = store_internal::DecodeWorkItem(bad);
    CHECK_MESSAGE(r.status().code() == Code::kInternal, bad);
  }
}

// Found by tests/fuzz/fuzz_records (its corpus keeps the input): the
// streaming decoder took an other_runs that was not an array for an
// unknown member and let it pass, where WorkItem::FromJson refuses it.
TEST_CASE("the streaming decoder refuses an other_runs that is not an array, as FromJson does") {
  for (const char* text : {R"({"work_id":"w","state":"done","other_runs":null})",
                           R"({"work_id":"w","state":"done","other_runs":7})",
                           R"({"work_id":"w","state":"done","other_runs":"run"})",
                           R"({"work_id":"w","state":"done","other_runs":{"a":"run"}})"}) {
    CHECK_MESSAGE(!WorkItem::FromJson(Json::parse(text)).ok(), text);
    StatusOr<WorkItem> streamed = store_internal::DecodeWorkItem(text);
    CHECK_MESSAGE(streamed.status().code() == Code::kInternal, text);
  }
  StatusOr<WorkItem> listed =
      store_internal::DecodeWorkItem(R"({"work_id":"w","state":"done","other_runs":["a","b"]})");
  REQUIRE(listed.ok());
  CHECK(listed->other_runs == std::vector<std::string>{"a", "b"});
}

}  // namespace
}  // namespace idem
