// `idem decisions export|import` and `idem cost` (cli.h).
#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "daemon/cli/cli.h"
#include "daemon/core/file_read.h"
#include "daemon/core/http_client.h"

namespace idem::cli {
namespace {

void Write(std::FILE* f, const std::string& text) { std::fwrite(text.data(), 1, text.size(), f); }

int Unreachable(const Output& o, const Status& s) {
  Write(o.err, "idem: " + s.message() + "\n");
  return kExitUnreachable;
}

int Refused(const Output& o, const std::string& what, const ApiAnswer& a) {
  if (o.json && !a.body.is_null()) {
    Write(o.out, JsonText(a.body, 2) + "\n");
  } else {
    Write(o.err, "idem: " + what + ": " + DescribeProblem(a) + "\n");
  }
  return ExitCodeForHttp(a.status);
}

std::string Usd(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6f", v);
  return buf;
}

}  // namespace

StatusOr<ApiAnswer> DaemonClient::CallText(const std::string& method, const std::string& path,
                                           const std::string& body,
                                           const std::string& content_type) {
  HttpRequest req;
  req.method = method;
  req.url = url_ + path;
  req.connect_timeout_ms = 5'000;
  req.timeout_ms = 90'000;
  req.headers.emplace_back("Accept", "application/json");
  if (!token_.empty()) req.headers.emplace_back("Authorization", "Bearer " + token_);
  req.headers.emplace_back("Content-Type", content_type);
  req.body = body;
  return Exchange(req);
}

StatusOr<int64_t> ParseTimeArg(const std::string& arg, int64_t now_ms) {
  auto number = [](std::string_view s, int64_t* out) {
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
    return ec == std::errc() && end == s.data() + s.size() && *out >= 0;
  };
  int64_t n = 0;
  if (arg.empty()) return InvalidArgument("a time is empty");
  if (number(arg, &n)) return n;
  if (arg.size() == 10 && arg[4] == '-' && arg[7] == '-') {
    int64_t y = 0, m = 0, d = 0;
    if (number(std::string_view(arg).substr(0, 4), &y) &&
        number(std::string_view(arg).substr(5, 2), &m) &&
        number(std::string_view(arg).substr(8, 2), &d)) {
      using namespace std::chrono;
      const year_month_day ymd{year{static_cast<int>(y)}, month{static_cast<unsigned>(m)},
                               day{static_cast<unsigned>(d)}};
      if (ymd.ok()) {
        return duration_cast<milliseconds>(sys_days{ymd}.time_since_epoch()).count();
      }
    }
  } else if (arg.size() >= 2 && number(std::string_view(arg).substr(0, arg.size() - 1), &n)) {
    int64_t unit = 0;
    switch (arg.back()) {
      case 'm':
        unit = 60'000;
        break;
      case 'h':
        unit = 3'600'000;
        break;
      case 'd':
        unit = 86'400'000;
        break;
    }
    if (unit != 0 && n <= now_ms / unit) return now_ms - n * unit;
  }
  return InvalidArgument("'" + arg +
                         "' is not a time: milliseconds since the epoch, a date (2026-11-30) or "
                         "a duration back from now (90m, 24h, 7d)");
}

StatusOr<std::string> ReadImportFile(const std::string& path, size_t max_line_bytes) {
  const std::string name = path == "-" ? "stdin" : path;
  const int fd = path == "-" ? STDIN_FILENO : open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return InvalidArgument("cannot read " + name + ": " + std::strerror(errno));
  Status error;
  std::string text;
  if (IsFolder(fd)) error = InvalidArgument("cannot read " + name + ": it is a folder, not a file");
  size_t line_bytes = 0;  // of the line being read, so far
  size_t line_no = 1;
  Status read = !error.ok() ? Status::Ok() : ReadChunks(fd, [&](std::string_view chunk) {
    for (char c : chunk) {
      if (c == '\n') {
        line_bytes = 0;
        ++line_no;
      } else if (++line_bytes > max_line_bytes) {
        error =
            InvalidArgument(name + ": line " + std::to_string(line_no) + " is longer than " +
                            std::to_string(max_line_bytes) + " bytes, more than an import takes");
        return false;
      }
    }
    text.append(chunk);
    return true;
  });
  if (path != "-") close(fd);
  if (!read.ok()) return InvalidArgument("cannot read " + name + ": " + read.message());
  if (!error.ok()) return error;
  return text;
}

std::vector<std::string> SplitLines(const std::string& text, size_t max_bytes,
                                    std::vector<size_t>* first_lines, size_t max_lines) {
  std::vector<std::string> batches;
  first_lines->clear();
  std::string current;
  size_t line_no = 0, current_first = 1;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    const size_t end = nl == std::string::npos ? text.size() : nl + 1;
    std::string line = text.substr(pos, end - pos);
    if (line.back() != '\n') line += '\n';
    pos = end;
    ++line_no;
    if (!current.empty() &&
        (current.size() + line.size() > max_bytes || line_no - current_first >= max_lines)) {
      batches.push_back(std::move(current));
      first_lines->push_back(current_first);
      current.clear();
    }
    if (current.empty()) current_first = line_no;
    current += line;
  }
  if (!current.empty()) {
    batches.push_back(std::move(current));
    first_lines->push_back(current_first);
  }
  return batches;
}

