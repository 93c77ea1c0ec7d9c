// HTTP/1.1 on the wire (RFC 9112), as much as the daemon serves: request
// parsing with limits, and response serialization. No I/O here; the event
// server (event_server.h) feeds bytes in and writes bytes out.
//
// Accepted: request line `METHOD SP origin-form SP HTTP/1.0|1.1`, header
// fields, a body framed by Content-Length or by chunked Transfer-Encoding
// (chunk extensions and trailers are skipped), `Expect: 100-continue`.
// Refused, with the status to answer and then close the connection:
//   400 malformed request line, header, length or chunk framing; both
//       Content-Length and Transfer-Encoding; conflicting Content-Lengths;
//       Transfer-Encoding whose final coding is not chunked, or with
//       chunked twice; more than one Host; a line of the head (or a chunk
//       size or trailer line) ending in a bare CR or LF instead of CRLF,
//       or holding any other control character but HTAB (RFC 9112 2.2
//       lets a server accept a bare LF; idem refuses it, so that it never
//       reads lines differently from a stricter peer in front of it);
//   413 body larger than Limits.max_body_bytes (checked before it is read),
//       or chunk framing (size lines, extensions, CRLFs) larger than
//       MaxChunkFraming;
//   431 request line plus headers larger than Limits.max_head_bytes, more
//       than Limits.max_headers fields, or chunked trailers larger than
//       max_head_bytes;
//   501 a transfer coding other than chunked (before the final chunked);
//   505 an HTTP version other than 1.0 and 1.1.
//
// Thread-safety: pure functions over caller-owned values.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace idem::http1 {

struct Field {
  std::string name;
  std::string value;
};

// ASCII case-insensitive equality (header names).
bool NameEquals(std::string_view a, std::string_view b);
// RFC 9110 tchar (methods, header names, tokens).
bool IsTokenChar(char c);
// Without leading and trailing spaces and tabs (RFC 9110 OWS).
std::string_view TrimOws(std::string_view s);

struct Request {
  std::string method;
  std::string target;                             // as sent: path plus "?query"
  std::string path;                               // percent-decoded
  std::multimap<std::string, std::string> query;  // percent-decoded, '+' is a space
  std::vector<Field> headers;
  std::string body;
  int minor_version = 1;
  bool keep_alive = true;  // after this exchange, per version and Connection
  // Set by the server, never parsed: the request came over the Unix-domain
  // socket (EventServerOptions::unix_socket), which no browser can reach.
  bool local_socket = false;

  // Header lookups are case-insensitive; "" when absent.
  bool HasHeader(std::string_view name) const;
  std::string HeaderValue(std::string_view name, size_t index = 0) const;
  size_t HeaderCount(std::string_view name) const;
};

struct Response {
  int status = 200;
  std::vector<Field> headers;  // without Content-Length and Connection
  std::string body;

  // Replaces any field of that name.
  void SetHeader(std::string_view name, std::string value);
  std::string HeaderValue(std::string_view name) const;
  void SetContent(std::string body, std::string_view content_type);
};

constexpr size_t kMaxLeadingEmptyLines = 16;

struct Limits {
  size_t max_head_bytes = 64 << 10;
  size_t max_headers = 100;
  size_t max_body_bytes = 1 << 20;
};

// The framing a chunked body may carry besides its data: 64 KiB plus a
// quarter of the body limit (a 1 MiB body in chunks of 24 bytes or more).
size_t MaxChunkFraming(const Limits& limits);
// The most bytes one acceptable request takes on the wire: the head, the
// body with its chunk framing, a chunked trailer section (at most
// max_head_bytes) and a chunk size line being read. More buffered input
// than this holds no acceptable request.
size_t MaxRequestBytes(const Limits& limits);

// What a chunked body's earlier kNeedMore decoded, so that more input
// resumes there instead of decoding the body from its start again (a body
// in many small chunks costs linear, not quadratic, work). Kept by the
// caller for one request on one growing input, and Reset once that request
// is parsed or refused.
struct ChunkedProgress {
  size_t decoded = 0;  // bytes of the chunked body, from its start, that are whole chunks
  std::string body;    // their data
  void Reset() {
    decoded = 0;
    body.clear();
  }
};

enum class ParseStatus {
  kNeedMore,  // not a whole request yet
  kComplete,  // *out is a request; `consumed` bytes of input belong to it
  kError,     // answer error_status and close
};

struct ParseResult {
  ParseStatus status = ParseStatus::kNeedMore;
  size_t consumed = 0;
  // kNeedMore after a complete head whose body is still to come and which
  // asked for it with Expect: 100-continue.
  bool wants_continue = false;
  // kNeedMore: parsing again cannot progress before the input holds this
  // many bytes (0: any more input may help). Lets a caller skip re-parsing
  // a large body on every read.
  size_t need = 0;
  // kNeedMore before the end of the head: the input's first this many bytes
  // hold no end of head and no bare CR or LF. Passed back to ParseRequest
  // with more input, they are not scanned again (a head trickling in a
  // byte at a time costs linear, not quadratic, work).
  size_t head_scanned = 0;
  int error_status = 0;
  std::string error;        // what was wrong, for the problem body
  std::string error_field;  // where, when one header is at fault: "header:Host"
};

// Parses one request from the start of `in`. Call again with more input
// after kNeedMore (the whole buffer, from the same start). At most
// kMaxLeadingEmptyLines empty lines before the request line are skipped
// (RFC 9112 2.2); more are a 400. `head_scanned`: the previous kNeedMore's
// ParseResult::head_scanned for the same (grown) input, or 0. `chunked`:
// where a chunked body's decoding resumes and is kept (nullptr: from the
// start, kept nowhere); Reset it after any result but kNeedMore.
ParseResult ParseRequest(std::string_view in, const Limits& limits, Request* out,
                         size_t head_scanned = 0, ChunkedProgress* chunked = nullptr);

// "HTTP/1.1 <status> <reason>" head, the fields, Content-Length, and
// `Connection: close` when !keep_alive (or keep-alive for an HTTP/1.0 peer
// that asked for it), then the body. `head_request`: the answer to a HEAD,
// which has the fields and Content-Length of the GET answer and no body
// (RFC 9110 9.3.2 and 8.6; the client reads no body after it). `date`, when
// not empty, goes out as the Date field (HttpDate).
void SerializeResponse(const Response& res, bool keep_alive, int minor_version, std::string& out,
                       bool head_request = false, std::string_view date = {});

// A time as the Date field writes it, IMF-fixdate (RFC 9110 5.6.7):
// "Sun, 06 Nov 1994 08:49:37 GMT", whatever the locale.
std::string HttpDate(int64_t unix_seconds);

std::string_view ReasonPhrase(int status);

// Percent-decoding of a path or query component; '+' means space when
// `plus_is_space`. Malformed escapes are kept as they are.
std::string PercentDecode(std::string_view s, bool plus_is_space);

// A request target's path, percent-decoded except for %2F and %25, which
// stay (as %2F, %25) so that an encoded slash is data within a segment
// (RFC 3986 2.2), never a separator: routes split on real slashes only.
std::string DecodePath(std::string_view s);
// One segment of a DecodePath'd path, decoded the rest of the way.
std::string DecodePathSegment(std::string_view s);

}  // namespace idem::http1
