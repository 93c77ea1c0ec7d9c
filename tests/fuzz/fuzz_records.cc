// The store's record codecs (daemon/store/record_codec.h) on arbitrary
// bytes, each against the reference it stands in for. Invariants:
//   - DecodeWorkItem, the journal's streaming decoder (every read of a work
//     item), accepts exactly what WorkItem::FromJson accepts of the parsed
//     text, and decodes it to the same item. The one allowed difference:
//     a record with a top-level member named twice (never written by
//     EncodeWorkItem) may be refused by the streaming decoder where the
//     parsed text keeps the last one;
//   - an item it decodes encodes (EncodeWorkItem) and decodes back to
//     itself;
//   - a decision that Decision::FromJson reads is stored (EncodeDecision:
//     the hot record and, when the trace has detail, the trace apart) and
//     read back (DecodeDecision, AttachTrace) to itself, and the hot
//     record alone reads back with the trace cut to its summary;
//   - a list cursor (ParseTimeIdCursor, from a query string) either is
//     refused or is one TimeIdCursor writes for what it parsed to.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "daemon/core/json.h"
#include "daemon/store/record_codec.h"
#include "daemon/store/store.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using idem::Decision;
using idem::Json;
using idem::StatusOr;
using idem::WorkItem;
namespace codec = idem::store_internal;

// Whether the text's top-level object names a member twice (a SAX pass
// over the parsed text; false when it is not an object).
class DuplicateMembers : public nlohmann::json_sax<Json> {
 public:
  bool found = false;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    ++depth_;
    return true;
  }
  bool end_object() override {
    --depth_;
    return true;
  }
  bool start_array(std::size_t n) override { return start_object(n); }  // a level deeper
  bool end_array() override { return end_object(); }
  bool key(string_t& k) override {
    if (depth_ == 1 && !names_.insert(k).second) found = true;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

 private:
  int depth_ = 0;
  std::set<std::string> names_;
};

bool NamesAMemberTwice(std::string_view text) {
  DuplicateMembers sax;
  try {
    Json::sax_parse(text, &sax);
  } catch (const Json::exception&) {
    return false;
  }
  return sax.found;
}

void CheckWorkItem(std::string_view text, const Json* parsed) {
  StatusOr<WorkItem> streamed = codec::DecodeWorkItem(text);
  StatusOr<WorkItem> reference =
      parsed != nullptr ? WorkItem::FromJson(*parsed) : StatusOr<WorkItem>(idem::Internal("x"));
  if (streamed.ok()) {
    FUZZ_CHECK(reference.ok());
    FUZZ_CHECK(streamed->ToJson() == reference->ToJson());
    StatusOr<std::string> encoded = codec::EncodeWorkItem(*streamed);
    FUZZ_CHECK(encoded.ok());  // every string came from JSON text: UTF-8
    StatusOr<WorkItem> again = codec::DecodeWorkItem(*encoded);
    FUZZ_CHECK(again.ok());
    FUZZ_CHECK(again->ToJson() == streamed->ToJson());
  } else {
    FUZZ_CHECK(streamed.status().code() == idem::Code::kInternal);
    if (reference.ok()) FUZZ_CHECK(NamesAMemberTwice(text));
  }
}

void CheckDecision(const Json& parsed) {
  StatusOr<Decision> d = Decision::FromJson(parsed);
  if (!d.ok()) return;
  StatusOr<codec::StoredDecision> stored = codec::EncodeDecision(*d);
  FUZZ_CHECK(stored.ok());
  bool apart = false;
  StatusOr<Decision> hot = codec::DecodeDecision(stored->hot, &apart);
  FUZZ_CHECK(hot.ok());
  FUZZ_CHECK(apart == stored->trace.has_value());
  FUZZ_CHECK(hot->trace_whole == !apart);
  if (apart) {
    FUZZ_CHECK(hot->trace == idem::TraceSummary(d->trace));
    FUZZ_CHECK(codec::AttachTrace(*hot, *stored->trace).ok());
  }
  FUZZ_CHECK(hot->trace_whole);
  FUZZ_CHECK(hot->ToJson() == d->ToJson());
}

void CheckCursor(std::string_view text) {
  auto parsed = idem::ParseTimeIdCursor(text);
  if (!parsed.ok()) {
    FUZZ_CHECK(parsed.status().code() == idem::Code::kInvalidArgument);
    return;
  }
  const std::string written = idem::TimeIdCursor(parsed->first, parsed->second);
  auto back = idem::ParseTimeIdCursor(written);
  FUZZ_CHECK(back.ok());
  FUZZ_CHECK(*back == *parsed);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = idem::fuzz::AsView(data, size);
  Json parsed = Json::parse(text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  const bool is_json = !parsed.is_discarded();
  CheckWorkItem(text, is_json ? &parsed : nullptr);
  if (is_json) CheckDecision(parsed);
  CheckCursor(text);
  return 0;
}
