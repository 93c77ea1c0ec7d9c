// JSONLogic evaluation with JavaScript's value model. json-logic-js is a thin
// layer over JavaScript operators, so matching it means modelling the values
// a JavaScript engine sees (undefined, NaN, -0, object identity) and its
// abstract operations (ToPrimitive, ToNumber, ToString, IsLooselyEqual,
// IsLessThan, parseFloat) as ECMA-262 defines them.
#include "daemon/decide/jsonlogic.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/core/json.h"

namespace idem {
namespace {

constexpr int kMaxValueDepth = 128;
constexpr int kMaxConversionDepth = 256;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInfinity = std::numeric_limits<double>::infinity();
constexpr char32_t kReplacement = 0xFFFD;

// ---------------------------------------------------------------------------
// Operators.

enum class Op {
  kEq,
  kStrictEq,
  kNe,
  kStrictNe,
  kGt,
  kGe,
  kLt,
  kLe,
  kNotNot,
  kNot,
  kMod,
  kLog,
  kIn,
  kCat,
  kSubstr,
  kPlus,
  kTimes,
  kMinus,
  kDivide,
  kMin,
  kMax,
  kMerge,
  kVar,
  kMissing,
  kMissingSome,
  kIf,
  kAnd,
  kOr,
  kFilter,
  kMap,
  kReduce,
  kAll,
  kNone,
  kSome,
};

struct OpName {
  std::string_view name;
  Op op;
};

constexpr OpName kOps[] = {
    {"==", Op::kEq},
    {"===", Op::kStrictEq},
    {"!=", Op::kNe},
    {"!==", Op::kStrictNe},
    {">", Op::kGt},
    {">=", Op::kGe},
    {"<", Op::kLt},
    {"<=", Op::kLe},
    {"!!", Op::kNotNot},
    {"!", Op::kNot},
    {"%", Op::kMod},
    {"log", Op::kLog},
    {"in", Op::kIn},
    {"cat", Op::kCat},
    {"substr", Op::kSubstr},
    {"+", Op::kPlus},
    {"*", Op::kTimes},
    {"-", Op::kMinus},
    {"/", Op::kDivide},
    {"min", Op::kMin},
    {"max", Op::kMax},
    {"merge", Op::kMerge},
    {"var", Op::kVar},
    {"missing", Op::kMissing},
    {"missing_some", Op::kMissingSome},
    {"if", Op::kIf},
    {"?:", Op::kIf},
    {"and", Op::kAnd},
    {"or", Op::kOr},
    {"filter", Op::kFilter},
    {"map", Op::kMap},
    {"reduce", Op::kReduce},
    {"all", Op::kAll},
    {"none", Op::kNone},
    {"some", Op::kSome},
};

std::optional<Op> FindOp(std::string_view name) {
  for (const OpName& entry : kOps) {
    if (entry.name == name) return entry.op;
  }
  return std::nullopt;
}

Status UnknownOperator(std::string_view name, std::string field = {}) {
  std::string message = "jsonlogic: unknown operator \"" + std::string(name) + "\"";
  if (name == "method") message += " (rules may not call methods)";
  return InvalidArgument(std::move(message), std::move(field));
}

// ---------------------------------------------------------------------------
// Text: UTF-8 in storage, UTF-16 code units where JavaScript counts them.

char32_t DecodeUtf8(std::string_view s, size_t& i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = byte(i);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  int extra = 0;
  char32_t cp = 0;
  if ((b0 & 0xE0) == 0xC0) {
    extra = 1;
    cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    extra = 2;
    cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    extra = 3;
    cp = b0 & 0x07;
  } else {
    ++i;
    return kReplacement;
  }
  if (i + extra >= s.size()) {
    ++i;
    return kReplacement;
  }
  for (int k = 1; k <= extra; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) {
      ++i;
      return kReplacement;
    }
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  i += extra + 1;
  return cp;
}

void AppendUtf8(char32_t cp, std::string& out) {
  if (cp >= 0xD800 && cp <= 0xDFFF) cp = kReplacement;  // a lone surrogate
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::u16string ToUtf16(std::string_view s) {
  std::u16string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const char32_t cp = DecodeUtf8(s, i);
    if (cp < 0x10000) {
      out += static_cast<char16_t>(cp);
    } else {
      const char32_t v = cp - 0x10000;
      out += static_cast<char16_t>(0xD800 + (v >> 10));
      out += static_cast<char16_t>(0xDC00 + (v & 0x3FF));
    }
  }
  return out;
}

std::string FromUtf16(std::u16string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const char16_t u = s[i];
    if (u >= 0xD800 && u <= 0xDBFF && i + 1 < s.size() && s[i + 1] >= 0xDC00 &&
        s[i + 1] <= 0xDFFF) {
      AppendUtf8(0x10000 + ((static_cast<char32_t>(u) - 0xD800) << 10) + (s[i + 1] - 0xDC00), out);
      ++i;
    } else {
      AppendUtf8(u, out);  // a lone surrogate becomes U+FFFD
    }
  }
  return out;
}

size_t Utf16Length(std::string_view s) {
  size_t n = 0;
  size_t i = 0;
  while (i < s.size()) n += DecodeUtf8(s, i) >= 0x10000 ? 2 : 1;
  return n;
}

// StrWhiteSpaceChar of ECMA-262: WhiteSpace and LineTerminator.
bool IsJsWhitespace(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
    case 0xFEFF:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

std::string_view TrimJsWhitespace(std::string_view s, bool trailing) {
  size_t start = 0;
  while (start < s.size()) {
    size_t next = start;
    if (!IsJsWhitespace(DecodeUtf8(s, next))) break;
    start = next;
  }
  s.remove_prefix(start);
  if (!trailing) return s;
  while (!s.empty()) {
    size_t begin = s.size() - 1;
    while (begin > 0 && (static_cast<unsigned char>(s[begin]) & 0xC0) == 0x80 &&
           s.size() - begin < 4) {
      --begin;
    }
    size_t next = begin;
    if (!IsJsWhitespace(DecodeUtf8(s, next)) || next != s.size()) break;
    s.remove_suffix(s.size() - begin);
  }
  return s;
}

// The canonical form of an array index ("0", "17"; not "01", "+1", "1.0").
std::optional<size_t> ArrayIndex(std::string_view key) {
  if (key.empty() || key.size() > 10) return std::nullopt;
  if (key.size() > 1 && key[0] == '0') return std::nullopt;
  uint64_t value = 0;
  for (char c : key) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  if (value >= 4294967295ULL) return std::nullopt;
  return static_cast<size_t>(value);
}

// ---------------------------------------------------------------------------
// Numbers from text: StringToNumber and parseFloat.

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Length of the longest StrDecimalLiteral prefix of `s` (sign, digits with
// an optional point, an optional exponent), 0 when there is none.
// "Infinity" is handled by the callers.
size_t ScanDecimal(std::string_view s) {
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  size_t digits = 0;
  while (i < s.size() && IsDigit(s[i])) {
    ++i;
    ++digits;
  }
  if (i < s.size() && s[i] == '.') {
    size_t j = i + 1;
    size_t frac = 0;
    while (j < s.size() && IsDigit(s[j])) {
      ++j;
      ++frac;
    }
    if (digits + frac > 0) {
      i = j;
      digits += frac;
    }
  }
  if (digits == 0) return 0;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    size_t j = i + 1;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
    size_t k = j;
    while (k < s.size() && IsDigit(s[k])) ++k;
    if (k > j) i = k;
  }
  return i;
}

// Converts a literal ScanDecimal accepted in full, correctly rounded.
double DecimalToDouble(std::string_view literal) {
  bool negative = false;
  if (!literal.empty() && (literal[0] == '+' || literal[0] == '-')) {
    negative = literal[0] == '-';
    literal.remove_prefix(1);
  }
  const size_t e_pos = literal.find_first_of("eE");
  std::string_view mantissa = literal.substr(0, e_pos);
  std::string_view exponent_text =
      e_pos == std::string_view::npos ? std::string_view() : literal.substr(e_pos + 1);
  const size_t point = mantissa.find('.');
  const std::string_view int_part = mantissa.substr(0, point);
  const std::string_view frac_part =
      point == std::string_view::npos ? std::string_view() : mantissa.substr(point + 1);

  std::string text;
  text.reserve(literal.size() + 2);
  if (negative) text += '-';
  text += int_part.empty() ? std::string_view("0") : int_part;
  if (!frac_part.empty()) {
    text += '.';
    text += frac_part;
  }
  if (!exponent_text.empty()) {
    text += 'e';
    text += exponent_text;
  }
  double value = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec == std::errc()) return value;
  // Out of range: decide between overflow and underflow from the power of
  // ten of the first significant digit.
  int64_t exponent = 0;
  {
    std::string_view e = exponent_text;
    bool e_negative = false;
    if (!e.empty() && (e[0] == '+' || e[0] == '-')) {
      e_negative = e[0] == '-';
      e.remove_prefix(1);
    }
    for (char c : e) exponent = std::min<int64_t>(exponent * 10 + (c - '0'), 1'000'000'000);
    if (e_negative) exponent = -exponent;
  }
  int64_t leading = 0;
  const size_t int_nonzero = int_part.find_first_not_of('0');
  if (int_nonzero != std::string_view::npos) {
    leading = static_cast<int64_t>(int_part.size() - int_nonzero) - 1;
  } else {
    const size_t frac_nonzero = frac_part.find_first_not_of('0');
    if (frac_nonzero == std::string_view::npos) return negative ? -0.0 : 0.0;
    leading = -static_cast<int64_t>(frac_nonzero) - 1;
  }
  const double magnitude = leading + exponent > 0 ? kInfinity : 0.0;
  return negative ? -magnitude : magnitude;
}

// 0x / 0o / 0b literals (no sign, no fraction), correctly rounded.
double RadixToDouble(std::string_view digits, int base) {
  std::string hex;
  if (base == 16) {
    hex = std::string(digits);
  } else {
    const int bits_per_digit = base == 8 ? 3 : 1;
    std::string bits;
    for (char c : digits) {
      const int d = c - '0';
      for (int b = bits_per_digit - 1; b >= 0; --b) bits += ((d >> b) & 1) ? '1' : '0';
    }
    while (bits.size() % 4 != 0) bits.insert(bits.begin(), '0');
    for (size_t i = 0; i < bits.size(); i += 4) {
      const int nibble = (bits[i] - '0') * 8 + (bits[i + 1] - '0') * 4 + (bits[i + 2] - '0') * 2 +
                         (bits[i + 3] - '0');
      hex += "0123456789abcdef"[nibble];
    }
  }
  double value = 0;
  const auto [ptr, ec] =
      std::from_chars(hex.data(), hex.data() + hex.size(), value, std::chars_format::hex);
  if (ec == std::errc::result_out_of_range) return kInfinity;
  if (ec != std::errc()) return kNaN;
  return value;
}

// ECMA-262 StringToNumber: the whole string (trimmed) must be a numeric
// literal; "" is 0.
double StringToNumber(std::string_view s) {
  s = TrimJsWhitespace(s, /*trailing=*/true);
  if (s.empty()) return 0;
  if (s.size() > 2 && s[0] == '0') {
    int base = 0;
    const char* allowed = nullptr;
    switch (s[1]) {
      case 'x':
      case 'X':
        base = 16;
        allowed = "0123456789abcdefABCDEF";
        break;
      case 'o':
      case 'O':
        base = 8;
        allowed = "01234567";
        break;
      case 'b':
      case 'B':
        base = 2;
        allowed = "01";
        break;
      default:
        break;
    }
    if (base != 0) {
      const std::string_view digits = s.substr(2);
      for (char c : digits) {
        if (std::strchr(allowed, c) == nullptr || c == '\0') return kNaN;
      }
      return RadixToDouble(digits, base);
    }
  }
  if (s == "Infinity" || s == "+Infinity") return kInfinity;
  if (s == "-Infinity") return -kInfinity;
  if (ScanDecimal(s) != s.size()) return kNaN;
  return DecimalToDouble(s);
}

// The global parseFloat applied to a string: the longest decimal prefix
// after leading whitespace, NaN when there is none.
double ParseFloatText(std::string_view s) {
  s = TrimJsWhitespace(s, /*trailing=*/false);
  std::string_view unsigned_part = s;
  bool negative = false;
  if (!unsigned_part.empty() && (unsigned_part[0] == '+' || unsigned_part[0] == '-')) {
    negative = unsigned_part[0] == '-';
    unsigned_part.remove_prefix(1);
  }
  if (unsigned_part.substr(0, 8) == "Infinity") return negative ? -kInfinity : kInfinity;
  const size_t n = ScanDecimal(s);
  if (n == 0) return kNaN;
  return DecimalToDouble(s.substr(0, n));
}

Json NumberToJson(double d) {
  if (!std::isfinite(d)) return nullptr;
  if (d == 0) return 0;  // also -0, as JSON.stringify writes it
  if (std::trunc(d) == d && std::fabs(d) < 9007199254740992.0) {
    return static_cast<int64_t>(d);
  }
  return d;
}

// ---------------------------------------------------------------------------
// Values: what a JavaScript engine would hold while json-logic-js runs.
//
// Strings, arrays and objects from the rule or the data are borrowed (a
// pointer into the caller's Json, which outlives the evaluation); values an
// operator builds are owned and shared, immutable, so that passing them
// around never copies. Identity (for == and === on arrays and objects) is
// the address of the borrowed Json or of the shared block, which matches
// JavaScript: `var` yields the same object twice, a rule's array literal is
// a new array each time it is applied.

class Value;

struct ArrayData {
  std::vector<Value> elements;
};

struct ObjectData {
  std::vector<std::pair<std::string, Value>> members;
};

class Value {
 public:
  enum class Kind : uint8_t { kUndefined, kNull, kBool, kNumber, kString, kArray, kObject };

  Value() = default;  // undefined

  static Value Null() { return Value(Kind::kNull); }
  static Value Bool(bool b) {
    Value v(Kind::kBool);
    v.bool_ = b;
    return v;
  }
  static Value Number(double d) {
    Value v(Kind::kNumber);
    v.number_ = d;
    return v;
  }
  static Value String(std::string s) {
    Value v(Kind::kString);
    v.string_ = std::make_shared<const std::string>(std::move(s));
    return v;
  }
  static Value Borrow(const Json& json) {
    switch (json.type()) {
      case Json::value_t::null:
        return Null();
      case Json::value_t::boolean:
        return Bool(json.get<bool>());
      case Json::value_t::number_integer:
        return Number(static_cast<double>(json.get<Json::number_integer_t>()));
      case Json::value_t::number_unsigned:
        return Number(static_cast<double>(json.get<Json::number_unsigned_t>()));
      case Json::value_t::number_float:
        return Number(json.get<double>());
      case Json::value_t::string: {
        Value v(Kind::kString);
        v.json_ = &json;
        return v;
      }
      case Json::value_t::array: {
        Value v(Kind::kArray);
        v.json_ = &json;
        return v;
      }
      case Json::value_t::object: {
        Value v(Kind::kObject);
        v.json_ = &json;
        return v;
      }
      case Json::value_t::binary:
      case Json::value_t::discarded:
        break;
    }
    return Value();
  }
  static Value Array(std::shared_ptr<const ArrayData> data, int depth) {
    Value v(Kind::kArray);
    v.array_ = std::move(data);
    v.depth_ = depth;
    return v;
  }
  static Value Object(std::shared_ptr<const ObjectData> data, int depth) {
    Value v(Kind::kObject);
    v.object_ = std::move(data);
    v.depth_ = depth;
    return v;
  }

  Kind kind() const { return kind_; }
  bool is(Kind k) const { return kind_ == k; }
  bool nullish() const { return kind_ == Kind::kUndefined || kind_ == Kind::kNull; }
  bool is_object_like() const { return kind_ == Kind::kArray || kind_ == Kind::kObject; }
  bool boolean() const { return bool_; }
  double number() const { return number_; }
  // REQUIRES: kind() == kString.
  std::string_view string() const {
    return json_ != nullptr ? std::string_view(json_->get_ref<const std::string&>())
                            : std::string_view(*string_);
  }
  // A Json holding this value exactly as given (borrowed values only).
  const Json* borrowed() const { return json_; }
  // REQUIRES: kind() == kArray.
  size_t size() const { return json_ != nullptr ? json_->size() : array_->elements.size(); }
  Value at(size_t i) const { return json_ != nullptr ? Borrow((*json_)[i]) : array_->elements[i]; }
  // An own member of an object (REQUIRES: kind() == kObject).
  std::optional<Value> Member(std::string_view key) const {
    if (json_ != nullptr) {
      const auto it = json_->find(std::string(key));
      if (it == json_->end()) return std::nullopt;
      return Borrow(*it);
    }
    for (const auto& [name, value] : object_->members) {
      if (name == key) return value;
    }
    return std::nullopt;
  }
  const void* identity() const {
    if (json_ != nullptr) return json_;
    if (array_) return array_.get();
    return object_.get();
  }
  // Nesting of built containers (borrowed ones count as 1).
  int depth() const { return is_object_like() ? std::max(depth_, 1) : 0; }

  // JSON.stringify's view: undefined, NaN and infinities are null, undefined
  // members are left out.
  Json ToJson() const {
    switch (kind_) {
      case Kind::kUndefined:
      case Kind::kNull:
        return nullptr;
      case Kind::kBool:
        return bool_;
      case Kind::kNumber:
        return NumberToJson(number_);
      case Kind::kString:
        return json_ != nullptr ? *json_ : Json(*string_);
      case Kind::kArray: {
        if (json_ != nullptr) return *json_;
        Json out = Json::array();
        for (const Value& element : array_->elements) out.push_back(element.ToJson());
        return out;
      }
      case Kind::kObject: {
        if (json_ != nullptr) return *json_;
        Json out = Json::object();
        for (const auto& [name, value] : object_->members) {
          if (!value.is(Kind::kUndefined)) out[name] = value.ToJson();
        }
        return out;
      }
    }
    return nullptr;
  }

 private:
  explicit Value(Kind kind) : kind_(kind) {}

  Kind kind_ = Kind::kUndefined;
  bool bool_ = false;
  double number_ = 0;
  int depth_ = 0;
  const Json* json_ = nullptr;
  // Why shared_ptr: built values are immutable and passed around (into
  // arrays, through var, reduce accumulators) without copying.
  std::shared_ptr<const std::string> string_;
  std::shared_ptr<const ArrayData> array_;
  std::shared_ptr<const ObjectData> object_;
};

using Kind = Value::Kind;

// JavaScript's ToBoolean (plain `!!`).
bool JsTruthy(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kNull:
      return false;
    case Kind::kBool:
      return v.boolean();
    case Kind::kNumber:
      return v.number() != 0 && !std::isnan(v.number());
    case Kind::kString:
      return !v.string().empty();
    case Kind::kArray:
    case Kind::kObject:
      return true;
  }
  return false;
}

// jsonLogic.truthy: an empty array is false, otherwise JavaScript's rule.
bool LogicTruthy(const Value& v) {
  if (v.is(Kind::kArray) && v.size() == 0) return false;
  return JsTruthy(v);
}

bool StrictEquals(const Value& a, const Value& b) {
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNull:
      return true;
    case Kind::kBool:
      return a.boolean() == b.boolean();
    case Kind::kNumber:
      return a.number() == b.number();  // NaN != NaN, -0 == 0
    case Kind::kString:
      return a.string() == b.string();
    case Kind::kArray:
    case Kind::kObject:
      return a.identity() == b.identity();
  }
  return false;
}

