#include "daemon/http/http1.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <ctime>

#include "daemon/core/http_client.h"

namespace idem::http1 {
namespace {

char Lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

// Does the comma-separated list `value` contain `token` (case-insensitive)?
bool ListHas(std::string_view value, std::string_view token) {
  while (!value.empty()) {
    size_t comma = value.find(',');
    std::string_view item = TrimOws(value.substr(0, comma));
    if (NameEquals(item, token)) return true;
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return false;
}

ParseResult Error(int status, std::string message, std::string field = {}) {
  ParseResult r;
  r.status = ParseStatus::kError;
  r.error_status = status;
  r.error = std::move(message);
  r.error_field = std::move(field);
  return r;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  c = Lower(c);
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

void ParseQuery(std::string_view q, std::multimap<std::string, std::string>& out) {
  while (!q.empty()) {
    size_t amp = q.find('&');
    std::string_view pair = q.substr(0, amp);
    if (!pair.empty()) {
      size_t eq = pair.find('=');
      std::string key = PercentDecode(pair.substr(0, eq), true);
      std::string value =
          eq == std::string_view::npos ? std::string() : PercentDecode(pair.substr(eq + 1), true);
      out.emplace(std::move(key), std::move(value));
    }
    if (amp == std::string_view::npos) break;
    q.remove_prefix(amp + 1);
  }
}

// A control character other than HTAB (a bare CR or LF among them), or DEL.
bool HasControl(std::string_view s) {
  for (char c : s) {
    if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f) return true;
  }
  return false;
}

// RFC 9112 2.2: a bare CR must not be taken for a line end, and a bare LF
// may be; idem takes neither, so that it never splits lines where a peer
// does not. The index of the first CR not followed by LF or LF not
// preceded by CR in `s`, or npos. A CR at the very end may be half of a
// CRLF still to come.
size_t FindBareCrOrLf(std::string_view s) {
  for (size_t i = s.find_first_of("\r\n"); i != std::string_view::npos;
       i = s.find_first_of("\r\n", i + 1)) {
    if (s[i] == '\n') return i;  // a CRLF's LF is skipped below
    if (i + 1 == s.size()) return std::string_view::npos;
    if (s[i + 1] != '\n') return i;
    ++i;
  }
  return std::string_view::npos;
}

enum class ChunkStatus {
  kNeedMore,
  kComplete,
  kError,
  kTooLarge,
  kFramingTooLarge,
  kTrailerTooLarge
};

constexpr size_t kMaxChunkLine = 1024;  // chunk size plus extensions, without CRLF

// Decodes a chunked body starting at `in`, resuming after the whole chunks
// `progress` holds (and adding to them); on kComplete, `used` is the length
// of the framing through the final CRLF. The trailer section (through its
// empty line) may take at most `max_trailer` bytes, the framing besides the
// data at most `max_framing`.
ChunkStatus DecodeChunked(std::string_view in, size_t max_body, size_t max_framing,
                          size_t max_trailer, ChunkedProgress& progress, size_t& used, size_t& need,
                          std::string& error) {
  std::string& body = progress.body;
  size_t pos = progress.decoded;
  for (;;) {
    progress.decoded = pos;  // whole chunks so far: a later call starts here
    // Chunk framing (size lines, extensions, CRLFs) may not outweigh the
    // body it carries without end.
    if (pos - body.size() > max_framing) return ChunkStatus::kFramingTooLarge;
    size_t eol = in.find("\r\n", pos);
    // The same limit whether or not the line's CRLF has arrived yet (a
    // trailing CR may be the start of it).
    size_t line_len = eol != std::string_view::npos          ? eol - pos
                      : in.size() > pos && in.back() == '\r' ? in.size() - pos - 1
                                                             : in.size() - pos;
    if (line_len > kMaxChunkLine) {
      error = "a chunk size line is too long";
      return ChunkStatus::kError;
    }
    if (eol == std::string_view::npos) return ChunkStatus::kNeedMore;
    std::string_view line = in.substr(pos, eol - pos);
    if (HasControl(line)) {
      error = "a chunk size line contains a control character";
      return ChunkStatus::kError;
    }
    size_t semi = line.find(';');  // chunk extensions are ignored
    // RFC 9112 7.1: chunk-size is 1*HEXDIG, with BWS only before an
    // extension's ';'. A lenient reading (" 5", "5 ") is how a front proxy
    // and this server could come to disagree on where a chunk ends.
    std::string_view digits = line.substr(0, semi);
    if (semi != std::string_view::npos) digits = TrimOws(digits);
    if (digits.empty() || digits.size() > 15) {
      error = "malformed chunk size";
      return ChunkStatus::kError;
    }
    uint64_t size = 0;
    for (char c : digits) {
      int d = HexDigit(c);
      if (d < 0) {
        error = "malformed chunk size";
        return ChunkStatus::kError;
      }
      size = size * 16 + static_cast<uint64_t>(d);
    }
    pos = eol + 2;
    if (size == 0) {
      // Trailer fields, then an empty line.
      const size_t trailer_start = pos;
      for (;;) {
        size_t end = in.find("\r\n", pos);
        size_t seen = (end == std::string_view::npos ? in.size() : end + 2) - trailer_start;
        if (seen > max_trailer) return ChunkStatus::kTrailerTooLarge;
        if (end == std::string_view::npos) return ChunkStatus::kNeedMore;
        if (HasControl(in.substr(pos, end - pos))) {
          error = "a chunked trailer line contains a control character";
          return ChunkStatus::kError;
        }
        bool empty = end == pos;
        pos = end + 2;
        if (empty) {
          used = pos;
          return ChunkStatus::kComplete;
        }
      }
    }
    if (body.size() + size > max_body) return ChunkStatus::kTooLarge;
    if (in.size() - pos < size + 2) {
      need = pos + size + 2;  // the rest of this chunk and its CRLF
      return ChunkStatus::kNeedMore;
    }
    body.append(in.substr(pos, size));
    pos += size;
    if (in.substr(pos, 2) != "\r\n") {
      error = "a chunk is not followed by CRLF";
      return ChunkStatus::kError;
    }
    pos += 2;
  }
}

}  // namespace

bool IsTokenChar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  switch (c) {
    case '!':
    case '#':
    case '$':
    case '%':
    case '&':
    case '\'':
    case '*':
    case '+':
    case '-':
    case '.':
    case '^':
    case '_':
    case '`':
    case '|':
    case '~':
      return true;
    default:
      return false;
  }
}

std::string_view TrimOws(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool NameEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (Lower(a[i]) != Lower(b[i])) return false;
  }
  return true;
}

