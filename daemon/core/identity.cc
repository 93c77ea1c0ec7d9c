#include "daemon/core/identity.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <exception>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "daemon/core/crypto.h"
#include "daemon/core/json.h"

namespace idem {
namespace {

// ECMAScript's WhiteSpace and LineTerminator set (what String.prototype.trim
// strips), in UTF-8. Text written by people or models often carries
// no-break or ideographic spaces that ASCII-only trimming would keep.
constexpr std::array<std::string_view, 25> kWhiteSpace = {
    "\t",           "\n",           "\v",           "\f",           "\r",           " ",
    "\xC2\xA0",     "\xE1\x9A\x80", "\xE2\x80\x80", "\xE2\x80\x81", "\xE2\x80\x82", "\xE2\x80\x83",
    "\xE2\x80\x84", "\xE2\x80\x85", "\xE2\x80\x86", "\xE2\x80\x87", "\xE2\x80\x88", "\xE2\x80\x89",
    "\xE2\x80\x8A", "\xE2\x80\xA8", "\xE2\x80\xA9", "\xE2\x80\xAF", "\xE2\x81\x9F", "\xE3\x80\x80",
    "\xEF\xBB\xBF",
};

std::string TrimWhiteSpace(std::string_view s) {
  bool changed = true;
  while (changed && !s.empty()) {
    changed = false;
    for (std::string_view ws : kWhiteSpace) {
      if (s.starts_with(ws)) {
        s.remove_prefix(ws.size());
        changed = true;
      }
      if (s.ends_with(ws)) {
        s.remove_suffix(ws.size());
        changed = true;
      }
    }
  }
  return std::string(s);
}

std::string AsciiLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

bool IsValidScheme(std::string_view scheme) {
  if (scheme.empty() || !IsAlpha(scheme[0])) return false;
  return std::all_of(scheme.begin(), scheme.end(), [](char c) {
    return IsAlpha(c) || IsDigit(c) || c == '+' || c == '-' || c == '.';
  });
}

// RFC 3986 reg-name characters, plus any non-ASCII byte so that
// internationalized host names written in UTF-8 pass through untouched.
bool IsValidRegName(std::string_view host) {
  static constexpr std::string_view kAllowed = "-._~%!$&'()*+,;=";
  return !host.empty() && std::all_of(host.begin(), host.end(), [](char c) {
    return IsAlpha(c) || IsDigit(c) || static_cast<unsigned char>(c) >= 0x80 ||
           kAllowed.find(c) != std::string_view::npos;
  });
}

bool IsTrackingParameter(std::string_view name) {
  static constexpr std::array<std::string_view, 9> kNames = {
      "gclid", "fbclid", "dclid", "msclkid", "mc_cid", "mc_eid", "_ga", "yclid", "igshid"};
  return name.starts_with("utm_") || std::find(kNames.begin(), kNames.end(), name) != kNames.end();
}

// The URL itself stays out of the message: it may carry credentials, and
// field() already says where it is.
Status NotAUrl(std::string_view why) { return InvalidArgument("not a URL: " + std::string(why)); }

// Walks the input once, so every pointer (drop and url_fields alike) refers
// to the input as the caller sent it, even after array elements are dropped.
class InputNormalizer {
 public:
  explicit InputNormalizer(const Normalizers& n) : trim_(n.trim_strings) {
    for (const std::string& d : n.drop) {
      // A pointer starts with '/'; anything else is a member name.
      (d.starts_with('/') ? drop_pointers_ : drop_names_).insert(d);
    }
    url_pointers_.insert(n.url_fields.begin(), n.url_fields.end());
  }

  StatusOr<Json> Normalize(const Json& value) {
    switch (value.type()) {
      case Json::value_t::object: {
        Json out = Json::object();
        for (auto it = value.begin(); it != value.end(); ++it) {
          if (drop_names_.contains(it.key())) continue;
          const size_t mark = path_.size();
          path_ += '/';
          path_ += JsonPointerToken(it.key());
          if (!drop_pointers_.contains(path_)) {
            StatusOr<Json> child = Normalize(it.value());
            if (!child.ok()) return child.status();
            out[it.key()] = std::move(child).value();
          }
          path_.resize(mark);
        }
        return out;
      }
      case Json::value_t::array: {
        Json out = Json::array();
        for (size_t i = 0; i < value.size(); ++i) {
          const size_t mark = path_.size();
          path_ += '/';
          path_ += std::to_string(i);
          if (!drop_pointers_.contains(path_)) {
            StatusOr<Json> child = Normalize(value[i]);
            if (!child.ok()) return child.status();
            out.push_back(std::move(child).value());
          }
          path_.resize(mark);
        }
        return out;
      }
      case Json::value_t::string: {
        const std::string& s = value.get_ref<const std::string&>();
        std::string text = trim_ ? TrimWhiteSpace(s) : s;
        if (url_pointers_.contains(path_)) {
          StatusOr<std::string> url = NormalizeUrl(text);
          if (!url.ok()) return url.status().WithField(path_);
          text = std::move(url).value();
        }
        return Json(std::move(text));
      }
      default:
        if (url_pointers_.contains(path_)) {
          return InvalidArgument(
              "a URL field must be a string, not " + std::string(value.type_name()), path_);
        }
        return value;
    }
  }