// ---------------------------------------------------------------------------
// The evaluator: one per evaluation, holding the work budget.

class Args {
 public:
  explicit Args(const Json& values) : values_(values) {}
  size_t size() const { return values_.is_array() ? values_.size() : 1; }
  // The raw (unapplied) argument, nullptr when absent (JavaScript undefined).
  const Json* at(size_t i) const {
    if (!values_.is_array()) return i == 0 ? &values_ : nullptr;
    return i < values_.size() ? &values_[i] : nullptr;
  }

 private:
  const Json& values_;
};

const Value& Arg(const std::vector<Value>& values, size_t i) {
  static const Value* const kUndefined = new Value();
  return i < values.size() ? values[i] : *kUndefined;
}

class Evaluator {
 public:
  explicit Evaluator(const JsonLogicLimits& limits, std::vector<std::string>* unresolved = nullptr)
      : limits_(limits), unresolved_(unresolved) {}

  // jsonLogic.apply(rule, data); rule == nullptr is `undefined`.
  StatusOr<Value> Apply(const Json* rule, const Value& data, int depth) {
    if (rule == nullptr) return Value();
    RETURN_IF_ERROR(Enter(depth));
    if (rule->is_array()) {
      std::vector<Value> out;
      out.reserve(rule->size());
      for (const Json& element : *rule) {
        ASSIGN_OR_RETURN(Value v, Apply(&element, data, depth + 1));
        out.push_back(std::move(v));
      }
      return MakeArray(std::move(out));
    }
    if (!rule->is_object() || rule->size() != 1) return Value::Borrow(*rule);
    const auto it = rule->begin();
    const std::optional<Op> op = FindOp(it.key());
    if (!op) {
      // json-logic-js applies the arguments before it finds out; their
      // errors and ours are the same outcome (an error), so skip the work.
      return UnknownOperator(it.key());
    }
    return Operate(*op, Args(it.value()), data, depth);
  }

