// The crash test with two daemons on one PostgreSQL schema (issue 13): N
// actions by 16 clients spread over both daemons while, round after round,
// one of them dies — SIGKILL at a random moment while it has requests in
// flight, or a crash failpoint of the apply path (IDEM_FAILPOINTS in that
// daemon's environment) — and the other keeps serving. The work the dead
// daemon held under lease must be finished by the survivor's apply workers
// (Journal::Due lists running work whose lease expired) before the dead one
// comes back. The target (idem_fake_effector, its own process) must end
// with exactly N effects, none twice, and the journal with every item done.
//
// The clients resubmit an action only while no daemon has answered for it
// (connection error, 5xx): once a daemon answers "busy" (409, a live lease)
// or "retrying" (202), the work is in the journal and the clients leave it
// to the workers. So work taken over from a dead daemon is finished by the
// survivor's workers, never by a client's retry; the test counts it from
// the journal itself (a lease held at the kill, superseded only after it
// expired) and requires some.
//
// IDEM_CRASH_N (default 120) sets N; IDEM_CRASH_ROUNDS (default 6) the
// number of rounds that end in a crash. The server: IDEM_TEST_PG_URL (or the
// PG* variables); the test's schema is dropped at the end.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "daemon/core/crypto.h"
#include "daemon/store/postgres/pg_client.h"
#include "tests/integration/crash_support.h"
#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

using Clock = std::chrono::steady_clock;

// Client-side states beyond CrashItem's 0/1/2: the journal holds the work
// (a daemon answered busy or retrying); the workers finish it.
constexpr int kHandedOff = 3;

// A running journal row as it was right after a daemon died.
struct HeldLease {
  std::string work_id;
  std::string token;
  int64_t locked_until_ms = 0;
};

// Direct reads of the test's schema.
class JournalReader {
 public:
  JournalReader(const std::string& url, const std::string& schema) : schema_(schema) {
    pg::PoolOptions po;
    po.conninfo = url;
    po.schema = schema;
    po.size = 1;
    auto pool = pg::Pool::Open(po);
    REQUIRE_MESSAGE(pool.ok(), pool.status().ToString());
    pool_ = std::move(*pool);
  }
  ~JournalReader() {
    (void)pool_->Exec("DROP SCHEMA IF EXISTS " + pg::QuoteIdent(schema_) + " CASCADE");
  }

  std::vector<HeldLease> Running() {
    auto r = pool_->Exec(
        "SELECT work_id, lease_token, locked_until_ms FROM journal WHERE state = 'running'");
    REQUIRE_MESSAGE(r.ok(), r.status().ToString());
    std::vector<HeldLease> out;
    for (int i = 0; i < r->rows(); ++i) out.push_back({r->str(i, 0), r->str(i, 1), r->i64(i, 2)});
    return out;
  }

  // For each lease: -1 while its holder still has the work; otherwise the
  // time (updated_at_ms) the work moved on (taken over, or finished).
  std::vector<int64_t> MovedOn(const std::vector<HeldLease>& leases) {
    std::vector<int64_t> out;
    for (const HeldLease& l : leases) {
      auto r = pool_->Exec(
          "SELECT state = 'running' AND lease_token = $2, updated_at_ms FROM journal"
          " WHERE work_id = $1",
          {pg::P(l.work_id), pg::P(l.token)});
      REQUIRE_MESSAGE(r.ok(), r.status().ToString());
      REQUIRE(r->rows() == 1);
      out.push_back(r->boolean(0, 0) ? -1 : r->i64(0, 1));
    }
    return out;
  }

  // Items done or dead.
  int64_t Settled() {
    auto r = pool_->Exec("SELECT count(*) FROM journal WHERE state IN ('done', 'dead')");
    REQUIRE(r.ok());
    return r->i64(0, 0);
  }

 private:
  std::string schema_;
  std::unique_ptr<pg::Pool> pool_;
};

}  // namespace