std::string PercentDecode(std::string_view s, bool plus_is_space) {
  return ::idem::PercentDecode(s, plus_is_space);
}

std::string DecodePath(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      int hi = HexDigit(s[i + 1]);
      int lo = HexDigit(s[i + 2]);
      if (hi >= 0 && lo >= 0) {
        const char c = static_cast<char>(hi * 16 + lo);
        if (c == '/' || c == '%') {
          out += c == '/' ? "%2F" : "%25";
        } else {
          out += c;
        }
        i += 2;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

std::string DecodePathSegment(std::string_view s) { return PercentDecode(s, false); }

bool Request::HasHeader(std::string_view name) const { return HeaderCount(name) > 0; }

std::string Request::HeaderValue(std::string_view name, size_t index) const {
  for (const Field& f : headers) {
    if (NameEquals(f.name, name) && index-- == 0) return f.value;
  }
  return "";
}

size_t Request::HeaderCount(std::string_view name) const {
  size_t n = 0;
  for (const Field& f : headers) n += NameEquals(f.name, name) ? 1 : 0;
  return n;
}

void Response::SetHeader(std::string_view name, std::string value) {
  for (Field& f : headers) {
    if (NameEquals(f.name, name)) {
      f.value = std::move(value);
      return;
    }
  }
  headers.push_back(Field{std::string(name), std::move(value)});
}

std::string Response::HeaderValue(std::string_view name) const {
  for (const Field& f : headers) {
    if (NameEquals(f.name, name)) return f.value;
  }
  return "";
}

void Response::SetContent(std::string content, std::string_view content_type) {
  body = std::move(content);
  SetHeader("Content-Type", std::string(content_type));
}

size_t MaxChunkFraming(const Limits& limits) { return (64 << 10) + limits.max_body_bytes / 4; }

size_t MaxRequestBytes(const Limits& limits) {
  return 2 * limits.max_head_bytes + limits.max_body_bytes + MaxChunkFraming(limits) +
         kMaxChunkLine + 2;
}

ParseResult ParseRequest(std::string_view in, const Limits& limits, Request* out,
                         size_t head_scanned, ChunkedProgress* chunked) {
  ChunkedProgress unkept;
  ChunkedProgress& progress = chunked != nullptr ? *chunked : unkept;
  // RFC 9112 2.2: ignore empty lines before the request line.
  size_t start = 0;
  while (in.substr(start, 2) == "\r\n") {
    start += 2;
    if (start / 2 > kMaxLeadingEmptyLines) {
      return Error(400, "more than " + std::to_string(kMaxLeadingEmptyLines) +
                            " empty lines before the request line");
    }
  }
  // Bytes before `from` were scanned by an earlier call: 3 back, for an end
  // of head that straddles it, and back over an LF, for a CRLF it splits.
  size_t from =
      std::max(start, std::min(head_scanned, in.size()) > 3 ? std::min(head_scanned, in.size()) - 3
                                                            : size_t{0});
  while (from > start && in[from] == '\n') --from;
  size_t head_end = in.find("\r\n\r\n", from);
  if (FindBareCrOrLf(in.substr(
          from, head_end == std::string_view::npos ? std::string_view::npos : head_end - from)) !=
      std::string_view::npos) {
    return Error(400, "a line in the request head ends in a bare CR or LF, not CRLF");
  }
  if (head_end == std::string_view::npos) {
    // Up to 3 bytes may be the start of the CRLF CRLF that ends a head of
    // max_head_bytes: refusing them would depend on how the bytes arrive.
    if (in.size() - start > limits.max_head_bytes + 3) {
      return Error(431, "the request line and headers exceed " +
                            std::to_string(limits.max_head_bytes) + " bytes");
    }
    ParseResult more;
    more.head_scanned = in.size();
    return more;
  }
  if (head_end - start > limits.max_head_bytes) {
    return Error(431, "the request line and headers exceed " +
                          std::to_string(limits.max_head_bytes) + " bytes");
  }
  std::string_view head = in.substr(start, head_end - start);
  const size_t body_start = head_end + 4;

  Request req;
  // Request line.
  size_t eol = head.find("\r\n");
  std::string_view line = head.substr(0, eol);
  size_t sp1 = line.find(' ');
  size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos || sp1 == 0 ||
      sp2 == sp1 + 1 || line.find(' ', sp2 + 1) != std::string_view::npos) {
    return Error(400, "malformed request line");
  }
  std::string_view method = line.substr(0, sp1);
  for (char c : method) {
    if (!IsTokenChar(c)) return Error(400, "malformed method");
  }
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  std::string_view version = line.substr(sp2 + 1);
  if (version == "HTTP/1.1") {
    req.minor_version = 1;
  } else if (version == "HTTP/1.0") {
    req.minor_version = 0;
  } else if (version.starts_with("HTTP/")) {
    return Error(505, "only HTTP/1.0 and HTTP/1.1 are served");
  } else {
    return Error(400, "malformed request line");
  }
  if (target.empty() || target.front() != '/') {
    return Error(400, "the request target must be an absolute path");
  }
  for (char c : target) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) {
      return Error(400, "the request target contains a control character");
    }
  }
  req.method = std::string(method);
  req.target = std::string(target);
  size_t qmark = target.find('?');
  req.path = DecodePath(target.substr(0, qmark));
  if (qmark != std::string_view::npos) ParseQuery(target.substr(qmark + 1), req.query);

  // Header fields.
  size_t pos = eol == std::string_view::npos ? head.size() : eol + 2;
  while (pos < head.size()) {
    size_t end = head.find("\r\n", pos);
    if (end == std::string_view::npos) end = head.size();
    std::string_view field = head.substr(pos, end - pos);
    pos = end + 2;
    size_t colon = field.find(':');
    if (colon == std::string_view::npos || colon == 0) return Error(400, "malformed header field");
    std::string_view name = field.substr(0, colon);
    for (char c : name) {
      // Also refuses obsolete line folding (a line starting with a space).
      if (!IsTokenChar(c)) return Error(400, "malformed header field name");
    }
    std::string_view value = TrimOws(field.substr(colon + 1));
    for (char c : value) {
      if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f) {
        return Error(400, "a header field value contains a control character");
      }
    }
    if (req.headers.size() >= limits.max_headers) {
      return Error(431, "more than " + std::to_string(limits.max_headers) + " header fields");
    }
    req.headers.push_back(Field{std::string(name), std::string(value)});
  }

  // RFC 9112 3.2: an HTTP/1.1 request without Host, or any request with
  // more than one (which one names the target would be up to each hop), is
  // a 400. An HTTP/1.0 request may leave Host out.
  const size_t hosts = req.HeaderCount("Host");
  if (hosts > 1) return Error(400, "more than one Host header field", "header:Host");
  if (hosts == 0 && req.minor_version == 1) {
    return Error(400, "an HTTP/1.1 request needs a Host header field", "header:Host");
  }

  // Connection persistence (RFC 9112 9.3).
  bool close = false, keep = false;
  for (const Field& f : req.headers) {
    if (!NameEquals(f.name, "Connection")) continue;
    close = close || ListHas(f.value, "close");
    keep = keep || ListHas(f.value, "keep-alive");
  }
  req.keep_alive = req.minor_version == 1 ? !close : (keep && !close);

  // Body framing (RFC 9112 6.3).
  size_t te_count = req.HeaderCount("Transfer-Encoding");
  size_t cl_count = req.HeaderCount("Content-Length");
  if (te_count > 0 && cl_count > 0) {
    return Error(400, "both Transfer-Encoding and Content-Length are present",
                 "header:Transfer-Encoding");
  }
  // RFC 9110 10.1.1: an HTTP/1.0 request's 100-continue expectation is ignored.
  const bool expects_continue =
      req.minor_version == 1 && ListHas(req.HeaderValue("Expect"), "100-continue");
  ParseResult r;
  if (te_count > 0) {
    // RFC 9112 6.1: Transfer-Encoding in HTTP/1.0 is faulty framing; the
    // connection closes after this request.
    if (req.minor_version == 0) req.keep_alive = false;
    // The codings of every Transfer-Encoding field, in order (empty list
    // elements ignored, RFC 9110 5.6.1).
    std::vector<std::string_view> codings;
    for (const Field& f : req.headers) {
      if (!NameEquals(f.name, "Transfer-Encoding")) continue;
      std::string_view list = f.value;
      while (!list.empty()) {
        size_t comma = list.find(',');
        std::string_view item = TrimOws(list.substr(0, comma));
        if (!item.empty()) codings.push_back(item);
        if (comma == std::string_view::npos) break;
        list.remove_prefix(comma + 1);
      }
    }
    // RFC 9112 6.3: chunked not last means the body has no known end: 400
    // and close. Chunked applied twice (RFC 9112 7) is as malformed.
    if (codings.empty() || !NameEquals(codings.back(), "chunked")) {
      return Error(400, "chunked is not the final transfer coding", "header:Transfer-Encoding");
    }
    if (codings.size() > 1) {
      for (size_t i = 0; i + 1 < codings.size(); ++i) {
        if (NameEquals(codings[i], "chunked")) {
          return Error(400, "the chunked transfer coding is applied more than once",
                       "header:Transfer-Encoding");
        }
      }
      return Error(501, "only the chunked transfer coding is supported",
                   "header:Transfer-Encoding");
    }
    size_t used = 0;
    size_t need = 0;
    std::string error;
    const ChunkStatus decoded =
        DecodeChunked(in.substr(body_start), limits.max_body_bytes, MaxChunkFraming(limits),
                      limits.max_head_bytes, progress, used, need, error);
    if (decoded == ChunkStatus::kNeedMore) {
      r.wants_continue = expects_continue;
      r.need = need == 0 ? 0 : body_start + need;
      return r;
    }
    std::string body = std::move(progress.body);
    progress.Reset();
    switch (decoded) {
      case ChunkStatus::kNeedMore:
      case ChunkStatus::kError:
        return Error(400, error);
      case ChunkStatus::kTooLarge:
        return Error(413,
                     "the body is larger than " + std::to_string(limits.max_body_bytes) + " bytes");
      case ChunkStatus::kFramingTooLarge:
        return Error(413,
                     "the chunked body's framing (chunk size lines, extensions and CRLFs) "
                     "is larger than " +
                         std::to_string(MaxChunkFraming(limits)) +
                         " bytes: send the body in fewer, larger chunks");
      case ChunkStatus::kTrailerTooLarge:
        return Error(431, "the chunked trailer section exceeds " +
                              std::to_string(limits.max_head_bytes) + " bytes");
      case ChunkStatus::kComplete:
        req.body = std::move(body);
        r.consumed = body_start + used;
        break;
    }
  } else {
    uint64_t length = 0;
    for (size_t i = 0; i < cl_count; ++i) {
      std::string v = req.HeaderValue("Content-Length", i);
      uint64_t n = 0;
      auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (v.empty() || ec != std::errc() || ptr != v.data() + v.size()) {
        return Error(400, "malformed Content-Length", "header:Content-Length");
      }
      if (i > 0 && n != length) {
        return Error(400, "conflicting Content-Length fields", "header:Content-Length");
      }
      length = n;
    }
    if (length > limits.max_body_bytes) {
      return Error(413,
                   "the body is larger than " + std::to_string(limits.max_body_bytes) + " bytes");
    }
    if (in.size() - body_start < length) {
      r.wants_continue = expects_continue;
      r.need = body_start + length;
      return r;
    }
    req.body = std::string(in.substr(body_start, length));
    r.consumed = body_start + length;
  }
  r.status = ParseStatus::kComplete;
  *out = std::move(req);
  return r;
}

