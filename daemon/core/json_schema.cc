// The one file that talks to valijson. valijson reports a failed schema or a
// bad regular expression by calling throwRuntimeError, which aborts the
// process unless VALIJSON_USE_EXCEPTIONS is set; no other translation unit
// may include valijson headers, so the setting cannot disagree between them.
#define VALIJSON_USE_EXCEPTIONS 1

#include "daemon/core/json_schema.h"

#include <charconv>
#include <exception>
#include <new>
#include <optional>
#include <regex>
#include <string_view>
#include <utility>

#include "daemon/core/json.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include <valijson/adapters/nlohmann_json_adapter.hpp>
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validation_results.hpp>
#include <valijson/validator.hpp>
#pragma GCC diagnostic pop

namespace idem {

namespace {

// A direct check of the keywords the API's request schemas use, for the
// hot path: valijson walks its constraint objects through std::function
// callbacks and allocates per keyword (16k instructions per claim +
// complete). It answers only "certainly valid"; anything it does not
// accept goes to valijson, which decides and explains. Built only for a
// schema whose every keyword, at every level, is one of these.
class DirectCheck {
 public:
  // Null when `schema` uses a keyword (or a form of one) this does not check.
  static std::unique_ptr<DirectCheck> Build(const Json& schema, int depth = 0) {
    if (depth > 16) return nullptr;
    if (schema.is_boolean()) {
      auto c = std::make_unique<DirectCheck>();
      c->reject_all_ = !schema.get<bool>();
      return c;
    }
    if (!schema.is_object()) return nullptr;
    auto c = std::make_unique<DirectCheck>();
    for (auto it = schema.begin(); it != schema.end(); ++it) {
      const std::string& k = it.key();
      const Json& v = *it;
      if (k == "$schema" || k == "$id" || k == "$comment" || k == "title" || k == "description" ||
          k == "default" || k == "examples") {
        continue;  // annotations: they constrain nothing
      }
      if (k == "type") {
        if (v.is_string()) {
          if (!c->AddType(v.get<std::string>())) return nullptr;
        } else if (v.is_array() && !v.empty()) {
          for (const Json& t : v) {
            if (!t.is_string() || !c->AddType(t.get<std::string>())) return nullptr;
          }
        } else {
          return nullptr;
        }
      } else if (k == "required" && v.is_array()) {
        for (const Json& name : v) {
          if (!name.is_string()) return nullptr;
          c->required_.push_back(name.get<std::string>());
        }
      } else if (k == "properties" && v.is_object()) {
        for (auto p = v.begin(); p != v.end(); ++p) {
          std::unique_ptr<DirectCheck> sub = Build(*p, depth + 1);
          if (sub == nullptr) return nullptr;
          c->properties_.emplace_back(p.key(), std::move(sub));
        }
      } else if (k == "additionalProperties" && v.is_boolean()) {
        c->closed_ = !v.get<bool>();
      } else if ((k == "minLength" || k == "maxLength") && v.is_number_unsigned()) {
        (k == "minLength" ? c->min_length_ : c->max_length_) = v.get<uint64_t>();
      } else {
        return nullptr;
      }
    }
    return c;
  }

