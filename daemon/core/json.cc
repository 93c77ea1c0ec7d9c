#include "daemon/core/json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace idem {
namespace {

// Eight bytes of text at a time (word-at-a-time tests, exact as a yes or
// no for the whole word; the byte order does not matter).
constexpr uint64_t kEachByte = 0x0101010101010101ull;  // times n: n in every byte
constexpr uint64_t kHighBits = 0x8080808080808080ull;

uint64_t Word(const char* at) {
  uint64_t w;
  std::memcpy(&w, at, sizeof(w));
  return w;
}

// Some byte of `w` is below `n` (n <= 128).
bool AnyByteBelow(uint64_t w, uint8_t n) { return ((w - kEachByte * n) & ~w & kHighBits) != 0; }

// Some byte of `w` is `c`.
bool AnyByteIs(uint64_t w, char c) {
  return AnyByteBelow(w ^ (kEachByte * static_cast<uint8_t>(c)), 1);
}

// What a JSON string must escape: control characters, '"' and '\\'.
bool NeedsEscape(char c) { return static_cast<unsigned char>(c) < 0x20 || c == '"' || c == '\\'; }
bool AnyNeedsEscape(uint64_t w) {
  return AnyByteBelow(w, 0x20) || AnyByteIs(w, '"') || AnyByteIs(w, '\\');
}

// Offset of the first byte that is not well-formed UTF-8, or npos.
size_t FindInvalidUtf8(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    // ASCII (the common case: ids, keys, most text) needs no decoding:
    // skipped a word at a time while no byte has its high bit set.
    while (s.size() - pos >= 8 && (Word(s.data() + pos) & kHighBits) == 0) pos += 8;
    if (pos == s.size()) break;
    if (static_cast<unsigned char>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    if (!DecodeUtf8(s, pos)) return pos;
  }
  return std::string_view::npos;
}

std::string PointerOf(const std::vector<std::string>& tokens) {
  std::string out;
  for (const std::string& t : tokens) {
    out += '/';
    out += JsonPointerToken(t);
  }
  return out;
}

// nlohmann's messages start with "[json.exception.parse_error.101] "; the
// tag means nothing to an API client. They also quote the bytes read so far,
// which can end in the middle of a character; a message that is not UTF-8
// would make the problem+json answer itself unserializable.
std::string ClientMessage(std::string_view what) {
  if (!what.empty() && what.front() == '[') {
    const size_t close = what.find("] ");
    if (close != std::string_view::npos) what.remove_prefix(close + 2);
  }
  return ValidUtf8Text(what, "?");
}

// Builds the value from SAX events. Doing it ourselves (instead of
// nlohmann's DOM parser) lets us stop at the first nested container that is
// too deep, before anything below it is allocated, and reject duplicate
// member names that nlohmann would silently overwrite.
class BoundedJsonBuilder {
 public:
  BoundedJsonBuilder(int max_depth, bool exact_integer_literals)
      : max_depth_(max_depth), exact_integer_literals_(exact_integer_literals) {}

  bool null() { return AddScalar(Json(nullptr)); }
  bool boolean(bool v) { return AddScalar(Json(v)); }
  bool number_integer(Json::number_integer_t v) { return AddScalar(Json(v)); }
  bool number_unsigned(Json::number_unsigned_t v) { return AddScalar(Json(v)); }
  bool number_float(Json::number_float_t v, const Json::string_t& text) {
    // nlohmann reads an integer literal past 64 bits as a double.
    if (exact_integer_literals_ && text.find_first_of(".eE") == Json::string_t::npos) {
      std::string pointer = PointerOf(path_);
      if (!open_.empty()) {
        const Json& parent = *open_.back();
        pointer += "/" + (parent.is_array() ? std::to_string(parent.size())
                                            : JsonPointerToken(pending_key_));
      }
      error_ = InvalidArgument("the integer " + text.substr(0, 40) + (text.size() > 40 ? "…" : "") +
                                   " does not fit 64 bits and would be kept rounded (two such "
                                   "integers could be one); send it as a string",
                               std::move(pointer));
      return false;
    }
    return AddScalar(Json(v));
  }
  bool string(Json::string_t& v) { return AddScalar(Json(std::move(v))); }
  bool binary(Json::binary_t&) {
    // Never produced by JSON text; only by the binary formats.
    error_ = Internal("binary value in JSON text");
    return false;
  }

