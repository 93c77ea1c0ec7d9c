// The operator's client commands of `idem`: plans, approve, reject, audit
// verify, dlq ls, escalations (and the older dlq replay, work, decision,
// which print the daemon's JSON), talking to the
// daemon's HTTP API through the daemon's own libcurl HttpClient.
//
// Connection: the URL from --url or IDEM_URL (default
// http://127.0.0.1:7411); the bearer token from IDEM_TOKEN only, never a
// flag (flags show up in `ps`).
//
// Output: on a terminal, aligned tables (colour only when stdout is a tty
// and NO_COLOR is unset, table.h); with --json, the daemon's JSON (success
// or problem body) on stdout for scripts. Human-readable errors go to
// stderr.
//
// Exit codes (ExitCode) are the contract for scripts; README "CLI" lists
// them. Every command returns one; none throws.
//
// Thread-safety: none needed (one command per process).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "daemon/cli/table.h"
#include "daemon/core/http_client.h"
#include "daemon/core/status.h"
#include "daemon/store/store.h"
#include "daemon/store/store_copy.h"

namespace idem::cli {

enum ExitCode : int {
  kExitOk = 0,
  kExitUsage = 1,        // bad arguments, or a request the daemon refused as invalid (400/422)
  kExitUnreachable = 2,  // no answer, 429 or 502/503/504: the daemon is down or busy; retry
  kExitNotFound = 3,     // 404
  kExitConflict = 4,     // 409: e.g. the plan is not awaiting approval
  kExitForbidden = 5,    // 401/403: no or wrong token, a missing role, separation of duties
  kExitAuditBroken = 6,  // `audit verify`: the chain is broken
  kExitFailed = 7,       // any other error answer (500)
};

// The exit code for an HTTP status (2xx: kExitOk).
int ExitCodeForHttp(int status);

// A member of a daemon answer as display text: a string as Printable makes
// it, another value as JSON, "" when absent or null or `j` is no object.
std::string Str(const Json& j, const char* key);
// A numeric member as an integer, 0 when absent or not a number.
int64_t Int(const Json& j, const char* key);
// `j` as JSON text for a terminal or a pipe (--json): invalid UTF-8
// replaced, C1 controls escaped (WithC1Escaped); indent as Json::dump.
std::string JsonText(const Json& j, int indent = -1);

struct ApiAnswer {
  int status = 0;
  Json body;            // null when the body is not JSON
  std::string text;     // the raw body
  HttpHeaders headers;  // names lower-cased
};

class DaemonClient {
 public:
  // `http` must outlive the client. `token` empty: no Authorization header.
  DaemonClient(std::string url, std::string token, HttpClient& http);
  // One request; `body` null sends none. Unavailable when the daemon cannot
  // be reached (the message names the URL without its userinfo, never the
  // token).
  StatusOr<ApiAnswer> Call(const std::string& method, const std::string& path,
                           const Json& body = Json(), const std::string& idempotency_key = "");
  // The same with a body that is not JSON (`content_type` says what it is).
  StatusOr<ApiAnswer> CallText(const std::string& method, const std::string& path,
                               const std::string& body, const std::string& content_type);
  const std::string& url() const { return url_; }

 private:
  StatusOr<ApiAnswer> Exchange(const HttpRequest& req);