  // True only when `doc` satisfies the schema this was built from.
  bool Accepts(const Json& doc) const {
    if (reject_all_) return false;
    if (types_ != 0 && (types_ & TypeBit(doc)) == 0) return false;
    if (doc.is_string() && (min_length_ != 0 || max_length_ != kNoMax)) {
      // Characters, as valijson counts them in UTF-8: the bytes that start
      // one. valijson counts a C string, ending at the first NUL
      // ("\u0000"); such a string, and one that is not UTF-8 (a value
      // built in code), is left to it.
      const std::string& text = doc.get_ref<const std::string&>();
      if (!IsValidUtf8(text)) return false;
      uint64_t chars = 0;
      for (char ch : text) {
        if (ch == '\0') return false;
        chars += (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
      }
      if (chars < min_length_ || chars > max_length_) return false;
    }
    if (!doc.is_object()) return true;
    for (const std::string& name : required_) {
      if (!doc.contains(name)) return false;
    }
    for (auto it = doc.begin(); it != doc.end(); ++it) {
      const DirectCheck* sub = nullptr;
      for (const auto& [name, check] : properties_) {
        if (name == it.key()) sub = check.get();
      }
      if (sub == nullptr ? closed_ : !sub->Accepts(*it)) return false;
    }
    return true;
  }

 private:
  static constexpr uint64_t kNoMax = ~uint64_t{0};
  enum : unsigned {
    kObject = 1,
    kArray = 2,
    kString = 4,
    kInteger = 8,
    kNumber = 16,
    kBoolean = 32,
    kNull = 64
  };

  bool AddType(const std::string& name) {
    static constexpr std::pair<std::string_view, unsigned> kTypes[] = {
        {"object", kObject},
        {"array", kArray},
        {"string", kString},
        {"integer", kInteger},
        {"number", kNumber | kInteger},
        {"boolean", kBoolean},
        {"null", kNull}};
    for (const auto& [type, bits] : kTypes) {
      if (type == name) {
        types_ |= bits;
        return true;
      }
    }
    return false;
  }

  // Strict: an integer is a number written without a fraction or exponent
  // (nlohmann's integer types); 1.0 is left to valijson.
  static unsigned TypeBit(const Json& doc) {
    switch (doc.type()) {
      case Json::value_t::object:
        return kObject;
      case Json::value_t::array:
        return kArray;
      case Json::value_t::string:
        return kString;
      case Json::value_t::number_integer:
      case Json::value_t::number_unsigned:
        return kInteger;
      case Json::value_t::number_float:
        return kNumber;
      case Json::value_t::boolean:
        return kBoolean;
      case Json::value_t::null:
        return kNull;
      default:
        return 0;
    }
  }

  bool reject_all_ = false;
  unsigned types_ = 0;  // 0: any type
  std::vector<std::string> required_;
  std::vector<std::pair<std::string, std::unique_ptr<DirectCheck>>> properties_;
  bool closed_ = false;  // additionalProperties: false
  uint64_t min_length_ = 0;
  uint64_t max_length_ = kNoMax;
};

}  // namespace

struct JsonSchema::Compiled {
  valijson::Schema schema;
  std::unique_ptr<DirectCheck> direct;  // null: valijson alone
  // The schema has patternProperties, which valijson matches with
  // std::regex: keys longer than kMaxPatternKeyBytes are refused first.
  bool pattern_properties = false;
  Json prepared;  // the schema as given to valijson (ForValijson)
};

namespace {

// libstdc++'s std::regex matches by recursion, a few hundred bytes of stack
// per character: a 20,000-character string under "pattern": "^[a-z]+$"
// overflowed a handler thread's 8 MiB stack and killed the daemon, and a
// backtracking pattern can run for ever. So "pattern" is checked with
// PCRE2 instead (its backtracking lives on the heap, under a heap and a
// match limit), with ECMAScript's spelling of \u escapes and of "$".
class SafeRegex {
 public:
  static StatusOr<std::shared_ptr<const SafeRegex>> Compile(const std::string& pattern) {
    int code = 0;
    PCRE2_SIZE offset = 0;
    pcre2_compile_context* cc = pcre2_compile_context_create(nullptr);
    if (cc == nullptr) return Internal("out of memory compiling a regular expression");
    pcre2_set_compile_extra_options(cc, PCRE2_EXTRA_ALT_BSUX);
    pcre2_code* re =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                      PCRE2_UTF | PCRE2_ALT_BSUX | PCRE2_DOLLAR_ENDONLY, &code, &offset, cc);
    pcre2_compile_context_free(cc);
    if (re == nullptr) {
      PCRE2_UCHAR text[256];
      pcre2_get_error_message(code, text, sizeof(text));
      return InvalidArgument("invalid regular expression in schema: " +
                             std::string(reinterpret_cast<const char*>(text)) + " at offset " +
                             std::to_string(offset));
    }
    auto out = std::shared_ptr<SafeRegex>(new SafeRegex());
    out->code_ = re;
    out->match_ = pcre2_match_context_create(nullptr);
    if (out->match_ == nullptr) return Internal("out of memory compiling a regular expression");
    pcre2_set_match_limit(out->match_, kMatchLimit);
    pcre2_set_heap_limit(out->match_, kHeapLimitKib);
    return std::shared_ptr<const SafeRegex>(std::move(out));
  }
  ~SafeRegex() {
    pcre2_match_context_free(match_);
    pcre2_code_free(code_);
  }

  // 1: `text` has a match, 0: it has none, -1: it could not be told within
  // the limits (or `text` is not UTF-8).
  int Search(std::string_view text) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    if (md == nullptr) return -1;
    const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0, 0,
                               md, match_);
    pcre2_match_data_free(md);
    if (rc >= 0) return 1;
    return rc == PCRE2_ERROR_NOMATCH ? 0 : -1;
  }

 private:
  // Per value checked: 10 million backtracking steps (about 150 ms on the
  // slowest pattern measured; ^[a-z]+$ fails a 1 MB string in 11 ms), and
  // 64 MiB of heap for them (a repeated group keeps a frame per repeat:
  // ^([a-z]|[0-9])*$ matches 100,000 characters in it, not 1,000,000).
  static constexpr uint32_t kMatchLimit = 10'000'000;
  static constexpr uint32_t kHeapLimitKib = 64 * 1024;
  SafeRegex() = default;
  pcre2_code* code_ = nullptr;
  pcre2_match_context* match_ = nullptr;
};

constexpr std::string_view kPatternKeyword = "x-idem-pattern";
constexpr std::string_view kFormatKeyword = "x-idem-format";
constexpr size_t kMaxPatternKeyBytes = 1024;

