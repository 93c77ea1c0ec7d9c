// Metrics (daemon/obs/metrics.h): the histogram, labelled families, the
// text-format exposition and the README's metrics reference.
#include "daemon/obs/metrics.h"

#include <doctest/doctest.h>

#include <atomic>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace idem {
namespace {

bool Contains(const std::string& text, const std::string& line) {
  return text.find(line) != std::string::npos;
}

TEST_CASE("histogram_counts_each_observation_in_the_first_bucket_it_does_not_exceed") {
  const double bounds[] = {0.1, 1};
  Histogram h(bounds);
  h.ObserveSeconds(0.05);
  h.ObserveSeconds(0.1);  // on the bound: le="0.1"
  h.ObserveMicros(500'000);
  h.ObserveSeconds(5);
  h.ObserveSeconds(-1);  // counted as 0
  Histogram::Snapshot s = h.Read();
  REQUIRE(s.cumulative.size() == 3);
  CHECK(s.cumulative[0] == 3);
  CHECK(s.cumulative[1] == 4);
  CHECK(s.cumulative[2] == 5);
  CHECK(s.count == 5);
  CHECK(s.sum_s == doctest::Approx(5.65));
}

TEST_CASE("histogram_renders_cumulative_buckets_sum_and_count_in_text_format") {
  const double bounds[] = {0.5, 2};
  Family<Histogram> f("idem_test_seconds", "Test durations.", {"route"}, bounds);
  Histogram& h = f.Declare({"GET /x"});
  h.ObserveSeconds(0.25);
  h.ObserveSeconds(1);
  h.ObserveSeconds(10);
  std::string out;
  f.Render(out);
  CHECK(out ==
        "# HELP idem_test_seconds Test durations.\n"
        "# TYPE idem_test_seconds histogram\n"
        "idem_test_seconds_bucket{route=\"GET /x\",le=\"0.5\"} 1\n"
        "idem_test_seconds_bucket{route=\"GET /x\",le=\"2\"} 2\n"
        "idem_test_seconds_bucket{route=\"GET /x\",le=\"+Inf\"} 3\n"
        "idem_test_seconds_sum{route=\"GET /x\"} 11.25\n"
        "idem_test_seconds_count{route=\"GET /x\"} 3\n");
}

TEST_CASE("label_values_and_help_are_escaped") {
  CHECK(EscapeLabelValue("a\"b\\c\nd") == "a\\\"b\\\\c\\nd");
  CHECK(EscapeHelp("x\\y\nz \"q\"") == "x\\\\y\\nz \"q\"");
  Family<Counter> f("idem_test_total", "Line one\nline two.", {"kind"});
  f.Declare({"we\"ird"}).Inc(2);
  std::string out;
  f.Render(out);
  CHECK(Contains(out, "# HELP idem_test_total Line one\\nline two.\n"));
  CHECK(Contains(out, "idem_test_total{kind=\"we\\\"ird\"} 2\n"));
}

TEST_CASE("family_declare_is_idempotent_and_its_cardinality_is_bounded") {
  Family<Counter> f("idem_test_total", "Test.", {"kind"});
  Counter& a = f.Declare({"a"});
  CHECK(&f.Declare({"a"}) == &a);
  // Find never creates a series from a value it was not declared with.
  Counter& unknown = f.Find({"from-a-request"});
  CHECK(&unknown == &f.Declare({"other"}));
  CHECK(&f.Find({"a"}) == &a);
  for (size_t i = 0; i < Family<Counter>::kMaxSeries + 10; ++i) {
    f.Declare({"k" + std::to_string(i)}).Inc();
  }
  std::string out;
  f.Render(out);
  size_t series = 0;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);)
    series += line.rfind("idem_test_total{", 0) == 0;
  CHECK(series == Family<Counter>::kMaxSeries);
  CHECK(Contains(out, "idem_test_total{kind=\"other\"} "));
  CHECK_FALSE(Contains(out, "kind=\"from-a-request\""));
}

TEST_CASE("duplicate_counter_is_labelled_by_kind_and_counts_each_increment_once") {
  Metrics m;
  Counter& send = m.Duplicates("send_reply");
  m.Duplicates("refund");
  send.Inc();
  std::string out = m.RenderPrometheus();
  CHECK(Contains(out, "idem_work_duplicates_total{kind=\"send_reply\"} 1\n"));
  CHECK(Contains(out, "idem_work_duplicates_total{kind=\"refund\"} 0\n"));
}

