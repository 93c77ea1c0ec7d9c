// `idem replay`: one decision's replay diff, and bulk replay jobs (cli.h).
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <string>
#include <thread>

#include "daemon/cli/cli.h"
#include "daemon/core/crypto.h"
#include "daemon/core/http_client.h"

namespace idem::cli {
namespace {

double Num(const Json& j, const char* key) {
  if (!j.is_object()) return 0;
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return 0;
  return it->get<double>();
}

const Json& Member(const Json& j, const char* key) {
  static const Json* null = new Json();
  if (!j.is_object()) return *null;
  auto it = j.find(key);
  return it == j.end() ? *null : *it;
}

std::string Compact(const Json& j, size_t max = 120) { return Truncate(JsonText(j), max); }

// "from → to" of a changed value, each cut to `max`; when the cut would
// show two equal texts (a long reply whose end changed), both are shown
// from a little before their first difference instead.
std::string ChangedPair(const Json& from, const Json& to, size_t max = 120) {
  const std::string a = JsonText(from), b = JsonText(to);
  std::string left = Truncate(a, max), right = Truncate(b, max);
  if (left == right && a != b) {
    size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    size_t start = i > 40 ? i - 40 : 0;
    // Not inside a UTF-8 sequence (both texts are the same up to i).
    while (start > 0 && (static_cast<unsigned char>(a[start]) & 0xC0) == 0x80) --start;
    const std::string lead = start > 0 ? "…" : "";
    left = lead + Truncate(a.substr(start), max);
    right = lead + Truncate(b.substr(start), max);
  }
  return left + " → " + right;
}

void Print(std::FILE* f, const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), f);
  std::fflush(f);
}

std::string Usd(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "$%.4f", v);
  return buf;
}

std::string Percent(int64_t part, int64_t whole) {
  if (whole <= 0) return "";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * static_cast<double>(part) / whole);
  return buf;
}

int ReportError(const Output& o, const std::string& what, const ApiAnswer& a) {
  if (o.json && !a.body.is_null()) {
    Print(o.out, JsonText(a.body, 2) + "\n");
  } else {
    Print(o.err, "idem: " + what + ": " + DescribeProblem(a) + "\n");
  }
  return ExitCodeForHttp(a.status);
}

int ReportUnreachable(const Output& o, const Status& s) {
  Print(o.err, "idem: " + s.message() + "\n");
  return kExitUnreachable;
}

// "provider/model prompt" of a decision summary.
std::string Setup(const Json& d) {
  std::string out = Str(d, "provider");
  if (!Str(d, "model").empty()) out += "/" + Str(d, "model");
  if (!Str(d, "prompt_version").empty()) out += " prompt " + Str(d, "prompt_version");
  return out;
}

}  // namespace

std::string RenderReplayDiff(const Json& answer, const Style& style) {
  const Json& original = Member(answer, "original");
  const Json& replayed = Member(answer, "replayed");
  std::string out = "replayed " + Str(original, "decision_id") + " (step " + Str(original, "step") +
                    "): " + Setup(original) + " → ";
  if (Str(replayed, "status") == "failed") {
    out += "no valid output\n";
    out += style.Paint("  the replay found no output that passes the schema and checks: ",
                       Color::kRed) +
           Str(replayed, "error") + "\n";
    return out;
  }
  out += Setup(replayed);
  out += ", cost " + Usd(Num(replayed, "cost_usd")) + "\n";
  const Json& diff = Member(answer, "diff");
  const Json& changed = Member(diff, "changed");
  const Json& added = Member(diff, "added");
  const Json& removed = Member(diff, "removed");
  const size_t n = (changed.is_array() ? changed.size() : 0) +
                   (added.is_array() ? added.size() : 0) +
                   (removed.is_array() ? removed.size() : 0);
  if (n == 0) return out + style.Paint("no change: the same output", Color::kGreen) + "\n";
  out += std::to_string(n) + (n == 1 ? " change:\n" : " changes:\n");
  // Document order within each kind: changed, then added, then removed.
  if (changed.is_array()) {
    for (const Json& c : changed) {
      out += style.Paint("  ~ " + Str(c, "pointer"), Color::kYellow) + ": " +
             ChangedPair(Member(c, "from"), Member(c, "to")) + "\n";
    }
  }
  if (added.is_array()) {
    for (const Json& a : added) {
      out += style.Paint("  + " + Str(a, "pointer"), Color::kGreen) + ": " +
             Compact(Member(a, "value")) + "\n";
    }
  }
  if (removed.is_array()) {
    for (const Json& r : removed) {
      out += style.Paint("  - " + Str(r, "pointer"), Color::kRed) + ": " +
             Compact(Member(r, "value")) + "\n";
    }
  }
  if (answer.value("promoted", false)) out += "promoted: now the cached decision\n";
  return out;
}