// "pattern", checked by SafeRegex (valijson calls it for every value the
// keyword applies to; a non-string passes, as the keyword says).
class PatternConstraint final : public valijson::constraints::PolyConstraint {
 public:
  explicit PatternConstraint(std::shared_ptr<const SafeRegex> re) : re_(std::move(re)) {}
  bool validate(const valijson::adapters::Adapter& target, const std::vector<std::string>& context,
                valijson::ValidationResults* results) const override {
    if (!target.isString()) return true;
    const int found = re_->Search(target.asString());
    if (found == 1) return true;
    if (results != nullptr) {
      results->pushError(context, found == 0
                                      ? "Failed to match regex specified by 'pattern' constraint."
                                      : "could not be matched against the schema's pattern "
                                        "within its limits (it backtracks too much on this value)");
    }
    return false;
  }

 private:
  Constraint* cloneInto(void* where) const override { return new (where) PatternConstraint(*this); }
  size_t sizeOf() const override { return sizeof(PatternConstraint); }
  std::shared_ptr<const SafeRegex> re_;
};

class PatternBuilder final : public valijson::ConstraintBuilder {
 public:
  valijson::constraints::Constraint* make(const valijson::adapters::Adapter& value) const override {
    auto re = SafeRegex::Compile(value.asString());
    if (!re.ok()) throw std::runtime_error(re.status().message());
    return new PatternConstraint(std::move(re).value());
  }
};

// RFC 3339's full-date, full-time and date-time, read by hand: valijson
// matches them with std::regex, whose recursion a long run of digits
// (a year or a fraction 100,000 digits long) took past the stack.
class DateTimeReader {
 public:
  explicit DateTimeReader(std::string_view s) : s_(s) {}
  bool Date() {
    int year = 0, month = 0, day = 0;
    if (!Digits(4, &year) || !Char("-") || !Digits(2, &month) || !Char("-") || !Digits(2, &day)) {
      return false;
    }
    static constexpr int kDays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (month < 1 || month > 12 || day < 1 || day > kDays[month - 1]) return false;
    const bool leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    return month != 2 || day <= 28 || leap;
  }
  bool Time() {
    int hour = 0, minute = 0, second = 0;
    if (!Digits(2, &hour) || !Char(":") || !Digits(2, &minute) || !Char(":") ||
        !Digits(2, &second) || hour > 23 || minute > 59 || second > 60) {
      return false;
    }
    if (Char(".")) {
      int unused = 0;
      if (!Digits(1, &unused)) return false;
      while (pos_ < s_.size() && IsDigit(s_[pos_])) ++pos_;
    }
    if (Char("Zz")) return true;
    int oh = 0, om = 0;
    return Char("+-") && Digits(2, &oh) && Char(":") && Digits(2, &om) && oh <= 23 && om <= 59;
  }
  bool Separator() { return Char("Tt"); }
  bool AtEnd() const { return pos_ == s_.size(); }

 private:
  static bool IsDigit(char c) { return c >= '0' && c <= '9'; }
  bool Digits(int n, int* out) {
    *out = 0;
    for (int i = 0; i < n; ++i, ++pos_) {
      if (pos_ >= s_.size() || !IsDigit(s_[pos_])) return false;
      *out = *out * 10 + (s_[pos_] - '0');
    }
    return true;
  }
  bool Char(std::string_view any_of) {
    if (pos_ >= s_.size() || any_of.find(s_[pos_]) == std::string_view::npos) return false;
    ++pos_;
    return true;
  }
  std::string_view s_;
  size_t pos_ = 0;
};

// "format": "date" | "time" | "date-time" (the ones valijson checks).
class FormatConstraint final : public valijson::constraints::PolyConstraint {
 public:
  explicit FormatConstraint(std::string format) : format_(std::move(format)) {}
  bool validate(const valijson::adapters::Adapter& target, const std::vector<std::string>& context,
                valijson::ValidationResults* results) const override {
    if (!target.isString()) return true;
    const std::string text = target.asString();
    DateTimeReader r(text);
    bool ok = false;
    if (format_ == "date") {
      ok = r.Date() && r.AtEnd();
    } else if (format_ == "time") {
      ok = r.Time() && r.AtEnd();
    } else {
      ok = r.Date() && r.Separator() && r.Time() && r.AtEnd();
    }
    if (!ok && results != nullptr) results->pushError(context, "must be an RFC 3339 " + format_);
    return ok;
  }

 private:
  Constraint* cloneInto(void* where) const override { return new (where) FormatConstraint(*this); }
  size_t sizeOf() const override { return sizeof(FormatConstraint); }
  std::string format_;
};

class FormatBuilder final : public valijson::ConstraintBuilder {
 public:
  valijson::constraints::Constraint* make(const valijson::adapters::Adapter& value) const override {
    return new FormatConstraint(value.asString());
  }
};

bool IsCheckedFormat(const Json& v) {
  return v.is_string() && (v == "date" || v == "time" || v == "date-time");
}

}  // namespace