  bool start_object(std::size_t) { return OpenContainer(Json::object()); }
  bool start_array(std::size_t) { return OpenContainer(Json::array()); }
  bool end_object() { return CloseContainer(); }
  bool end_array() { return CloseContainer(); }

  bool key(Json::string_t& name) {
    Json& object = *open_.back();
    if (object.find(name) != object.end()) {
      path_.push_back(name);
      std::string pointer = PointerOf(path_);
      path_.pop_back();
      error_ = InvalidArgument("duplicate member name \"" + name + "\"", std::move(pointer));
      return false;
    }
    pending_key_ = std::move(name);
    return true;
  }

  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& ex) {
    // `position` counts bytes read, including the offending one.
    const size_t offset = position > 0 ? position - 1 : 0;
    error_ = InvalidArgument("invalid JSON at byte offset " + std::to_string(offset) + ": " +
                             ClientMessage(ex.what()));
    return false;
  }

  Status error() const { return error_; }
  Json TakeResult() { return std::move(root_); }

 private:
  // Places `value` where the grammar says the next value goes and returns it.
  Json* Place(Json&& value) {
    if (open_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    Json& parent = *open_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(value));
      return &parent.back();
    }
    Json& slot = parent[pending_key_];
    slot = std::move(value);
    return &slot;
  }

  bool AddScalar(Json&& value) {
    Place(std::move(value));
    return true;
  }

  bool OpenContainer(Json&& empty) {
    if (!open_.empty()) {
      const Json& parent = *open_.back();
      path_.push_back(parent.is_array() ? std::to_string(parent.size()) : pending_key_);
    }
    if (static_cast<int64_t>(open_.size()) + 1 > max_depth_) {
      error_ = ResourceExhausted("JSON nesting deeper than " + std::to_string(max_depth_),
                                 PointerOf(path_));
      return false;
    }
    // Children are only added to the innermost open container, so the
    // pointers held for its ancestors stay valid.
    open_.push_back(Place(std::move(empty)));
    return true;
  }

  bool CloseContainer() {
    open_.pop_back();
    if (!open_.empty()) path_.pop_back();
    return true;
  }

  const int max_depth_;
  const bool exact_integer_literals_;
  Json root_;
  std::vector<Json*> open_;
  std::vector<std::string> path_;  // pointer tokens of the innermost open container
  std::string pending_key_;
  Status error_;
};

void AppendEscapedString(std::string_view s, std::string& out) {
  out += '"';
  AppendJsonStringContent(s, out);
  out += '"';
}

// UTF-16 code units of a well-formed UTF-8 string: the sort key RFC 8785
// prescribes for member names.
std::optional<std::u16string> ToUtf16(std::string_view s) {
  std::u16string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    std::optional<char32_t> cp = DecodeUtf8(s, pos);
    if (!cp) return std::nullopt;
    if (*cp < 0x10000) {
      out += static_cast<char16_t>(*cp);
    } else {
      const char32_t v = *cp - 0x10000;
      out += static_cast<char16_t>(0xD800 + (v >> 10));
      out += static_cast<char16_t>(0xDC00 + (v & 0x3FF));
    }
  }
  return out;
}

