// The HTTP/1.1 request parser (daemon/http/http1.h) on arbitrary bytes.
// Invariants: no crash; `consumed` within the input; a complete request's
// body within max_body_bytes and its headers within max_headers; and the
// parse is incremental-safe: feeding the same bytes in pieces (as the event
// server does, re-parsing the whole buffer after each read) reaches the
// same outcome as feeding them at once, never completing or failing on a
// prefix differently from what the whole input says, also when the
// prefix's chunked decoding is kept (ChunkedProgress) and resumed.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "daemon/http/http1.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using idem::http1::ChunkedProgress;
using idem::http1::Limits;
using idem::http1::ParseRequest;
using idem::http1::ParseResult;
using idem::http1::ParseStatus;
using idem::http1::Request;

bool SameRequest(const Request& a, const Request& b) {
  if (a.method != b.method || a.target != b.target || a.path != b.path || a.query != b.query ||
      a.body != b.body || a.minor_version != b.minor_version || a.keep_alive != b.keep_alive ||
      a.headers.size() != b.headers.size()) {
    return false;
  }
  for (size_t i = 0; i < a.headers.size(); ++i) {
    if (a.headers[i].name != b.headers[i].name || a.headers[i].value != b.headers[i].value) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  // Small limits so the fuzzer reaches every limit check.
  Limits limits;
  limits.max_head_bytes = 512;
  limits.max_headers = 8;
  limits.max_body_bytes = 256;
  // The first byte picks where to split the rest in two.
  const size_t split_seed = data[0];
  std::string_view in = idem::fuzz::AsView(data + 1, size - 1);

  Request whole;
  ParseResult r = ParseRequest(in, limits, &whole);
  FUZZ_CHECK(r.consumed <= in.size());
  switch (r.status) {
    case ParseStatus::kComplete:
      FUZZ_CHECK(r.consumed > 0);
      FUZZ_CHECK(whole.body.size() <= limits.max_body_bytes);
      FUZZ_CHECK(whole.headers.size() <= limits.max_headers);
      FUZZ_CHECK(!whole.method.empty());
      FUZZ_CHECK(!whole.target.empty() && whole.target[0] == '/');
      break;
    case ParseStatus::kError:
      FUZZ_CHECK(r.error_status >= 400 && r.error_status < 600);
      FUZZ_CHECK(!r.error.empty());
      break;
    case ParseStatus::kNeedMore:
      FUZZ_CHECK(r.consumed == 0);
      break;
  }

  // The request complete over the whole input is complete, the same, over
  // exactly its own bytes (what comes after it cannot change it).
  if (r.status == ParseStatus::kComplete) {
    Request own;
    ParseResult again = ParseRequest(in.substr(0, r.consumed), limits, &own);
    FUZZ_CHECK(again.status == ParseStatus::kComplete);
    FUZZ_CHECK(again.consumed == r.consumed);
    FUZZ_CHECK(SameRequest(own, whole));
  }

  // A prefix: the parser must not finish differently than on the whole.
  size_t cut = in.empty() ? 0 : split_seed * in.size() / 256;
  Request partial;
  ChunkedProgress progress;
  ParseResult p = ParseRequest(in.substr(0, cut), limits, &partial, 0, &progress);
  FUZZ_CHECK(p.consumed <= cut);
  if (p.status == ParseStatus::kComplete) {
    // A prefix that holds a whole request: it is the same request.
    FUZZ_CHECK(r.status == ParseStatus::kComplete);
    FUZZ_CHECK(p.consumed == r.consumed);
    FUZZ_CHECK(SameRequest(partial, whole));
  } else if (p.status == ParseStatus::kError) {
    // An error seen early stays an error with more bytes.
    FUZZ_CHECK(r.status == ParseStatus::kError);
  } else {
    // Resumed where the prefix's head scan and chunked decoding stopped:
    // the same outcome as parsing the whole from the start.
    FUZZ_CHECK(p.head_scanned <= cut);
    FUZZ_CHECK(progress.body.size() <= limits.max_body_bytes);
    FUZZ_CHECK(progress.decoded <= cut);
    Request resumed;
    ParseResult q = ParseRequest(in, limits, &resumed, p.head_scanned, &progress);
    FUZZ_CHECK(q.status == r.status);
    FUZZ_CHECK(q.consumed == r.consumed);
    FUZZ_CHECK(q.error_status == r.error_status);
    if (q.status == ParseStatus::kComplete) FUZZ_CHECK(SameRequest(resumed, whole));
  }
  return 0;
}