namespace {

constexpr int kMaxRefHops = 32;

// valijson names each step of its path "[name]" (or "[3]" for an array
// index) after a first "<root>" element. Property names may themselves hold
// brackets, so only the outermost pair is stripped.
std::vector<std::string> ContextTokens(const std::vector<std::string>& context) {
  std::vector<std::string> tokens;
  for (const std::string& part : context) {
    if (part == "<root>") continue;
    if (part.size() >= 2 && part.front() == '[' && part.back() == ']') {
      tokens.push_back(part.substr(1, part.size() - 2));
    } else {
      tokens.push_back(part);
    }
  }
  return tokens;
}

std::string PointerOf(const std::vector<std::string>& tokens) {
  std::string pointer;
  for (const std::string& t : tokens) pointer += "/" + JsonPointerToken(t);
  return pointer;
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// Summary lines valijson adds after a nested failure; the nested error says
// the same thing more precisely.
bool IsPropagation(std::string_view description) {
  static constexpr std::string_view kPrefixes[] = {
      "Failed to validate against schema associated with property name",
      "Failed to validate against schema associated with pattern",
      "Failed to validate item #",
      "Failed to validate against additional properties schema",
      "Failed to validate against additional items schema",
      "Failed to validate against child schema #",
      "Failed to validate against dependent schema",
      "Failed to validate against a conditional schema",
  };
  for (std::string_view p : kPrefixes) {
    if (StartsWith(description, p)) return true;
  }
  return false;
}

// Text between the first single quote after `marker` and the last one, e.g.
// the property name in "Missing required property 'version'.". The name
// may itself hold quotes, hence the last one.
std::string Quoted(std::string_view description, std::string_view marker = {}) {
  size_t from = marker.empty() ? 0 : description.find(marker);
  if (from == std::string_view::npos) from = 0;
  size_t open = description.find('\'', from + marker.size());
  size_t close = description.rfind('\'');
  if (open == std::string_view::npos || close == open) return {};
  return std::string(description.substr(open + 1, close - open - 1));
}

// valijson prints limits with std::to_string(double): "2.000000" -> "2".
std::string TrimNumber(std::string_view text) {
  std::string s(text);
  while (!s.empty() && (s.back() == '.' || s.back() == ' ')) s.pop_back();
  if (s.find('.') != std::string::npos) {
    while (!s.empty() && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
  }
  return s;
}

std::string JsonTypeName(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "integer";
    case Json::value_t::number_float:
      return "number";
    case Json::value_t::string:
      return "string";
    case Json::value_t::array:
      return "array";
    case Json::value_t::object:
      return "object";
    default:
      return "value";
  }
}

// Follows local "$ref"s ("#/definitions/x"); returns nullptr for anything
// else (remote refs are rejected at Create anyway).
const Json* Deref(const Json& root, const Json* node) {
  for (int hops = 0; node != nullptr && node->is_object() && hops < kMaxRefHops; ++hops) {
    auto ref = node->find("$ref");
    if (ref == node->end() || !ref->is_string()) return node;
    const std::string& target = ref->get_ref<const std::string&>();
    if (target.empty() || target[0] != '#') return nullptr;
    try {
      const Json::json_pointer pointer(target.substr(1));
      if (!root.contains(pointer)) return nullptr;
      node = &root.at(pointer);
    } catch (const std::exception&) {
      return nullptr;
    }
  }
  return node;
}

// Whether `schema` (dereferenced) could accept a value of `value`'s type,
// judged from its "type", "enum", "const" or object keywords only.
bool TypeAdmits(const Json& schema, const Json& value) {
  if (!schema.is_object()) return true;
  const std::string actual = JsonTypeName(value);
  auto names = [&](const Json& type) {
    if (type.is_string()) {
      const std::string& t = type.get_ref<const std::string&>();
      return t == actual || (t == "number" && actual == "integer");
    }
    return false;
  };
  if (auto type = schema.find("type"); type != schema.end()) {
    if (type->is_array()) {
      for (const Json& t : *type) {
        if (names(t)) return true;
      }
      return false;
    }
    return names(*type);
  }
  auto same_kind = [&](const Json& v) {
    return JsonTypeName(v) == actual || (v.is_number() && value.is_number());
  };
  if (auto values = schema.find("enum"); values != schema.end() && values->is_array()) {
    for (const Json& v : *values) {
      if (same_kind(v)) return true;
    }
    return false;
  }
  if (auto c = schema.find("const"); c != schema.end()) return same_kind(*c);
  if (schema.contains("properties") || schema.contains("required")) return value.is_object();
  if (schema.contains("items")) return value.is_array();
  return true;
}

const Json* Combinator(const Json& schema) {
  for (const char* key : {"anyOf", "oneOf"}) {
    auto it = schema.find(key);
    if (it != schema.end() && it->is_array()) return &*it;
  }
  return nullptr;
}

// The one anyOf / oneOf branch whose type fits `value`, or nullptr when
// none or several do.
const Json* PickBranch(const Json& root, const Json& schema, const Json& value) {
  const Json* branches = Combinator(schema);
  if (branches == nullptr) return nullptr;
  const Json* picked = nullptr;
  for (const Json& branch : *branches) {
    const Json* b = Deref(root, &branch);
    if (b == nullptr || !TypeAdmits(*b, value)) continue;
    if (picked != nullptr) return nullptr;
    picked = b;
  }
  return picked;
}

// Best effort: the subschema that governs the value at `tokens` in `doc`,
// following properties / patternProperties / additionalProperties / items,
// and an anyOf / oneOf branch where only one fits the value. nullptr when
// it cannot tell; the caller then falls back to valijson's own wording.
const Json* SubschemaAt(const Json& root, const Json& doc, const std::vector<std::string>& tokens) {
  const Json* schema = Deref(root, &root);
  const Json* value = &doc;
  auto settle = [&] {
    if (schema != nullptr && schema->is_object() && value != nullptr) {
      if (const Json* branch = PickBranch(root, *schema, *value)) schema = branch;
    }
  };
  settle();
  for (const std::string& token : tokens) {
    if (schema == nullptr || !schema->is_object() || value == nullptr) return nullptr;
    const Json* next = nullptr;
    if (value->is_object()) {
      auto props = schema->find("properties");
      if (props != schema->end() && props->is_object() && props->contains(token)) {
        next = &(*props)[token];
      }
      auto patterns = schema->find("patternProperties");
      if (next == nullptr && patterns != schema->end() && patterns->is_object()) {
        for (auto it = patterns->begin(); it != patterns->end() && next == nullptr; ++it) {
          try {
            if (std::regex_search(token, std::regex(it.key(), std::regex::ECMAScript))) {
              next = &it.value();
            }
          } catch (const std::regex_error&) {
          }
        }
      }
      auto additional = schema->find("additionalProperties");
      if (next == nullptr && additional != schema->end() && additional->is_object()) {
        next = &*additional;
      }
      auto member = value->find(token);
      value = member == value->end() ? nullptr : &*member;
    } else if (value->is_array()) {
      size_t index = 0;
      auto [ptr, ec] = std::from_chars(token.data(), token.data() + token.size(), index);
      if (ec != std::errc() || ptr != token.data() + token.size() || index >= value->size()) {
        return nullptr;
      }
      auto items = schema->find("items");
      if (items != schema->end() && items->is_object()) {
        next = &*items;
      } else if (items != schema->end() && items->is_array() && index < items->size()) {
        next = &(*items)[index];
      }
      value = &(*value)[index];
    } else {
      return nullptr;
    }
    schema = Deref(root, next);
    settle();
  }
  return schema;
}

const Json* ValueAt(const Json& doc, const std::string& pointer) {
  try {
    const Json::json_pointer p(pointer);
    if (doc.contains(p)) return &doc.at(p);
  } catch (const std::exception&) {
  }
  return nullptr;
}

std::string DescribeAllowed(const Json& allowed) {
  std::string out;
  for (size_t i = 0; i < allowed.size(); ++i) {
    if (i > 0) out += i + 1 == allowed.size() ? " or " : ", ";
    out += allowed[i].is_string() ? allowed[i].get<std::string>() : allowed[i].dump();
  }
  return out;
}

std::string WithArticle(const std::string& type) {
  return (type == "integer" || type == "object" || type == "array" ? "an " : "a ") + type;
}

// "escalate", "an object with keys model, provider", "a string".
std::string DescribeBranch(const Json& root, const Json& branch) {
  const Json* b = Deref(root, &branch);
  if (b == nullptr || !b->is_object()) return "a value of another form";
  if (auto e = b->find("enum"); e != b->end() && e->is_array()) return DescribeAllowed(*e);
  if (auto c = b->find("const"); c != b->end())
    return c->is_string() ? c->get<std::string>() : c->dump();
  if (auto p = b->find("properties"); p != b->end() && p->is_object() && !p->empty()) {
    std::string keys;
    for (auto it = p->begin(); it != p->end(); ++it) keys += (keys.empty() ? "" : ", ") + it.key();
    return "an object with keys " + keys;
  }
  if (auto t = b->find("type"); t != b->end()) {
    if (t->is_string()) return WithArticle(t->get<std::string>());
    if (t->is_array()) return DescribeAllowed(*t);
  }
  return "a value of another form";
}

struct Bound {
  std::string_view prefix;
  std::string_view before;
  std::string_view after;
};

// Rewrites one valijson error into a pointer and a sentence for people.
SchemaError Translate(const Json& root, const Json& doc,
                      const valijson::ValidationResults::Error& error) {
  std::vector<std::string> tokens = ContextTokens(error.context);
  const std::string& d = error.description;
  SchemaError out;

  if (StartsWith(d, "Object contains a property that could not be validated")) {
    tokens.push_back(Quoted(d, "constraints: "));
    out.pointer = PointerOf(tokens);
    out.message = "unknown key";
    return out;
  }
  out.pointer = PointerOf(tokens);

  // valijson's wording "<prefix>N<rest>" -> "<before>N<after>".
  static constexpr Bound kBounds[] = {
      {"Expected number less than or equal to ", "must be <= ", ""},
      {"Expected number less than ", "must be < ", ""},
      {"Expected number greater than or equal to ", "must be >= ", ""},
      {"Expected number greater than ", "must be > ", ""},
      {"Array should contain no fewer than ", "must have at least ", " item(s)"},
      {"Array should contain no more than ", "must have at most ", " item(s)"},
      {"String should be no fewer than ", "must be at least ", " character(s) long"},
      {"String should be no more than ", "must be at most ", " character(s) long"},
      {"Object should have no fewer than ", "must have at least ", " key(s)"},
      {"Object should have no more than ", "must have at most ", " key(s)"},
  };
  for (const Bound& b : kBounds) {
    if (StartsWith(d, b.prefix)) {
      std::string_view rest = std::string_view(d).substr(b.prefix.size());
      out.message = std::string(b.before) + TrimNumber(rest.substr(0, rest.find_first_of(" \t"))) +
                    std::string(b.after);
      return out;
    }
  }
  if (StartsWith(d, "Missing required property")) {
    // The pointer names the member that is missing, so that a client's
    // problem+json points at the field to add (a config error takes the
    // line of its object: YamlDocument::LineOf walks up to it).
    tokens.push_back(Quoted(d));
    out.pointer = PointerOf(tokens);
    out.message = "missing required key";
    return out;
  }
  if (StartsWith(d, "Elements at indexes #")) {
    out.message = "must not repeat an item (" + d.substr(std::string_view("Elements at ").size());
    if (out.message.back() == '.') out.message.pop_back();
    out.message += ")";
    return out;
  }

  const Json* sub = SubschemaAt(root, doc, tokens);
  const Json* value = ValueAt(doc, out.pointer);

  if (StartsWith(d, "Value type not permitted")) {
    std::string expected;
    if (sub != nullptr && sub->contains("type")) {
      const Json& type = (*sub)["type"];
      expected = type.is_array() ? DescribeAllowed(type) : type.get<std::string>();
    }
    out.message = expected.empty() ? "has the wrong type" : "must be " + expected;
    if (value != nullptr) out.message += ", not " + JsonTypeName(*value);
    return out;
  }
  if (StartsWith(d, "Failed to match against any enum values") && sub != nullptr &&
      sub->contains("enum") && (*sub)["enum"].is_array()) {
    const Json& allowed = (*sub)["enum"];
    out.message = (allowed.size() == 1 ? "must be " : "must be one of ") + DescribeAllowed(allowed);
    return out;
  }
  if (StartsWith(d, "Failed to match expected value set by 'const'") && sub != nullptr &&
      sub->contains("const")) {
    const Json& c = (*sub)["const"];
    out.message = "must be " + (c.is_string() ? c.get<std::string>() : c.dump());
    return out;
  }
  if (StartsWith(d, "Failed to match regex")) {
    if (sub != nullptr && sub->contains("description") && (*sub)["description"].is_string()) {
      // A schema author's description says what the pattern means better
      // than the pattern does ("a duration like 30s, 5m or forever").
      out.message = "must be " + (*sub)["description"].get<std::string>();
    } else if (sub != nullptr && sub->contains("pattern") && (*sub)["pattern"].is_string()) {
      out.message = "must match " + (*sub)["pattern"].get<std::string>();
    } else {
      out.message = "does not match the required pattern";
    }
    return out;
  }

  if (StartsWith(d, "Failed to validate against exactly one child schema")) {
    out.message =
        "matches more than one of its allowed forms: give exactly one (e.g. one key of "
        "a choice, not two)";
    return out;
  }

  // Anything else: valijson's sentence, lower-cased start and no full stop.
  out.message = d;
  if (!out.message.empty() && out.message.back() == '.') out.message.pop_back();
  if (!out.message.empty() && out.message[0] >= 'A' && out.message[0] <= 'Z') {
    out.message[0] = static_cast<char>(out.message[0] - 'A' + 'a');
  }
  return out;
}

bool IsCombinatorSummary(std::string_view description) {
  return StartsWith(description, "Failed to validate against any schemas allowed by anyOf") ||
         StartsWith(description, "Failed to validate against any child schemas allowed by oneOf");
}

bool Within(const std::string& pointer, const std::string& base) {
  return pointer == base || StartsWith(pointer, base + "/");
}

// valijson compiles "pattern" regexes lazily, during validation; compiling
// them here turns a bad one into a Create error instead of a surprise later.
Status CheckPatterns(const Json& node, const std::string& where) {
  if (node.is_object()) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      const std::string here = where + "/" + JsonPointerToken(it.key());
      if (it.key() == "pattern" && it->is_string()) {
        auto re = SafeRegex::Compile(it->get<std::string>());
        if (!re.ok()) return re.status().WithField(here);
      } else if (it.key() == "patternProperties" && it->is_object()) {
        for (auto p = it->begin(); p != it->end(); ++p) {
          try {
            std::regex re(p.key(), std::regex::ECMAScript);
          } catch (const std::regex_error& e) {
            return InvalidArgument("invalid regular expression in schema: " + std::string(e.what()),
                                   here);
          }
        }
      }
      if (it.key() == "$ref" && it->is_string()) {
        const std::string& ref = it->get_ref<const std::string&>();
        if (ref.empty() || ref[0] != '#') {
          return InvalidArgument("only local $ref (\"#/...\") is supported, got \"" + ref + "\"",
                                 here);
        }
      }
      const bool data = it.key() == "enum" || it.key() == "const" || it.key() == "default" ||
                        it.key() == "examples";
      if (!data) RETURN_IF_ERROR(CheckPatterns(*it, here));
    }
  } else if (node.is_array()) {
    for (size_t i = 0; i < node.size(); ++i) {
      RETURN_IF_ERROR(CheckPatterns(node[i], where + "/" + std::to_string(i)));
    }
  }
  return Status::Ok();
}