 private:
  Status Enter(int depth) {
    if (depth > limits_.max_depth) {
      return ResourceExhausted("jsonlogic: rule nested deeper than " +
                               std::to_string(limits_.max_depth) + " levels");
    }
    return Charge(1);
  }

  Status Charge(int64_t units) {
    used_ += units;
    if (used_ > limits_.max_operations) {
      return ResourceExhausted("jsonlogic: evaluation needs more than " +
                               std::to_string(limits_.max_operations) + " operations");
    }
    return Status::Ok();
  }
  Status ChargeText(size_t bytes) { return Charge(static_cast<int64_t>(bytes / 16)); }

  StatusOr<Value> MakeArray(std::vector<Value> elements) {
    RETURN_IF_ERROR(Charge(static_cast<int64_t>(elements.size())));
    int depth = 1;
    for (const Value& e : elements) depth = std::max(depth, e.depth() + 1);
    if (depth > kMaxValueDepth) {
      return ResourceExhausted("jsonlogic: a built value is nested deeper than " +
                               std::to_string(kMaxValueDepth) + " levels");
    }
    return Value::Array(std::make_shared<const ArrayData>(ArrayData{std::move(elements)}), depth);
  }

  StatusOr<Value> MakeObject(ObjectData object) {
    RETURN_IF_ERROR(Charge(static_cast<int64_t>(object.members.size())));
    int depth = 1;
    for (const auto& member : object.members) depth = std::max(depth, member.second.depth() + 1);
    if (depth > kMaxValueDepth) {
      return ResourceExhausted("jsonlogic: a built value is nested deeper than " +
                               std::to_string(kMaxValueDepth) + " levels");
    }
    return Value::Object(std::make_shared<const ObjectData>(std::move(object)), depth);
  }