class Canonicalizer {
 public:
  Status Append(const Json& value, std::string& out) {
    switch (value.type()) {
      case Json::value_t::null:
        out += "null";
        return Status::Ok();
      case Json::value_t::boolean:
        out += value.get<bool>() ? "true" : "false";
        return Status::Ok();
      case Json::value_t::number_integer:
        // JCS numbers are IEEE-754 doubles; integers above 2^53 round.
        out += FormatJcsNumber(static_cast<double>(value.get<Json::number_integer_t>()));
        return Status::Ok();
      case Json::value_t::number_unsigned:
        out += FormatJcsNumber(static_cast<double>(value.get<Json::number_unsigned_t>()));
        return Status::Ok();
      case Json::value_t::number_float: {
        const double v = value.get<double>();
        if (!std::isfinite(v)) {
          return InvalidArgument("NaN and infinities have no JSON form", PointerOf(path_));
        }
        out += FormatJcsNumber(v);
        return Status::Ok();
      }
      case Json::value_t::string: {
        const std::string& s = value.get_ref<const std::string&>();
        if (size_t bad = FindInvalidUtf8(s); bad != std::string_view::npos) {
          return InvalidArgument("string is not valid UTF-8 (byte " + std::to_string(bad) + ")",
                                 PointerOf(path_));
        }
        AppendEscapedString(s, out);
        return Status::Ok();
      }
      case Json::value_t::array: {
        out += '[';
        size_t index = 0;
        for (const Json& element : value) {
          if (index > 0) out += ',';
          path_.push_back(std::to_string(index++));
          Status s = Append(element, out);
          path_.pop_back();
          RETURN_IF_ERROR(s);
        }
        out += ']';
        return Status::Ok();
      }
      case Json::value_t::object:
        return AppendObject(value, out);
      case Json::value_t::binary:
        return InvalidArgument("binary values have no JSON form", PointerOf(path_));
      case Json::value_t::discarded:
        break;
    }
    return InvalidArgument("discarded value has no JSON form", PointerOf(path_));
  }

 private:
  struct Member {
    std::u16string sort_key;
    const std::string* name;
    const Json* value;
  };

  Status AppendObject(const Json& object, std::string& out) {
    std::vector<Member> members;
    members.reserve(object.size());
    for (auto it = object.begin(); it != object.end(); ++it) {
      std::optional<std::u16string> key = ToUtf16(it.key());
      if (!key) {
        path_.push_back(it.key());
        Status s = InvalidArgument("member name is not valid UTF-8", PointerOf(path_));
        path_.pop_back();
        return s;
      }
      members.push_back({std::move(*key), &it.key(), &it.value()});
    }
    // nlohmann's std::map orders by UTF-8 bytes, which puts U+E000..U+FFFF
    // before supplementary characters; UTF-16 order puts them after.
    std::sort(members.begin(), members.end(),
              [](const Member& a, const Member& b) { return a.sort_key < b.sort_key; });
    out += '{';
    bool first = true;
    for (const Member& m : members) {
      if (!first) out += ',';
      first = false;
      AppendEscapedString(*m.name, out);
      out += ':';
      path_.push_back(*m.name);
      Status s = Append(*m.value, out);
      path_.pop_back();
      RETURN_IF_ERROR(s);
    }
    out += '}';
    return Status::Ok();
  }

  std::vector<std::string> path_;
};

}  // namespace

std::optional<char32_t> DecodeUtf8(std::string_view s, size_t& pos) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char b0 = byte(pos);
  if (b0 < 0x80) {
    ++pos;
    return b0;
  }
  size_t len;
  char32_t cp;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // UTF-16 surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return std::nullopt;
  }
  if (s.size() - pos < len) return std::nullopt;
  for (size_t i = 1; i < len; ++i) {
    const unsigned char b = byte(pos + i);
    if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return std::nullopt;
    cp = (cp << 6) | (b & 0x3F);
  }
  pos += len;
  return cp;
}