TEST_CASE("a_gauge_nobody_could_read_renders_as_nan_not_as_zero") {
  Metrics m;
  m.dead_letter_count.SetUnknown();
  m.plans_by_state.Declare({"approved"}).SetUnknown();
  std::string out = m.RenderPrometheus();
  CHECK(Contains(out, "\nidem_dead_letters NaN\n"));
  CHECK(Contains(out, "idem_plans{state=\"approved\"} NaN\n"));
  m.dead_letter_count.Set(3);
  CHECK(Contains(m.RenderPrometheus(), "\nidem_dead_letters 3\n"));
}

TEST_CASE("provider_cost_is_rendered_in_dollars") {
  Metrics m;
  ProviderMetrics p = m.ForProvider("openai", "gpt-x");
  p.AddCostUsd(0.0125);
  p.AddCostUsd(0.0000005);
  p.tokens[0]->Inc(120);
  std::string out = m.RenderPrometheus();
  CHECK(Contains(out,
                 "idem_provider_cost_usd_total{provider=\"openai\",model=\"gpt-x\"} 0.0125005\n"));
  CHECK(Contains(
      out, "idem_provider_tokens_total{provider=\"openai\",model=\"gpt-x\",type=\"input\"} 120\n"));
  CHECK(Contains(
      out,
      "idem_provider_errors_total{provider=\"openai\",model=\"gpt-x\",class=\"timeout\"} 0\n"));
}

TEST_CASE("route_metrics_count_by_status_class_and_time_each_request") {
  Metrics m;
  RouteMetrics r = m.ForRoute("POST /v1/decide");
  r.Observe(200, 1500);
  r.Observe(201, 1500);
  r.Observe(503, 10);
  r.Count(404);
  std::string out = m.RenderPrometheus();
  CHECK(Contains(out, "idem_http_requests_total{route=\"POST /v1/decide\",code=\"2xx\"} 2\n"));
  CHECK(Contains(out, "idem_http_requests_total{route=\"POST /v1/decide\",code=\"4xx\"} 1\n"));
  CHECK(Contains(out, "idem_http_requests_total{route=\"POST /v1/decide\",code=\"5xx\"} 1\n"));
  CHECK(Contains(out, "idem_http_request_duration_seconds_count{route=\"POST /v1/decide\"} 3\n"));
  CHECK(Contains(
      out,
      "idem_http_request_duration_seconds_bucket{route=\"POST /v1/decide\",le=\"0.0025\"} 3\n"));
}

TEST_CASE("concurrent_observations_are_all_counted") {
  Metrics m;
  Histogram& h = m.store_write;
  Counter& c = m.decide_cache_hits.Declare({"s"});
  constexpr int kThreads = 4, kEach = 2'000'000;
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) {
      }
      for (int i = 0; i < kEach; ++i) {
        h.ObserveMicros(i % 3);  // the same few buckets: the most contention
        c.Inc();
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(h.Read().count == uint64_t{kThreads} * kEach);
  CHECK(c.Get() == uint64_t{kThreads} * kEach);
}

// The README's table is the metrics reference: every family rendered must be
// in it with the same type, and every row must be a family the daemon renders.
TEST_CASE("every_rendered_metric_is_in_the_readme_table_and_every_row_is_rendered") {
  std::ifstream in(std::string(IDEM_SOURCE_DIR) + "/README.md");
  REQUIRE(in.good());
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string readme = buf.str();
  size_t begin = readme.find("<!-- metrics-reference:begin -->");
  size_t end = readme.find("<!-- metrics-reference:end -->");
  REQUIRE(begin != std::string::npos);
  REQUIRE(end != std::string::npos);
  std::map<std::string, std::string> documented;
  const std::regex row("^\\| `(idem_[a-z0-9_]+)` \\| (counter|gauge|histogram) \\|");
  std::istringstream rows(readme.substr(begin, end - begin));
  for (std::string line; std::getline(rows, line);) {
    std::smatch m;
    if (std::regex_search(line, m, row)) documented[m[1]] = m[2];
  }
  REQUIRE(documented.size() > 20);

  Metrics m;
  std::map<std::string, std::string> rendered;
  std::istringstream text(m.RenderPrometheus());
  for (std::string line; std::getline(text, line);) {
    if (line.rfind("# TYPE ", 0) != 0) continue;
    std::istringstream fields(line.substr(7));
    std::string name, type;
    fields >> name >> type;
    CHECK_MESSAGE(rendered.count(name) == 0, name << " rendered twice");
    rendered[name] = type;
  }
  for (const auto& entry : rendered) {
    CAPTURE(entry.first);
    auto it = documented.find(entry.first);
    CHECK_MESSAGE(it != documented.end(), entry.first << " is not in the README table");
    if (it != documented.end()) CHECK(it->second == entry.second);
  }
  for (const auto& entry : documented) {
    CHECK_MESSAGE(rendered.count(entry.first) == 1,
                  entry.first << " is in the README table but not rendered");
  }
}

}  // namespace
}  // namespace idem
