// Request smuggling: the classic ways of making two HTTP parsers disagree
// on where a request ends, each answered as RFC 9112 requires, and never
// with a second request read out of the first. First the parser alone
// (every refusal is refused however the bytes arrive, and no prefix of it
// completes as some shorter request), then the server (one answer, then
// the connection closes: the bytes after a refused head are never parsed).
#include <doctest/doctest.h>

#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/http/event_server.h"
#include "daemon/http/http1.h"
#include "tests/unit/http/event_server_test_util.h"

namespace idem {
namespace {

using http1::Limits;
using http1::ParseRequest;
using http1::ParseResult;
using http1::ParseStatus;
using http1::Request;
using testing::Client;
using testing::EchoCallbacks;
using testing::Get;
using testing::Reply;
using testing::Running;

// What a smuggled request looks like when a parser is fooled into reading
// it: it follows the refused request's head or hides in its body.
const std::string kSmuggled = "GET /smuggled HTTP/1.1\r\nHost: t\r\n\r\n";

struct Case {
  std::string name;
  std::string request;  // kSmuggled is appended
  int status;           // the answer RFC 9112 requires (or allows)
};

std::string S(std::string_view bytes) { return std::string(bytes); }

// Each case names the RFC 9112 section that decides it.
std::vector<Case> Refused() {
  const std::string post = "POST /x HTTP/1.1\r\nHost: t\r\n";
  const std::string chunked = post + "Transfer-Encoding: chunked\r\n\r\n";
  return {
      // 6.3 (3): Content-Length and Transfer-Encoding together: the server
      // may reject, and must close afterwards either way.
      {"CL then TE", post + "Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
       400},
      {"TE then CL", post + "Transfer-Encoding: chunked\r\nContent-Length: 6\r\n\r\n0\r\n\r\n",
       400},
      // 6.3 (5): differing Content-Lengths, or a list of them, are invalid.
      {"two different Content-Lengths", post + "Content-Length: 3\r\nContent-Length: 40\r\n\r\nabc",
       400},
      {"a Content-Length list", post + "Content-Length: 3, 40\r\n\r\nabc", 400},
      {"a signed Content-Length", post + "Content-Length: +3\r\n\r\nabc", 400},
      {"a hex Content-Length", post + "Content-Length: 0x3\r\n\r\nabc", 400},
      {"a Content-Length over 2^64", post + "Content-Length: 18446744073709551619\r\n\r\nabc", 400},
      // 6.3 (4) and 6.1: chunked must be the final coding, else 400 and close.
      {"TE chunked, identity", post + "Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n", 400},
      {"TE chunked then a TE identity field",
       post + "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n0\r\n\r\n", 400},
      {"TE identity", post + "Transfer-Encoding: identity\r\n\r\n0\r\n\r\n", 400},
      {"TE gzip alone", post + "Transfer-Encoding: gzip\r\n\r\n0\r\n\r\n", 400},
      {"TE empty", post + "Transfer-Encoding: \r\n\r\n0\r\n\r\n", 400},
      {"TE xchunked", post + "Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", 400},
      {"TE quoted chunked", post + "Transfer-Encoding: \"chunked\"\r\n\r\n0\r\n\r\n", 400},
      // 7: chunked must not be applied twice.
      {"TE chunked, chunked", post + "Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", 400},
      // 5.2: obs-fold in a request is refused with 400.
      {"obs-fold", post + "X-A: a\r\n b\r\nContent-Length: 0\r\n\r\n", 400},
      {"obs-fold carrying TE", post + "Transfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n", 400},
      {"obs-fold with a tab", post + "X-A: a\r\n\tTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
       400},
      // 2.2: a bare LF may be a line end; idem does not take it as one (nor
      // inside a line), and a bare CR is never one.
      {"bare LF line ends", "GET / HTTP/1.1\nHost: t\n\n", 400},
      {"a bare LF hiding a TE field",
       post + "X-A: a\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n", 400},
      {"a bare LF after the request line", "GET / HTTP/1.1\nHost: t\r\n\r\n", 400},
      {"a bare CR hiding a TE field",
       post + "X-A: a\rTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n", 400},
      // 7.1: chunk-size is 1*HEXDIG; more digits than 64 bits hold overflow.
      {"a chunk size over 64 bits", chunked + "10000000000000005\r\nhello\r\n0\r\n\r\n", 400},
      {"a chunk size of 2^64 - 1", chunked + "FFFFFFFFFFFFFFFF\r\nhello\r\n0\r\n\r\n", 400},
      {"a chunk size with 0x", chunked + "0x5\r\nhello\r\n0\r\n\r\n", 400},
      {"a negative chunk size", chunked + "-5\r\nhello\r\n0\r\n\r\n", 400},
      {"a chunk size with a leading space", chunked + " 5\r\nhello\r\n0\r\n\r\n", 400},
      {"a chunk size with a trailing space", chunked + "5 \r\nhello\r\n0\r\n\r\n", 400},
      {"a bare LF after a chunk size", chunked + "5\nhello\r\n0\r\n\r\n", 400},
      {"a bare LF in a chunk extension", chunked + "5;a\nb\r\nhello\r\n0\r\n\r\n", 400},
      {"a NUL in a chunk extension",
       chunked + S(std::string_view("5;a\0b\r\nhello\r\n", 14)) + "0\r\n\r\n", 400},
      {"a bare LF in a trailer", chunked + "0\r\nX: a\nY: b\r\n\r\n", 400},
      {"chunk data longer than its size", chunked + "3\r\nhello\r\n0\r\n\r\n", 400},
      // 5.1: no whitespace between a field name and its colon.
      {"a space before the colon", post + "Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n", 400},
      {"a tab before the colon", post + "Content-Length\t: 5\r\n\r\nhello", 400},
      {"a space in a field name", post + "Content Length: 5\r\n\r\nhello", 400},
      // 3: the request line: a token method, single spaces, origin-form.
      {"a method with @", "G@T / HTTP/1.1\r\nHost: t\r\n\r\n", 400},
      {"a method with a slash", "GET/ / HTTP/1.1\r\nHost: t\r\n\r\n", 400},
      {"an empty method", " / HTTP/1.1\r\nHost: t\r\n\r\n", 400},
      {"two spaces after the method", "GET  / HTTP/1.1\r\nHost: t\r\n\r\n", 400},
      {"a tab for a space", "GET\t/ HTTP/1.1\r\nHost: t\r\n\r\n", 400},
      {"a trailing space after the version", "GET / HTTP/1.1 \r\nHost: t\r\n\r\n", 400},
      {"a lower-case version", "GET / http/1.1\r\nHost: t\r\n\r\n", 400},
      {"an absolute-form target", "GET http://t/ HTTP/1.1\r\nHost: t\r\n\r\n", 400},
      // NUL bytes anywhere in the head.
      {"a NUL in the method", S(std::string_view("GE\0T / HTTP/1.1\r\nHost: t\r\n\r\n", 29)), 400},
      {"a NUL in the target", S(std::string_view("GET /\0 HTTP/1.1\r\nHost: t\r\n\r\n", 29)), 400},
      {"a NUL in a field name", post + S(std::string_view("X\0: a\r\n\r\n", 9)), 400},
      {"a NUL in a field value", post + S(std::string_view("X: a\0b\r\n\r\n", 10)), 400},
      // 3.2: more than one Host, or none in HTTP/1.1.
      {"two Host fields", "GET / HTTP/1.1\r\nHost: t\r\nHost: evil\r\n\r\n", 400},
      {"an HTTP/1.1 request without Host", "GET /healthz HTTP/1.1\r\nAccept: */*\r\n\r\n", 400},
      // 2.3: a version idem does not serve.
      {"HTTP/2.0 in a request line", "GET / HTTP/2.0\r\nHost: t\r\n\r\n", 505},
  };
}

// Parses `in` fed whole, and each prefix of it as the server would see it
// arriving byte by byte.
void CheckRefusedEverywhere(const Case& c) {
  const std::string in = c.request + kSmuggled;
  Request req;
  ParseResult r = ParseRequest(in, Limits(), &req);
  CHECK_MESSAGE(r.status == ParseStatus::kError, c.name);
  CHECK_MESSAGE(r.error_status == c.status, c.name, ": ", r.error_status, " ", r.error);
  for (size_t n = 0; n < in.size(); ++n) {
    Request part;
    ParseResult p = ParseRequest(std::string_view(in).substr(0, n), Limits(), &part);
    if (p.status == ParseStatus::kComplete) {
      FAIL_CHECK(c.name, ": the first ", n, " bytes parse as a request for ", part.target);
      break;
    }
  }
}

TEST_CASE("each classic smuggling request is refused by the parser with the RFC 9112 status") {
  for (const Case& c : Refused()) {
    CAPTURE(c.name);
    CheckRefusedEverywhere(c);
  }
}

TEST_CASE("each classic smuggling request gets one answer and a closed connection") {
  Running s(EchoCallbacks());
  for (const Case& c : Refused()) {
    CAPTURE(c.name);
    Client client(s.port());
    REQUIRE(client.ok());
    REQUIRE(client.Send(c.request + kSmuggled));
    std::optional<Reply> r = client.Read();
    REQUIRE(r);
    CHECK(r->status == c.status);
    CHECK(r->Header("Connection") == "close");
    // No answer for /smuggled: the server reads nothing after the refusal.
    CHECK(client.Closed(/*reset_ok=*/true));
  }
}

TEST_CASE("a request hidden in a Content-Length body is the body, not a second request") {
  Running s(EchoCallbacks());
  Client client(s.port());
  REQUIRE(client.ok());
  REQUIRE(client.Send("POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: " +
                      std::to_string(kSmuggled.size()) + "\r\n\r\n" + kSmuggled + Get("/next")));
  std::optional<Reply> first = client.Read();
  REQUIRE(first);
  CHECK(first->status == 200);
  CHECK(first->body == "POST /x " + kSmuggled);
  std::optional<Reply> second = client.Read();
  REQUIRE(second);
  CHECK(second->body == "GET /next ");
}

TEST_CASE("a request hidden in a chunked body is the body, not a second request") {
  Running s(EchoCallbacks());
  Client client(s.port());
  REQUIRE(client.ok());
  char size[8];
  // "0\r\n\r\n" inside the chunk does not end the body early.
  const std::string data = "0\r\n\r\n" + kSmuggled;
  std::snprintf(size, sizeof(size), "%zx", data.size());
  REQUIRE(client.Send("POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" +
                      std::string(size) + "\r\n" + data + "\r\n0\r\n\r\n" + Get("/next")));
  std::optional<Reply> first = client.Read();
  REQUIRE(first);
  CHECK(first->status == 200);
  CHECK(first->body == "POST /x " + data);
  std::optional<Reply> second = client.Read();
  REQUIRE(second);
  CHECK(second->body == "GET /next ");
}

TEST_CASE("a head with bare LF line ends is refused at once, not waited on until a timeout") {
  Request req;
  ParseResult r = ParseRequest("GET / HTTP/1.1\nHost: t\n\n", Limits(), &req);
  CHECK(r.status == ParseStatus::kError);
  CHECK(r.error_status == 400);
}

TEST_CASE("a chunk size with whitespace before its extension is accepted (BWS)") {
  Request req;
  const std::string in =
      "POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5 ;a=b\r\nhello\r\n"
      "0\r\n\r\n";
  ParseResult r = ParseRequest(in, Limits(), &req);
  REQUIRE(r.status == ParseStatus::kComplete);
  CHECK(r.consumed == in.size());
  CHECK(req.body == "hello");
}

TEST_CASE("a repeated, equal Content-Length is one length (RFC 9112 6.3)") {
  Request req;
  const std::string in =
      "POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello";
  ParseResult r = ParseRequest(in + kSmuggled, Limits(), &req);
  REQUIRE(r.status == ParseStatus::kComplete);
  CHECK(r.consumed == in.size());
  CHECK(req.body == "hello");
}

}  // namespace
}  // namespace idem