  // ----- JavaScript abstract operations -----------------------------------

  // OrdinaryToPrimitive on a JSON object: an own "toString" member shadows
  // Object.prototype.toString with something that is not a function, and
  // valueOf returns the object itself, so JavaScript throws a TypeError.
  static Status ObjectToPrimitiveError(const Value& object) {
    if (object.is(Kind::kObject) && object.Member("toString").has_value()) {
      return InvalidArgument(
          "jsonlogic: cannot convert an object with a \"toString\" member to a primitive value");
    }
    return Status::Ok();
  }

  StatusOr<std::string> ToStringImpl(const Value& v, int nesting) {
    if (nesting > kMaxConversionDepth) {
      return ResourceExhausted("jsonlogic: value nested too deeply to convert to text");
    }
    switch (v.kind()) {
      case Kind::kUndefined:
        return std::string("undefined");
      case Kind::kNull:
        return std::string("null");
      case Kind::kBool:
        return std::string(v.boolean() ? "true" : "false");
      case Kind::kNumber:
        return FormatJcsNumber(v.number());
      case Kind::kString:
        RETURN_IF_ERROR(ChargeText(v.string().size()));
        return std::string(v.string());
      case Kind::kArray: {
        // Array.prototype.join(","): null and undefined elements are "".
        std::string out;
        const size_t n = v.size();
        RETURN_IF_ERROR(Charge(static_cast<int64_t>(n)));
        for (size_t i = 0; i < n; ++i) {
          if (i > 0) out += ',';
          const Value element = v.at(i);
          if (element.nullish()) continue;
          ASSIGN_OR_RETURN(std::string text, ToStringImpl(element, nesting + 1));
          out += text;
        }
        return out;
      }
      case Kind::kObject:
        RETURN_IF_ERROR(ObjectToPrimitiveError(v));
        return std::string("[object Object]");
    }
    return std::string();
  }

  StatusOr<std::string> ToString(const Value& v) { return ToStringImpl(v, 0); }

  // ToPrimitive: arrays and objects become their string form.
  StatusOr<Value> ToPrimitive(const Value& v) {
    if (!v.is_object_like()) return v;
    ASSIGN_OR_RETURN(std::string text, ToString(v));
    return Value::String(std::move(text));
  }

  StatusOr<double> ToNumber(const Value& v) {
    switch (v.kind()) {
      case Kind::kUndefined:
        return kNaN;
      case Kind::kNull:
        return 0.0;
      case Kind::kBool:
        return v.boolean() ? 1.0 : 0.0;
      case Kind::kNumber:
        return v.number();
      case Kind::kString:
        RETURN_IF_ERROR(ChargeText(v.string().size()));
        return StringToNumber(v.string());
      case Kind::kArray:
      case Kind::kObject: {
        ASSIGN_OR_RETURN(Value primitive, ToPrimitive(v));
        return ToNumber(primitive);
      }
    }
    return kNaN;
  }