  std::string url_;
  std::string token_;
  HttpClient& http_;
};

// Where a command writes and how.
struct Output {
  std::FILE* out = stdout;
  std::FILE* err = stderr;
  bool json = false;
  Style style;  // colour for `out`
  int64_t now_ms = 0;
};

// "PATH=VALUE" -> {"path": PATH, "value": VALUE}: PATH a JSON pointer into
// the plan's actions ("/0/args/amount"), VALUE parsed as JSON, else taken
// as a string ("90" -> 90, "true" -> true, "bob@x" -> "bob@x", "" -> "").
// InvalidArgument when there is no '=' or PATH is not a JSON pointer.
StatusOr<Json> ParseEdit(const std::string& arg);

// The body of POST /v1/plans/{id}/approve.
Json ApproveBody(const std::vector<Json>& edits, const std::string& comment);

// Pure renderings (tested without a daemon).
std::string RenderPlanList(const Json& items, const Style& style, int64_t now_ms);
std::string RenderPlan(const Json& plan, const Style& style, int64_t now_ms);
// One line for a problem answer: "HTTP 409 Conflict: detail (state rejected)".
std::string DescribeProblem(const ApiAnswer& answer);

// `idem dlq ls`: one row per dead letter (work id whole, for `dlq replay`),
// newest as the daemon lists them.
std::string RenderDeadLetters(const Json& items, const Style& style, int64_t now_ms);

// `idem escalations`: one row per open escalation (id, step, age, the
// context's summary of why it could not be decided).
std::string RenderEscalations(const Json& items, const Style& style, int64_t now_ms);

// The commands; each returns an ExitCode.
// GET /v1/dead-letters?limit=N: the table above, or the daemon's JSON.
int DlqLs(DaemonClient& api, const Output& o, size_t limit);
// GET /v1/escalations?state=open&limit=N: the table above, or the JSON.
int EscalationsLs(DaemonClient& api, const Output& o, size_t limit);
int PlansLs(DaemonClient& api, const Output& o, const std::string& state, size_t limit);
int PlansShow(DaemonClient& api, const Output& o, const std::string& plan_id);
int Approve(DaemonClient& api, const Output& o, const std::string& plan_id,
            const std::vector<std::string>& edits, const std::string& comment);
int Reject(DaemonClient& api, const Output& o, const std::string& plan_id,
           const std::string& reason);
// Asks the daemon (GET /v1/audit/verify), then fetches every page of
// GET /v1/audit and recomputes the chain here with the store's rule
// (AuditChainCheck), so a daemon that lies about its own log is caught as
// well. kExitAuditBroken when either finds a break; the first broken seq
// is reported.
int AuditVerify(DaemonClient& api, const Output& o);
// `idem replay ID`: POST /v1/decisions/{id}/replay with `body` ({provider?,
// model?, prompt_version?, temperature?}) and the diff, readably: one line
// per pointer, "~ /p: before → after", "+ /p: value", "- /p: value"
// (coloured on a tty). A replay that found no valid output is reported,
// exit 0 (a finding, not a failure of the command).
std::string RenderReplayDiff(const Json& answer, const Style& style);
int ReplayDecision(DaemonClient& api, const Output& o, const std::string& decision_id,
                   const Json& body);

// `idem replay --step S …`: POST /v1/replays with `body`, then GET
// /v1/replays/{id} every `poll_ms` until the job is no longer running,
// showing progress on `o.err` (a bar redrawn in place when `tty_progress`,
// else a plain line whenever the count moved; nothing with --json), then
// the summary (RenderReplaySummary; with --json the job's JSON). Exit 0
// when the job is done, kExitFailed when it failed.
std::string RenderReplaySummary(const Json& job, const Style& style);
std::string ProgressBar(int64_t done, int64_t total, size_t width);
int BulkReplay(DaemonClient& api, const Output& o, const Json& body, bool tty_progress,
               int64_t poll_ms = 500);

// GET/POST and print the JSON answer as is (the older client commands).
int PrintCall(DaemonClient& api, const Output& o, const std::string& method,
              const std::string& path, const Json& body = Json(),
              const std::string& idempotency_key = "");

// ---- decisions export / import and cost (decisions_io.cc)

// What the daemon takes in one POST /v1/decisions/import (kMaxImportLines,
// daemon/http/api_decisions_io.cc).
constexpr size_t kMaxImportLinesPerRequest = 10'000;

// A time for --since / --until: milliseconds since the epoch ("1764547200000"),
// a UTC date ("2026-11-30"), or a duration back from now_ms ("90m", "24h",
// "7d"). InvalidArgument otherwise.
StatusOr<int64_t> ParseTimeArg(const std::string& arg, int64_t now_ms);

// The longest line `idem decisions import` reads: no daemon takes a body
// past 1 GiB (server.max_body_bytes), and no record needs a line near this.
constexpr size_t kMaxImportLineBytes = 64u << 20;

// The JSON Lines of `path` ("-": stdin) for an import. InvalidArgument
// naming the file when it cannot be read, is a folder, or holds a line
// longer than max_line_bytes (/dev/zero is one endless line: refused once
// it passes the limit, not read until memory runs out).
StatusOr<std::string> ReadImportFile(const std::string& path,
                                     size_t max_line_bytes = kMaxImportLineBytes);

// JSON Lines cut into requests of at most max_bytes and max_lines lines
// each, at line ends (a longer line is a request of its own); first_lines[i]
// is the 1-based line number in `text` where batch i starts.
std::vector<std::string> SplitLines(const std::string& text, size_t max_bytes,
                                    std::vector<size_t>* first_lines,
                                    size_t max_lines = kMaxImportLinesPerRequest);

// The table of GET /v1/stats/cost.
std::string RenderCost(const Json& body, const Style& style);

// Every page of GET /v1/decisions/export written to `sink` as is (one
// decision per line); the count to o.err.
int DecisionsExport(DaemonClient& api, const Output& o, std::FILE* sink, const std::string& step,
                    int64_t since_ms);
// POST /v1/decisions/import in batches of at most max_request_bytes; line
// numbers in the answers are the file's. Refused lines are listed (--json:
// the merged answer); exit 1 (kExitUsage) when any line was refused.
int DecisionsImport(DaemonClient& api, const Output& o, const std::string& text,
                    size_t max_request_bytes);
int Cost(DaemonClient& api, const Output& o, const std::string& by, const std::string& since,
         const std::string& until);

// `idem store copy`: the RocksDB store at `rocks_path` (its daemon stopped)
// into the PostgreSQL schema `to` names, which must hold no records
// (store_copy.h). Prints the records copied per family (--json: an object
// of counts). Exit: 3 no store at the path, 4 the schema holds records,
// 2 the store is in use or the server unreachable, 7 other errors.
std::string RenderCopyCounts(const CopyCounts& counts, const Style& style);
int StoreCopy(const Output& o, const std::string& rocks_path, const PgStoreOptions& to);

}  // namespace idem::cli