std::string RenderCost(const Json& body, const Style& style) {
  const std::string by = body.value("by", "step");
  Table t({by == "step"    ? "STEP"
           : by == "model" ? "MODEL"
                           : "DAY",
           "CALLS", "IN TOKENS", "OUT TOKENS", "SPENT USD", "HITS", "SAVED USD"});
  auto row = [&](const std::string& name, const Json& c, Color color) {
    t.AddRow({Table::Cell(name, color), std::to_string(c.value("calls", int64_t{0})),
              std::to_string(c.value("input_tokens", int64_t{0})),
              std::to_string(c.value("output_tokens", int64_t{0})), Usd(c.value("spent_usd", 0.0)),
              std::to_string(c.value("hits", int64_t{0})),
              Table::Cell(Usd(c.value("saved_usd", 0.0)), Color::kGreen)});
  };
  for (const Json& item : body.value("items", Json::array())) {
    // A model name is whatever a replay's caller sent: Str makes it Printable.
    row(Str(item, by.c_str()), item, Color::kNone);
  }
  row("TOTAL", body.value("total", Json::object()), Color::kBold);
  return style.Paint(Str(body, "from_day") + " .. " + Str(body, "to_day") + " (UTC)", Color::kDim) +
         "\n" + t.Render(style);
}

int DecisionsExport(DaemonClient& api, const Output& o, std::FILE* sink, const std::string& step,
                    int64_t since_ms) {
  std::string cursor;
  size_t count = 0;
  do {
    // 200 a page: well under the client's 16 MiB answer limit even with full traces.
    std::string path = "/v1/decisions/export?limit=200";
    if (!step.empty()) path += "&step=" + PercentEncode(step);
    if (since_ms > 0) path += "&since=" + std::to_string(since_ms);
    if (!cursor.empty()) path += "&cursor=" + PercentEncode(cursor);
    StatusOr<ApiAnswer> a = api.Call("GET", path);
    if (!a.ok()) return Unreachable(o, a.status());
    if (a->status != 200) return Refused(o, "decisions export", *a);
    for (char c : a->text) count += c == '\n';
    // The same JSON, with C1 controls (a terminal's CSI) escaped: an export
    // printed to a terminal cannot drive it.
    Write(sink, WithC1Escaped(a->text));
    cursor.clear();
    for (const auto& [name, value] : a->headers) {
      if (name == "idem-next-cursor") cursor = value;
    }
  } while (!cursor.empty());
  std::fflush(sink);
  Write(o.err, "idem: exported " + std::to_string(count) + " decisions\n");
  return kExitOk;
}

namespace {

// "imported 3, exists 0, expired 0, refused 0"
std::string ImportCounts(const Json& merged) {
  std::string out;
  for (const char* n : {"imported", "exists", "expired", "refused"}) {
    if (!out.empty()) out += ", ";
    out += std::string(n) + " " + std::to_string(merged.value(n, int64_t{0}));
  }
  return out;
}

}  // namespace

