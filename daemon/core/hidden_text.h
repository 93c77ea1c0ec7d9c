// Text shown to a person (the operator page's twin in C++: the CLI's
// tables and JSON, the Telegram notification): the code points that hide
// or reorder text without showing themselves, and their JSON escapes.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace idem {

// The code point that hides or reorders text without showing itself whose
// UTF-8 starts at text[i], with its length in bytes; 0 when none starts
// there (or the bytes are not well-formed UTF-8, as DecodeUtf8 reads it).
// Hidden: the C1 controls (U+0080-U+009F), Unicode's
// Default_Ignorable_Code_Point set (bidi controls such as U+202E,
// zero-width characters, the soft hyphen, variation selectors, fillers,
// tags) and the other format characters (Cf).
char32_t HiddenCodePointAt(std::string_view text, size_t i, size_t* length);
// The JSON escape of a code point: "\\uNNNN", a surrogate pair above U+FFFF.
std::string JsonUnicodeEscapes(char32_t cp);
// `json_text` (JSON, whose C0 controls are escaped already) with every
// hidden code point (HiddenCodePointAt) written as its JSON escape: still
// the same JSON, and shown to a person it cannot hide or reorder itself.
std::string EscapeHiddenInJson(std::string json_text);
// True when `text` is well-formed UTF-8 with no control character: none of
// C0 (U+0000-U+001F), DEL or C1 (U+0080-U+009F, where U+009B starts a
// terminal's escape sequence as ESC [ does). For names a caller chooses and
// a person reads (lease names).
bool IsPrintableText(std::string_view text);

}  // namespace idem