StatusOr<Json> ParseJson(std::string_view text, const JsonLimits& limits) {
  if (text.size() > limits.max_bytes) {
    return ResourceExhausted("JSON text of " + std::to_string(text.size()) +
                             " bytes exceeds the limit of " + std::to_string(limits.max_bytes));
  }
  // nlohmann checks UTF-8 inside strings too, but only we can say where.
  if (size_t bad = FindInvalidUtf8(text); bad != std::string_view::npos) {
    return InvalidArgument("invalid UTF-8 at byte offset " + std::to_string(bad));
  }
  BoundedJsonBuilder builder(limits.max_depth, limits.exact_integer_literals);
  try {
    const bool ok = Json::sax_parse(text.data(), text.data() + text.size(), &builder,
                                    nlohmann::detail::input_format_t::json, /*strict=*/true,
                                    /*ignore_comments=*/false);
    if (!ok) {
      Status s = builder.error();
      return s.ok() ? InvalidArgument("invalid JSON") : s;
    }
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("out of memory while parsing JSON");
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("invalid JSON: ") + ClientMessage(e.what()));
  }
  return builder.TakeResult();
}

StatusOr<std::string> CanonicalJson(const Json& value) {
  std::string out;
  try {
    Canonicalizer canonicalizer;
    RETURN_IF_ERROR(canonicalizer.Append(value, out));
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("out of memory while canonicalizing JSON");
  } catch (const std::exception& e) {
    return Internal(std::string("canonicalizing JSON: ") + e.what());
  }
  return out;
}

bool IsValidUtf8(std::string_view s) { return FindInvalidUtf8(s) == std::string_view::npos; }

size_t CodePoints(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::string ValidUtf8Text(std::string_view s, std::string_view replacement) {
  size_t bad = FindInvalidUtf8(s);
  if (bad == std::string_view::npos) return std::string(s);
  std::string out(s.substr(0, bad));
  size_t pos = bad;
  while (pos < s.size()) {
    const size_t start = pos;
    if (DecodeUtf8(s, pos)) {
      out.append(s, start, pos - start);
    } else {
      out += replacement;
      ++pos;
    }
  }
  return out;
}

namespace {

// No byte of `s` needs a JSON escape.
bool NeedsNoEscape(std::string_view s) {
  size_t i = 0;
  for (; s.size() - i >= 8; i += 8) {
    if (AnyNeedsEscape(Word(s.data() + i))) return false;
  }
  for (; i < s.size(); ++i) {
    if (NeedsEscape(s[i])) return false;
  }
  return true;
}

}  // namespace

void AppendJsonStringContent(std::string_view s, std::string& out) {
  static constexpr char kHex[] = "0123456789abcdef";
  // Runs of characters that need no escape are appended whole: this writes
  // every trace entry, outbox event and canonical form.
  size_t run = 0;  // the first character not yet appended
  for (size_t i = 0; i < s.size(); ++i) {
    // Eight at a time while none of them needs an escape.
    while (s.size() - i >= 8 && !AnyNeedsEscape(Word(s.data() + i))) i += 8;
    if (i == s.size()) break;
    const char c = s[i];
    if (!NeedsEscape(c)) continue;
    out.append(s, run, i - run);
    run = i + 1;
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        out += "\\u00";
        out += kHex[(c >> 4) & 0xF];
        out += kHex[c & 0xF];
    }
  }
  out.append(s, run, s.size() - run);
}