int DecisionsImport(DaemonClient& api, const Output& o, const std::string& text,
                    size_t max_request_bytes) {
  std::vector<size_t> first_lines;
  std::vector<std::string> batches = SplitLines(text, max_request_bytes, &first_lines);
  Json merged = {
      {"imported", 0}, {"exists", 0}, {"expired", 0}, {"refused", 0}, {"results", Json::array()}};
  for (size_t i = 0; i < batches.size(); ++i) {
    StatusOr<ApiAnswer> a =
        api.CallText("POST", "/v1/decisions/import", batches[i], "application/x-ndjson");
    if (!a.ok()) return Unreachable(o, a.status());
    if (a->status != 200 || !a->body.is_object()) {
      std::string landed;
      if (i > 0) {
        // The batches before it did land: say what became of them, so a
        // second run (which finds them as exists) is no surprise.
        landed = "; lines 1-" + std::to_string(first_lines[i] - 1) +
                 " were sent before it: " + ImportCounts(merged);
      }
      Write(o.err, "idem: the batch from line " + std::to_string(first_lines[i]) +
                       " was not imported" + landed + "\n");
      return Refused(o, "decisions import", *a);
    }
    for (const char* n : {"imported", "exists", "expired", "refused"}) {
      merged[n] = merged[n].get<int64_t>() + a->body.value(n, int64_t{0});
    }
    for (Json r : a->body.value("results", Json::array())) {
      r["line"] = r.value("line", int64_t{0}) + static_cast<int64_t>(first_lines[i]) - 1;
      merged["results"].push_back(std::move(r));
    }
  }
  const bool refused = merged["refused"].get<int64_t>() > 0;
  if (o.json) {
    Write(o.out, JsonText(merged, 2) + "\n");
    return refused ? kExitUsage : kExitOk;
  }
  if (refused) {
    Table t({"LINE", "DECISION", "REASON", "FIELD"});
    t.SetMaxWidth(2, 80);
    for (const Json& r : merged["results"]) {
      if (r.value("verdict", "") != "refused") continue;
      t.AddRow({std::to_string(r.value("line", int64_t{0})), r.value("decision_id", ""),
                Table::Cell(r.value("reason", ""), Color::kRed), r.value("field", "")});
    }
    Write(o.out, t.Render(o.style));
  }
  // A decision whose key holds another one here was not stored: say which
  // (an older decision of a key refreshed since, in an export of both).
  Table kept({"LINE", "DECISION NOT STORED", "THE KEY KEEPS"});
  size_t not_stored = 0;
  for (const Json& r : merged["results"]) {
    const std::string cached = r.value("cached_decision_id", "");
    if (r.value("verdict", "") != "exists" || cached.empty()) continue;
    if (++not_stored <= 20) {
      kept.AddRow(
          {std::to_string(r.value("line", int64_t{0})), r.value("decision_id", ""), cached});
    }
  }
  if (not_stored > 0) {
    Write(o.out, kept.Render(o.style));
    if (not_stored > 20) {
      Write(o.out, "(and " + std::to_string(not_stored - 20) + " more; --json lists them all)\n");
    }
  }
  Write(o.out, ImportCounts(merged) + "\n");
  return refused ? kExitUsage : kExitOk;
}

int Cost(DaemonClient& api, const Output& o, const std::string& by, const std::string& since,
         const std::string& until) {
  std::string path = "/v1/stats/cost?by=" + PercentEncode(by);
  for (const auto& [name, arg] : {std::pair<std::string, std::string>{"since", since},
                                  std::pair<std::string, std::string>{"until", until}}) {
    if (arg.empty()) continue;
    StatusOr<int64_t> ms = ParseTimeArg(arg, o.now_ms);
    if (!ms.ok()) {
      Write(o.err, "idem: --" + name + ": " + ms.status().message() + "\n");
      return kExitUsage;
    }
    path += "&" + name + "=" + std::to_string(*ms);
  }
  StatusOr<ApiAnswer> a = api.Call("GET", path);
  if (!a.ok()) return Unreachable(o, a.status());
  if (a->status != 200) return Refused(o, "cost", *a);
  if (o.json) {
    Write(o.out, JsonText(a->body, 2) + "\n");
  } else {
    Write(o.out, RenderCost(a->body, o.style));
  }
  return kExitOk;
}

}  // namespace idem::cli
