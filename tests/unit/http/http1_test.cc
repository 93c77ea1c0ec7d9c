#include "daemon/http/http1.h"

#include <doctest/doctest.h>

#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idem::http1 {
namespace {

Limits SmallLimits() {
  Limits l;
  l.max_head_bytes = 256;
  l.max_headers = 4;
  l.max_body_bytes = 16;
  return l;
}

// Parses `in` with `limits` and expects a framing error with `status`.
void CheckError(std::string_view in, int status, const Limits& limits = Limits()) {
  Request req;
  ParseResult r = ParseRequest(in, limits, &req);
  CHECK_MESSAGE(r.status == ParseStatus::kError, std::string(in));
  CHECK_MESSAGE(r.error_status == status, std::string(in), " -> ", r.error);
  CHECK_FALSE(r.error.empty());
}

Request MustParse(std::string_view in, const Limits& limits = Limits()) {
  Request req;
  ParseResult r = ParseRequest(in, limits, &req);
  REQUIRE_MESSAGE(r.status == ParseStatus::kComplete, std::string(in), " -> ", r.error_status, " ",
                  r.error);
  CHECK(r.consumed == in.size());
  return req;
}

std::vector<std::string> QueryValues(const Request& req, const std::string& key) {
  std::vector<std::string> out;
  auto [lo, hi] = req.query.equal_range(key);
  for (auto it = lo; it != hi; ++it) out.push_back(it->second);
  return out;
}

// ------------------------------------------------------------- well formed

TEST_CASE("a simple GET parses method, target, path, version and headers") {
  Request req = MustParse("GET /v1/work HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n");
  CHECK(req.method == "GET");
  CHECK(req.target == "/v1/work");
  CHECK(req.path == "/v1/work");
  CHECK(req.query.empty());
  CHECK(req.minor_version == 1);
  CHECK(req.body.empty());
  REQUIRE(req.headers.size() == 2);
  CHECK(req.headers[0].name == "Host");
  CHECK(req.headers[0].value == "example.com");
  CHECK(req.headers[1].name == "Accept");
  CHECK(req.headers[1].value == "*/*");
}

TEST_CASE("an HTTP/1.0 GET without header fields parses") {
  Request req = MustParse("GET / HTTP/1.0\r\n\r\n");
  CHECK(req.method == "GET");
  CHECK(req.path == "/");
  CHECK(req.headers.empty());
}

TEST_CASE("an HTTP/1.1 request without Host is refused with 400, as RFC 9112 3.2 requires") {
  CheckError("GET / HTTP/1.1\r\n\r\n", 400);
  CheckError("GET /healthz HTTP/1.1\r\nAccept: */*\r\n\r\n", 400);
  CheckError("POST /v1/work/claim HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", 400);
  // An empty Host is a valid field value (the target has no authority).
  CHECK(MustParse("GET / HTTP/1.1\r\nHost:\r\n\r\n").HeaderCount("Host") == 1);
}

TEST_CASE("empty lines before the request line are ignored") {
  Request req = MustParse("\r\n\r\nGET /x HTTP/1.1\r\nHost: t\r\n\r\n");
  CHECK(req.path == "/x");
}

TEST_CASE("more empty lines before the request line than kMaxLeadingEmptyLines are a 400") {
  std::string lines;
  for (size_t i = 0; i < kMaxLeadingEmptyLines; ++i) lines += "\r\n";
  CHECK(MustParse(lines + "GET /x HTTP/1.1\r\nHost: t\r\n\r\n").path == "/x");
  CheckError(lines + "\r\nGET /x HTTP/1.1\r\nHost: t\r\n\r\n", 400);
  CheckError(lines + "\r\n", 400);  // refused before a request line ever comes
}

TEST_CASE("a body still arriving says how many bytes the input must hold to go on") {
  Request req;
  const std::string head = "POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n";
  ParseResult r = ParseRequest(head + "abc", Limits(), &req);
  CHECK(r.status == ParseStatus::kNeedMore);
  CHECK(r.need == head.size() + 10);
  const std::string chunked = "POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
  r = ParseRequest(chunked + "a\r\n0123", Limits(), &req);
  CHECK(r.status == ParseStatus::kNeedMore);
  CHECK(r.need == chunked.size() + 3 + 10 + 2);  // size line, the chunk, its CRLF
  r = ParseRequest("GET /x HTTP/1.1\r\nHost: a", Limits(), &req);
  CHECK(r.status == ParseStatus::kNeedMore);
  CHECK(r.need == 0);  // a head: any more input may complete it
}

TEST_CASE("a head resumed from head_scanned does not scan those bytes again") {
  Request req;
  const std::string start = "GET /x HTTP/1.1\r\nHost: t\r\nX-A: 1\r\n";
  ParseResult r = ParseRequest(start, Limits(), &req);
  REQUIRE(r.status == ParseStatus::kNeedMore);
  CHECK(r.head_scanned == start.size());
  // A bare LF planted where the first call already looked: resumed from its
  // head_scanned, the parser does not see it; from 0, it does.
  std::string planted = start;
  planted[5] = '\n';
  const std::string more = planted + "X-B: 2\r\n";
  CHECK(ParseRequest(more, Limits(), &req, r.head_scanned).status == ParseStatus::kNeedMore);
  CHECK(ParseRequest(more, Limits(), &req).status == ParseStatus::kError);
}

TEST_CASE("a head trickling in a byte at a time, resumed each time, parses as when whole") {
  const std::string whole = "\r\nPOST /t HTTP/1.1\r\nHost: h\r\nX-Long: " + std::string(300, 'v') +
                            "\r\nContent-Length: 2\r\n\r\nok";
  Request once = MustParse(whole);
  size_t scanned = 0;
  for (size_t n = 1; n <= whole.size(); ++n) {
    Request req;
    ParseResult r = ParseRequest(std::string_view(whole).substr(0, n), Limits(), &req, scanned);
    if (n < whole.size()) {
      REQUIRE(r.status == ParseStatus::kNeedMore);
      CHECK(r.head_scanned <= n);
      scanned = r.head_scanned;
      continue;
    }
    REQUIRE(r.status == ParseStatus::kComplete);
    CHECK(req.path == once.path);
    CHECK(req.body == "ok");
    CHECK(req.HeaderValue("X-Long") == once.HeaderValue("X-Long"));
  }
  // A CRLF split by the resume point, and a bare CR found after it.
  Request req;
  const std::string split = "GET / HTTP/1.1\r";
  ParseResult r = ParseRequest(split, Limits(), &req);
  REQUIRE(r.status == ParseStatus::kNeedMore);
  CHECK(ParseRequest(split + "\nHost: t\r\n\r\n", Limits(), &req, r.head_scanned).status ==
        ParseStatus::kComplete);
  CHECK(ParseRequest(split + "x\r\n\r\n", Limits(), &req, r.head_scanned).status ==
        ParseStatus::kError);
}

TEST_CASE("header values are trimmed of surrounding spaces and tabs") {
  Request req =
      MustParse("GET / HTTP/1.1\r\nHost: t\r\nX-A: \t padded value \t\r\nX-B:tight\r\n\r\n");
  CHECK(req.HeaderValue("X-A") == "padded value");
  CHECK(req.HeaderValue("X-B") == "tight");
}

TEST_CASE("a POST with Content-Length carries exactly that many body bytes") {
  Request req = MustParse(
      "POST /v1/work HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\nContent-Type: text/plain\r\n\r\n"
      "hello world");
  CHECK(req.method == "POST");
  CHECK(req.body == "hello world");
}

TEST_CASE("Content-Length: 0 gives an empty body") {
  Request req = MustParse("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n");
  CHECK(req.body.empty());
}

TEST_CASE("repeated identical Content-Length fields are accepted") {
  Request req =
      MustParse("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc");
  CHECK(req.body == "abc");
}

TEST_CASE("two pipelined requests: the first parse consumes exactly the first request") {
  const std::string first = "POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc";
  const std::string second = "GET /b?x=1 HTTP/1.1\r\nHost: h\r\n\r\n";
  const std::string buf = first + second;

  Request req;
  ParseResult r = ParseRequest(buf, Limits(), &req);
  REQUIRE(r.status == ParseStatus::kComplete);
  CHECK(r.consumed == first.size());
  CHECK(req.path == "/a");
  CHECK(req.body == "abc");

  Request req2;
  ParseResult r2 = ParseRequest(std::string_view(buf).substr(r.consumed), Limits(), &req2);
  REQUIRE(r2.status == ParseStatus::kComplete);
  CHECK(r2.consumed == second.size());
  CHECK(req2.method == "GET");
  CHECK(req2.path == "/b");
  CHECK(req2.HeaderValue("Host") == "h");
}

TEST_CASE("a request fed a byte at a time needs more until its last byte arrives") {
  const std::string full = "POST /in/pieces HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nabcde";
  for (size_t n = 0; n < full.size(); ++n) {
    Request req;
    ParseResult r = ParseRequest(std::string_view(full).substr(0, n), Limits(), &req);
    REQUIRE_MESSAGE(r.status == ParseStatus::kNeedMore, "prefix of ", n, " bytes");
    CHECK(r.consumed == 0);
    CHECK_FALSE(r.wants_continue);
  }
  Request req = MustParse(full);
  CHECK(req.body == "abcde");
}

TEST_CASE("Expect: 100-continue asks for the body once the head is complete") {
  const std::string head =
      "POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n";
  Request req;
  SUBCASE("an incomplete head does not ask yet") {
    ParseResult r = ParseRequest(head.substr(0, head.size() - 2), Limits(), &req);
    CHECK(r.status == ParseStatus::kNeedMore);
    CHECK_FALSE(r.wants_continue);
  }
  SUBCASE("a complete head without the body asks") {
    ParseResult r = ParseRequest(head, Limits(), &req);
    CHECK(r.status == ParseStatus::kNeedMore);
    CHECK(r.wants_continue);
  }
  SUBCASE("a partial body still asks") {
    ParseResult r = ParseRequest(head + "ab", Limits(), &req);
    CHECK(r.status == ParseStatus::kNeedMore);
    CHECK(r.wants_continue);
  }
  SUBCASE("the whole body completes the request") {
    ParseResult r = ParseRequest(head + "abcd", Limits(), &req);
    CHECK(r.status == ParseStatus::kComplete);
    CHECK_FALSE(r.wants_continue);
    CHECK(req.body == "abcd");
  }
  SUBCASE("the expectation is matched case-insensitively") {
    ParseResult r = ParseRequest(
        "POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nexpect: 100-Continue\r\n\r\n",
        Limits(), &req);
    CHECK(r.status == ParseStatus::kNeedMore);
    CHECK(r.wants_continue);
  }
}

TEST_CASE("an HTTP/1.0 request's Expect: 100-continue is ignored") {
  Request req;
  ParseResult r = ParseRequest(
      "POST /up HTTP/1.0\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n", Limits(), &req);
  CHECK(r.status == ParseStatus::kNeedMore);
  CHECK_FALSE(r.wants_continue);
  ParseResult chunked = ParseRequest(
      "POST /up HTTP/1.0\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n", Limits(),
      &req);
  CHECK(chunked.status == ParseStatus::kNeedMore);
  CHECK_FALSE(chunked.wants_continue);
}

TEST_CASE("a request with an incomplete body and no Expect does not ask to continue") {
  Request req;
  ParseResult r =
      ParseRequest("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nab", Limits(), &req);
  CHECK(r.status == ParseStatus::kNeedMore);
  CHECK_FALSE(r.wants_continue);
}

// ----------------------------------------------------------------- chunked

TEST_CASE("a chunked body with an extension and a trailer is decoded") {
  const std::string in =
      "POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5;name=value\r\nhello\r\n"
      "1\r\n \r\n"
      "A\r\n0123456789\r\n"
      "0\r\nX-Trailer: t\r\nX-Other: o\r\n\r\n";
  Request req = MustParse(in);
  CHECK(req.body == "hello 0123456789");
}

TEST_CASE("chunk sizes are hexadecimal in either case") {
  Request req = MustParse(
      "POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: Chunked\r\n\r\n"
      "b\r\n0123456789a\r\nB\r\n0123456789b\r\n0\r\n\r\n");
  CHECK(req.body == "0123456789a0123456789b");
}

TEST_CASE("a chunked request followed by a pipelined one consumes only its own framing") {
  const std::string first =
      "POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
  const std::string buf = first + "GET /next HTTP/1.1\r\nHost: t\r\n\r\n";
  Request req;
  ParseResult r = ParseRequest(buf, Limits(), &req);
  REQUIRE(r.status == ParseStatus::kComplete);
  CHECK(r.consumed == first.size());
  CHECK(req.body == "abc");
}

TEST_CASE("a chunked body needs more until the last chunk and its empty line arrive") {
  const std::string full =
      "POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nT: "
      "v\r\n\r\n";
  const size_t head_size = full.find("\r\n\r\n") + 4;
  for (size_t n = head_size; n < full.size(); ++n) {
    Request req;
    ParseResult r = ParseRequest(std::string_view(full).substr(0, n), Limits(), &req);
    CHECK_MESSAGE(r.status == ParseStatus::kNeedMore, "prefix of ", n, " bytes");
  }
  CHECK(MustParse(full).body == "abc");
}

TEST_CASE("a chunked request with Expect: 100-continue asks for its body") {
  Request req;
  ParseResult r = ParseRequest(
      "POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n",
      Limits(), &req);
  CHECK(r.status == ParseStatus::kNeedMore);
  CHECK(r.wants_continue);
}

TEST_CASE("a malformed chunk size is refused with 400") {
  const std::string head = "POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
  CheckError(head + "zz\r\nab\r\n0\r\n\r\n", 400);
  CheckError(head + "\r\nab\r\n0\r\n\r\n", 400);
  CheckError(head + "-1\r\nab\r\n0\r\n\r\n", 400);
  CheckError(head + "1234567890abcdef0\r\n", 400);  // more than 15 hex digits
}

TEST_CASE("chunk data not followed by CRLF is refused with 400") {
  CheckError(
      "POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcd\r\n0\r\n\r\n",
      400);
}

TEST_CASE("an endless chunk size line is refused with 400") {
  CheckError(
      "POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" + std::string(2000, '0'),
      400);
}

TEST_CASE("a chunk size line over 1024 bytes is refused with 400 however the bytes arrive") {
  const std::string head = "POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
  const std::string long_line = "1;" + std::string(1023, 'e');  // 1025 bytes
  SUBCASE("its CRLF not yet arrived") { CheckError(head + long_line, 400); }
  SUBCASE("its CRLF arrived in the same read") {
    CheckError(head + long_line + "\r\na\r\n0\r\n\r\n", 400);
  }
  SUBCASE("a line of exactly 1024 bytes is accepted") {
    const std::string line = "1;" + std::string(1022, 'e');
    Request req;
    CHECK(ParseRequest(head + line + "\r", Limits(), &req).status == ParseStatus::kNeedMore);
    CHECK(MustParse(head + line + "\r\na\r\n0\r\n\r\n").body == "a");
  }
}

TEST_CASE("a chunked trailer section larger than max_head_bytes is refused with 431") {
  Limits l = SmallLimits();  // 256 head bytes
  const std::string head =
      "POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n";
  SUBCASE("one endless trailer line") {
    CheckError(head + "X-Trailer: " + std::string(1000, 't'), 431, l);
  }
  SUBCASE("many trailer lines") {
    std::string trailers;
    for (int i = 0; i < 100; ++i) trailers += "X-T: v\r\n";
    CheckError(head + trailers, 431, l);
    CheckError(head + trailers + "\r\n", 431, l);
  }
  SUBCASE("a trailer section within the limit is accepted") {
    CHECK(MustParse(head + "X-T: " + std::string(200, 'v') + "\r\n\r\n", l).body == "a");
  }
}

TEST_CASE("a chunked body longer than max_body_bytes is refused with 413") {
  Limits l = SmallLimits();  // 16 body bytes
  const std::string head = "POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
  SUBCASE("in one chunk, refused from its size line alone") { CheckError(head + "11\r\n", 413, l); }
  SUBCASE("across several chunks") {
    CheckError(head + "8\r\n01234567\r\n8\r\n01234567\r\n1\r\nx\r\n0\r\n\r\n", 413, l);
  }
  SUBCASE("exactly max_body_bytes is accepted") {
    Request req = MustParse(head + "8\r\n01234567\r\n8\r\n01234567\r\n0\r\n\r\n", l);
    CHECK(req.body.size() == 16);
  }
}

TEST_CASE("chunk framing past MaxChunkFraming is refused with 413, however small the data") {
  Limits l;
  l.max_body_bytes = 4096;  // framing: 64 KiB + 1 KiB
  const std::string head = "POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
  CHECK(MaxChunkFraming(l) == (64 << 10) + 1024);
  // Empty-looking chunks cannot be sent (size 0 ends the body), so the
  // framing grows through extensions: 1,000 bytes of them on each 1-byte chunk.
  const std::string chunk = "1;" + std::string(997, 'e') + "\r\nx\r\n";
  std::string body;
  for (int i = 0; i < 70; ++i) body += chunk;
  Request req;
  ParseResult r = ParseRequest(head + body, l, &req);
  REQUIRE(r.status == ParseStatus::kError);
  CHECK(r.error_status == 413);
  CHECK(r.error.find("framing") != std::string::npos);
  // The same framing in fewer chunks is a body.
  std::string fewer;
  for (int i = 0; i < 60; ++i) fewer += chunk;
  CHECK(MustParse(head + fewer + "0\r\n\r\n", l).body == std::string(60, 'x'));
  // One acceptable request, at its largest, fits MaxRequestBytes.
  CHECK(MaxRequestBytes(l) >= 2 * l.max_head_bytes + l.max_body_bytes + MaxChunkFraming(l));
}

TEST_CASE("a body of 1 MiB in 24-byte chunks is accepted under the default limits") {
  const std::string head = "POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
  std::string body;
  for (size_t i = 0; i < (1u << 20) / 24; ++i) body += "18\r\n0123456789abcdef01234567\r\n";
  body += "10\r\n0123456789abcdef\r\n";  // 43,690 x 24 + 16 = 1 MiB
  const std::string whole = head + body + "0\r\n\r\n";
  CHECK(whole.size() <= MaxRequestBytes(Limits()));
  CHECK(MustParse(whole).body.size() == (1u << 20));
}

TEST_CASE(
    "a chunked body decoded as it arrives, resumed each time, equals the body decoded whole") {
  const std::string head = "POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
  std::string framed;
  std::string data;
  for (int i = 1; i <= 40; ++i) {
    std::string piece(static_cast<size_t>(i % 7 + 1), static_cast<char>('a' + i % 26));
    char size[8];
    std::snprintf(size, sizeof size, "%zx", piece.size());
    framed += std::string(size) + (i % 5 == 0 ? ";ext=1" : "") + "\r\n" + piece + "\r\n";
    data += piece;
  }
  const std::string whole = head + framed + "0\r\nX-Trailer: t\r\n\r\nGET /next";
  Request once;
  ParseResult all = ParseRequest(whole, Limits(), &once);
  REQUIRE(all.status == ParseStatus::kComplete);
  CHECK(once.body == data);
  ChunkedProgress progress;
  size_t scanned = 0;
  for (size_t n = 1; n <= all.consumed; ++n) {
    Request req;
    ParseResult r =
        ParseRequest(std::string_view(whole).substr(0, n), Limits(), &req, scanned, &progress);
    if (n < all.consumed) {
      REQUIRE_MESSAGE(r.status == ParseStatus::kNeedMore, n);
      scanned = r.head_scanned;
      CHECK(progress.body.size() <= data.size());
      CHECK(data.compare(0, progress.body.size(), progress.body) == 0);
      continue;
    }
    REQUIRE(r.status == ParseStatus::kComplete);
    CHECK(r.consumed == all.consumed);
    CHECK(req.body == data);
    CHECK(progress.decoded == 0);  // given back whole
    CHECK(progress.body.empty());
  }
}

// ----------------------------------------------------------- body framing

TEST_CASE("a Content-Length over max_body_bytes is refused with 413 before the body is read") {
  Limits l = SmallLimits();
  CheckError("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 17\r\n\r\n", 413, l);
  CheckError("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 99999999999999\r\n\r\n", 413, l);
  // Even when a 100-continue was asked for: the final answer comes at once.
  CheckError("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 17\r\nExpect: 100-continue\r\n\r\n",
             413, l);
}

TEST_CASE("a body of exactly max_body_bytes is accepted") {
  Limits l = SmallLimits();
  Request req =
      MustParse("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 16\r\n\r\n0123456789abcdef", l);
  CHECK(req.body == "0123456789abcdef");
}

TEST_CASE("a malformed Content-Length is refused with 400") {
  CheckError("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n\r\n", 400);
  CheckError("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: -5\r\n\r\n", 400);
  CheckError("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: +5\r\n\r\n", 400);
  CheckError("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5x\r\n\r\nhello", 400);
  CheckError("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 1 2\r\n\r\nhello", 400);
  CheckError("POST / HTTP/1.1\r\nHost: t\r\nContent-Length:\r\n\r\n", 400);
  CheckError("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 99999999999999999999999\r\n\r\n", 400);
}

TEST_CASE("conflicting Content-Length fields are refused with 400") {
  CheckError("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
             400);
}

TEST_CASE("both Transfer-Encoding and Content-Length are refused with 400") {
  CheckError(
      "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
      "3\r\nabc\r\n0\r\n\r\n",
      400);
}

TEST_CASE("a transfer coding other than chunked is refused with 501") {
  // Without a final chunked it is a 400 instead (smuggling_test.cc).
  CheckError("POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501);
}

// ------------------------------------------------------------------ limits

TEST_CASE("a head larger than max_head_bytes is refused with 431") {
  Limits l = SmallLimits();  // 256 head bytes
  const std::string big = "GET / HTTP/1.1\r\nHost: t\r\nX-Big: " + std::string(300, 'a') + "\r\n";
  SUBCASE("without its terminating empty line") { CheckError(big, 431, l); }
  SUBCASE("with its terminating empty line") { CheckError(big + "\r\n", 431, l); }
  SUBCASE("a long request line") {
    CheckError("GET /" + std::string(300, 'p') + " HTTP/1.1\r\nHost: t\r\n\r\n", 431, l);
  }
}

TEST_CASE("a head just within max_head_bytes is still waited for and accepted") {
  Limits l = SmallLimits();
  std::string head = "GET / HTTP/1.1\r\nHost: t\r\nX-Fill: ";
  head += std::string(l.max_head_bytes - head.size(), 'f');
  REQUIRE(head.size() == l.max_head_bytes);
  Request req;
  CHECK(ParseRequest(head, l, &req).status == ParseStatus::kNeedMore);
  // However its terminating CRLF CRLF arrives: part of it is not head.
  // (The split invariant tests/fuzz/fuzz_http1 checks.)
  for (std::string part : {"\r", "\r\n", "\r\n\r"}) {
    CAPTURE(part.size());
    CHECK(ParseRequest(head + part, l, &req).status == ParseStatus::kNeedMore);
  }
  Request full = MustParse(head + "\r\n\r\n", l);
  CHECK(full.HeaderValue("X-Fill").size() == l.max_head_bytes - 33);
}

TEST_CASE("more than max_headers fields are refused with 431") {
  Limits l = SmallLimits();  // 4 fields
  MustParse("GET / HTTP/1.1\r\nHost: t\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n", l);
  CheckError("GET / HTTP/1.1\r\nHost: t\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n", 431, l);
}

// -------------------------------------------------------- request line

TEST_CASE("an HTTP version other than 1.0 and 1.1 is refused with 505") {
  CheckError("GET / HTTP/2.0\r\n\r\n", 505);
  CheckError("GET / HTTP/1.2\r\n\r\n", 505);
  CheckError("GET / HTTP/0.9\r\n\r\n", 505);
}

TEST_CASE("a garbage request line is refused with 400") {
  CheckError("hello\r\n\r\n", 400);
  CheckError("GET /\r\n\r\n", 400);
  CheckError("GET / HTTP/1.1 extra\r\n\r\n", 400);
  CheckError("GET  / HTTP/1.1\r\nHost: t\r\n\r\n", 400);
  CheckError(" GET / HTTP/1.1\r\nHost: t\r\n\r\n", 400);
  CheckError("GET / FTP/1.1\r\n\r\n", 400);
  CheckError("G(E)T / HTTP/1.1\r\nHost: t\r\n\r\n", 400);
  CheckError("\x01\x02\x03 / HTTP/1.1\r\nHost: t\r\n\r\n", 400);
}

TEST_CASE("a request target that does not start with '/' is refused with 400") {
  CheckError("GET http://example.com/ HTTP/1.1\r\nHost: t\r\n\r\n", 400);
  CheckError("GET * HTTP/1.1\r\nHost: t\r\n\r\n", 400);
  CheckError("GET v1/work HTTP/1.1\r\nHost: t\r\n\r\n", 400);
}

TEST_CASE("a request target with a control character is refused with 400") {
  CheckError(std::string("GET /a\x01 HTTP/1.1\r\nHost: t\r\n\r\n"), 400);
  CheckError(std::string("GET /a\x7f HTTP/1.1\r\nHost: t\r\n\r\n"), 400);
}

// ---------------------------------------------------------------- headers

TEST_CASE("a header line without a colon is refused with 400") {
  CheckError("GET / HTTP/1.1\r\nHost: t\r\nHost example.com\r\n\r\n", 400);
  CheckError("GET / HTTP/1.1\r\nHost: t\r\n: no name\r\n\r\n", 400);
}

TEST_CASE("a header name with whitespace or an obs-fold line is refused with 400") {
  CheckError("GET / HTTP/1.1\r\nHost: t\r\nBad Name: x\r\n\r\n", 400);
  CheckError("GET / HTTP/1.1\r\nHost: t\r\nHost : x\r\n\r\n", 400);
  CheckError("GET / HTTP/1.1\r\nHost: t\r\nX-A: first\r\n continued: part\r\n\r\n", 400);
  CheckError("GET / HTTP/1.1\r\nHost: t\r\nX-A: first\r\n\tcontinued\r\n\r\n", 400);
}

TEST_CASE("a header value with a control character is refused with 400") {
  CheckError(std::string("GET / HTTP/1.1\r\nHost: t\r\nX-A: a\x01") + "b\r\n\r\n", 400);
  CheckError(std::string("GET / HTTP/1.1\r\nHost: t\r\nX-A: a\nb\r\n\r\n"), 400);
}

TEST_CASE("header lookups are case-insensitive and HeaderCount counts repeated fields") {
  Request req = MustParse(
      "GET / HTTP/1.1\r\nHost: t\r\nX-Tag: one\r\nx-tag: two\r\nX-TAG: three\r\nContent-Type: "
      "a/b\r\n\r\n");
  CHECK(req.HasHeader("content-type"));
  CHECK(req.HasHeader("CONTENT-TYPE"));
  CHECK(req.HeaderValue("cOnTeNt-TyPe") == "a/b");
  CHECK(req.HeaderCount("x-tag") == 3);
  CHECK(req.HeaderValue("X-Tag", 0) == "one");
  CHECK(req.HeaderValue("X-Tag", 1) == "two");
  CHECK(req.HeaderValue("X-Tag", 2) == "three");
  CHECK(req.HeaderValue("X-Tag", 3).empty());
  CHECK_FALSE(req.HasHeader("X-Missing"));
  CHECK(req.HeaderCount("X-Missing") == 0);
  CHECK(req.HeaderValue("X-Missing").empty());
}

TEST_CASE("NameEquals compares ASCII case-insensitively") {
  CHECK(NameEquals("Content-Length", "content-length"));
  CHECK(NameEquals("", ""));
  CHECK_FALSE(NameEquals("Content-Length", "Content-Lengt"));
  CHECK_FALSE(NameEquals("a-b", "a_b"));
}

TEST_CASE("IsTokenChar accepts RFC 9110 tchar only") {
  for (char c : std::string_view("azAZ09!#$%&'*+-.^_`|~")) CHECK_MESSAGE(IsTokenChar(c), c);
  for (char c : std::string_view(" \t:;,\"()/<=>?@[\\]{}\x7f"))
    CHECK_FALSE_MESSAGE(IsTokenChar(c), c);
  CHECK_FALSE(IsTokenChar('\0'));
  CHECK_FALSE(IsTokenChar(static_cast<char>(0xc3)));
}

TEST_CASE("TrimOws strips spaces and tabs at both ends only") {
  CHECK(TrimOws(" \t a b \t ") == "a b");
  CHECK(TrimOws("") == "");
  CHECK(TrimOws(" \t ") == "");
  CHECK(TrimOws("\r\nx") == "\r\nx");
}

// ------------------------------------------------------------- keep-alive

TEST_CASE("HTTP/1.1 keeps the connection alive unless Connection: close") {
  CHECK(MustParse("GET / HTTP/1.1\r\nHost: t\r\n\r\n").keep_alive);
  CHECK_FALSE(MustParse("GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").keep_alive);
  CHECK_FALSE(
      MustParse("GET / HTTP/1.1\r\nHost: t\r\nconnection: Upgrade, CLOSE\r\n\r\n").keep_alive);
  CHECK(MustParse("GET / HTTP/1.1\r\nHost: t\r\nConnection: keep-alive\r\n\r\n").keep_alive);
}

TEST_CASE("HTTP/1.0 closes the connection unless Connection: keep-alive") {
  Request plain = MustParse("GET / HTTP/1.0\r\n\r\n");
  CHECK(plain.minor_version == 0);
  CHECK_FALSE(plain.keep_alive);
  CHECK(MustParse("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").keep_alive);
  CHECK(MustParse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive);
  CHECK_FALSE(MustParse("GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n").keep_alive);
}

TEST_CASE("an HTTP/1.0 request with Transfer-Encoding closes the connection after it") {
  Request req = MustParse(
      "POST / HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n"
      "1\r\na\r\n0\r\n\r\n");
  CHECK(req.body == "a");
  CHECK_FALSE(req.keep_alive);
}

// ------------------------------------------------------------ query, path

TEST_CASE("the query is split into decoded pairs, '+' meaning space") {
  Request req = MustParse("GET /search?a=1&b=x%20y&c=a+b&flag HTTP/1.1\r\nHost: t\r\n\r\n");
  CHECK(req.path == "/search");
  CHECK(req.target == "/search?a=1&b=x%20y&c=a+b&flag");
  CHECK(req.query.size() == 4);
  CHECK(QueryValues(req, "a") == std::vector<std::string>{"1"});
  CHECK(QueryValues(req, "b") == std::vector<std::string>{"x y"});
  CHECK(QueryValues(req, "c") == std::vector<std::string>{"a b"});
  CHECK(QueryValues(req, "flag") == std::vector<std::string>{""});
}

TEST_CASE("repeated query keys keep every value and empty pairs are skipped") {
  Request req = MustParse("GET /?k=1&&k=2&k%3D=3&=v HTTP/1.1\r\nHost: t\r\n\r\n");
  CHECK(QueryValues(req, "k") == std::vector<std::string>{"1", "2"});
  CHECK(QueryValues(req, "k=") == std::vector<std::string>{"3"});
  CHECK(QueryValues(req, "") == std::vector<std::string>{"v"});
  CHECK(req.query.size() == 4);
}

TEST_CASE(
    "the path is percent-decoded but '+' stays a plus, and an encoded slash or percent stays "
    "encoded") {
  Request req = MustParse("GET /a%20b/c+d/%41%2f%252F?q=1 HTTP/1.1\r\nHost: t\r\n\r\n");
  CHECK(req.path == "/a b/c+d/A%2F%252F");
  CHECK(DecodePathSegment("A%2F%252F") == "A/%2F");  // decoded once, in its segment
  CHECK(QueryValues(req, "q") == std::vector<std::string>{"1"});
}

TEST_CASE("PercentDecode keeps malformed escapes as they are") {
  CHECK(PercentDecode("a%20b", false) == "a b");
  CHECK(PercentDecode("a+b", false) == "a+b");
  CHECK(PercentDecode("a+b", true) == "a b");
  CHECK(PercentDecode("%zz", false) == "%zz");
  CHECK(PercentDecode("%4", false) == "%4");
  CHECK(PercentDecode("%", false) == "%");
  CHECK(PercentDecode("x%", true) == "x%");
  CHECK(PercentDecode("%41", false) == "A");
  CHECK(PercentDecode("%e2%82%ac", false) == "\xe2\x82\xac");
  CHECK(PercentDecode("%2B", true) == "+");  // an escaped plus is not a space
}

// --------------------------------------------------------------- response

TEST_CASE("SerializeResponse writes the status line, fields, Content-Length and body") {
  Response res;
  res.status = 201;
  res.SetHeader("Content-Type", "application/json");
  res.SetHeader("X-Request-Id", "abc");
  res.body = R"({"ok":true})";
  std::string out;
  SerializeResponse(res, /*keep_alive=*/true, /*minor_version=*/1, out);
  CHECK(out ==
        "HTTP/1.1 201 Created\r\n"
        "Content-Type: application/json\r\n"
        "X-Request-Id: abc\r\n"
        "Content-Length: 11\r\n"
        "\r\n"
        R"({"ok":true})");
}

TEST_CASE("SerializeResponse to a HEAD writes the body's Content-Length and not the body") {
  Response res;
  res.SetHeader("Content-Type", "application/json");
  res.body = R"({"ok":true})";
  std::string out;
  SerializeResponse(res, /*keep_alive=*/true, 1, out, /*head_request=*/true);
  CHECK(out ==
        "HTTP/1.1 200 OK\r\n"
        "Content-Type: application/json\r\n"
        "Content-Length: 11\r\n"
        "\r\n");
}

TEST_CASE("SerializeResponse writes Date before Content-Length when given one") {
  Response res;
  std::string out;
  SerializeResponse(res, true, 1, out, false, "Sun, 06 Nov 1994 08:49:37 GMT");
  CHECK(out ==
        "HTTP/1.1 200 OK\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\nContent-Length: 0\r\n\r\n");
}

TEST_CASE("HttpDate writes IMF-fixdate in GMT") {
  CHECK(HttpDate(0) == "Thu, 01 Jan 1970 00:00:00 GMT");
  CHECK(HttpDate(784111777) == "Sun, 06 Nov 1994 08:49:37 GMT");  // RFC 9110 5.6.7's example
  CHECK(HttpDate(951782400) == "Tue, 29 Feb 2000 00:00:00 GMT");
  CHECK(HttpDate(1796353478) == "Fri, 04 Dec 2026 03:04:38 GMT");
}

TEST_CASE("SerializeResponse appends to what the output already holds") {
  Response res;
  std::string out = "prefix";
  SerializeResponse(res, true, 1, out);
  CHECK(out == "prefixHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
}

TEST_CASE("SerializeResponse says Connection: close when the connection will close") {
  Response res;
  res.status = 400;
  res.body = "bad";
  std::string out;
  SerializeResponse(res, /*keep_alive=*/false, 1, out);
  CHECK(out == "HTTP/1.1 400 Bad Request\r\nContent-Length: 3\r\nConnection: close\r\n\r\nbad");
  std::string out10;
  SerializeResponse(res, /*keep_alive=*/false, 0, out10);
  CHECK(out10 == out);
}

TEST_CASE("SerializeResponse says Connection: keep-alive to an HTTP/1.0 peer kept alive") {
  Response res;
  res.status = 204;
  std::string out;
  SerializeResponse(res, /*keep_alive=*/true, /*minor_version=*/0, out);
  CHECK(out == "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n");
}

TEST_CASE("reason phrases name the statuses the daemon answers with") {
  CHECK(ReasonPhrase(100) == "Continue");
  CHECK(ReasonPhrase(200) == "OK");
  CHECK(ReasonPhrase(308) == "Permanent Redirect");  // GET /ui
  CHECK(ReasonPhrase(399) == "Redirection");         // no 3xx is a client error
  CHECK(ReasonPhrase(404) == "Not Found");
  CHECK(ReasonPhrase(406) == "Not Acceptable");  // the /mcp refusal of an Accept it cannot meet
  CHECK(ReasonPhrase(413) == "Content Too Large");
  CHECK(ReasonPhrase(431) == "Request Header Fields Too Large");
  CHECK(ReasonPhrase(501) == "Not Implemented");
  CHECK(ReasonPhrase(505) == "HTTP Version Not Supported");
  CHECK_FALSE(ReasonPhrase(299).empty());
  CHECK_FALSE(ReasonPhrase(418).empty());
  CHECK_FALSE(ReasonPhrase(599).empty());
}

TEST_CASE("Response::SetHeader replaces a field case-insensitively") {
  Response res;
  res.SetHeader("Content-Type", "text/plain");
  res.SetHeader("content-type", "application/json");
  REQUIRE(res.headers.size() == 1);
  CHECK(res.headers[0].value == "application/json");
  CHECK(res.HeaderValue("CONTENT-TYPE") == "application/json");
  res.SetHeader("X-Other", "1");
  CHECK(res.headers.size() == 2);
  CHECK(res.HeaderValue("x-missing").empty());
}

TEST_CASE("Response::SetContent sets the body and its Content-Type") {
  Response res;
  res.SetHeader("Content-Type", "text/plain");
  res.SetContent("{}", "application/json");
  CHECK(res.body == "{}");
  REQUIRE(res.headers.size() == 1);
  CHECK(res.HeaderValue("Content-Type") == "application/json");
}

TEST_CASE("a serialized response parses back with the same status line and body") {
  Response res;
  res.status = 422;
  res.SetContent("payload", "text/plain");
  std::string out;
  SerializeResponse(res, true, 1, out);
  CHECK(out.starts_with("HTTP/1.1 422 Unprocessable Content\r\n"));
  const size_t head_end = out.find("\r\n\r\n");
  REQUIRE(head_end != std::string::npos);
  CHECK(out.substr(head_end + 4) == "payload");
  CHECK(out.find("Content-Length: 7\r\n") != std::string::npos);
  CHECK(out.find("Connection:") == std::string::npos);
}

}  // namespace
}  // namespace idem::http1