TEST_SUITE("postgres") {
  TEST_CASE("crash_test_with_two_daemons_on_one_database_makes_exactly_n_effects") {
    const int n = EnvInt("IDEM_CRASH_N", 120);
    const int crash_rounds = EnvInt("IDEM_CRASH_ROUNDS", 6);
    constexpr int kClients = 16;
    const auto started = Clock::now();
    const char* url_env = std::getenv("IDEM_TEST_PG_URL");
    const std::string url = url_env != nullptr ? url_env : "";

    FakeEffectorProcess fake;
    REQUIRE(fake.Start());
    REQUIRE(fake.SetLatencyMs(20));  // keeps effects in flight when the kills land

    TempDir dir;
    const std::string schema = "crash_" + RandomHex(6);
    const std::string config =
        OnPostgres(dir, WriteTestConfig(dir, kCrashRules, CrashActionsYaml(fake)),
                   "  url_env: IDEM_PG_URL\n  schema: " + schema +
                       "\n  pool_size: 8\n  statement_timeout: 5s\n");

    std::vector<CrashItem> items(n);
    InitCrashItems(items);
    std::vector<std::atomic<bool>> ran_by_client(n);  // a client got 201 (executed) for it

    // Round r kills daemon r % 2. "N*crash" fires on the Nth hit in that
    // daemon's process; the counts are small because the victim sees about
    // half of one round's batch.
    const std::vector<std::string> schedule = {
        "apply.after_claim=3*crash",  "", "apply.after_effect=2*crash",
        "apply.after_record=4*crash", "", "apply.after_lookup=2*crash"};
    std::mt19937 rng(20261201);

    std::unique_ptr<JournalReader> journal;  // drops the schema after the daemons stopped
    std::unique_ptr<DaemonProcess> daemons[2];
    std::string armed[2];                // the failpoints each running daemon was started with
    std::atomic<int> ports[2] = {0, 0};  // 0: down (the clients use the other)
    std::atomic<int> in_flight[2] = {0, 0};
    int restarts = 0, rearms = 0, sigkills = 0, failpoint_crashes = 0, not_fired = 0;
    std::map<std::string, int> crashes_by_failpoint;
    long leases_at_kill = 0, taken_over = 0, taken_over_by_workers = 0, takeover_wait_ms = 0;
    std::atomic<long> requests{0}, conflicts{0}, retrying{0}, connection_errors{0};
    std::atomic<size_t> next{0}, released{0};
    std::atomic<bool> stop{false};

    // Starts daemon `d` with `failpoints`; false if it died before serving
    // (the failpoint fired while its workers resumed leftover work).
    auto start = [&](int d, const std::string& failpoints) {
      DaemonArgs args{config, dir.path() + "/d" + std::to_string(d), {}, {{"IDEM_PG_URL", url}}};
      if (!failpoints.empty()) args.env["IDEM_FAILPOINTS"] = failpoints;
      std::string error;
      daemons[d] = DaemonProcess::Start(args, &error);
      armed[d] = failpoints;
      if (daemons[d] == nullptr) {
        REQUIRE_MESSAGE(!failpoints.empty(), error);
        return false;
      }
      ports[d] = daemons[d]->port();
      return true;
    };
    auto open_items = [&] {
      int left = 0;
      for (size_t i = 0; i < released.load(); ++i) left += items[i].settled.load() == 0 ? 1 : 0;
      return left;
    };

    REQUIRE(start(0, ""));
    REQUIRE(start(1, ""));
    journal = std::make_unique<JournalReader>(url, schema);

    std::vector<std::thread> clients;
    struct Joiner {  // the clients stop before what they use goes, even on a failed REQUIRE
      std::atomic<bool>& stop;
      std::vector<std::thread>& threads;
      ~Joiner() {
        stop = true;
        for (auto& t : threads) {
          if (t.joinable()) t.join();
        }
      }
    } joiner{stop, clients};
    for (int c = 0; c < kClients; ++c) {
      clients.emplace_back([&, c] {
        int attempt = 0;
        while (!stop.load()) {
          const size_t avail = released.load();
          CrashItem* item = nullptr;
          size_t index = 0;
          for (size_t scanned = 0; scanned < avail && item == nullptr; ++scanned) {
            index = next.fetch_add(1) % avail;
            if (items[index].settled.load() == 0) item = &items[index];
          }
          int d = (c + attempt) % 2;
          if (ports[d].load() == 0) d = 1 - d;
          const int port = ports[d].load();
          if (item == nullptr || port == 0) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
            continue;
          }
          httplib::Client client("127.0.0.1", port);
          client.set_connection_timeout(2, 0);
          client.set_read_timeout(15, 0);
          httplib::Headers headers = {{"Idempotency-Key", "pgcrash-" + std::to_string(c) + "-" +
                                                              std::to_string(attempt++)}};
          Json body = {{"args", item->args}, {"run_id", "pgcrash"}};
          ++in_flight[d];
          auto res =
              client.Post("/v1/actions/" + item->kind, headers, body.dump(), "application/json");
          --in_flight[d];
          ++requests;
          if (!res) {
            ++connection_errors;  // that daemon died: another request goes to the other
            continue;
          }
          Json answer = Json::parse(res->body, nullptr, false);
          const std::string state =
              answer.is_object() ? answer.value("state", std::string()) : std::string();
          if (res->status == 201 || res->status == 200) {
            if (res->status == 201) ran_by_client[index] = true;
            if (state == "done") item->settled = 1;
          } else if (res->status == 409) {
            ++conflicts;
            int expected = 0;
            item->settled.compare_exchange_strong(expected, state == "dead" ? 2 : kHandedOff);
          } else if (res->status == 202) {
            ++retrying;
            int expected = 0;
            item->settled.compare_exchange_strong(expected, kHandedOff);
          } else if (res->status >= 500) {
            // A store error: nothing is promised; resubmit later.
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          } else {
            FAIL_CHECK("unexpected answer " << res->status << ": " << res->body);
          }
        }
      });
    }

    const size_t batch = std::max<size_t>(1, n / (crash_rounds + 1));
    for (int round = 0; round < crash_rounds; ++round) {
      const int victim = round % 2;
      const std::string failpoint = schedule[round % schedule.size()];
      bool crashed = false;
      if (armed[victim] != failpoint) {
        // Arm the victim: a graceful restart while the other serves.
        ports[victim] = 0;
        daemons[victim]->Stop();
        ++rearms;
        crashed = !start(victim, failpoint);
      }
      released = std::min<size_t>(n, released.load() + batch);
      if (!crashed && failpoint.empty()) {
        // SIGKILL at a random moment while the victim has requests in flight.
        std::uniform_int_distribution<int> wait_ms(20, 250);
        std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms(rng)));
        const auto give_up = Clock::now() + std::chrono::seconds(5);
        while (in_flight[victim].load() == 0 && open_items() > 0 && Clock::now() < give_up) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        daemons[victim]->Kill9();
        ++sigkills;
        crashed = true;
      } else if (!crashed) {
        // The failpoint kills the process; wait for it (or for the batch to end).
        const auto give_up = Clock::now() + std::chrono::seconds(20);
        while (!daemons[victim]->WaitExit(20) && Clock::now() < give_up &&
               (open_items() > 0 || in_flight[0] + in_flight[1] > 0)) {
        }
        crashed = daemons[victim]->WaitExit(0);
        if (!crashed) ++not_fired;
      } else {
        crashed = true;  // died while starting
      }
      ports[victim] = 0;
      if (crashed && !failpoint.empty()) {
        ++failpoint_crashes;
        ++crashes_by_failpoint[failpoint.substr(0, failpoint.find('='))];
      }
      if (crashed) {
        // The leases held now are the dead daemon's (and the survivor's,
        // which it finishes within its lease): wait until every one moved on,
        // with only the survivor alive to move it.
        const auto kill_time = Clock::now();
        const std::vector<HeldLease> held = journal->Running();
        leases_at_kill += static_cast<long>(held.size());
        std::vector<int64_t> moved(held.size(), -1);
        const auto give_up = kill_time + std::chrono::seconds(30);
        while (std::count(moved.begin(), moved.end(), -1) > 0 && Clock::now() < give_up) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          moved = journal->MovedOn(held);
        }
        takeover_wait_ms +=
            std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - kill_time).count();
        CHECK_MESSAGE(std::count(moved.begin(), moved.end(), -1) == 0,
                      "leases of the dead daemon were never taken over");
        for (size_t i = 0; i < held.size(); ++i) {
          // Moved on only after the lease ran out: its holder was the dead one.
          if (moved[i] < held[i].locked_until_ms) continue;
          ++taken_over;
          for (int k = 0; k < n; ++k) {
            if (items[k].work_id == held[i].work_id && !ran_by_client[k]) ++taken_over_by_workers;
          }
        }
      }
      // Back up without failpoints: it serves beside the other from now on.
      if (daemons[victim] != nullptr) daemons[victim]->Stop();
      REQUIRE(start(victim, ""));
      ++restarts;
    }

    // Crash-free: the rest of the items, then every one settled in the journal.
    released = static_cast<size_t>(n);
    const auto deadline = Clock::now() + std::chrono::seconds(120);
    while ((open_items() > 0 || journal->Settled() < n) && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    stop = true;
    for (auto& t : clients) t.join();
    CHECK(open_items() == 0);

    const CrashTally tally = TallyCrashTest(*daemons[1], fake, items);
    const auto took_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started).count();
    std::string by_failpoint;
    for (const auto& [name, count] : crashes_by_failpoint) {
      by_failpoint += " " + name + "=" + std::to_string(count);
    }
    MESSAGE(
        "pg crash test: N=" << n << " daemons=2 sigkills=" << sigkills << " failpoint_crashes="
                            << failpoint_crashes << " (by failpoint:" << by_failpoint << ")"
                            << " failpoints_not_fired=" << not_fired << " restarts=" << restarts
                            << " rearm_restarts=" << rearms << " leases_at_kill=" << leases_at_kill
                            << " taken_over_after_lease=" << taken_over << " of_which_by_workers="
                            << taken_over_by_workers << " takeover_wait_ms=" << takeover_wait_ms
                            << " requests=" << requests.load() << " conflicts=" << conflicts.load()
                            << " retrying=" << retrying.load() << " connection_errors="
                            << connection_errors.load() << " done=" << tally.done
                            << " dead=" << tally.dead << " effects=" << tally.stats["effects"]
                            << " duplicates=" << tally.stats["duplicates_by_key"] << " raw_calls="
                            << tally.stats["raw_calls"] << " replays=" << tally.stats["replays"]
                            << " lookups=" << tally.stats["lookups"] << " time_ms=" << took_ms);
    CheckExactlyOnce(tally, n);
    CHECK(sigkills + failpoint_crashes >= crash_rounds - not_fired);
    // The dead daemons' leases were taken over by the survivors' workers.
    CHECK(taken_over_by_workers > 0);
  }
}

}  // namespace idem::testing
