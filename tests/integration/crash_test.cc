// Crash test (R8-R11, R15-R17, R19, R39): N actions submitted by 16+
// concurrent clients while the daemon is killed again and again — SIGKILL at
// random moments and crash failpoints at each step of claim -> effect ->
// record — and restarted, with every unfinished action resubmitted (the
// clients' at-least-once retry). The target (idem_fake_effector, its own
// process, so it survives the kills) must end with exactly N effects and no
// double effect, and the journal with every item done or dead.
//
// IDEM_CRASH_N (default 200) sets N; IDEM_CRASH_ROUNDS (default 10) the
// number of rounds that end in a crash.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/crash_support.h"
#include "tests/integration/harness.h"

namespace idem::testing {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

TEST_CASE("crash test: N actions under kill -9 and crash failpoints make exactly N effects") {
  const int n = EnvInt("IDEM_CRASH_N", 400);
  const int crash_rounds = EnvInt("IDEM_CRASH_ROUNDS", 10);  // the schedule's length
  constexpr int kClients = 16;
  const auto started = Clock::now();

  FakeEffectorProcess fake;
  REQUIRE(fake.Start());
  REQUIRE(fake.SetLatencyMs(5));  // keeps effects in flight when the kills land
  TempDir dir;
  const std::string config = WriteTestConfig(dir, kCrashRules, CrashActionsYaml(fake));
  const std::string data = dir.path() + "/data";

  std::vector<CrashItem> items(n);
  InitCrashItems(items);

  // Crash schedule: each failpoint of the apply path, and SIGKILL at a
  // random moment, in turn. "N*crash" fires on the Nth hit in that process.
  // A round crashes only while work is left, so every kind of crash comes
  // in the first seven rounds, with enough items (400) to outlast them on a
  // quick host; the lookup's follows crashes that leave effects unknown.
  const std::vector<std::string> schedule = {"",
                                             "apply.after_claim=5*crash",
                                             "apply.after_effect=3*crash",
                                             "",
                                             "apply.after_lookup=2*crash",
                                             "apply.after_record=7*crash",
                                             "",
                                             "apply.after_effect=11*crash",
                                             "apply.after_claim=17*crash",
                                             "apply.after_lookup=9*crash"};
  std::mt19937 rng(20240611);
  int restarts = 0, sigkills = 0, failpoint_crashes = 0;
  std::map<std::string, int> crashes_by_failpoint;
  std::atomic<long> requests{0}, conflicts{0}, retrying{0}, connection_errors{0};
  std::atomic<size_t> next{0};

  auto unsettled = [&] {
    int left = 0;
    for (const CrashItem& it : items) left += it.settled.load() == 0 ? 1 : 0;
    return left;
  };

  for (int round = 0; unsettled() > 0; ++round) {
    const bool crash_round = round < crash_rounds;
    const std::string failpoint = crash_round ? schedule[round % schedule.size()] : "";
    DaemonArgs args{config, data, {}, {}};
    if (!failpoint.empty()) args.env["IDEM_FAILPOINTS"] = failpoint;
    std::string error;
    auto daemon = DaemonProcess::Start(args, &error);
    if (round > 0) ++restarts;
    if (daemon == nullptr && !failpoint.empty()) {
      // The workers resumed leftover work at start-up and hit the crash
      // failpoint before the daemon answered /healthz: a crash all the same.
      ++failpoint_crashes;
      ++crashes_by_failpoint[failpoint.substr(0, failpoint.find('='))];
      continue;
    }
    REQUIRE_MESSAGE(daemon != nullptr, error);

    std::atomic<bool> down{false};
    std::vector<std::thread> clients;
    for (int c = 0; c < kClients; ++c) {
      clients.emplace_back([&, c] {
        auto client = daemon->Client();
        client->set_read_timeout(15, 0);
        int attempt = 0;
        while (!down.load()) {
          // Round-robin over the unsettled items.
          CrashItem* item = nullptr;
          for (int scanned = 0; scanned < n && item == nullptr; ++scanned) {
            CrashItem& candidate = items[next.fetch_add(1) % n];
            if (candidate.settled.load() == 0) item = &candidate;
          }
          if (item == nullptr) return;
          // A fresh Idempotency-Key per request: the work_id (from args) is
          // what dedups here; a reused key would replay a stored 202.
          httplib::Headers headers = {{"Idempotency-Key", "crash-" + std::to_string(round) + "-" +
                                                              std::to_string(c) + "-" +
                                                              std::to_string(attempt++)}};
          Json body = {{"args", item->args}, {"run_id", "crash"}};
          auto res =
              client->Post("/v1/actions/" + item->kind, headers, body.dump(), "application/json");
          ++requests;
          if (!res) {
            ++connection_errors;
            down = true;  // the daemon died (or is dying)
            return;
          }
          Json answer = Json::parse(res->body, nullptr, false);
          const std::string state =
              answer.is_object() ? answer.value("state", std::string()) : std::string();
          if (res->status == 201 || res->status == 200) {
            if (state == "done") item->settled = 1;
          } else if (res->status == 409) {
            ++conflicts;
            if (state == "dead") item->settled = 2;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          } else if (res->status == 202) {
            ++retrying;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          } else if (res->status >= 500) {
            // A failpoint error or a store error: the lease expires, resubmit later.
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          } else {
            FAIL_CHECK("unexpected answer " << res->status << ": " << res->body);
            down = true;
            return;
          }
        }
      });
    }

    if (crash_round && failpoint.empty()) {
      // SIGKILL at a random moment while the clients are busy.
      std::uniform_int_distribution<int> wait_ms(50, 600);
      std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms(rng)));
      if (unsettled() > 0) {
        daemon->Kill9();
        ++sigkills;
      }
      down = true;
    } else if (crash_round) {
      // The failpoint kills the process; wait for it (or for the work to end).
      while (!daemon->WaitExit(20) && unsettled() > 0) {
      }
      if (daemon->WaitExit(0)) {
        ++failpoint_crashes;
        ++crashes_by_failpoint[failpoint.substr(0, failpoint.find('='))];
      }
      down = true;
    }
    for (auto& t : clients) t.join();
    if (!crash_round) {
      CHECK(unsettled() == 0);
    }
    if (round > crash_rounds + 5) break;  // the final, crash-free round did not finish
    // The daemon object's destructor kills a daemon still running after a
    // finished round; the next round (if any) restarts it on the same store.
  }

  // Verify the journal through a fresh, crash-free daemon.
  auto daemon = DaemonProcess::Start(DaemonArgs{config, data, {}, {}});
  REQUIRE(daemon != nullptr);
  const CrashTally tally = TallyCrashTest(*daemon, fake, items);
  const auto took_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started).count();
  MESSAGE("crash test: N=" << n << " sigkills=" << sigkills
                           << " failpoint_crashes=" << failpoint_crashes << " restarts=" << restarts
                           << " requests=" << requests.load() << " conflicts=" << conflicts.load()
                           << " retrying=" << retrying.load() << " connection_errors="
                           << connection_errors.load() << " done=" << tally.done
                           << " dead=" << tally.dead << " effects=" << tally.stats["effects"]
                           << " duplicates=" << tally.stats["duplicates_by_key"] << " raw_calls="
                           << tally.stats["raw_calls"] << " replays=" << tally.stats["replays"]
                           << " upsert_overwrites=" << tally.stats["updates"]
                           << " lookups=" << tally.stats["lookups"] << " time_ms=" << took_ms);
  CheckExactlyOnce(tally, n);
  std::string by_failpoint;
  for (const auto& [name, count] : crashes_by_failpoint) {
    by_failpoint += " " + name + "=" + std::to_string(count);
  }
  MESSAGE("crashes by failpoint:" << by_failpoint);
  if (crash_rounds >= static_cast<int>(schedule.size())) {
    // Every step of claim -> (lookup) -> effect -> record crashed at least once.
    CHECK(crashes_by_failpoint.size() == 4);
    CHECK(sigkills >= 3);
  }
}

}  // namespace idem::testing
