#include "daemon/cli/table.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <utility>

#include "daemon/core/hidden_text.h"

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
    } else if (char32_t hidden = HiddenCodePointAt(text, i, &length); hidden != 0) {
      // C1 (two bytes in UTF-8) as \xNN, the others as \uNNNN.
      if (hidden <= 0x9f) {
        show(static_cast<unsigned char>(hidden));
      } else {
        out += JsonUnicodeEscapes(hidden);
      }
      i += length - 1;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string WithC1Escaped(std::string json_text) {
  return EscapeHiddenInJson(std::move(json_text));
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