std::string_view Utf8Prefix(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  size_t n = max_bytes;
  // s[n] is the first byte left out; while it continues a character, that
  // character started inside the prefix and must go too. A UTF-8 character
  // has at most 3 continuation bytes; past that the text is not UTF-8 and
  // the byte cut stands.
  for (int i = 0; i < 3 && n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80; ++i) --n;
  if ((static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) n = max_bytes;
  return s.substr(0, n);
}

std::string CutUtf8(std::string_view s, size_t max_bytes, std::string_view marker) {
  if (s.size() <= max_bytes) return std::string(s);
  std::string out(Utf8Prefix(s, max_bytes));
  out += marker;
  return out;
}

std::string FormatJcsNumber(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  if (value == 0) return "0";  // also -0
  std::string out;
  if (value < 0) {
    out += '-';
    value = -value;
  }
  // Shortest round-trip digits, as ECMAScript Number::toString requires;
  // scientific form makes the digits and the exponent easy to take apart.
  char buf[40];
  const auto result = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
  const std::string_view sci(buf, static_cast<size_t>(result.ptr - buf));
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos)) {
    if (c != '.') digits += c;
  }
  int exponent = 0;
  std::string_view exp_text = sci.substr(e_pos + 1);
  if (!exp_text.empty() && exp_text.front() == '+') exp_text.remove_prefix(1);
  std::from_chars(exp_text.data(), exp_text.data() + exp_text.size(), exponent);

  // ECMAScript's names: the value is 0.digits * 10^n, with k digits.
  const int k = static_cast<int>(digits.size());
  const int n = exponent + 1;
  if (k <= n && n <= 21) {
    out += digits;
    out.append(static_cast<size_t>(n - k), '0');
  } else if (0 < n && n <= 21) {
    out.append(digits, 0, static_cast<size_t>(n));
    out += '.';
    out.append(digits, static_cast<size_t>(n));
  } else if (-6 < n && n <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-n), '0');
    out += digits;
  } else {
    out += digits[0];
    if (k > 1) {
      out += '.';
      out.append(digits, 1);
    }
    out += 'e';
    out += n - 1 >= 0 ? '+' : '-';
    out += std::to_string(std::abs(n - 1));
  }
  return out;
}

std::string JsonPointerToken(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  for (char c : token) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

JsonObjectWriter::JsonObjectWriter() {
  // One allocation for most objects (a work record is about 560 bytes, a
  // trace entry 270): grown from empty, a record was reallocated five times.
  out_.reserve(640);
  out_ += '{';
}

void JsonObjectWriter::Name(std::string_view name) {
  const bool first = out_.size() == 1;
  // The caller's literals need no escape: `,"name":` goes in with one
  // append, built on the stack.
  char buf[72];
  if (name.size() + 4 <= sizeof buf && NeedsNoEscape(name)) {
    char* p = buf;
    if (!first) *p++ = ',';
    *p++ = '"';
    std::memcpy(p, name.data(), name.size());
    p += name.size();
    *p++ = '"';
    *p++ = ':';
    out_.append(buf, static_cast<size_t>(p - buf));
    return;
  }
  if (!first) out_ += ',';
  AppendEscapedString(name, out_);
  out_ += ':';
}

JsonObjectWriter& JsonObjectWriter::Str(std::string_view name, std::string_view value) {
  Name(name);
  out_ += '"';
  if (IsValidUtf8(value)) {
    AppendJsonStringContent(value, out_);
  } else if (bad_.empty()) {
    bad_ = name;
  }
  out_ += '"';
  return *this;
}

JsonObjectWriter& JsonObjectWriter::Int(std::string_view name, int64_t value) {
  Name(name);
  char digits[24];
  // 24 bytes hold every int64_t, so to_chars cannot fail.
  const char* end = std::to_chars(digits, digits + sizeof digits, value).ptr;
  out_.append(digits, static_cast<size_t>(end - digits));
  return *this;
}

JsonObjectWriter& JsonObjectWriter::Double(std::string_view name, double value) {
  Name(name);
  out_ += std::isfinite(value) ? FormatJcsNumber(value) : "null";
  return *this;
}

JsonObjectWriter& JsonObjectWriter::Bool(std::string_view name, bool value) {
  Name(name);
  out_ += value ? "true" : "false";
  return *this;
}

JsonObjectWriter& JsonObjectWriter::Raw(std::string_view name, std::string_view json_text) {
  Name(name);
  out_ += json_text;
  return *this;
}

std::string JsonObjectWriter::Take() {
  out_ += '}';
  return std::move(out_);
}

}  // namespace idem