int ReplayDecision(DaemonClient& api, const Output& o, const std::string& decision_id,
                   const Json& body) {
  StatusOr<ApiAnswer> a =
      api.Call("POST", "/v1/decisions/" + PercentEncode(decision_id) + "/replay", body);
  if (!a.ok()) return ReportUnreachable(o, a.status());
  if (a->status != 200) return ReportError(o, "replay " + decision_id, *a);
  if (o.json) {
    Print(o.out, JsonText(a->body, 2) + "\n");
  } else {
    Print(o.out, RenderReplayDiff(a->body, o.style));
  }
  return kExitOk;
}

std::string ProgressBar(int64_t done, int64_t total, size_t width) {
  size_t filled = 0;
  if (total > 0) {
    const int64_t d = std::min(std::max<int64_t>(done, 0), total);
    filled = static_cast<size_t>(static_cast<double>(width) * d / total);
  }
  std::string bar = "[";
  for (size_t i = 0; i < width; ++i) bar += i < filled ? "#" : ".";
  bar += "] " + std::to_string(done) + "/" + std::to_string(total);
  if (total > 0) bar += " (" + Percent(done, total) + ")";
  return bar;
}

std::string RenderReplaySummary(const Json& job, const Style& style) {
  const std::string state = Str(job, "state");
  const int64_t total = Int(job, "total"), done = Int(job, "done");
  std::string setup;
  if (!Str(job, "prompt_version").empty()) setup += " prompt " + Str(job, "prompt_version");
  if (!Str(job, "provider").empty()) setup += " provider " + Str(job, "provider");
  if (!Str(job, "model").empty()) setup += " model " + Str(job, "model");
  if (job.contains("temperature")) setup += " temperature " + Str(job, "temperature");
  const int64_t started = Int(job, "started_at_ms"), finished = Int(job, "finished_at_ms");
  std::string took;
  if (finished >= started && finished > 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, " in %.1fs", static_cast<double>(finished - started) / 1000);
    took = buf;
  }
  std::string out = style.Paint("bulk replay " + Str(job, "replay_id"), Color::kBold) + " " +
                    style.Paint(state, state == "done"     ? Color::kGreen
                                       : state == "failed" ? Color::kRed
                                                           : Color::kCyan) +
                    ": step " + Str(job, "step") + (setup.empty() ? "" : "," + setup) + ", " +
                    std::to_string(done) + " of " + std::to_string(total) + " decisions" + took +
                    "\n";
  if (!Str(job, "error").empty()) {
    out += style.Paint("  error: " + Str(job, "error"), Color::kRed) + "\n";
  }
  const Json& tokens = Member(job, "tokens");
  const int64_t changed = Int(job, "changed"), failed = Int(job, "failed_validation_count"),
                errors = Int(job, "errors");
  Table counts({"OUTCOME", "DECISIONS", "SHARE"});
  counts.AddRow({{"changed", changed > 0 ? Color::kYellow : Color::kNone},
                 std::to_string(changed),
                 Percent(changed, done)});
  counts.AddRow(
      {"unchanged", std::to_string(Int(job, "unchanged")), Percent(Int(job, "unchanged"), done)});
  counts.AddRow({{"failed validation", failed > 0 ? Color::kRed : Color::kNone},
                 std::to_string(failed),
                 Percent(failed, done)});
  counts.AddRow({{"errors", errors > 0 ? Color::kRed : Color::kNone},
                 std::to_string(errors),
                 Percent(errors, done)});
  out += counts.Render(style);
  out += "cost " + Usd(Num(job, "cost_usd")) + " (the originals cost " +
         Usd(Num(job, "original_cost_usd")) + "), tokens " + std::to_string(Int(tokens, "input")) +
         " in / " + std::to_string(Int(tokens, "output")) + " out\n";

  const Json& top = Member(job, "top_changed_pointers");
  if (top.is_array() && !top.empty()) {
    Table t({"POINTER", "CHANGED IN"});
    t.SetMaxWidth(0, 80);
    for (const Json& p : top) t.AddRow({Str(p, "pointer"), std::to_string(Int(p, "count"))});
    out += "\n" + style.Paint("Pointers that changed most:", Color::kBold) + "\n" + t.Render(style);
  }
  const Json& ids = Member(job, "failed_validation");
  if (failed > 0 && ids.is_array()) {
    out += "\n" +
           style.Paint("Decisions that now fail validation (" + std::to_string(failed) + "):",
                       Color::kBold) +
           "\n";
    constexpr size_t kShown = 10;
    for (size_t i = 0; i < ids.size() && i < kShown; ++i) {
      out += "  " + ids[i].get<std::string>() + "\n";
    }
    if (static_cast<size_t>(failed) > kShown) {
      out += style.Paint("  … " + std::to_string(failed - static_cast<int64_t>(kShown)) +
                             " more (--json lists up to 1,000)",
                         Color::kDim) +
             "\n";
    }
  }
  const Json& samples = Member(job, "error_samples");
  if (errors > 0 && samples.is_array()) {
    out += "\n" + style.Paint("Errors (" + std::to_string(errors) + "):", Color::kBold) + "\n";
    for (const Json& e : samples) {
      out += "  " + Str(e, "decision_id") + ": " + Truncate(Str(e, "error"), 160) + "\n";
    }
  }
  return out;
}