// The schema as valijson is given it: "pattern" and the formats it would
// match with std::regex become keywords of ours (PatternConstraint,
// FormatConstraint), at the places CheckPatterns reads as keywords.
Json ForValijson(const Json& node, bool* pattern_properties) {
  if (node.is_array()) {
    Json out = Json::array();
    for (const Json& v : node) out.push_back(ForValijson(v, pattern_properties));
    return out;
  }
  if (!node.is_object()) return node;
  Json out = Json::object();
  for (auto it = node.begin(); it != node.end(); ++it) {
    const std::string& k = it.key();
    if (k == "pattern" && it->is_string()) {
      out[std::string(kPatternKeyword)] = *it;
    } else if (k == "format" && IsCheckedFormat(*it)) {
      out[std::string(kFormatKeyword)] = *it;
    } else if (k == "enum" || k == "const" || k == "default" || k == "examples") {
      out[k] = *it;
    } else {
      if (k == "patternProperties") *pattern_properties = true;
      out[k] = ForValijson(*it, pattern_properties);
    }
  }
  return out;
}

// The first object key in `doc` longer than kMaxPatternKeyBytes, as a pointer.
std::optional<std::string> LongKey(const Json& doc, const std::string& at) {
  if (doc.is_object()) {
    for (auto it = doc.begin(); it != doc.end(); ++it) {
      const std::string here = at + "/" + JsonPointerToken(it.key());
      if (it.key().size() > kMaxPatternKeyBytes) return here;
      if (auto found = LongKey(*it, here)) return found;
    }
  } else if (doc.is_array()) {
    for (size_t i = 0; i < doc.size(); ++i) {
      if (auto found = LongKey(doc[i], at + "/" + std::to_string(i))) return found;
    }
  }
  return std::nullopt;
}

}  // namespace