 private:
  const bool trim_;
  std::set<std::string, std::less<>> drop_names_;
  std::set<std::string, std::less<>> drop_pointers_;
  std::set<std::string, std::less<>> url_pointers_;
  std::string path_;
};

// Canonical form of `value`; a failure's field() is prefixed with `where`
// so it points into the whole key material.
StatusOr<std::string> CanonicalAt(const Json& value, const std::string& where) {
  StatusOr<std::string> c = CanonicalJson(value);
  if (!c.ok()) return c.status().WithField(where + c.status().field());
  return c;
}

// Walks `value` depth first; `path` is the pointer of `value`.
Status CheckExactIntegersAt(const Json& value, std::string& path) {
  // 2^53: the first integer from which two integers share one double.
  constexpr uint64_t kLimit = uint64_t{1} << 53;
  switch (value.type()) {
    case Json::value_t::number_unsigned:
      if (value.get<Json::number_unsigned_t>() >= kLimit) break;
      return Status::Ok();
    case Json::value_t::number_integer: {
      const int64_t n = value.get<Json::number_integer_t>();
      const uint64_t magnitude = n < 0 ? uint64_t{0} - static_cast<uint64_t>(n) : uint64_t(n);
      if (magnitude >= kLimit) break;
      return Status::Ok();
    }
    case Json::value_t::number_float: {
      // Every double of magnitude 2^53 or more is an integer, and no longer
      // one apart from the next: 10000000000000000000001 (past 64 bits, it
      // arrives as a double), 1e22 and 1.00000000000000001e22 are one
      // double, one key. Below 1e21 JCS writes it without an exponent, so
      // 1e16 would also come back from the stored material as an integer
      // that an import then refuses. Smaller doubles keep their fraction.
      const double d = std::fabs(value.get<Json::number_float_t>());
      if (std::isfinite(d) && d >= static_cast<double>(kLimit)) break;
      return Status::Ok();
    }
    case Json::value_t::object:
      for (auto it = value.begin(); it != value.end(); ++it) {
        const size_t mark = path.size();
        path += '/';
        path += JsonPointerToken(it.key());
        RETURN_IF_ERROR(CheckExactIntegersAt(it.value(), path));
        path.resize(mark);
      }
      return Status::Ok();
    case Json::value_t::array:
      for (size_t i = 0; i < value.size(); ++i) {
        const size_t mark = path.size();
        path += '/';
        path += std::to_string(i);
        RETURN_IF_ERROR(CheckExactIntegersAt(value[i], path));
        path.resize(mark);
      }
      return Status::Ok();
    default:
      return Status::Ok();
  }
  return InvalidArgument(
      "a number of magnitude 2^53 or more cannot be told apart from its neighbours once "
      "canonicalized (JCS numbers are doubles); send it as a string",
      path);
}

}  // namespace

Status CheckExactIntegers(const Json& value, const std::string& where) {
  std::string path = where;
  return CheckExactIntegersAt(value, path);
}

StatusOr<std::string> ComputePromptHash(std::string_view template_text, std::string_view system,
                                        const Json& tools) {
  try {
    Json parts = {{"system", std::string(system)},
                  {"template", std::string(template_text)},
                  {"tools", tools}};
    ASSIGN_OR_RETURN(std::string canonical, CanonicalJson(parts));
    return Sha256Hex(canonical);
  } catch (const std::exception& e) {
    return Internal(std::string("computing prompt hash: ") + e.what());
  }
}

StatusOr<Json> NormalizeInput(const Json& input, const Normalizers& normalizers) {
  try {
    InputNormalizer normalizer(normalizers);
    return normalizer.Normalize(input);
  } catch (const std::exception& e) {
    return Internal(std::string("normalizing input: ") + e.what());
  }
}

StatusOr<std::string> NormalizeUrl(std::string_view url) {
  for (char c : url) {
    const auto b = static_cast<unsigned char>(c);
    if (b <= 0x20 || b == 0x7F) return NotAUrl("white space or control character");
  }
  const size_t sep = url.find("://");
  if (sep == std::string_view::npos) return NotAUrl("no scheme://host");
  const std::string_view scheme_text = url.substr(0, sep);
  if (!IsValidScheme(scheme_text)) return NotAUrl("bad scheme");
  const std::string scheme = AsciiLower(scheme_text);

  std::string_view rest = url.substr(sep + 3);
  if (size_t hash = rest.find('#'); hash != std::string_view::npos) rest = rest.substr(0, hash);
  const size_t authority_end = rest.find_first_of("/?");
  std::string_view authority = rest.substr(0, authority_end);
  rest = authority_end == std::string_view::npos ? std::string_view() : rest.substr(authority_end);

  std::string_view userinfo;
  if (size_t at = authority.rfind('@'); at != std::string_view::npos) {
    userinfo = authority.substr(0, at);
    authority.remove_prefix(at + 1);
  }
  std::string_view host;
  std::string_view port;
  bool has_port = false;
  if (authority.starts_with('[')) {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return NotAUrl("unterminated IPv6 literal");
    host = authority.substr(0, close + 1);
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return NotAUrl("junk after IPv6 literal");
      has_port = true;
      port = after.substr(1);
    }
    if (host.size() <= 2) return NotAUrl("empty host");
  } else {
    const size_t colon = authority.find(':');
    host = authority.substr(0, colon);
    if (colon != std::string_view::npos) {
      has_port = true;
      port = authority.substr(colon + 1);
    }
    if (host.empty()) return NotAUrl("empty host");
    if (!IsValidRegName(host)) return NotAUrl("bad host");
  }

