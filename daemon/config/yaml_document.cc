// The one file that talks to yaml-cpp: YAML text -> JSON plus a line map.
#include "daemon/config/yaml_document.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "daemon/core/file_read.h"
#include "daemon/core/json.h"

namespace idem {
namespace {

constexpr int kMaxDepth = 64;
// Values in a document once its aliases are expanded: an alias repeats all
// it names, so nine lines of nine aliases each name 9^9 values (a "billion
// laughs") and would take all memory. A real config has a few thousand.
constexpr size_t kMaxValues = 100'000;
// The largest config file read (a file of that size parses in about a
// second; a real config is a few KB).
constexpr size_t kMaxBytes = 4 << 20;
// The text (keys and scalars) a document may hold once its aliases are
// expanded: an alias of a long string copies it whole, so a few thousand
// aliases of one 100 KB string would take gigabytes within kMaxValues.
constexpr size_t kMaxExpandedBytes = 16 << 20;
constexpr size_t kMaxErrorsListed = 20;

const std::string kTagStr = "tag:yaml.org,2002:str";
const std::string kTagInt = "tag:yaml.org,2002:int";
const std::string kTagFloat = "tag:yaml.org,2002:float";
const std::string kTagBool = "tag:yaml.org,2002:bool";
const std::string kTagNull = "tag:yaml.org,2002:null";

bool IsNullWord(std::string_view s) {
  return s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL";
}

std::optional<bool> ParseBool(std::string_view s) {
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  return std::nullopt;
}

bool AllOf(std::string_view s, const char* allowed) {
  if (s.empty()) return false;
  for (char c : s) {
    if (std::strchr(allowed, c) == nullptr) return false;
  }
  return true;
}

// YAML 1.2 core schema integers: [-+]?[0-9]+, 0o[0-7]+, 0x[0-9a-fA-F]+.
std::optional<Json> ParseInt(std::string_view s) {
  int base = 10;
  bool negative = false;
  std::string_view digits = s;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'o')) {
    base = s[1] == 'x' ? 16 : 8;
    digits = s.substr(2);
    if (!AllOf(digits, base == 16 ? "0123456789abcdefABCDEF" : "01234567")) return std::nullopt;
  } else {
    if (!digits.empty() && (digits[0] == '-' || digits[0] == '+')) {
      negative = digits[0] == '-';
      digits.remove_prefix(1);
    }
    if (!AllOf(digits, "0123456789")) return std::nullopt;
  }
  uint64_t magnitude = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), magnitude, base);
  if (ec == std::errc() && ptr == digits.data() + digits.size()) {
    if (!negative) {
      if (magnitude <= static_cast<uint64_t>(INT64_MAX))
        return Json(static_cast<int64_t>(magnitude));
      return Json(magnitude);
    }
    if (magnitude <= static_cast<uint64_t>(INT64_MAX))
      return Json(-static_cast<int64_t>(magnitude));
    if (magnitude == static_cast<uint64_t>(INT64_MAX) + 1) return Json(INT64_MIN);
  }
  if (base != 10) return std::nullopt;
  // Too large for 64 bits: keep it as a number, as JSON parsers do.
  double d = 0;
  auto [p2, ec2] = std::from_chars(digits.data(), digits.data() + digits.size(), d);
  if (ec2 != std::errc() || p2 != digits.data() + digits.size()) return std::nullopt;
  return Json(negative ? -d : d);
}

