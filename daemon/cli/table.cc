#include "daemon/cli/table.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <utility>

namespace idem::cli {
namespace {

const char* Escape(Color c) {
  switch (c) {
    case Color::kBold:
      return "\033[1m";
    case Color::kDim:
      return "\033[2m";
    case Color::kRed:
      return "\033[31m";
    case Color::kGreen:
      return "\033[32m";
    case Color::kYellow:
      return "\033[33m";
    case Color::kCyan:
      return "\033[36m";
    case Color::kNone:
      break;
  }
  return "";
}

bool IsContinuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// Code points that hide or reorder text without showing themselves: the
// C1 controls (U+0080-U+009F), Unicode's Default_Ignorable_Code_Point set
// (soft hyphen, zero-width and joiner characters, bidi controls and
// isolates, variation selectors, fillers, tags) and the format characters
// (Cf) outside it ("O-1<U+00AD>000" read "O-1000").
bool IsHidden(char32_t cp) {
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

// The hidden code point (IsHidden) whose UTF-8 starts at text[i], with its
// length in bytes; 0 when none starts there (or the bytes are not UTF-8).
char32_t HiddenControlAt(std::string_view text, size_t i, size_t* length) {
  auto at = [&](size_t k) -> unsigned {
    return i + k < text.size() ? static_cast<unsigned char>(text[i + k]) : 0u;
  };
  const unsigned c = at(0);
  size_t n = 0;
  char32_t cp = 0;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
    cp = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    cp = c & 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  for (size_t k = 1; k < n; ++k) {
    if (!IsContinuation(at(k))) return 0;
    cp = cp << 6 | (at(k) & 0x3f);
  }
  if (!IsHidden(cp)) return 0;
  *length = n;
  return cp;
}

// "\u" and four hex digits: the JSON escape of a code point below U+10000.
std::string UnicodeEscape(char32_t cp) {
  static const char* kHex = "0123456789abcdef";
  std::string out = "\\u";
  for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(cp >> shift) & 15];
  return out;
}

// JSON escapes of a code point: "\\uNNNN", or a surrogate pair above U+FFFF.
std::string UnicodeEscapes(char32_t cp) {
  if (cp < 0x10000) return UnicodeEscape(cp);
  const char32_t v = cp - 0x10000;
  return UnicodeEscape(0xd800 + (v >> 10)) + UnicodeEscape(0xdc00 + (v & 0x3ff));
}

}  // namespace

std::string Printable(std::string_view text) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  auto show = [&out](unsigned char c) {
    out += "\\x";
    out += kHex[c >> 4];
    out += kHex[c & 15];
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    size_t length = 0;
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
      show(c);
    } else if (char32_t hidden = HiddenControlAt(text, i, &length); hidden != 0) {
      // C1 (two bytes in UTF-8) as \xNN, the others as \uNNNN.
      if (hidden <= 0x9f) {
        show(static_cast<unsigned char>(hidden));
      } else {
        out += UnicodeEscapes(hidden);
      }
      i += length - 1;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string WithC1Escaped(std::string json_text) {
  const auto non_ascii = std::find_if(json_text.begin(), json_text.end(),
                                      [](char c) { return static_cast<unsigned char>(c) >= 0x80; });
  if (non_ascii == json_text.end()) return json_text;
  const size_t at = static_cast<size_t>(non_ascii - json_text.begin());
  std::string out = json_text.substr(0, at);
  for (size_t i = at; i < json_text.size(); ++i) {
    size_t length = 0;
    if (char32_t hidden = HiddenControlAt(json_text, i, &length); hidden != 0) {
      out += UnicodeEscapes(hidden);
      i += length - 1;
    } else {
      out += json_text[i];
    }
  }
  return out;
}

std::string Style::Paint(std::string_view text, Color c) const {
  if (!color || c == Color::kNone || text.empty()) return std::string(text);
  return std::string(Escape(c)) + std::string(text) + "\033[0m";
}

bool UseColor(std::FILE* stream) {
  if (std::getenv("NO_COLOR") != nullptr) return false;
  return isatty(fileno(stream)) == 1;
}

size_t DisplayWidth(std::string_view utf8) {
  size_t n = 0;
  for (char c : utf8) n += IsContinuation(static_cast<unsigned char>(c)) ? 0 : 1;
  return n;
}

std::string Truncate(std::string_view utf8, size_t max) {
  std::string flat;
  flat.reserve(utf8.size());
  for (char c : utf8) flat.push_back(c == '\n' || c == '\r' || c == '\t' ? ' ' : c);
  if (max == 0 || DisplayWidth(flat) <= max) return flat;
  // Keep max - 1 code points, then the ellipsis.
  size_t kept = 0, i = 0;
  for (; i < flat.size(); ++i) {
    if (!IsContinuation(static_cast<unsigned char>(flat[i]))) {
      if (kept == max - 1) break;
      ++kept;
    }
  }
  return flat.substr(0, i) + "\u2026";
}

Table::Table(std::vector<std::string> headers)
    : headers_(std::move(headers)), max_(headers_.size(), 0) {}

void Table::SetMaxWidth(size_t column, size_t max) {
  if (column < max_.size()) max_[column] = max;
}

void Table::AddRow(std::vector<Cell> cells) {
  cells.resize(headers_.size(), Cell(""));
  for (size_t i = 0; i < cells.size(); ++i) {
    cells[i].text = Truncate(Printable(cells[i].text), max_[i]);
  }
  rows_.push_back(std::move(cells));
}

std::string Table::Render(const Style& style) const {
  std::vector<size_t> width(headers_.size(), 0);
  for (size_t i = 0; i < headers_.size(); ++i) width[i] = DisplayWidth(headers_[i]);
  for (const auto& row : rows_) {
    for (size_t i = 0; i < row.size(); ++i)
      width[i] = std::max(width[i], DisplayWidth(row[i].text));
  }
  std::string out;
  auto line = [&](const std::vector<Cell>& cells) {
    std::string text;
    for (size_t i = 0; i < cells.size(); ++i) {
      text += style.Paint(cells[i].text, cells[i].color);
      if (i + 1 < cells.size()) {
        text.append(width[i] - DisplayWidth(cells[i].text) + 2, ' ');
      }
    }
    while (!text.empty() && text.back() == ' ') text.pop_back();
    out += text;
    out += '\n';
  };
  std::vector<Cell> header;
  for (const auto& h : headers_) header.emplace_back(h, Color::kBold);
  line(header);
  for (const auto& row : rows_) line(row);
  return out;
}

std::string KeyValues(const std::vector<std::pair<std::string, std::string>>& rows,
                      const Style& style) {
  size_t width = 0;
  for (const auto& row : rows) width = std::max(width, DisplayWidth(row.first) + 1);
  std::string out;
  for (const auto& [label, value] : rows) {
    std::string head = label + ":";
    out += style.Paint(head, Color::kBold);
    out.append(width - DisplayWidth(head) + 1, ' ');
    out += value;
    out += '\n';
  }
  return out;
}

std::string Age(int64_t then_ms, int64_t now_ms) {
  if (then_ms <= 0) return "-";
  int64_t s = std::max<int64_t>(0, (now_ms - then_ms) / 1000);
  if (s < 60) return std::to_string(s) + "s";
  if (s < 3600) return std::to_string(s / 60) + "m";
  if (s < 86400) return std::to_string(s / 3600) + "h";
  return std::to_string(s / 86400) + "d";
}

std::string UtcTime(int64_t ms) {
  if (ms <= 0) return "-";
  std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%SZ", &tm);
  return buf;
}

}  // namespace idem::cli