  // ToIntegerOrInfinity.
  StatusOr<double> ToInteger(const Value& v) {
    ASSIGN_OR_RETURN(double d, ToNumber(v));
    if (std::isnan(d)) return 0.0;
    return std::trunc(d);
  }

  // parseFloat(v): a number goes through its string form, which loses
  // only the sign of -0.
  StatusOr<double> ParseFloat(const Value& v) {
    if (v.is(Kind::kNumber)) return v.number() == 0 ? 0.0 : v.number();
    ASSIGN_OR_RETURN(std::string text, ToString(v));
    return ParseFloatText(text);
  }

  // IsLooselyEqual (==).
  StatusOr<bool> LooseEquals(const Value& x, const Value& y) {
    const auto type = [](const Value& v) {
      return v.kind() == Kind::kArray ? Kind::kObject : v.kind();
    };
    if (type(x) == type(y)) return StrictEquals(x, y);
    if (x.nullish() && y.nullish()) return true;
    if (x.is(Kind::kNumber) && y.is(Kind::kString)) {
      RETURN_IF_ERROR(ChargeText(y.string().size()));
      return x.number() == StringToNumber(y.string());
    }
    if (x.is(Kind::kString) && y.is(Kind::kNumber)) {
      RETURN_IF_ERROR(ChargeText(x.string().size()));
      return StringToNumber(x.string()) == y.number();
    }
    if (x.is(Kind::kBool)) return LooseEquals(Value::Number(x.boolean() ? 1 : 0), y);
    if (y.is(Kind::kBool)) return LooseEquals(x, Value::Number(y.boolean() ? 1 : 0));
    const auto primitive_operand = [](const Value& v) {
      return v.is(Kind::kString) || v.is(Kind::kNumber);
    };
    if (x.is_object_like() && primitive_operand(y)) {
      ASSIGN_OR_RETURN(Value px, ToPrimitive(x));
      return LooseEquals(px, y);
    }
    if (y.is_object_like() && primitive_operand(x)) {
      ASSIGN_OR_RETURN(Value py, ToPrimitive(y));
      return LooseEquals(x, py);
    }
    return false;
  }

  // A primitive that ToNumber turns into a number it does not hold: a
  // boolean, null, or a string of white space only.
  static bool NotANumber(const Value& v) {
    if (v.is(Kind::kBool) || v.is(Kind::kNull) || v.is(Kind::kUndefined)) return true;
    return v.is(Kind::kString) && v.string().find_first_not_of(" \t\n\r\f\v") == std::string::npos;
  }

  // IsLessThan (x < y): nullopt is JavaScript's "undefined" (a NaN operand).
  StatusOr<std::optional<bool>> LessThan(const Value& x, const Value& y) {
    ASSIGN_OR_RETURN(Value px, ToPrimitive(x));
    ASSIGN_OR_RETURN(Value py, ToPrimitive(y));
    // An array or an object compares as its text ([50] as "50", [[99]] as
    // "99"): JavaScript judges it, but no amount was judged.
    const bool container = x.is_object_like() || y.is_object_like();
    if (container && unresolved_ != nullptr && unresolved_->size() < 16) {
      unresolved_->push_back("a comparison has a value that is not a number");
    }
    if (px.is(Kind::kString) && py.is(Kind::kString)) {
      RETURN_IF_ERROR(ChargeText(px.string().size() + py.string().size()));
      return std::optional<bool>(ToUtf16(px.string()) < ToUtf16(py.string()));
    }
    ASSIGN_OR_RETURN(double nx, ToNumber(px));
    ASSIGN_OR_RETURN(double ny, ToNumber(py));
    // JavaScript compares "5,000" (NaN) as false either way, and true, null
    // or "" as 0 or 1: none is a judgement of an amount.
    if (!container && unresolved_ != nullptr && unresolved_->size() < 16 &&
        (std::isnan(nx) || std::isnan(ny) || NotANumber(px) || NotANumber(py))) {
      unresolved_->push_back("a comparison has a value that is not a number");
    }
    if (std::isnan(nx) || std::isnan(ny)) return std::optional<bool>();
    return std::optional<bool>(nx < ny);
  }

  StatusOr<bool> Less(const Value& x, const Value& y) {
    ASSIGN_OR_RETURN(std::optional<bool> r, LessThan(x, y));
    return r.value_or(false);
  }
  // x <= y is !(y < x), false when undefined.
  StatusOr<bool> LessOrEqual(const Value& x, const Value& y) {
    ASSIGN_OR_RETURN(std::optional<bool> r, LessThan(y, x));
    return r.has_value() && !*r;
  }

  // data[key] for the values JSON can hold; inherited members are not data.
  static Value GetProperty(const Value& v, std::string_view key) {
    switch (v.kind()) {
      case Kind::kObject:
        return v.Member(key).value_or(Value());
      case Kind::kArray: {
        if (key == "length") return Value::Number(static_cast<double>(v.size()));
        const std::optional<size_t> index = ArrayIndex(key);
        if (index && *index < v.size()) return v.at(*index);
        return Value();
      }
      case Kind::kString: {
        if (key == "length") return Value::Number(static_cast<double>(Utf16Length(v.string())));
        const std::optional<size_t> index = ArrayIndex(key);
        if (!index) return Value();
        const std::u16string units = ToUtf16(v.string());
        if (*index >= units.size()) return Value();
        return Value::String(FromUtf16(std::u16string_view(units).substr(*index, 1)));
      }
      default:
        return Value();
    }
  }

  // ----- operators ----------------------------------------------------------

  StatusOr<Value> Operate(Op op, const Args& args, const Value& data, int depth) {
    switch (op) {
      case Op::kIf:
        return If(args, data, depth);
      case Op::kAnd:
      case Op::kOr:
        return AndOr(op == Op::kOr, args, data, depth);
      case Op::kFilter:
      case Op::kMap:
      case Op::kReduce:
      case Op::kAll:
      case Op::kNone:
      case Op::kSome:
        return Iterate(op, args, data, depth);
      default:
        break;
    }
    std::vector<Value> values;
    values.reserve(args.size());
    for (size_t i = 0; i < args.size(); ++i) {
      ASSIGN_OR_RETURN(Value v, Apply(args.at(i), data, depth + 1));
      values.push_back(std::move(v));
    }
    return Call(op, values, data, depth);
  }