  std::string out = scheme + "://";
  if (!userinfo.empty()) {
    out += userinfo;
    out += '@';
  }
  out += AsciiLower(host);
  // An empty port (`host:`) means the default one, as in WHATWG URL.
  if (has_port && !port.empty()) {
    unsigned number = 0;
    const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), number);
    if (ec != std::errc() || end != port.data() + port.size() || number > 65535) {
      return NotAUrl("bad port");
    }
    const bool is_default =
        (scheme == "http" && number == 80) || (scheme == "https" && number == 443);
    if (!is_default) out += ":" + std::to_string(number);
  }

  const size_t query_start = rest.find('?');
  const std::string_view path = rest.substr(0, query_start);
  out += path.empty() ? std::string_view("/") : path;

  if (query_start != std::string_view::npos) {
    struct Param {
      std::string_view name;
      std::string_view text;  // name[=value], as written
    };
    std::vector<Param> params;
    std::string_view query = rest.substr(query_start + 1);
    while (!query.empty()) {
      const size_t amp = query.find('&');
      const std::string_view text = query.substr(0, amp);
      query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
      if (text.empty()) continue;
      const std::string_view name = text.substr(0, text.find('='));
      if (IsTrackingParameter(name)) continue;
      params.push_back({name, text});
    }
    // Comparing the whole text after the name orders equal names by value.
    std::stable_sort(params.begin(), params.end(), [](const Param& a, const Param& b) {
      if (a.name != b.name) return a.name < b.name;
      return a.text < b.text;
    });
    for (size_t i = 0; i < params.size(); ++i) {
      out += i == 0 ? '?' : '&';
      out += params[i].text;
    }
  }
  return out;
}

StatusOr<DecisionKeyer> DecisionKeyer::Create(const DecisionKeyParts& parts) {
  try {
    std::string tools_hash = parts.tools_hash;
    if (tools_hash.empty()) {
      StatusOr<std::string> tools = CanonicalAt(parts.tools, "/tools");
      if (!tools.ok()) return tools.status();
      tools_hash = Sha256Hex(*tools);
    }
    std::string schema_hash = parts.schema_hash;
    if (schema_hash.empty()) {
      StatusOr<std::string> schema = CanonicalAt(parts.output_schema, "/output_schema");
      if (!schema.ok()) return schema.status();
      schema_hash = Sha256Hex(*schema);
    }
    Json material = {
        {"v", kDecisionKeyVersion},
        {"step", parts.step},
        {"provider", parts.provider},
        {"model", parts.model},
        {"prompt_version", parts.prompt_version},
        {"prompt_hash", parts.prompt_hash},
        {"temperature", parts.temperature ? Json(*parts.temperature) : Json(nullptr)},
        {"tools_hash", tools_hash},
        {"schema_hash", schema_hash},
        {"input", nullptr},
    };
    StatusOr<std::string> canonical = CanonicalAt(material, "");
    if (!canonical.ok()) return canonical.status();
    static constexpr std::string_view kHead = "{\"input\":null";
    if (!std::string_view(*canonical).starts_with(kHead)) {
      return Internal("decision key material does not start with its input");
    }
    DecisionKeyer keyer;
    keyer.suffix_ = canonical->substr(kHead.size());
    return keyer;
  } catch (const std::exception& e) {
    return Internal(std::string("computing decision key: ") + e.what());
  }
}