// YAML 1.2 core schema floats, without .inf / .nan (JSON has neither).
// `out_of_range`, when given, is set for a float literal past a double
// (1e400), which is then nullopt as well.
std::optional<double> ParseFloat(std::string_view s, bool* out_of_range = nullptr) {
  std::string_view body = s;
  bool negative = false;
  if (!body.empty() && (body[0] == '-' || body[0] == '+')) {
    negative = body[0] == '-';
    body.remove_prefix(1);
  }
  if (!AllOf(body, "0123456789.eE+-")) return std::nullopt;
  if (body.find_first_of("0123456789") == std::string_view::npos) return std::nullopt;
  if (body[0] != '.' && (body[0] < '0' || body[0] > '9')) return std::nullopt;
  std::string text(body);
  if (text[0] == '.') text.insert(text.begin(), '0');
  if (text.back() == '.') text.push_back('0');
  double value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (out_of_range != nullptr) {
    *out_of_range = ec == std::errc::result_out_of_range && ptr == text.data() + text.size();
  }
  if (ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  return negative ? -value : value;
}

bool IsInfOrNan(std::string_view s) {
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  return s == ".inf" || s == ".Inf" || s == ".INF" || s == ".nan" || s == ".NaN" || s == ".NAN";
}

class Converter {
 public:
  explicit Converter(YamlDocument& doc) : doc_(doc) {}

  Status Convert(const YAML::Node& node, const std::string& pointer, int line, int depth,
                 Json& out) {
    if (depth > kMaxDepth) {
      return doc_.Error(pointer, "nested deeper than " + std::to_string(kMaxDepth) + " levels");
    }
    if (++values_ > kMaxValues) {
      return doc_.Error(pointer, "the document holds more than " + std::to_string(kMaxValues) +
                                     " values once its aliases are expanded (an alias repeats "
                                     "everything its anchor names)");
    }
    if (node.IsScalar()) bytes_ += node.Scalar().size();
    if (bytes_ > kMaxExpandedBytes) {
      return doc_.Error(pointer, "the document holds more than " +
                                     std::to_string(kMaxExpandedBytes >> 20) +
                                     " MiB of text once its aliases are expanded (an alias "
                                     "repeats everything its anchor names)");
    }
    switch (node.Type()) {
      case YAML::NodeType::Undefined:
      case YAML::NodeType::Null:
        out = nullptr;
        return Status::Ok();
      case YAML::NodeType::Scalar:
        return Scalar(node, pointer, out);
      case YAML::NodeType::Sequence: {
        out = Json::array();
        size_t index = 0;
        for (const YAML::Node& item : node) {
          const std::string child = pointer + "/" + std::to_string(index++);
          bytes_ += child.size();  // its line entry
          const int item_line = item.Mark().line >= 0 ? item.Mark().line + 1 : line;
          doc_.lines[child] = item_line;
          Json value;
          RETURN_IF_ERROR(Convert(item, child, item_line, depth + 1, value));
          out.push_back(std::move(value));
        }
        return Status::Ok();
      }
      case YAML::NodeType::Map: {
        out = Json::object();
        for (auto it = node.begin(); it != node.end(); ++it) {
          const YAML::Node key = it->first;  // a copy: the iterator yields proxies
          const int key_line = key.Mark().line >= 0 ? key.Mark().line + 1 : line;
          if (!key.IsScalar()) {
            doc_.lines[pointer + "/?"] = key_line;
            return doc_.Error(pointer + "/?", "mapping keys must be plain strings");
          }
          const std::string& name = key.Scalar();
          bytes_ += name.size() + pointer.size();  // the key, and its line entry's pointer
          if (!IsValidUtf8(name)) {
            doc_.lines[pointer + "/?"] = key_line;
            return doc_.Error(pointer + "/?", "a mapping key is not valid UTF-8");
          }
          const std::string child = pointer + "/" + JsonPointerToken(name);
          doc_.lines[child] = key_line;
          if (name == "<<" && key.Tag() == "?") {
            return doc_.Error(child,
                              "YAML merge keys (<<) are not supported: write the keys out, or "
                              "alias a whole value (retry: *defaults)");
          }
          if (out.contains(name)) return doc_.Error(child, "duplicate key '" + name + "'");
          Json value;
          RETURN_IF_ERROR(Convert(YAML::Node(it->second), child, key_line, depth + 1, value));
          out[name] = std::move(value);
        }
        return Status::Ok();
      }
    }
    return doc_.Error(pointer, "unsupported YAML node");
  }

 private:
  Status Scalar(const YAML::Node& node, const std::string& pointer, Json& out) {
    const std::string& text = node.Scalar();
    // YAML streams are Unicode, and the rest of idem (JSON Schema checks
    // among them) may assume valid UTF-8 in strings.
    if (!IsValidUtf8(text)) return doc_.Error(pointer, "the value is not valid UTF-8");
    const std::string& tag = node.Tag();
    if (tag == "!" || tag == kTagStr) {
      out = text;  // quoted, block or explicitly a string
      return Status::Ok();
    }
    if (tag == kTagNull) {
      out = nullptr;
      return Status::Ok();
    }
    if (tag == kTagBool) {
      auto b = ParseBool(text);
      if (!b) return doc_.Error(pointer, "'" + text + "' is not a boolean");
      out = *b;
      return Status::Ok();
    }
    if (tag == kTagInt) {
      auto i = ParseInt(text);
      if (!i) return doc_.Error(pointer, "'" + text + "' is not an integer");
      out = std::move(*i);
      return Status::Ok();
    }
    bool out_of_range = false;
    if (tag == kTagFloat) {
      auto f = ParseFloat(text, &out_of_range);
      if (!f) return doc_.Error(pointer, "'" + text + "' is not a finite number");
      out = *f;
      return Status::Ok();
    }
    if (tag != "?" && !tag.empty()) {
      return doc_.Error(pointer, "unsupported tag " + tag);
    }
    // A plain scalar: resolve it as the YAML 1.2 core schema does.
    if (IsNullWord(text)) {
      out = nullptr;
    } else if (auto b = ParseBool(text)) {
      out = *b;
    } else if (auto i = ParseInt(text)) {
      out = std::move(*i);
    } else if (auto f = ParseFloat(text, &out_of_range)) {
      out = *f;
    } else if (IsInfOrNan(text)) {
      return doc_.Error(pointer, "'" + text + "' cannot be represented in JSON; quote it");
    } else if (out_of_range) {
      // Read as text it would fail as "not a string" somewhere else.
      return doc_.Error(pointer, "'" + text +
                                     "' is a number out of a double's range (about 1.8e308, "
                                     "or below 4.9e-324); quote it to mean text");
    } else {
      out = text;
    }
    return Status::Ok();
  }

  YamlDocument& doc_;
  size_t values_ = 0;
  size_t bytes_ = 0;  // text expanded so far (kMaxExpandedBytes)
};

}  // namespace

