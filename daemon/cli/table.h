// Terminal output for the CLI: aligned text tables and optional ANSI colour.
//
// Colour is decided once per stream by UseColor: only when the stream is a
// terminal and NO_COLOR is not set (https://no-color.org), so pipes, files
// and scripts always get plain text. Widths count UTF-8 code points, not
// bytes, and never the colour escapes, so coloured tables stay aligned.
//
// Thread-safety: pure functions and plain values.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace idem::cli {

enum class Color { kNone, kBold, kDim, kRed, kGreen, kYellow, kCyan };

struct Style {
  bool color = false;
  // `text` wrapped in the escape for `c` when color is on, else as is.
  std::string Paint(std::string_view text, Color c) const;
};

// True when `stream` is a terminal and the environment has no NO_COLOR.
bool UseColor(std::FILE* stream);

// `text` (from the daemon: another caller wrote it) safe for a terminal:
// C0 controls other than newline and tab, DEL and the C1 controls
// (U+0080-U+009F) are shown as \xNN, so a field cannot move the cursor,
// erase a line, set the window title or recolour what follows; the
// characters that hide or reorder text without showing themselves
// (Unicode's Default_Ignorable_Code_Point set: bidi controls such as
// U+202E, zero-width characters, the soft hyphen, variation selectors,
// tags; and the other format characters) are shown as \uNNNN (a surrogate
// pair above U+FFFF), so a field cannot reorder or hide what the operator
// reads (an "error" that shows "approved", "O-1<U+00AD>000" as "O-1000").
std::string Printable(std::string_view text);
// `json_text` (a dump of JSON: C0 controls are escaped already) with its C1
// controls (U+0080-U+009F, which a terminal may take as CSI and the like)
// and the characters Printable shows as \uNNNN written as JSON escapes
// (\u0080-\u009f, \u202e...): still the same JSON, and as safe for a
// terminal as Printable.
std::string WithC1Escaped(std::string json_text);

// Code points in a UTF-8 string (a display width good enough for tables).
size_t DisplayWidth(std::string_view utf8);
// At most `max` code points, the last one an ellipsis when cut; newlines
// and tabs become spaces, so one cell stays on one line.
std::string Truncate(std::string_view utf8, size_t max);

// A table of columns separated by two spaces, with a header row (bold when
// coloured). Cells may carry a colour; the last column is not padded.
class Table {
 public:
  explicit Table(std::vector<std::string> headers);
  // Cells wider than `max` code points are truncated (0: no limit).
  void SetMaxWidth(size_t column, size_t max);
  struct Cell {
    std::string text;
    Color color = Color::kNone;
    Cell(std::string t) : text(std::move(t)) {}  // NOLINT: implicit by design
    Cell(const char* t) : text(t) {}             // NOLINT
    Cell(std::string t, Color c) : text(std::move(t)), color(c) {}
  };
  // Missing cells are empty; extra cells are dropped. Every cell is shown
  // as Printable makes it (its text may be another caller's), so a cell
  // cannot carry its own escapes: colour it with Cell::color.
  void AddRow(std::vector<Cell> cells);
  size_t rows() const { return rows_.size(); }
  // Every line ends with '\n'.
  std::string Render(const Style& style) const;

 private:
  std::vector<std::string> headers_;
  std::vector<size_t> max_;
  std::vector<std::vector<Cell>> rows_;
};

// "label: value" lines with the labels padded to one width.
std::string KeyValues(const std::vector<std::pair<std::string, std::string>>& rows,
                      const Style& style);

// How long ago `then_ms` was at `now_ms`: "12s", "5m", "3h", "2d"; "-" for 0.
std::string Age(int64_t then_ms, int64_t now_ms);
// UTC "2026-11-30 22:10:05Z"; "-" for 0.
std::string UtcTime(int64_t ms);

}  // namespace idem::cli
