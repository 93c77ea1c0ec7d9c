#include "daemon/core/hidden_text.h"

#include <doctest/doctest.h>

#include <string>

namespace idem {
namespace {

TEST_CASE("hidden_code_point_is_found_with_its_length_in_bytes") {
  size_t length = 0;
  // U+202E RIGHT-TO-LEFT OVERRIDE, three bytes.
  CHECK(HiddenCodePointAt("a\xE2\x80\xAE", 1, &length) == 0x202E);
  CHECK(length == 3);
  // U+00AD SOFT HYPHEN, two bytes; U+E0041 TAG LATIN CAPITAL LETTER A, four.
  CHECK(HiddenCodePointAt("\xC2\xAD", 0, &length) == 0xAD);
  CHECK(length == 2);
  CHECK(HiddenCodePointAt("\xF3\xA0\x81\x81", 0, &length) == 0xE0041);
  CHECK(length == 4);
}

TEST_CASE("visible_text_and_malformed_utf8_are_not_hidden") {
  size_t length = 7;
  CHECK(HiddenCodePointAt("a", 0, &length) == 0);
  CHECK(HiddenCodePointAt("\xC3\xA9", 0, &length) == 0);          // é
  CHECK(HiddenCodePointAt("\xE2\x80", 0, &length) == 0);          // cut short
  CHECK(HiddenCodePointAt("\xE0\x82\xAD", 0, &length) == 0);      // overlong U+00AD
  CHECK(HiddenCodePointAt("\xF4\x90\x80\x80", 0, &length) == 0);  // above U+10FFFF
  CHECK(HiddenCodePointAt("ab", 5, &length) == 0);                // past the end
  CHECK(length == 7);
}

TEST_CASE("hidden_code_points_in_json_become_escapes_and_the_rest_is_kept") {
  CHECK(EscapeHiddenInJson(R"({"id":"O-1)"
                           "\xC2\xAD"
                           R"(000","n":"caf)"
                           "\xC3\xA9"
                           R"("})") == R"({"id":"O-1\u00ad000","n":"caf)"
                                       "\xC3\xA9"
                                       R"("})");
  CHECK(EscapeHiddenInJson("\"\xF3\xA0\x81\x81\"") == R"("\udb40\udc41")");
  CHECK(JsonUnicodeEscapes(0x200B) == R"(\u200b)");
}

TEST_CASE("printable_text_has_no_c0_del_or_c1_control_and_is_utf8") {
  CHECK(IsPrintableText("nightly-report \xC3\xA9t\xC3\xA9"));
  CHECK(IsPrintableText(""));
  CHECK_FALSE(IsPrintableText(std::string("a\0b", 3)));
  CHECK_FALSE(IsPrintableText("a\x1b[2Jb"));
  CHECK_FALSE(IsPrintableText("a\x7f"));
  CHECK_FALSE(
      IsPrintableText("a\xC2\x9B"
                      "2J"));                 // U+009B, the C1 escape introducer
  CHECK_FALSE(IsPrintableText("a\xC2\x85"));  // U+0085 NEXT LINE
  CHECK(IsPrintableText("a\xC2\xA0"));        // U+00A0 is no control
  CHECK_FALSE(IsPrintableText("a\xC0\xAF"));  // overlong
}

}  // namespace
}  // namespace idem