int BulkReplay(DaemonClient& api, const Output& o, const Json& body, bool tty_progress,
               int64_t poll_ms) {
  // One key per invocation: a retried POST inside this run starts no second job.
  const std::string key = "\"cli-bulk-replay-" + RandomHex(8) + "\"";
  StatusOr<ApiAnswer> started = api.Call("POST", "/v1/replays", body, key);
  if (!started.ok()) return ReportUnreachable(o, started.status());
  if (started->status != 202) return ReportError(o, "replay --step", *started);
  const std::string id = Str(started->body, "replay_id");
  const bool progress = !o.json;
  if (progress && !tty_progress) Print(o.err, "bulk replay " + id + " started\n");
  int64_t last_done = -1;
  Json job;
  for (;;) {
    StatusOr<ApiAnswer> a = api.Call("GET", "/v1/replays/" + PercentEncode(id));
    if (!a.ok()) return ReportUnreachable(o, a.status());
    if (a->status != 200) return ReportError(o, "replay " + id, *a);
    job = std::move(a->body);
    const bool running = Str(job, "state") == "running";
    const int64_t done = Int(job, "done"), total = Int(job, "total");
    if (running && Str(job, "phase") == "selecting") {
      // Nothing to count yet.
    } else if (progress && tty_progress) {
      std::string line = "\r" + ProgressBar(done, total, 40) + "  changed " +
                         std::to_string(Int(job, "changed")) + ", failing " +
                         std::to_string(Int(job, "failed_validation_count")) + ", errors " +
                         std::to_string(Int(job, "errors")) + "\x1b[K";
      if (!running) line += "\n";
      Print(o.err, line);
    } else if (progress && done != last_done) {
      Print(o.err, "bulk replay " + id + ": " + std::to_string(done) + "/" + std::to_string(total) +
                       " done\n");
    }
    last_done = done;
    if (!running) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
  }
  if (o.json) {
    Print(o.out, JsonText(job, 2) + "\n");
  } else {
    Print(o.out, RenderReplaySummary(job, o.style));
  }
  return Str(job, "state") == "done" ? kExitOk : kExitFailed;
}

}  // namespace idem::cli
