#include "daemon/store/postgres/pg_client.h"

#include <poll.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "daemon/core/dynlib.h"
#include "daemon/core/http_client.h"
#include "daemon/core/json.h"
#include "daemon/obs/log.h"

namespace idem::pg {
namespace {

// The libpq functions this file calls.
struct PqApi {
  decltype(&::PQconnectdb) connectdb;
  decltype(&::PQstatus) status;
  decltype(&::PQsocket) socket;
  decltype(&::PQerrorMessage) error_message;
  decltype(&::PQfinish) finish;
  decltype(&::PQexec) exec;
  decltype(&::PQexecParams) exec_params;
  decltype(&::PQresultStatus) result_status;
  decltype(&::PQresultErrorField) result_error_field;
  decltype(&::PQresultErrorMessage) result_error_message;
  decltype(&::PQntuples) ntuples;
  decltype(&::PQgetisnull) getisnull;
  decltype(&::PQgetvalue) getvalue;
  decltype(&::PQgetlength) getlength;
  decltype(&::PQcmdTuples) cmd_tuples;
  decltype(&::PQclear) clear;
  decltype(&::PQsetNoticeProcessor) set_notice_processor;
};

void BindPq(DynSymbols& s, PqApi& a) {
  s.Bind(a.connectdb, "PQconnectdb");
  s.Bind(a.status, "PQstatus");
  s.Bind(a.socket, "PQsocket");
  s.Bind(a.error_message, "PQerrorMessage");
  s.Bind(a.finish, "PQfinish");
  s.Bind(a.exec, "PQexec");
  s.Bind(a.exec_params, "PQexecParams");
  s.Bind(a.result_status, "PQresultStatus");
  s.Bind(a.result_error_field, "PQresultErrorField");
  s.Bind(a.result_error_message, "PQresultErrorMessage");
  s.Bind(a.ntuples, "PQntuples");
  s.Bind(a.getisnull, "PQgetisnull");
  s.Bind(a.getvalue, "PQgetvalue");
  s.Bind(a.getlength, "PQgetlength");
  s.Bind(a.cmd_tuples, "PQcmdTuples");
  s.Bind(a.clear, "PQclear");
  s.Bind(a.set_notice_processor, "PQsetNoticeProcessor");
}

StatusOr<const PqApi*> LoadPq() {
  // Never destroyed: connections may still close while the process exits.
  static auto* lib = new LazyLibrary<PqApi>("libpq.so.5", "libpq5", &BindPq);
  return lib->Get();
}

// libpq, for code that holds a connection or a result: Conn::Open loaded it.
const PqApi& Pq() {
  StatusOr<const PqApi*> pq = LoadPq();
  if (!pq.ok()) std::abort();  // a PGconn or PGresult without libpq: a bug
  return **pq;
}

// The first line of libpq's message, without the trailing newline.
std::string Trimmed(const char* msg) {
  std::string s = msg ? msg : "";
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// libpq's notices (the server's WARNING that it is shutting down, a FATAL
// that ends a connection) go to the daemon's log as one JSON line each,
// not raw to stderr, where they broke the log's one-object-per-line form.
void LogNotice(void* /*arg*/, const char* message) {
  LogEvent(LogLevel::kWarn, "postgres.notice", {{"message", ValidUtf8Text(Trimmed(message))}});
}

Status FromResult(PGconn* c, PGresult* r, std::string_view sql) {
  const PqApi& pq = Pq();
  const char* state = r ? pq.result_error_field(r, PG_DIAG_SQLSTATE) : nullptr;
  std::string msg = Trimmed(r ? pq.result_error_message(r) : pq.error_message(c));
  if (msg.empty()) msg = Trimmed(pq.error_message(c));
  std::string head(sql.substr(0, 60));
  std::string text = "postgres: " + msg + " [" + head + (sql.size() > 60 ? "…" : "") + "]";
  if (pq.status(c) != CONNECTION_OK) return Unavailable(text);
  if (state == nullptr) return Unavailable(text);
  std::string_view st(state);
  if (st == "40001" || st == "40P01") return Aborted(text).WithRetryable(true);
  if (st == "23505") return AlreadyExists(text);
  // 08: connection exception; 57: operator intervention (statement timeout
  // 57014, admin shutdown 57P01); 53: insufficient resources.
  if (st.starts_with("08") || st.starts_with("57") || st.starts_with("53")) {
    return Unavailable(text);
  }
  return Internal(text);
}

// The passwords `conninfo` holds, as written: a URL's user:password@ (and
// the whole userinfo) and its ?password= parameter, or a key=value
// string's password= value.
std::vector<std::string> ConninfoPasswords(std::string_view conninfo) {
  std::vector<std::string> out;
  const size_t scheme = conninfo.find("://");
  if (conninfo.starts_with("postgresql://") || conninfo.starts_with("postgres://")) {
    const size_t start = scheme + 3;
    const size_t end = std::min(conninfo.find_first_of("/?", start), conninfo.size());
    std::string_view authority = conninfo.substr(start, end - start);
    const size_t at = authority.rfind('@');
    if (at != std::string_view::npos) {
      std::string_view userinfo = authority.substr(0, at);
      out.emplace_back(userinfo);
      const size_t colon = userinfo.find(':');
      if (colon != std::string_view::npos) out.emplace_back(userinfo.substr(colon + 1));
    }
    const size_t query = conninfo.find('?', start);
    if (query != std::string_view::npos) {
      std::string_view params = conninfo.substr(query + 1);
      while (!params.empty()) {
        const size_t amp = std::min(params.find('&'), params.size());
        std::string_view param = params.substr(0, amp);
        if (param.starts_with("password=")) out.emplace_back(param.substr(9));
        params.remove_prefix(std::min(amp + 1, params.size()));
      }
    }
    return out;
  }
  // key = value pairs; a value may be 'quoted' with \ escapes.
  size_t i = 0;
  auto skip_space = [&] {
    while (i < conninfo.size() && std::isspace(static_cast<unsigned char>(conninfo[i]))) ++i;
  };
  while (i < conninfo.size()) {
    skip_space();
    const size_t key_start = i;
    while (i < conninfo.size() && conninfo[i] != '=' &&
           !std::isspace(static_cast<unsigned char>(conninfo[i]))) {
      ++i;
    }
    std::string_view key = conninfo.substr(key_start, i - key_start);
    skip_space();
    if (i >= conninfo.size() || conninfo[i] != '=') continue;
    ++i;
    skip_space();
    std::string value;
    if (i < conninfo.size() && conninfo[i] == '\'') {
      for (++i; i < conninfo.size() && conninfo[i] != '\''; ++i) {
        if (conninfo[i] == '\\' && i + 1 < conninfo.size()) ++i;
        value.push_back(conninfo[i]);
      }
      ++i;
    } else {
      while (i < conninfo.size() && !std::isspace(static_cast<unsigned char>(conninfo[i]))) {
        value.push_back(conninfo[i++]);
      }
    }
    if (key == "password") out.push_back(std::move(value));
  }
  return out;
}

}  // namespace

std::string ConninfoFreeMessage(std::string_view message, std::string_view conninfo) {
  // The names of libpq's options may be quoted ("invalid integer value
  // \"x\" for connection option \"port\""): they say what is wrong and are
  // no secret.
  static constexpr std::string_view kKeywords[] = {"host",
                                                   "hostaddr",
                                                   "port",
                                                   "dbname",
                                                   "user",
                                                   "password",
                                                   "passfile",
                                                   "connect_timeout",
                                                   "sslmode",
                                                   "sslcert",
                                                   "sslkey",
                                                   "sslrootcert",
                                                   "sslcrl",
                                                   "options",
                                                   "service",
                                                   "application_name",
                                                   "client_encoding",
                                                   "target_session_attrs",
                                                   "keepalives",
                                                   "gssencmode"};
  const std::string decoded = PercentDecode(conninfo, false);
  auto in_conninfo = [&](std::string_view t) {
    return conninfo.find(t) != std::string_view::npos || decoded.find(t) != std::string::npos;
  };
  std::string out;
  out.reserve(message.size());
  size_t i = 0;
  while (i < message.size()) {
    const size_t open = message.find('"', i);
    const size_t close = open == std::string_view::npos ? open : message.find('"', open + 1);
    if (close == std::string_view::npos) {
      out.append(message.substr(i));
      break;
    }
    std::string_view quoted = message.substr(open + 1, close - open - 1);
    const bool words = std::any_of(quoted.begin(), quoted.end(), [](unsigned char c) {
      return std::isalnum(c) != 0 || c >= 0x80;
    });
    const bool keyword =
        std::find(std::begin(kKeywords), std::end(kKeywords), quoted) != std::end(kKeywords);
    out.append(message.substr(i, open + 1 - i));
    out.append(words && !keyword && in_conninfo(quoted) ? std::string_view("…") : quoted);
    out.push_back('"');
    i = close + 1;
  }
  for (const std::string& raw : ConninfoPasswords(conninfo)) {
    for (const std::string& secret : {raw, PercentDecode(raw, false)}) {
      if (secret.size() < 4) continue;
      for (size_t pos = 0; (pos = out.find(secret, pos)) != std::string::npos;) {
        out.replace(pos, secret.size(), "…");
        pos += std::string_view("…").size();
      }
    }
  }
  return out;
}

Param Bytea(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\\x";
  out.reserve(2 + bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

bool IsText(std::string_view v) { return v.find('\0') == std::string_view::npos && IsValidUtf8(v); }

Status CheckText(std::string_view v, std::string_view field) {
  if (IsText(v)) return Status::Ok();
  return InvalidArgument(std::string(field.substr(field.empty() ? 0 : 1)) + " is not valid text",
                         std::string(field));
}

Result::Result(PGresult* r) : r_(r, Pq().clear) {}

int Result::rows() const { return r_ ? Pq().ntuples(r_.get()) : 0; }

bool Result::null(int row, int col) const { return Pq().getisnull(r_.get(), row, col) != 0; }

std::string_view Result::text(int row, int col) const {
  const PqApi& pq = Pq();
  return {pq.getvalue(r_.get(), row, col), static_cast<size_t>(pq.getlength(r_.get(), row, col))};
}

int64_t Result::i64(int row, int col) const {
  if (null(row, col)) return 0;
  return std::strtoll(Pq().getvalue(r_.get(), row, col), nullptr, 10);
}

std::string Result::bytea(int row, int col) const {
  std::string_view t = text(row, col);
  std::string out;
  if (!t.starts_with("\\x")) return std::string(t);
  auto nib = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return 0;
  };
  out.reserve((t.size() - 2) / 2);
  for (size_t i = 2; i + 1 < t.size(); i += 2) {
    out.push_back(static_cast<char>(nib(t[i]) << 4 | nib(t[i + 1])));
  }
  return out;
}

int64_t Result::affected() const {
  const char* n = r_ ? Pq().cmd_tuples(r_.get()) : nullptr;
  return (n && *n) ? std::strtoll(n, nullptr, 10) : 0;
}

std::string QuoteIdent(std::string_view name) {
  std::string out = "\"";
  for (char c : name) {
    if (c == '"') out.push_back('"');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

StatusOr<std::unique_ptr<Conn>> Conn::Open(const std::string& conninfo, const std::string& schema,
                                           int64_t statement_timeout_ms) {
  StatusOr<const PqApi*> loaded = LoadPq();
  if (!loaded.ok()) return loaded.status().Annotate("postgres");
  const PqApi& pq = **loaded;
  PGconn* c = pq.connectdb(conninfo.c_str());
  if (c == nullptr) return Unavailable("postgres: out of memory opening a connection");
  if (pq.status(c) != CONNECTION_OK) {
    std::string msg = ConninfoFreeMessage(Trimmed(pq.error_message(c)), conninfo);
    pq.finish(c);
    return Unavailable("postgres: cannot connect: " + msg);
  }
  pq.set_notice_processor(c, &LogNotice, nullptr);
  std::unique_ptr<Conn> conn(new Conn(c));
  std::string setup = "SET search_path TO " + QuoteIdent(schema) +
                      "; SET statement_timeout = " + std::to_string(statement_timeout_ms) +
                      "; SET client_min_messages = warning";
  RETURN_IF_ERROR(conn->ExecScript(setup));
  return conn;
}

Conn::~Conn() { Pq().finish(c_); }

bool Conn::healthy() const { return Pq().status(c_) == CONNECTION_OK; }

bool Conn::StillOpen() {
  const PqApi& pq = Pq();
  const int fd = pq.socket(c_);
  if (fd < 0 || pq.status(c_) != CONNECTION_OK) return false;
  // An idle connection has nothing to read unless the server spoke: the
  // FATAL it sends before it closes (a restart, pg_terminate_backend,
  // idle_session_timeout), whose end of stream may come a moment later, or
  // rarely a notice or a reload's new setting. Whatever it said, a fresh
  // connection is the safe one.
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

StatusOr<Result> Conn::Exec(std::string_view sql, const std::vector<Param>& params) {
  std::string q(sql);
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const Param& p : params) values.push_back(p ? p->c_str() : nullptr);
  const PqApi& pq = Pq();
  PGresult* r = pq.exec_params(c_, q.c_str(), static_cast<int>(params.size()), nullptr,
                               values.data(), nullptr, nullptr, 0);
  ExecStatusType st = r ? pq.result_status(r) : PGRES_FATAL_ERROR;
  if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) return Result(r);
  Status s = FromResult(c_, r, sql);
  if (r) pq.clear(r);
  return s;
}

Status Conn::ExecScript(std::string_view sql) {
  std::string q(sql);
  const PqApi& pq = Pq();
  PGresult* r = pq.exec(c_, q.c_str());
  ExecStatusType st = r ? pq.result_status(r) : PGRES_FATAL_ERROR;
  Status s =
      (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) ? Status::Ok() : FromResult(c_, r, sql);
  if (r) pq.clear(r);
  return s;
}

StatusOr<std::unique_ptr<Pool>> Pool::Open(PoolOptions options) {
  if (options.size < 1) return InvalidArgument("postgres pool size must be at least 1");
  std::unique_ptr<Pool> pool(new Pool(std::move(options)));
  // The schema must exist before connections set their search_path to it.
  ASSIGN_OR_RETURN(std::unique_ptr<Conn> c, Conn::Open(pool->options_.conninfo, "public",
                                                       pool->options_.statement_timeout_ms));
  // IF NOT EXISTS is not safe against a concurrent CREATE: a daemon that
  // starts beside another may lose the race with a unique violation
  // (AlreadyExists), which means the schema is there.
  if (Status made =
          c->ExecScript("CREATE SCHEMA IF NOT EXISTS " + QuoteIdent(pool->options_.schema));
      !made.ok() && made.code() != Code::kAlreadyExists) {
    return made;
  }
  RETURN_IF_ERROR(c->ExecScript("SET search_path TO " + QuoteIdent(pool->options_.schema)));
  {
    std::lock_guard<std::mutex> lock(pool->mu_);
    pool->idle_.push_back(std::move(c));
    pool->open_ = 1;
  }
  return pool;
}

Pool::~Pool() = default;

Pool::Lease::~Lease() {
  if (pool_ && c_) pool_->Give(std::move(c_));
}

void Pool::Give(std::unique_ptr<Conn> c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (c->healthy()) {
      idle_.push_back(std::move(c));
    } else {
      --open_;  // dropped; the next Acquire opens a new one
    }
  }
  cv_.notify_one();
}

StatusOr<Pool::Lease> Pool::Acquire() {
  std::unique_lock<std::mutex> lock(mu_);
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.acquire_timeout_ms);
  while (true) {
    if (!idle_.empty()) {
      std::unique_ptr<Conn> c = std::move(idle_.back());
      idle_.pop_back();
      if (c->StillOpen()) return Lease(this, std::move(c));
      --open_;  // closed by the server while idle: a statement sent on it would fail
      continue;
    }
    if (open_ < options_.size) {
      ++open_;
      lock.unlock();
      StatusOr<std::unique_ptr<Conn>> c =
          Conn::Open(options_.conninfo, options_.schema, options_.statement_timeout_ms);
      if (!c.ok()) {
        lock.lock();
        --open_;
        return c.status();
      }
      return Lease(this, std::move(c).value());
    }
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && idle_.empty() &&
        open_ >= options_.size) {
      return Unavailable("postgres: no free connection within " +
                         std::to_string(options_.acquire_timeout_ms) + " ms (pool size " +
                         std::to_string(options_.size) + ")");
    }
  }
}

Status Pool::Tx(const std::function<Status(Conn&)>& fn) {
  Status last;
  for (int attempt = 0; attempt < 5; ++attempt) {
    ASSIGN_OR_RETURN(Lease lease, Acquire());
    Conn& c = *lease;
    RETURN_IF_ERROR(c.ExecScript("BEGIN"));
    Status s = fn(c);
    if (s.ok()) s = c.ExecScript("COMMIT");
    if (s.ok()) return s;
    if (c.healthy()) (void)c.ExecScript("ROLLBACK");
    if (s.code() != Code::kAborted || !s.retryable()) return s;
    last = s;
  }
  return last;
}

StatusOr<Result> Pool::Exec(std::string_view sql, const std::vector<Param>& params) {
  ASSIGN_OR_RETURN(Lease lease, Acquire());
  return lease->Exec(sql, params);
}

StatusOr<int64_t> Pool::ServerNowMillis() {
  ASSIGN_OR_RETURN(Result r, Exec("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"));
  if (r.rows() != 1) return Internal("postgres: clock_timestamp() returned no row");
  return r.i64(0, 0);
}

// A text-format array literal of `values` ("{"a","b\"c"}").
StatusOr<size_t> CountRows(Pool& pool, std::string_view from_where, std::vector<Param> params,
                           size_t cap) {
  params.insert(params.begin(), P(static_cast<uint64_t>(cap)));
  ASSIGN_OR_RETURN(Result r, pool.Exec("SELECT count(*) FROM (SELECT 1 FROM " +
                                           std::string(from_where) + " LIMIT $1) AS capped",
                                       params));
  if (r.rows() != 1) return Internal("a count returned no row");
  return static_cast<size_t>(r.i64(0, 0));
}

std::string ArrayLiteral(const std::vector<std::string>& values) {
  std::string out = "{";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) out += ',';
    out += '"';
    for (char c : values[i]) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    out += '"';
  }
  out += '}';
  return out;
}

}  // namespace idem::pg