  StatusOr<Value> If(const Args& args, const Value& data, int depth) {
    const size_t n = args.size();
    size_t i = 0;
    for (; i + 1 < n; i += 2) {
      ASSIGN_OR_RETURN(Value condition, Apply(args.at(i), data, depth + 1));
      if (LogicTruthy(condition)) return Apply(args.at(i + 1), data, depth + 1);
    }
    if (n == i + 1) return Apply(args.at(i), data, depth + 1);
    return Value::Null();
  }

  StatusOr<Value> AndOr(bool is_or, const Args& args, const Value& data, int depth) {
    Value current;  // undefined when there are no arguments
    for (size_t i = 0; i < args.size(); ++i) {
      const size_t doubts = unresolved_ != nullptr ? unresolved_->size() : 0;
      ASSIGN_OR_RETURN(current, Apply(args.at(i), data, depth + 1));
      if (LogicTruthy(current) == is_or) return current;
      // An `or` that goes on to a next operand is a fallback the author
      // wrote: what the falsy one could not read is covered by it.
      if (is_or && i + 1 < args.size() && unresolved_ != nullptr) unresolved_->resize(doubts);
    }
    return current;
  }

  StatusOr<Value> Iterate(Op op, const Args& args, const Value& data, int depth) {
    ASSIGN_OR_RETURN(Value scoped, Apply(args.at(0), data, depth + 1));
    const Json* logic = args.at(1);
    const bool is_array = scoped.is(Kind::kArray);
    const size_t n = is_array ? scoped.size() : 0;
    switch (op) {
      case Op::kFilter: {
        std::vector<Value> kept;
        for (size_t i = 0; i < n; ++i) {
          Value element = scoped.at(i);
          ASSIGN_OR_RETURN(Value r, Apply(logic, element, depth + 1));
          if (LogicTruthy(r)) kept.push_back(std::move(element));
        }
        return MakeArray(std::move(kept));
      }
      case Op::kMap: {
        std::vector<Value> out;
        out.reserve(n);
        for (size_t i = 0; i < n; ++i) {
          ASSIGN_OR_RETURN(Value r, Apply(logic, scoped.at(i), depth + 1));
          out.push_back(std::move(r));
        }
        return MakeArray(std::move(out));
      }
      case Op::kReduce: {
        Value accumulator = Value::Null();
        if (args.at(2) != nullptr) {
          ASSIGN_OR_RETURN(accumulator, Apply(args.at(2), data, depth + 1));
        }
        for (size_t i = 0; i < n; ++i) {
          ObjectData scope;
          scope.members.emplace_back("current", scoped.at(i));
          scope.members.emplace_back("accumulator", std::move(accumulator));
          ASSIGN_OR_RETURN(Value scope_value, MakeObject(std::move(scope)));
          ASSIGN_OR_RETURN(accumulator, Apply(logic, scope_value, depth + 1));
        }
        return accumulator;
      }
      case Op::kAll:
      case Op::kNone:
      case Op::kSome: {
        if (n == 0) return Value::Bool(op == Op::kNone);
        // all: stop at the first falsy; some/none: at the first truthy.
        const bool stop_on = op != Op::kAll;
        for (size_t i = 0; i < n; ++i) {
          ASSIGN_OR_RETURN(Value r, Apply(logic, scoped.at(i), depth + 1));
          if (LogicTruthy(r) == stop_on) return Value::Bool(op == Op::kSome);
        }
        return Value::Bool(op != Op::kSome);
      }
      default:
        break;
    }
    return Internal("jsonlogic: not an iterating operator");
  }

  StatusOr<Value> Call(Op op, const std::vector<Value>& values, const Value& data, int depth) {
    const Value& a = Arg(values, 0);
    const Value& b = Arg(values, 1);
    const Value& c = Arg(values, 2);
    switch (op) {
      case Op::kEq: {
        ASSIGN_OR_RETURN(bool r, LooseEquals(a, b));
        return Value::Bool(r);
      }
      case Op::kNe: {
        ASSIGN_OR_RETURN(bool r, LooseEquals(a, b));
        return Value::Bool(!r);
      }
      case Op::kStrictEq:
        return Value::Bool(StrictEquals(a, b));
      case Op::kStrictNe:
        return Value::Bool(!StrictEquals(a, b));
      case Op::kGt: {
        ASSIGN_OR_RETURN(bool r, Less(b, a));
        return Value::Bool(r);
      }
      case Op::kGe: {
        ASSIGN_OR_RETURN(bool r, LessOrEqual(b, a));
        return Value::Bool(r);
      }
      case Op::kLt:
      case Op::kLe: {
        const auto compare = [&](const Value& x, const Value& y) {
          return op == Op::kLt ? Less(x, y) : LessOrEqual(x, y);
        };
        ASSIGN_OR_RETURN(bool first, compare(a, b));
        if (c.is(Kind::kUndefined) || !first) return Value::Bool(first);
        ASSIGN_OR_RETURN(bool second, compare(b, c));
        return Value::Bool(second);
      }
      case Op::kNotNot:
        return Value::Bool(LogicTruthy(a));
      case Op::kNot:
        return Value::Bool(!LogicTruthy(a));
      case Op::kMod: {
        ASSIGN_OR_RETURN(double x, ToNumber(a));
        ASSIGN_OR_RETURN(double y, ToNumber(b));
        return Value::Number(std::fmod(x, y));
      }
      case Op::kLog:
        return a;
      case Op::kIn:
        return In(a, b);
      case Op::kCat: {
        std::string out;
        for (const Value& v : values) {
          if (v.nullish()) continue;
          ASSIGN_OR_RETURN(std::string text, ToString(v));
          out += text;
        }
        RETURN_IF_ERROR(ChargeText(out.size()));
        return Value::String(std::move(out));
      }
      case Op::kSubstr:
        return Substr(a, b, c);
      case Op::kPlus: {
        double sum = 0;
        for (const Value& v : values) {
          ASSIGN_OR_RETURN(double x, ParseFloat(v));
          sum = (sum == 0 ? 0.0 : sum) + x;
        }
        return Value::Number(sum);
      }
      case Op::kTimes: {
        if (values.empty()) {
          return InvalidArgument("jsonlogic: \"*\" needs at least one argument");
        }
        if (values.size() == 1) return values[0];  // reduce() without a call
        ASSIGN_OR_RETURN(double product, ParseFloat(values[0]));
        for (size_t i = 1; i < values.size(); ++i) {
          ASSIGN_OR_RETURN(double x, ParseFloat(values[i]));
          product = (i > 1 && product == 0 ? 0.0 : product) * x;
        }
        return Value::Number(product);
      }
      case Op::kMinus: {
        ASSIGN_OR_RETURN(double x, ToNumber(a));
        if (b.is(Kind::kUndefined)) return Value::Number(-x);
        ASSIGN_OR_RETURN(double y, ToNumber(b));
        return Value::Number(x - y);
      }
      case Op::kDivide: {
        ASSIGN_OR_RETURN(double x, ToNumber(a));
        ASSIGN_OR_RETURN(double y, ToNumber(b));
        return Value::Number(x / y);
      }
      case Op::kMin:
      case Op::kMax:
        return MinMax(op == Op::kMin, values);
      case Op::kMerge: {
        std::vector<Value> out;
        for (const Value& v : values) {
          if (!v.is(Kind::kArray)) {
            out.push_back(v);
            continue;
          }
          for (size_t i = 0; i < v.size(); ++i) out.push_back(v.at(i));
        }
        return MakeArray(std::move(out));
      }
      case Op::kVar: {
        bool found = true;
        ASSIGN_OR_RETURN(Value v, Var(values, data, &found));
        if ((!found || v.is(Kind::kNull)) && unresolved_ != nullptr &&
            Arg(values, 1).is(Kind::kUndefined) && unresolved_->size() < 16) {
          const Value& path = Arg(values, 0);
          auto text = ToString(path);
          unresolved_->push_back((text.ok() ? *text : std::string("?")) +
                                 (found ? " is null" : " is absent"));
        }
        return v;
      }
      case Op::kMissing:
        return Missing(values, data, depth);
      case Op::kMissingSome:
        return MissingSome(values, data, depth);
      default:
        break;
    }
    return Internal("jsonlogic: operator without an implementation");
  }