JsonSchema::JsonSchema(Json schema, std::unique_ptr<Compiled> compiled)
    : schema_(std::move(schema)), compiled_(std::move(compiled)) {}

JsonSchema::~JsonSchema() = default;

StatusOr<std::unique_ptr<JsonSchema>> JsonSchema::Create(const Json& schema) {
  if (!schema.is_object() && !schema.is_boolean()) {
    return InvalidArgument("a JSON Schema must be an object or a boolean, not " +
                           JsonTypeName(schema));
  }
  RETURN_IF_ERROR(CheckPatterns(schema, ""));
  auto compiled = std::make_unique<Compiled>();
  try {
    valijson::SchemaParser parser(valijson::SchemaParser::kDraft7);
    parser.addConstraintBuilder(std::string(kPatternKeyword), new PatternBuilder());
    parser.addConstraintBuilder(std::string(kFormatKeyword), new FormatBuilder());
    compiled->prepared = ForValijson(schema, &compiled->pattern_properties);
    valijson::adapters::NlohmannJsonAdapter adapter(compiled->prepared);
    parser.populateSchema(adapter, compiled->schema);
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("invalid JSON Schema: ") + e.what());
  }
  compiled->direct = DirectCheck::Build(schema);
  return std::unique_ptr<JsonSchema>(new JsonSchema(schema, std::move(compiled)));
}