int YamlDocument::LineOf(std::string_view pointer) const {
  std::string p(pointer);
  while (true) {
    auto it = lines.find(p);
    if (it != lines.end()) return it->second;
    if (p.empty()) return 0;
    p.resize(p.rfind('/'));
  }
}

Status YamlDocument::Error(std::string_view pointer, std::string_view reason) const {
  std::string message = source;
  if (int line = LineOf(pointer); line > 0) message += ":" + std::to_string(line);
  message += ": ";
  message += pointer.empty() ? std::string_view("(root)") : pointer;
  message += ": ";
  message += reason;
  return InvalidArgument(std::move(message), std::string(pointer));
}

Status YamlDocument::Check(const JsonSchema& schema) const {
  std::vector<SchemaError> errors = schema.Errors(value);
  if (errors.empty()) return Status::Ok();
  // Schema order follows the schema's key order; people read files top down.
  std::stable_sort(errors.begin(), errors.end(),
                   [this](const SchemaError& a, const SchemaError& b) {
                     return LineOf(a.pointer) < LineOf(b.pointer);
                   });
  std::string message;
  for (size_t i = 0; i < errors.size() && i < kMaxErrorsListed; ++i) {
    if (i > 0) message += "\n";
    message += Error(errors[i].pointer, errors[i].message).message();
  }
  if (errors.size() > kMaxErrorsListed) {
    message += "\n(and " + std::to_string(errors.size() - kMaxErrorsListed) + " more)";
  }
  return InvalidArgument(std::move(message), errors.front().pointer);
}

// The 1-based line where a second document's content begins, or 0: the
// first line with content after a document marker (`---` or `...` at the
// start of a line, then a blank or the end) that follows content. Blank
// and comment lines are not content; a `---` before any content opens the
// first document.
static int SecondDocumentLine(std::string_view text) {
  bool content = false, ended = false;
  int line = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view l = text.substr(pos, eol - pos);
    ++line;
    const bool marker = (l.substr(0, 3) == "---" || l.substr(0, 3) == "...") &&
                        (l.size() == 3 || l[3] == ' ' || l[3] == '\t' || l[3] == '\r');
    std::string_view rest = marker ? l.substr(3) : l;
    const size_t first = rest.find_first_not_of(" \t\r");
    const bool has = first != std::string_view::npos && rest[first] != '#';
    if (marker && content) ended = true;
    if (has) {
      if (ended) return line;
      content = true;
    }
    if (eol == text.size()) break;
    pos = eol + 1;
  }
  return 0;
}