  StatusOr<Value> In(const Value& needle, const Value& haystack) {
    if (!JsTruthy(haystack)) return Value::Bool(false);
    switch (haystack.kind()) {
      case Kind::kString: {
        ASSIGN_OR_RETURN(std::string text, ToString(needle));
        RETURN_IF_ERROR(ChargeText(haystack.string().size()));
        return Value::Bool(haystack.string().find(text) != std::string_view::npos);
      }
      case Kind::kArray: {
        const size_t n = haystack.size();
        RETURN_IF_ERROR(Charge(static_cast<int64_t>(n)));
        for (size_t i = 0; i < n; ++i) {
          if (StrictEquals(needle, haystack.at(i))) return Value::Bool(true);
        }
        return Value::Bool(false);
      }
      case Kind::kObject:
        // An own "indexOf" member is not a function: JavaScript throws.
        if (haystack.Member("indexOf").has_value()) {
          return InvalidArgument(
              "jsonlogic: \"in\": the object's indexOf member is not a function");
        }
        return Value::Bool(false);
      default:
        return Value::Bool(false);
    }
  }

  // String.prototype.substr (Annex B) on UTF-16 code units.
  StatusOr<std::u16string> SubstrUnits(std::u16string_view s, const Value& start,
                                       const Value& length) {
    const double size = static_cast<double>(s.size());
    ASSIGN_OR_RETURN(double int_start, ToInteger(start));
    if (int_start == -kInfinity) {
      int_start = 0;
    } else if (int_start < 0) {
      int_start = std::max(size + int_start, 0.0);
    } else {
      int_start = std::min(int_start, size);
    }
    double int_length = size;
    if (!length.is(Kind::kUndefined)) {
      ASSIGN_OR_RETURN(int_length, ToInteger(length));
    }
    int_length = std::clamp(int_length, 0.0, size);
    const double int_end = std::min(int_start + int_length, size);
    if (int_end <= int_start) return std::u16string();
    return std::u16string(
        s.substr(static_cast<size_t>(int_start), static_cast<size_t>(int_end - int_start)));
  }

  StatusOr<Value> Substr(const Value& source, const Value& start, const Value& end) {
    ASSIGN_OR_RETURN(bool negative_end, Less(end, Value::Number(0)));
    ASSIGN_OR_RETURN(std::string text, ToString(source));
    const std::u16string units = ToUtf16(text);
    if (!negative_end) {
      ASSIGN_OR_RETURN(std::u16string r, SubstrUnits(units, start, end));
      return Value::String(FromUtf16(r));
    }
    // json-logic-js emulates PHP: temp.substr(0, temp.length + end), where
    // `+` concatenates when `end` is not a number.
    ASSIGN_OR_RETURN(std::u16string temp, SubstrUnits(units, start, Value()));
    const double temp_length = static_cast<double>(temp.size());
    ASSIGN_OR_RETURN(Value end_primitive, ToPrimitive(end));
    Value length;
    if (end_primitive.is(Kind::kString)) {
      length = Value::String(FormatJcsNumber(temp_length) + std::string(end_primitive.string()));
    } else {
      ASSIGN_OR_RETURN(double e, ToNumber(end_primitive));
      length = Value::Number(temp_length + e);
    }
    ASSIGN_OR_RETURN(std::u16string r, SubstrUnits(temp, Value::Number(0), length));
    return Value::String(FromUtf16(r));
  }

  StatusOr<Value> MinMax(bool is_min, const std::vector<Value>& values) {
    double result = is_min ? kInfinity : -kInfinity;
    bool nan = false;
    for (const Value& v : values) {
      ASSIGN_OR_RETURN(double x, ToNumber(v));
      if (std::isnan(x)) {
        nan = true;
      } else if (x == 0 && result == 0) {
        // Math.min prefers -0, Math.max +0.
        if (std::signbit(x) == is_min) result = x;
      } else if (is_min ? x < result : x > result) {
        result = x;
      }
    }
    return Value::Number(nan ? kNaN : result);
  }

  // `found` (when given) is set false when the path leads nowhere and the
  // fallback stands in.
  StatusOr<Value> Var(const std::vector<Value>& values, const Value& data, bool* found = nullptr) {
    const Value& path_value = Arg(values, 0);
    const Value& fallback = Arg(values, 1);
    const Value not_found = fallback.is(Kind::kUndefined) ? Value::Null() : fallback;
    if (path_value.nullish() || (path_value.is(Kind::kString) && path_value.string().empty())) {
      return data;
    }
    ASSIGN_OR_RETURN(std::string path, ToString(path_value));
    Value current = data;
    size_t pos = 0;
    while (true) {
      const size_t dot = path.find('.', pos);
      const std::string_view part = std::string_view(path).substr(
          pos, dot == std::string::npos ? std::string::npos : dot - pos);
      if (current.nullish() || (current = GetProperty(current, part)).is(Kind::kUndefined)) {
        if (found != nullptr) *found = false;
        return not_found;
      }
      if (dot == std::string::npos) break;
      pos = dot + 1;
    }
    return current;
  }