namespace {

// valijson stops at an object's first unknown key: appends an "unknown
// key" error for every key of the object at `object_tokens` that its
// schema does not know (the first among them again; Errors drops repeats).
void UnknownSiblings(const Json& root, const std::vector<std::string>& object_tokens,
                     const Json& doc, std::vector<SchemaError>& errors) {
  const Json* schema = SubschemaAt(root, doc, object_tokens);
  const std::string at = PointerOf(object_tokens);
  const Json* value = ValueAt(doc, at);
  if (schema == nullptr || !schema->is_object() || value == nullptr || !value->is_object()) return;
  auto additional = schema->find("additionalProperties");
  if (additional == schema->end() || *additional != false) return;
  const auto props = schema->find("properties");
  const auto patterns = schema->find("patternProperties");
  for (auto it = value->begin(); it != value->end(); ++it) {
    bool known = props != schema->end() && props->is_object() && props->contains(it.key());
    if (!known && patterns != schema->end() && patterns->is_object()) {
      for (auto p = patterns->begin(); p != patterns->end() && !known; ++p) {
        try {
          known = std::regex_search(it.key(), std::regex(p.key(), std::regex::ECMAScript));
        } catch (const std::regex_error&) {
          known = true;  // cannot tell: not reported
        }
      }
    }
    if (!known) errors.push_back({at + "/" + JsonPointerToken(it.key()), "unknown key"});
  }
}

}  // namespace