std::string_view ReasonPhrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 202:
      return "Accepted";
    case 204:
      return "No Content";
    case 304:
      return "Not Modified";
    case 308:
      return "Permanent Redirect";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 406:
      return "Not Acceptable";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 410:
      return "Gone";
    case 411:
      return "Length Required";
    case 412:
      return "Precondition Failed";
    case 413:
      return "Content Too Large";
    case 414:
      return "URI Too Long";
    case 415:
      return "Unsupported Media Type";
    case 422:
      return "Unprocessable Content";
    case 428:
      return "Precondition Required";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return status < 300   ? "OK"
             : status < 400 ? "Redirection"
             : status < 500 ? "Client Error"
                            : "Server Error";
  }
}

void SerializeResponse(const Response& res, bool keep_alive, int minor_version, std::string& out,
                       bool head_request, std::string_view date) {
  out += "HTTP/1.1 ";
  out += std::to_string(res.status);
  out += ' ';
  out += ReasonPhrase(res.status);
  out += "\r\n";
  for (const Field& f : res.headers) {
    out += f.name;
    out += ": ";
    out += f.value;
    out += "\r\n";
  }
  if (!date.empty()) {
    out += "Date: ";
    out += date;
    out += "\r\n";
  }
  out += "Content-Length: ";
  out += std::to_string(res.body.size());
  out += "\r\n";
  if (!keep_alive) {
    out += "Connection: close\r\n";
  } else if (minor_version == 0) {
    out += "Connection: keep-alive\r\n";
  }
  out += "\r\n";
  if (!head_request) out += res.body;
}

std::string HttpDate(int64_t unix_seconds) {
  static constexpr const char* kDays[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  const time_t t = static_cast<time_t>(unix_seconds);
  tm utc{};
  if (gmtime_r(&t, &utc) == nullptr) return "";
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%s, %02d %s %04d %02d:%02d:%02d GMT", kDays[utc.tm_wday],
                utc.tm_mday, kMonths[utc.tm_mon], utc.tm_year + 1900, utc.tm_hour, utc.tm_min,
                utc.tm_sec);
  return buf;
}

}  // namespace idem::http1