  // jsonLogic.apply(value, data) for a value that is itself used as a rule
  // (missing and missing_some apply their keys again).
  StatusOr<Value> ApplyValue(const Value& rule, const Value& data, int depth) {
    if (rule.borrowed() != nullptr) return Apply(rule.borrowed(), data, depth);
    if (!rule.is(Kind::kArray)) return rule;  // primitives and built objects
    RETURN_IF_ERROR(Enter(depth));
    std::vector<Value> out;
    out.reserve(rule.size());
    for (size_t i = 0; i < rule.size(); ++i) {
      ASSIGN_OR_RETURN(Value v, ApplyValue(rule.at(i), data, depth + 1));
      out.push_back(std::move(v));
    }
    return MakeArray(std::move(out));
  }

  // The argument list an operator gets for {"op": value}: a value that is
  // an array is the list, anything else one argument; each applied.
  StatusOr<std::vector<Value>> ApplyAsArguments(const Value& value, const Value& data, int depth) {
    std::vector<Value> out;
    if (!value.is(Kind::kArray)) {
      ASSIGN_OR_RETURN(Value v, ApplyValue(value, data, depth));
      out.push_back(std::move(v));
      return out;
    }
    out.reserve(value.size());
    for (size_t i = 0; i < value.size(); ++i) {
      ASSIGN_OR_RETURN(Value v, ApplyValue(value.at(i), data, depth));
      out.push_back(std::move(v));
    }
    return out;
  }

  StatusOr<Value> Missing(const std::vector<Value>& values, const Value& data, int depth) {
    std::vector<Value> keys;
    const Value& first = Arg(values, 0);
    if (first.is(Kind::kArray)) {
      for (size_t i = 0; i < first.size(); ++i) keys.push_back(first.at(i));
    } else {
      keys = values;
    }
    std::vector<Value> missing;
    for (const Value& key : keys) {
      // jsonLogic.apply({"var": key}, data)
      RETURN_IF_ERROR(Enter(depth + 1));
      ASSIGN_OR_RETURN(std::vector<Value> var_args, ApplyAsArguments(key, data, depth + 2));
      ASSIGN_OR_RETURN(Value found, Var(var_args, data));
      if (found.is(Kind::kNull) || (found.is(Kind::kString) && found.string().empty())) {
        missing.push_back(key);
      }
    }
    return MakeArray(std::move(missing));
  }

  StatusOr<Value> MissingSome(const std::vector<Value>& values, const Value& data, int depth) {
    const Value& need_count = Arg(values, 0);
    const Value& options = Arg(values, 1);
    // jsonLogic.apply({"missing": options}, data)
    RETURN_IF_ERROR(Enter(depth + 1));
    ASSIGN_OR_RETURN(std::vector<Value> missing_args, ApplyAsArguments(options, data, depth + 2));
    ASSIGN_OR_RETURN(Value are_missing, Missing(missing_args, data, depth + 1));
    Value options_length;
    switch (options.kind()) {
      case Kind::kUndefined:
      case Kind::kNull:
        return InvalidArgument("jsonlogic: \"missing_some\" needs a list of keys");
      case Kind::kArray:
        options_length = Value::Number(static_cast<double>(options.size()));
        break;
      case Kind::kString:
        options_length = Value::Number(static_cast<double>(Utf16Length(options.string())));
        break;
      case Kind::kObject:
        options_length = options.Member("length").value_or(Value());
        break;
      default:
        break;
    }
    ASSIGN_OR_RETURN(double length, ToNumber(options_length));
    const double present = length - static_cast<double>(are_missing.size());
    ASSIGN_OR_RETURN(bool enough, LessOrEqual(need_count, Value::Number(present)));
    if (enough) return MakeArray({});
    return are_missing;
  }

  const JsonLogicLimits limits_;
  std::vector<std::string>* const unresolved_;  // may be null
  int64_t used_ = 0;
};

Status CheckRule(const Json& rule, const JsonLogicLimits& limits, std::string& pointer, int depth) {
  if (depth > limits.max_depth) {
    return ResourceExhausted(
        "jsonlogic: rule nested deeper than " + std::to_string(limits.max_depth) + " levels",
        pointer);
  }
  if (rule.is_array()) {
    for (size_t i = 0; i < rule.size(); ++i) {
      const size_t mark = pointer.size();
      pointer += "/" + std::to_string(i);
      RETURN_IF_ERROR(CheckRule(rule[i], limits, pointer, depth + 1));
      pointer.resize(mark);
    }
    return Status::Ok();
  }
  if (!rule.is_object() || rule.size() != 1) return Status::Ok();  // a literal
  const auto it = rule.begin();
  if (!FindOp(it.key())) return UnknownOperator(it.key(), pointer);
  const size_t mark = pointer.size();
  pointer += "/" + JsonPointerToken(it.key());
  const Json& args = it.value();
  if (args.is_array()) {
    for (size_t i = 0; i < args.size(); ++i) {
      const size_t arg_mark = pointer.size();
      pointer += "/" + std::to_string(i);
      RETURN_IF_ERROR(CheckRule(args[i], limits, pointer, depth + 1));
      pointer.resize(arg_mark);
    }
  } else {
    RETURN_IF_ERROR(CheckRule(args, limits, pointer, depth + 1));
  }
  pointer.resize(mark);
  return Status::Ok();
}

}  // namespace

StatusOr<Json> EvalJsonLogic(const Json& rule, const Json& data, const JsonLogicLimits& limits) {
  return EvalJsonLogic(rule, data, limits, nullptr);
}

StatusOr<Json> EvalJsonLogic(const Json& rule, const Json& data, const JsonLogicLimits& limits,
                             std::vector<std::string>* unresolved) {
  try {
    Evaluator evaluator(limits, unresolved);
    ASSIGN_OR_RETURN(Value result, evaluator.Apply(&rule, Value::Borrow(data), 1));
    return result.ToJson();
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("jsonlogic: out of memory");
  } catch (const std::exception& e) {
    return Internal(std::string("jsonlogic: ") + e.what());
  }
}

bool JsonLogicTruthy(const Json& value) { return LogicTruthy(Value::Borrow(value)); }

Status CheckJsonLogicRule(const Json& rule, const JsonLogicLimits& limits) {
  std::string pointer;
  return CheckRule(rule, limits, pointer, 1);
}

}  // namespace idem