bool JsonSchema::HasDirectCheck() const { return compiled_->direct != nullptr; }

bool JsonSchema::DirectlyAccepts(const Json& doc) const {
  return compiled_->direct != nullptr && compiled_->direct->Accepts(doc);
}

std::vector<SchemaError> JsonSchema::Errors(const Json& doc) const {
  if (DirectlyAccepts(doc)) return {};
  if (compiled_->pattern_properties) {
    if (std::optional<std::string> at = LongKey(doc, "")) {
      return {SchemaError{*at, "a key longer than " + std::to_string(kMaxPatternKeyBytes) +
                                   " bytes, more than patternProperties are matched against"}};
    }
  }
  valijson::ValidationResults results;
  try {
    // A Validator caches compiled regexes in a plain map, so each call gets
    // its own; the parsed Schema is only read.
    valijson::Validator validator(valijson::Validator::kStrongTypes);
    valijson::adapters::NlohmannJsonAdapter adapter(doc);
    if (validator.validate(compiled_->schema, adapter, &results)) return {};
  } catch (const std::exception& e) {
    return {SchemaError{"", std::string("schema could not be applied: ") + e.what()}};
  }

  bool has_specific = false;
  for (const auto& error : results) {
    if (!IsPropagation(error.description)) has_specific = true;
  }
  std::vector<SchemaError> errors;
  for (const auto& error : results) {
    if (has_specific && IsPropagation(error.description)) continue;
    if (!IsCombinatorSummary(error.description)) {
      errors.push_back(Translate(schema_, doc, error));
      if (errors.back().message == "unknown key") {
        // The others are listed too, so that one run shows every typo.
        UnknownSiblings(schema_, ContextTokens(error.context), doc, errors);
      }
      continue;
    }
    // valijson lists every branch's errors, then this summary. Replace them
    // with the errors of the one branch that fits the value's type, or with
    // a list of the forms the value may take.
    const std::string at = PointerOf(ContextTokens(error.context));
    while (!errors.empty() && Within(errors.back().pointer, at)) errors.pop_back();
    const Json* value = ValueAt(doc, at);
    const Json* sub = SubschemaAt(schema_, doc, ContextTokens(error.context));
    const Json* branch = nullptr;
    const Json* holder = nullptr;
    if (sub != nullptr && value != nullptr) {
      // SubschemaAt already descended into the fitting branch, if any; find
      // the holder of the combinator again to list all forms otherwise.
      branch = Combinator(*sub) == nullptr ? sub : nullptr;
      holder = Combinator(*sub) != nullptr ? sub : nullptr;
    }
    std::vector<SchemaError> nested;
    if (branch != nullptr && branch->is_object()) {
      // Validate against that branch alone, with the root's definitions so
      // that its "#/definitions/..." references still resolve.
      Json alone = *branch;
      if (schema_.is_object() && schema_.contains("definitions") &&
          !alone.contains("definitions")) {
        alone["definitions"] = schema_["definitions"];
      }
      if (auto compiled = JsonSchema::Create(alone); compiled.ok()) {
        nested = (*compiled)->Errors(*value);
      }
    }
    if (!nested.empty()) {
      for (SchemaError& e : nested) errors.push_back({at + e.pointer, std::move(e.message)});
      continue;
    }
    std::string forms;
    if (holder != nullptr) {
      const Json& branches = *Combinator(*holder);
      for (size_t i = 0; i < branches.size(); ++i) {
        if (i > 0) forms += ", or ";
        forms += DescribeBranch(schema_, branches[i]);
      }
    }
    errors.push_back(
        {at, forms.empty() ? "matches none of the allowed forms" : "must be " + forms});
  }

  std::vector<SchemaError> unique;
  for (SchemaError& e : errors) {
    bool seen = false;
    for (const SchemaError& u : unique) seen |= u.pointer == e.pointer && u.message == e.message;
    if (!seen) unique.push_back(std::move(e));
  }
  if (unique.empty()) {
    // valijson fails some keywords (propertyNames, for one) without saying
    // where; there is nothing better to point at than the document.
    unique.push_back({"", "does not satisfy the schema (a constraint failed without details)"});
  }
  return unique;
}

Status JsonSchema::Validate(const Json& doc) const {
  std::vector<SchemaError> errors = Errors(doc);
  if (errors.empty()) return Status::Ok();
  std::string message;
  for (const SchemaError& e : errors) {
    if (!message.empty()) message += "; ";
    message += (e.pointer.empty() ? std::string("(root)") : e.pointer) + ": " + e.message;
  }
  return InvalidArgument(std::move(message), errors.front().pointer);
}

}  // namespace idem