namespace {

// Whether line `line` (0-based) or the one before it has a tab in its
// indentation: the most common YAML mistake, which yaml-cpp reports as
// "illegal map value" or the like.
bool TabIndentedNear(std::string_view text, int line) {
  int n = 0;
  for (size_t pos = 0; pos <= text.size(); ++n) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    if (n == line - 1 || n == line) {
      std::string_view l = text.substr(pos, eol - pos);
      const size_t indent = l.find_first_not_of(" \t");
      if (l.substr(0, indent).find('\t') != std::string_view::npos) return true;
    }
    if (n >= line) break;
    pos = eol + 1;
  }
  return false;
}

}  // namespace

StatusOr<YamlDocument> ParseYaml(std::string_view text, std::string source) {
  YamlDocument doc;
  doc.source = std::move(source);
  if (text.size() > kMaxBytes) {
    return InvalidArgument(doc.source + ": " + std::to_string(text.size()) +
                           " bytes; a config file may hold at most " + std::to_string(kMaxBytes) +
                           " (4 MiB)");
  }
  try {
    // A file is one document: settings after a `---` (files joined with
    // cat, a template's output) would otherwise be dropped without a word,
    // auth tokens among them. Found by their markers (`---` or `...` at
    // the start of a line) rather than by parsing every document, which
    // lets a file of many tiny documents take any amount of memory.
    if (int line = SecondDocumentLine(text); line > 0) {
      return InvalidArgument(doc.source + ":" + std::to_string(line) +
                             ": a second YAML document (after `---`); idem reads one document a "
                             "file, so merge them into one");
    }
    YAML::Node root = YAML::Load(std::string(text));
    doc.lines[""] = root.Mark().line >= 0 ? root.Mark().line + 1 : 1;
    RETURN_IF_ERROR(Converter(doc).Convert(root, "", doc.lines[""], 0, doc.value));
  } catch (const YAML::Exception& e) {
    std::string message = doc.source;
    if (e.mark.line >= 0) message += ":" + std::to_string(e.mark.line + 1);
    message += ": yaml syntax error: " + e.msg;
    if (e.mark.line >= 0 && TabIndentedNear(text, e.mark.line)) {
      message += " (a tab indents a line here: YAML indents with spaces only)";
    }
    return InvalidArgument(std::move(message));
  } catch (const std::exception& e) {
    return InvalidArgument(doc.source + ": cannot parse: " + e.what());
  }
  return doc;
}

StatusOr<YamlDocument> ReadYamlFile(const std::string& path, std::string display_name) {
  if (display_name.empty()) display_name = path;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::string why = std::strerror(errno);
    // `idem serve` run from another folder than the checkout's root looks
    // for its default config/idem.yaml there: say where it looked.
    std::error_code ec;
    const std::filesystem::path here = std::filesystem::current_path(ec);
    if (!path.empty() && path.front() != '/' && !ec) {
      why += " (relative to the current folder, " + here.string() + ")";
    }
    return InvalidArgument(display_name + ": cannot read: " + why);
  }
  // A folder opens as a stream that reads nothing: it would load as an
  // empty document, all defaults, and a daemon with no steps would start.
  std::error_code folder_ec;
  if (std::filesystem::is_directory(path, folder_ec)) {
    return InvalidArgument(display_name +
                           ": is a folder, not a file (give the config file in it, " + "e.g. " +
                           (std::filesystem::path(path) / "idem.yaml").string() + ")");
  }
  if (const auto size = std::filesystem::file_size(path, folder_ec);
      !folder_ec && size > kMaxBytes) {
    return InvalidArgument(display_name + ": " + std::to_string(size) +
                           " bytes; a config file may hold at most " + std::to_string(kMaxBytes) +
                           " (4 MiB)");
  }
  // The size above is the file's word for it: /dev/zero, a pipe or a /proc
  // file say 0 and read without end, so the read itself stops at the limit.
  ASSIGN_OR_RETURN(std::string text, ReadFileAtMost(path, kMaxBytes, display_name));
  return ParseYaml(text, std::move(display_name));
}

}  // namespace idem
