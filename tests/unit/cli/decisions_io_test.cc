#include <doctest/doctest.h>
#include <stdlib.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "daemon/cli/cli.h"

namespace idem::cli {
namespace {

constexpr int64_t kNow = 1'764'547'200'000;  // 2025-12-01T00:00:00Z

class FakeHttp final : public HttpClient {
 public:
  std::function<StatusOr<HttpResponse>(const HttpRequest&)> answer;
  std::vector<HttpRequest> seen;
  StatusOr<HttpResponse> Send(const HttpRequest& r) override {
    seen.push_back(r);
    return answer(r);
  }
};

// stdout / stderr of a command, captured.
struct Captured {
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  ~Captured() {
    std::fclose(out);
    std::fclose(err);
  }
  static std::string Read(std::FILE* f) {
    std::fflush(f);
    std::rewind(f);
    std::string s;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) s.append(buf, n);
    return s;
  }
  Output Make(bool json = false) {
    Output o;
    o.out = out;
    o.err = err;
    o.json = json;
    o.now_ms = kNow;
    return o;
  }
};

}  // namespace

TEST_CASE("times for --since and --until: milliseconds, a UTC date, or a duration back") {
  CHECK(*ParseTimeArg("1764547200000", kNow) == 1'764'547'200'000);
  CHECK(*ParseTimeArg("2025-11-30", kNow) == kNow - 86'400'000);
  CHECK(*ParseTimeArg("24h", kNow) == kNow - 86'400'000);
  CHECK(*ParseTimeArg("7d", kNow) == kNow - 7 * 86'400'000LL);
  CHECK(*ParseTimeArg("90m", kNow) == kNow - 90 * 60'000LL);
  for (const char* bad : {"", "yesterday", "-5", "2025-13-01", "7w", "h", "99999999999999d"}) {
    CHECK_MESSAGE(!ParseTimeArg(bad, kNow).ok(), bad);
  }
}

TEST_CASE("an import is cut into requests at line ends, each under the byte limit") {
  std::vector<size_t> first;
  auto batches = SplitLines("aaaa\nbbbb\ncccc\n", 10, &first);
  REQUIRE(batches.size() == 2);
  CHECK(batches[0] == "aaaa\nbbbb\n");
  CHECK(batches[1] == "cccc\n");
  CHECK(first == std::vector<size_t>{1, 3});
  // A line longer than the limit goes alone; a missing last newline is added.
  batches = SplitLines("a\nbbbbbbbbbbbbbbbb\nc", 4, &first);
  REQUIRE(batches.size() == 3);
  CHECK(batches[1] == "bbbbbbbbbbbbbbbb\n");
  CHECK(batches[2] == "c\n");
  CHECK(first == std::vector<size_t>{1, 2, 3});
  CHECK(SplitLines("", 10, &first).empty());
}

TEST_CASE("an import is cut into requests of at most the daemon's line count too") {
  std::vector<size_t> first;
  auto batches = SplitLines("a\nb\nc\nd\ne\n", 1000, &first, 2);
  REQUIRE(batches.size() == 3);
  CHECK(batches[0] == "a\nb\n");
  CHECK(batches[2] == "e\n");
  CHECK(first == std::vector<size_t>{1, 3, 5});
  // Short lines: the daemon's 10,000 lines come before the byte limit.
  std::string many;
  for (int i = 0; i < 10'001; ++i) many += "{}\n";
  batches = SplitLines(many, 1 << 20, &first);
  REQUIRE(batches.size() == 2);
  CHECK(batches[1] == "{}\n");
  CHECK(first == std::vector<size_t>{1, 10'001});
}

TEST_CASE("an import file is read whole; a folder or an endless line is refused") {
  char tmpl[] = "/tmp/idem-import-XXXXXX";
  const std::string folder = mkdtemp(tmpl);
  const std::string file = folder + "/d.jsonl";
  std::FILE* f = std::fopen(file.c_str(), "w");
  REQUIRE(f != nullptr);
  std::fputs("{\"a\":1}\n{\"b\":2}\n", f);
  std::fclose(f);
  StatusOr<std::string> text = ReadImportFile(file);
  REQUIRE(text.ok());
  CHECK(*text == "{\"a\":1}\n{\"b\":2}\n");
  // A line may be as long as the limit, not longer; the error names it.
  CHECK(ReadImportFile(file, 7).ok());
  StatusOr<std::string> long_line = ReadImportFile(file, 6);
  REQUIRE_FALSE(long_line.ok());
  CHECK(long_line.status().message() == file +
                                            ": line 1 is longer than 6 bytes, more than an "
                                            "import takes");
  // A folder read as a file used to abort the CLI (an uncaught exception).
  StatusOr<std::string> dir = ReadImportFile(folder);
  REQUIRE_FALSE(dir.ok());
  CHECK(dir.status().message() == "cannot read " + folder + ": it is a folder, not a file");
  // /dev/zero is one endless line: refused at the limit, not read on.
  StatusOr<std::string> zero = ReadImportFile("/dev/zero", 1 << 20);
  REQUIRE_FALSE(zero.ok());
  CHECK(zero.status().message().find("line 1 is longer than 1048576 bytes") != std::string::npos);
  std::remove(file.c_str());
  std::remove(folder.c_str());
}

TEST_CASE("decisions import sends JSON Lines and reports the file's line numbers") {
  FakeHttp http;
  int calls = 0;
  http.answer = [&](const HttpRequest& r) -> StatusOr<HttpResponse> {
    ++calls;
    HttpResponse res;
    res.status = 200;
    // The second batch's first line is refused.
    Json body = {{"imported", calls == 1 ? 1 : 0},
                 {"exists", 0},
                 {"expired", 0},
                 {"refused", calls == 1 ? 0 : 1}};
    body["results"] = Json::array({{{"line", 1},
                                    {"verdict", calls == 1 ? "imported" : "refused"},
                                    {"reason", "decision_key is not the key of this material"},
                                    {"field", "/decision_key"}}});
    res.body = body.dump();
    CHECK(r.url == "http://d/v1/decisions/import");
    return res;
  };
  DaemonClient api("http://d", "", http);
  Captured cap;
  int code = DecisionsImport(api, cap.Make(), "{\"a\":1}\n{\"b\":2}\n", 9);
  REQUIRE(http.seen.size() == 2);
  bool ndjson = false;
  for (const auto& [name, value] : http.seen[0].headers) {
    ndjson = ndjson || (name == "Content-Type" && value == "application/x-ndjson");
  }
  CHECK(ndjson);
  CHECK(code == kExitUsage);
  std::string out = Captured::Read(cap.out);
  CHECK(out.find("imported 1, exists 0, expired 0, refused 1") != std::string::npos);
  CHECK(out.find("\n2 ") != std::string::npos);  // line 1 of batch 2 is the file's line 2
}

TEST_CASE("decisions import lists the lines it did not store because their key keeps another") {
  FakeHttp http;
  http.answer = [&](const HttpRequest&) -> StatusOr<HttpResponse> {
    HttpResponse res;
    res.status = 200;
    Json body = {{"imported", 1}, {"exists", 2}, {"expired", 0}, {"refused", 0}};
    body["results"] =
        Json::array({{{"line", 1}, {"verdict", "imported"}, {"decision_id", "dec_new"}},
                     {{"line", 2}, {"verdict", "exists"}, {"decision_id", "dec_same"}},
                     {{"line", 3},
                      {"verdict", "exists"},
                      {"decision_id", "dec_old"},
                      {"cached_decision_id", "dec_new"}}});
    res.body = body.dump();
    return res;
  };
  DaemonClient api("http://d", "", http);
  Captured cap;
  CHECK(DecisionsImport(api, cap.Make(), "{}\n{}\n{}\n", 9) == kExitOk);
  const std::string out = Captured::Read(cap.out);
  CHECK_MESSAGE(out.find("DECISION NOT STORED") != std::string::npos, out);
  CHECK(out.find("dec_old") != std::string::npos);
  CHECK(out.find("dec_same") == std::string::npos);  // stored already: nothing to say
  CHECK(out.find("imported 1, exists 2") != std::string::npos);
}

TEST_CASE("decisions export follows Idem-Next-Cursor and writes the lines as sent") {
  FakeHttp http;
  http.answer = [&](const HttpRequest& r) -> StatusOr<HttpResponse> {
    HttpResponse res;
    res.status = 200;
    if (r.url.find("cursor=") == std::string::npos) {
      res.body = "{\"n\":1}\n{\"n\":2}\n";
      res.headers = {{"idem-next-cursor", "c/2"}};
    } else {
      CHECK(r.url.find("cursor=c%2F2") != std::string::npos);
      res.body = "{\"n\":3}\n";
    }
    return res;
  };
  DaemonClient api("http://d", "", http);
  Captured cap;
  CHECK(DecisionsExport(api, cap.Make(), cap.out, "triage", 5) == kExitOk);
  CHECK(http.seen.size() == 2);
  CHECK(http.seen[0].url.find("step=triage") != std::string::npos);
  CHECK(http.seen[0].url.find("since=5") != std::string::npos);
  CHECK(Captured::Read(cap.out) == "{\"n\":1}\n{\"n\":2}\n{\"n\":3}\n");
  CHECK(Captured::Read(cap.err).find("exported 3 decisions") != std::string::npos);
}

TEST_CASE("the cost table lists each group and the total") {
  Json body = {
      {"by", "model"},
      {"from_day", "2025-11-01"},
      {"to_day", "2025-11-30"},
      {"items", Json::array({{{"model", "gpt-x"},
                              {"calls", 3},
                              {"input_tokens", 1200},
                              {"output_tokens", 300},
                              {"spent_usd", 0.0123},
                              {"hits", 40},
                              {"saved_usd", 0.164}}})},
      {"total", {{"calls", 3}, {"hits", 40}, {"spent_usd", 0.0123}, {"saved_usd", 0.164}}}};
  std::string text = RenderCost(body, Style{});
  CHECK(text.find("2025-11-01 .. 2025-11-30") != std::string::npos);
  CHECK(text.find("MODEL") != std::string::npos);
  CHECK(text.find("gpt-x") != std::string::npos);
  CHECK(text.find("0.164000") != std::string::npos);
  CHECK(text.find("TOTAL") != std::string::npos);
  CHECK(text.find("1200") != std::string::npos);
}

TEST_CASE("the cost table shows a model name's control characters escaped") {
  // Any caller may replay with a model of its choosing; the operator's
  // terminal must not take its bytes as commands (clear the screen here).
  Json body = {
      {"by", "model"},
      {"from_day", "2025-11-01\x1b]0;t\x07"},
      {"to_day", "2025-11-30"},
      {"items", Json::array({{{"model", std::string("a\0b\x1b[2J\xc2\x9b", 9)}, {"calls", 1}}})},
      {"total", {{"calls", 1}}}};
  std::string text = RenderCost(body, Style{});
  CAPTURE(text);
  CHECK(text.find('\x1b') == std::string::npos);
  CHECK(text.find('\0') == std::string::npos);
  CHECK(text.find("\xc2\x9b") == std::string::npos);
  CHECK(text.find("a\\x00b\\x1b[2J\\x9b") != std::string::npos);
  CHECK(text.find("2025-11-01\\x1b]0;t\\x07 .. 2025-11-30") != std::string::npos);
}

TEST_CASE("idem cost refuses a bad --since before asking the daemon") {
  FakeHttp http;
  http.answer = [](const HttpRequest&) -> StatusOr<HttpResponse> { return HttpResponse{}; };
  DaemonClient api("http://d", "", http);
  Captured cap;
  CHECK(Cost(api, cap.Make(), "step", "last tuesday", "") == kExitUsage);
  CHECK(http.seen.empty());
}

}  // namespace idem::cli
