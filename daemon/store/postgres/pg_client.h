// A small libpq client for the PostgreSQL store: one connection (Conn), its
// results (Result), and a fixed-size pool with transactions (Pool).
//
// Every statement is sent with PQexecParams in text format, so values never
// meet SQL text (no quoting, no injection). Errors map to Status:
//   - the server unreachable, a broken connection, admin shutdown or a
//     statement timeout: Unavailable (retryable);
//   - a serialization failure or deadlock (40001, 40P01): Aborted, which
//     Pool::Tx retries a few times before giving up;
//   - a unique violation (23505): AlreadyExists;
//   - anything else: Internal with the server's message.
// Messages carry libpq's text, never the connection string (it may hold a
// password).
//
// libpq is not linked into `idem`: the first Conn::Open loads libpq.so.5
// (dlopen, daemon/core/dynlib.h), so a daemon on RocksDB never maps it and
// its dependencies (idle RSS, issue 9); <libpq-fe.h> gives types and
// constants only. When it cannot be loaded, Conn::Open (and so Pool::Open)
// fails with FailedPrecondition naming libpq.so.5 and the Debian package
// libpq5.
//
// Thread-safety: a Conn is used by one thread at a time; Pool's methods may
// be called from any thread.
#pragma once

#include <libpq-fe.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/core/status.h"

namespace idem::pg {

// One parameter: a text value or SQL NULL.
using Param = std::optional<std::string>;
inline Param P(std::string_view s) { return std::string(s); }
inline Param P(const char* s) { return std::string(s); }
inline Param P(const std::string& s) { return s; }
inline Param P(int64_t v) { return std::to_string(v); }
// A seq or a count: every column is a bigint, so a value past its range
// (a "through everything" bound such as UINT64_MAX - 1) is its maximum,
// which no stored value exceeds; PostgreSQL refuses a larger one.
inline Param P(uint64_t v) {
  return std::to_string(std::min<uint64_t>(v, std::numeric_limits<int64_t>::max()));
}
inline Param P(int v) { return std::to_string(v); }
inline Param P(bool v) { return std::string(v ? "true" : "false"); }
// bytea values: hex form ("\x...").
Param Bytea(std::string_view bytes);
// Can `v` be a text value? libpq takes C strings (a NUL would cut it) and
// the server refuses text that is not UTF-8.
bool IsText(std::string_view v);
// InvalidArgument "<field without its '/'> is not valid text" at `field`
// (a JSON pointer) unless IsText(v).
Status CheckText(std::string_view v, std::string_view field);

class Result {
 public:
  Result() = default;
  // Takes `r`, which a Conn made (libpq is loaded).
  explicit Result(PGresult* r);
  int rows() const;
  bool null(int row, int col) const;
  std::string_view text(int row, int col) const;
  std::string str(int row, int col) const { return std::string(text(row, col)); }
  int64_t i64(int row, int col) const;  // 0 for NULL
  bool boolean(int row, int col) const { return text(row, col) == "t"; }
  std::string bytea(int row, int col) const;  // decodes the hex form
  // Rows changed by an INSERT/UPDATE/DELETE.
  int64_t affected() const;

 private:
  std::shared_ptr<PGresult> r_;
};

class Conn {
 public:
  // Connects with `conninfo` (a libpq URL or key=value string; empty: the
  // PG* environment variables) and sets the search_path to `schema` and
  // statement_timeout. Unavailable when the server cannot be reached.
  static StatusOr<std::unique_ptr<Conn>> Open(const std::string& conninfo,
                                              const std::string& schema,
                                              int64_t statement_timeout_ms);
  ~Conn();
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  StatusOr<Result> Exec(std::string_view sql, const std::vector<Param>& params = {});
  // Several statements without parameters (schema scripts).
  Status ExecScript(std::string_view sql);
  // False once the connection broke; the pool then replaces it.
  bool healthy() const;
  // For an idle connection: false when the server has sent anything since
  // (the FATAL before it closes, above all), found without waiting, so that
  // the pool opens another instead of failing the next statement on it.
  bool StillOpen();

 private:
  explicit Conn(PGconn* c) : c_(c) {}
  PGconn* c_;
};

struct PoolOptions {
  std::string conninfo;  // never logged
  std::string schema = "idem";
  int size = 8;
  int64_t statement_timeout_ms = 5'000;
  int64_t acquire_timeout_ms = 5'000;  // waiting for a free connection
};

class Pool {
 public:
  // Opens one connection to check the server is reachable; the others are
  // opened on demand. Creates the schema if missing.
  static StatusOr<std::unique_ptr<Pool>> Open(PoolOptions options);
  ~Pool();

  // A connection checked out of the pool; given back when destroyed
  // (dropped instead if it broke).
  class Lease {
   public:
    Lease(Pool* pool, std::unique_ptr<Conn> c) : pool_(pool), c_(std::move(c)) {}
    Lease(Lease&&) = default;
    Lease& operator=(Lease&&) = default;
    ~Lease();
    Conn& operator*() { return *c_; }
    Conn* operator->() { return c_.get(); }

   private:
    Pool* pool_;
    std::unique_ptr<Conn> c_;
  };
  // Unavailable when no connection frees up within acquire_timeout_ms or a
  // new one cannot be opened.
  StatusOr<Lease> Acquire();

  // Runs `fn` between BEGIN and COMMIT on one connection; ROLLBACK when fn
  // fails. A serialization failure or deadlock (Aborted from the server) is
  // retried up to 4 times; fn must therefore be safe to run again.
  Status Tx(const std::function<Status(Conn&)>& fn);
  // One statement outside a transaction (autocommit).
  StatusOr<Result> Exec(std::string_view sql, const std::vector<Param>& params = {});

  // The database's clock (clock_timestamp()), in ms since the epoch.
  StatusOr<int64_t> ServerNowMillis();

  const PoolOptions& options() const { return options_; }

 private:
  explicit Pool(PoolOptions options) : options_(std::move(options)) {}
  void Give(std::unique_ptr<Conn> c);

  const PoolOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Conn>> idle_;  // under mu_
  int open_ = 0;                             // under mu_: checked out + idle
};

// libpq's message about a connection to `conninfo`, fit to show: libpq
// quotes the part of a connection string it cannot parse ("invalid
// percent-encoded token: \"p%ssw0rd\"", "missing \"=\" after \"...\""), and
// that part may be the password. So any quoted text of `message` that occurs
// in `conninfo` (as written or percent-decoded), except the name of a libpq
// option, is shown as "…", and so is the password wherever it appears (a
// URL's user:password@ or password= parameter, a key=value string's
// password=; one shorter than 4 bytes is left alone, it would redact noise).
// Conn::Open's Unavailable carries this, never the libpq message itself.
std::string ConninfoFreeMessage(std::string_view message, std::string_view conninfo);

// Quotes an identifier for SQL text ("schema" names only; values always go
// as parameters).
std::string QuoteIdent(std::string_view name);

// A text-format array literal of `values` ("{"a","b\"c"}"), for a
// `$n::text[]` parameter.
std::string ArrayLiteral(const std::vector<std::string>& values);

// How many rows `from_where` ("table WHERE ...", whose own parameters are
// $2 on, `params`) holds, counted up to `cap` ($1): the database stops at
// `cap` rows instead of counting them all.
StatusOr<size_t> CountRows(Pool& pool, std::string_view from_where, std::vector<Param> params,
                           size_t cap);

}  // namespace idem::pg