StatusOr<KeyMaterial> DecisionKeyer::Key(const Json& normalized_input) const {
  RETURN_IF_ERROR(CheckExactIntegers(normalized_input, "/input"));
  StatusOr<std::string> input = CanonicalAt(normalized_input, "/input");
  if (!input.ok()) return input.status();
  std::string canonical;
  canonical.reserve(10 + input->size() + suffix_.size());
  canonical.append("{\"input\":").append(*input).append(suffix_);
  std::string key = Sha256Hex(canonical);
  return KeyMaterial{std::move(key), std::move(canonical)};
}

StatusOr<KeyMaterial> ComputeDecisionKey(const DecisionKeyParts& parts) {
  ASSIGN_OR_RETURN(DecisionKeyer keyer, DecisionKeyer::Create(parts));
  return keyer.Key(parts.input);
}

StatusOr<KeyMaterial> DecisionKeyOfMaterial(const Json& material) {
  if (!material.is_object()) return InvalidArgument("key material must be an object", "/material");
  auto it = material.find("v");
  if (it == material.end() || !it->is_number_integer() ||
      it->get<int64_t>() != kDecisionKeyVersion) {
    return InvalidArgument("key material is not version " + std::to_string(kDecisionKeyVersion),
                           "/material/v");
  }
  DecisionKeyParts parts;
  for (const char* name : {"step", "provider", "model", "prompt_version", "prompt_hash",
                           "tools_hash", "schema_hash"}) {
    auto m = material.find(name);
    if (m == material.end() || !m->is_string()) {
      return InvalidArgument(std::string("key material needs a string ") + name,
                             std::string("/material/") + name);
    }
  }
  parts.step = material["step"].get<std::string>();
  parts.provider = material["provider"].get<std::string>();
  parts.model = material["model"].get<std::string>();
  parts.prompt_version = material["prompt_version"].get<std::string>();
  parts.prompt_hash = material["prompt_hash"].get<std::string>();
  parts.tools_hash = material["tools_hash"].get<std::string>();
  parts.schema_hash = material["schema_hash"].get<std::string>();
  if (parts.tools_hash.empty() || parts.schema_hash.empty()) {
    return InvalidArgument("key material has an empty hash", "/material");
  }
  auto t = material.find("temperature");
  if (t == material.end() || !(t->is_null() || t->is_number())) {
    return InvalidArgument("key material needs a temperature (a number or null)",
                           "/material/temperature");
  }
  if (t->is_number()) parts.temperature = t->get<double>();
  auto in = material.find("input");
  if (in == material.end())
    return InvalidArgument("key material needs an input", "/material/input");
  parts.input = *in;
  StatusOr<KeyMaterial> key = ComputeDecisionKey(parts);
  if (!key.ok()) {
    Status s = key.status();
    return s.WithField("/material" + s.field());
  }
  // Members the computation does not read must not ride along unchecked.
  StatusOr<std::string> canonical = CanonicalAt(material, "/material");
  if (!canonical.ok()) return canonical.status();
  if (*canonical != key->canonical) {
    return InvalidArgument("key material has members that are not part of the decision key",
                           "/material");
  }
  return key;
}

StatusOr<KeyMaterial> ComputeWorkId(std::string_view kind, std::string_view version,
                                    const Json& identity) {
  // With ':' as the separator, a ':' inside kind or version would let two
  // different (kind, version) pairs hash the same bytes.
  if (kind.empty() || kind.find(':') != std::string_view::npos) {
    return InvalidArgument("action kind must be non-empty and contain no ':'");
  }
  if (version.empty() || version.find(':') != std::string_view::npos) {
    return InvalidArgument("action version must be non-empty and contain no ':'");
  }
  RETURN_IF_ERROR(CheckExactIntegers(identity, ""));
  try {
    StatusOr<std::string> identity_json = CanonicalAt(identity, "");
    if (!identity_json.ok()) return identity_json.status();
    std::string canonical = std::string(kind) + ":" + std::string(version) + ":" + *identity_json;
    std::string key = Sha256Hex(canonical);
    return KeyMaterial{std::move(key), std::move(canonical)};
  } catch (const std::exception& e) {
    return Internal(std::string("computing work id: ") + e.what());
  }
}

}  // namespace idem
