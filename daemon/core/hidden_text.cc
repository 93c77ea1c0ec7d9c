#include "daemon/core/hidden_text.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "daemon/core/json.h"

namespace idem {

namespace {

// Code points that hide or reorder text without showing themselves: the
// C1 controls (U+0080-U+009F), Unicode's Default_Ignorable_Code_Point set
// (soft hyphen, zero-width and joiner characters, bidi controls and
// isolates, variation selectors, fillers, tags) and the format characters
// (Cf) outside it ("O-1<U+00AD>000" read "O-1000").
bool IsHiddenCodePoint(char32_t cp) {
  static constexpr std::pair<char32_t, char32_t> kRanges[] = {
      {0x0080, 0x009f},   {0x00ad, 0x00ad},   {0x034f, 0x034f},   {0x0600, 0x0605},
      {0x061c, 0x061c},   {0x06dd, 0x06dd},   {0x070f, 0x070f},   {0x0890, 0x0891},
      {0x08e2, 0x08e2},   {0x115f, 0x1160},   {0x17b4, 0x17b5},   {0x180b, 0x180f},
      {0x200b, 0x200f},   {0x202a, 0x202e},   {0x2060, 0x206f},   {0x3164, 0x3164},
      {0xfe00, 0xfe0f},   {0xfeff, 0xfeff},   {0xffa0, 0xffa0},   {0xfff0, 0xfffb},
      {0x110bd, 0x110bd}, {0x110cd, 0x110cd}, {0x13430, 0x1343f}, {0x1bca0, 0x1bca3},
      {0x1d173, 0x1d17a}, {0xe0000, 0xe0fff}};
  for (const auto& [from, to] : kRanges) {
    if (cp >= from && cp <= to) return true;
  }
  return false;
}

// "\u" and four hex digits: the JSON escape of a code point below U+10000.
std::string UnicodeEscape(char32_t cp) {
  static const char* kHex = "0123456789abcdef";
  std::string out = "\\u";
  for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(cp >> shift) & 15];
  return out;
}

}  // namespace

char32_t HiddenCodePointAt(std::string_view text, size_t i, size_t* length) {
  if (i >= text.size() || static_cast<unsigned char>(text[i]) < 0x80) return 0;
  size_t next = i;
  const std::optional<char32_t> cp = DecodeUtf8(text, next);
  if (!cp || !IsHiddenCodePoint(*cp)) return 0;
  *length = next - i;
  return *cp;
}

bool IsPrintableText(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    const std::optional<char32_t> cp = DecodeUtf8(text, pos);
    if (!cp || *cp < 0x20 || (*cp >= 0x7f && *cp <= 0x9f)) return false;
  }
  return true;
}

std::string JsonUnicodeEscapes(char32_t cp) {
  if (cp < 0x10000) return UnicodeEscape(cp);
  const char32_t v = cp - 0x10000;
  return UnicodeEscape(0xd800 + (v >> 10)) + UnicodeEscape(0xdc00 + (v & 0x3ff));
}

std::string EscapeHiddenInJson(std::string json_text) {
  const auto non_ascii = std::find_if(json_text.begin(), json_text.end(),
                                      [](char c) { return static_cast<unsigned char>(c) >= 0x80; });
  if (non_ascii == json_text.end()) return json_text;
  const size_t at = static_cast<size_t>(non_ascii - json_text.begin());
  std::string out = json_text.substr(0, at);
  for (size_t i = at; i < json_text.size(); ++i) {
    size_t length = 0;
    if (char32_t hidden = HiddenCodePointAt(json_text, i, &length); hidden != 0) {
      out += JsonUnicodeEscapes(hidden);
      i += length - 1;
    } else {
      out += json_text[i];
    }
  }
  return out;
}

}  // namespace idem
