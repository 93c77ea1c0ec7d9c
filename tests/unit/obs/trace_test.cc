#include "daemon/obs/trace.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>

namespace idem {
namespace {

constexpr char kValid[] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

TEST_CASE("traceparent_of_the_spec_example_is_parsed") {
  auto p = ParseTraceparent(kValid);
  REQUIRE(p.has_value());
  CHECK(p->trace_id == "4bf92f3577b34da6a3ce929d0e0e4736");
  CHECK(p->parent_id == "00f067aa0ba902b7");
  CHECK(p->flags == 1);
}

TEST_CASE("malformed_traceparents_are_refused") {
  const char* bad[] = {
      "",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",       // no flags
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",  // 00 is exactly 55
      "00-00000000000000000000000000000000-00f067aa0ba902b7-01",    // zero trace id
      "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",    // zero parent id
      "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",    // upper-case hex
      "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",    // version ff
      "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",    // version not hex
      "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",    // wrong separator
      "00-4bf92f3577b34da6a3ce929d0e0e473z-00f067aa0ba902b7-01",    // trace id not hex
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",    // flags not hex
      "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",   // future: '-' after 55
  };
  for (const char* v : bad) {
    INFO(v);
    CHECK_FALSE(ParseTraceparent(v).has_value());
  }
}

TEST_CASE("a_future_version_is_read_by_its_version_00_fields") {
  auto p = ParseTraceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03-more");
  REQUIRE(p.has_value());
  CHECK(p->flags == 3);
  CHECK(ParseTraceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03").has_value());
}

TEST_CASE("format_traceparent_round_trips") {
  std::string t = FormatTraceparent("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 0xaf);
  CHECK(t == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-af");
  auto p = ParseTraceparent(t);
  REQUIRE(p.has_value());
  CHECK(p->flags == 0xaf);
}

TEST_CASE("invalid_traceparent_starts_a_new_trace_and_drops_tracestate") {
  TraceContext c = TraceContext::FromHeaders("garbage", "vendor=1", "req-1");
  CHECK(ValidTraceId(c.trace_id));
  CHECK(c.parent_id.empty());
  CHECK(c.tracestate.empty());
  CHECK(c.flags == 1);
  CHECK(c.request_id == "req-1");
  TraceContext d = TraceContext::FromHeaders("", "", "req-2");
  CHECK(d.trace_id != c.trace_id);
}

TEST_CASE("valid_traceparent_is_continued_with_its_tracestate") {
  TraceContext c =
      TraceContext::FromHeaders(kValid, " congo=t61rcWkgMzE , rojo=00f067aa0ba902b7", "r");
  CHECK(c.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736");
  CHECK(c.parent_id == "00f067aa0ba902b7");
  CHECK(c.span_id.size() == 16);
  CHECK(c.span_id != c.parent_id);
  CHECK(c.tracestate == "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7");
}

TEST_CASE("tracestate_with_a_malformed_member_is_discarded") {
  CHECK(BoundTracestate("a=1,=2") == "");
  CHECK(BoundTracestate("a=1,Upper=2") == "");
  CHECK(BoundTracestate("a=1,b") == "");
  CHECK(BoundTracestate("a=1,b=x,y") == "");
  CHECK(BoundTracestate("a=1,,b=2") == "a=1,b=2");  // empty members are allowed
  CHECK(BoundTracestate("tenant@sys=v") == "tenant@sys=v");
}

TEST_CASE("tracestate_is_bounded_to_32_members_and_512_characters") {
  std::string many;
  for (int i = 0; i < 40; ++i) many += (i ? "," : "") + std::string("k") + std::to_string(i) + "=v";
  std::string kept = BoundTracestate(many);
  CHECK(std::count(kept.begin(), kept.end(), ',') == 31);
  CHECK(kept.starts_with("k0=v,"));

  std::string big;
  for (int i = 0; i < 10; ++i) {
    big += (i ? "," : "") + std::string("k") + std::to_string(i) + "=" + std::string(100, 'x');
  }
  kept = BoundTracestate(big);
  CHECK(kept.size() <= kMaxTracestateChars);
  CHECK(std::count(kept.begin(), kept.end(), ',') == 3);  // four members of 103 or 104 chars
}

TEST_CASE("outgoing_headers_carry_the_trace_a_new_span_and_the_request_id") {
  TraceContext c = TraceContext::FromHeaders(kValid, "congo=t61rcWkgMzE", "req-9");
  HttpHeaders h = {{"Traceparent", "stale"}, {"Authorization", "Bearer x"}};
  c.AddHeaders(h);
  std::string tp, ts, rid;
  int traceparents = 0;
  for (const auto& [k, v] : h) {
    if (k == "traceparent" || k == "Traceparent") ++traceparents, tp = v;
    if (k == "tracestate") ts = v;
    if (k == "X-Request-Id") rid = v;
  }
  CHECK(traceparents == 1);
  auto p = ParseTraceparent(tp);
  REQUIRE(p.has_value());
  CHECK(p->trace_id == c.trace_id);
  CHECK(p->parent_id != "00f067aa0ba902b7");  // a new span, not the caller's
  CHECK(p->flags == 1);
  CHECK(ts == "congo=t61rcWkgMzE");
  CHECK(rid == "req-9");
  CHECK(c.OutgoingTraceparent() != c.OutgoingTraceparent());
}

TEST_CASE("trace_scope_sets_and_restores_the_threads_context") {
  CHECK(CurrentTrace() == nullptr);
  {
    TraceScope outer(TraceContext::Continue("4bf92f3577b34da6a3ce929d0e0e4736", "a"));
    CHECK(CurrentTraceId() == "4bf92f3577b34da6a3ce929d0e0e4736");
    {
      TraceScope inner(TraceContext::Continue("", "b"));  // not a trace id: a new trace
      CHECK(ValidTraceId(CurrentTraceId()));
      CHECK(CurrentTraceId() != "4bf92f3577b34da6a3ce929d0e0e4736");
      CHECK(CurrentRequestId() == "b");
    }
    CHECK(CurrentRequestId() == "a");
  }
  CHECK(CurrentTrace() == nullptr);
}

TEST_CASE("trace_events_reach_the_sink_only_inside_a_scope") {
  std::string got;
  SetTraceSink(
      [&](const std::string& trace_id, std::string_view type, std::string_view ref, std::string) {
        got = trace_id + " " + std::string(type) + " " + std::string(ref);
      });
  RecordTraceEvent("decision", "dec_1");
  CHECK(got.empty());
  {
    TraceScope s(TraceContext::Continue("4bf92f3577b34da6a3ce929d0e0e4736", "r"));
    RecordTraceEvent("decision", "dec_1");
  }
  CHECK(got == "4bf92f3577b34da6a3ce929d0e0e4736 decision dec_1");
  SetTraceSink(nullptr);
}

}  // namespace
}  // namespace idem
