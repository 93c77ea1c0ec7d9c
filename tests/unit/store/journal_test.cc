#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <latch>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "daemon/core/failpoints.h"
#include "daemon/store/store.h"
#include "tests/unit/store/store_test_util.h"

namespace idem {
namespace {

using testing::OnPostgres;
using testing::OpenStore;
using testing::TempDir;

using testing::kT0;

ClaimRequest Req(const std::string& work_id, int64_t now_ms, int64_t lease_ms = 1'000) {
  return testing::ClaimReq(work_id, now_ms, lease_ms);
}

ClaimResult MustClaim(Journal& j, const ClaimRequest& r) {
  StatusOr<ClaimResult> c = j.Claim(r);
  REQUIRE_MESSAGE(c.ok(), c.status().ToString());
  return std::move(c).value();
}

std::set<std::string> Ids(const std::vector<WorkItem>& items) {
  std::set<std::string> out;
  for (const WorkItem& w : items) out.insert(w.work_id);
  return out;
}

TEST_CASE("first claim creates a running record with attempt 1 and a lease") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  ClaimResult c = MustClaim(store->journal(), Req("w1", kT0, 5'000));
  CHECK(c.outcome == ClaimOutcome::kClaimed);
  CHECK(c.item.state == WorkState::kRunning);
  CHECK(c.item.attempt == 1);
  CHECK(c.item.lease_token.size() == 32);
  CHECK(c.item.locked_until_ms == kT0 + 5'000);
  CHECK(c.item.identity == Json{{"to", "a@example.com"}});

  StatusOr<WorkItem> got = store->journal().Get("w1");
  REQUIRE(got.ok());
  CHECK(got->state == WorkState::kRunning);
  CHECK(got->lease_token.empty());  // only the claimer learns the token
}

TEST_CASE("64 simultaneous claims of one work_id give exactly one winner") {
  TempDir dir;
  auto store = OpenStore(dir.path(), /*sync=*/true);
  constexpr int kThreads = 64;
  std::latch start(kThreads);
  std::atomic<int> claimed{0}, busy{0}, other{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      start.arrive_and_wait();
      StatusOr<ClaimResult> c = store->journal().Claim(Req("contended", kT0, 60'000));
      if (!c.ok()) {
        ++other;
      } else if (c->outcome == ClaimOutcome::kClaimed) {
        ++claimed;
      } else if (c->outcome == ClaimOutcome::kBusy) {
        ++busy;
      } else {
        ++other;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(claimed.load() == 1);
  CHECK(busy.load() == kThreads - 1);
  CHECK(other.load() == 0);
  StatusOr<WorkItem> got = store->journal().Get("contended");
  REQUIRE(got.ok());
  CHECK(got->attempt == 1);
}

TEST_CASE("a duplicate claim under a live lease is busy until the lease ends") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  MustClaim(store->journal(), Req("w1", kT0, 1'000));
  ClaimResult dup = MustClaim(store->journal(), Req("w1", kT0 + 999, 1'000));
  CHECK(dup.outcome == ClaimOutcome::kBusy);
  CHECK(dup.item.locked_until_ms == kT0 + 1'000);
  CHECK(dup.item.lease_token.empty());
  CHECK(dup.item.attempt == 1);
}

TEST_CASE(
    "claim after an expired lease is granted to the next caller and the stale token is refused") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Journal& j = store->journal();
  ClaimResult first = MustClaim(j, Req("w1", kT0, 1'000));
  ClaimResult second = MustClaim(j, Req("w1", kT0 + 1'000, 1'000));
  CHECK(second.outcome == ClaimOutcome::kClaimed);
  CHECK(second.item.attempt == 2);
  CHECK(second.item.lease_token != first.item.lease_token);
  CHECK(second.item.locked_until_ms == kT0 + 2'000);

  Status stale_complete =
      j.Complete("w1", first.item.lease_token, Json{{"ok", true}}, "ref", kT0 + 1'100);
  CHECK(stale_complete.code() == Code::kFailedPrecondition);
  StatusOr<WorkItem> stale_fail = j.Fail("w1", first.item.lease_token, "x", true, 0, kT0 + 1'100);
  CHECK(stale_fail.status().code() == Code::kFailedPrecondition);
  Status stale_ref = j.RecordExternalRef("w1", first.item.lease_token, "ref", kT0 + 1'100);
  CHECK(stale_ref.code() == Code::kFailedPrecondition);

  CHECK(j.Complete("w1", second.item.lease_token, Json{{"ok", true}}, "ref-2", kT0 + 1'200).ok());
  StatusOr<WorkItem> got = j.Get("w1");
  REQUIRE(got.ok());
  CHECK(got->state == WorkState::kDone);
  CHECK(got->attempt == 2);
  CHECK(got->external_ref == "ref-2");
}

TEST_CASE("an expired lease nobody took over can still complete") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  ClaimResult c = MustClaim(store->journal(), Req("w1", kT0, 1'000));
  CHECK(store->journal().Complete("w1", c.item.lease_token, 1, "", kT0 + 5'000).ok());
  CHECK(store->journal().Get("w1")->state == WorkState::kDone);
}

TEST_CASE(
    "claim of failed work waits out the backoff its failure set, then is granted with the next "
    "attempt") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Journal& j = store->journal();
  ClaimResult c = MustClaim(j, Req("w1", kT0));
  StatusOr<WorkItem> failed = j.Fail("w1", c.item.lease_token, "503 from upstream",
                                     /*retryable=*/true, kT0 + 60'000, kT0 + 10);
  REQUIRE(failed.ok());
  CHECK(failed->state == WorkState::kFailed);
  CHECK(failed->next_attempt_at_ms == kT0 + 60'000);
  CHECK(failed->last_error == "503 from upstream");
  CHECK(failed->lease_token.empty());

  // The old token is spent.
  CHECK(j.Complete("w1", c.item.lease_token, 1, "", kT0 + 20).code() == Code::kFailedPrecondition);

  // Before its next attempt is due, a claim (anyone's) is told when it is.
  ClaimResult early = MustClaim(j, Req("w1", kT0 + 20));
  CHECK(early.outcome == ClaimOutcome::kBackoff);
  CHECK(early.item.state == WorkState::kFailed);
  CHECK(early.item.attempt == 1);
  CHECK(early.item.next_attempt_at_ms == kT0 + 60'000);
  CHECK(early.item.lease_token.empty());
  CHECK(j.Get("w1")->updated_at_ms == kT0 + 10);  // nothing written

  ClaimResult again = MustClaim(j, Req("w1", kT0 + 60'000));
  CHECK(again.outcome == ClaimOutcome::kClaimed);
  CHECK(again.item.attempt == 2);
  CHECK(again.item.last_error == "503 from upstream");
  // Done, the record no longer carries the earlier attempt's error.
  REQUIRE(j.Complete("w1", again.item.lease_token, 1, "", kT0 + 60'001).ok());
  CHECK(j.Get("w1")->last_error.empty());
}

TEST_CASE(
    "a fail retried by its holder is answered as the first one left the work, and writes "
    "nothing") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Journal& j = store->journal();
  ClaimRequest r = Req("w1", kT0);
  r.max_attempts = 2;
  ClaimResult c1 = MustClaim(j, r);
  StatusOr<WorkItem> first = j.Fail("w1", c1.item.lease_token, "503", true, kT0 + 60'000, kT0 + 1);
  REQUIRE(first.ok());
  StatusOr<WorkItem> again =
      j.Fail("w1", c1.item.lease_token, "other error", true, kT0 + 90'000, kT0 + 2);
  REQUIRE_MESSAGE(again.ok(), again.status().ToString());
  CHECK(again->state == WorkState::kFailed);
  CHECK(again->last_error == "503");
  CHECK(again->next_attempt_at_ms == kT0 + 60'000);
  CHECK(again->updated_at_ms == first->updated_at_ms);
  CHECK(again->lease_token.empty());  // never handed out again
  // The next claim takes a new lease; the old token holds nothing any more.
  ClaimRequest due = r;
  due.now_ms = kT0 + 60'000;  // its backoff waited out
  ClaimResult c2 = MustClaim(j, due);
  REQUIRE(c2.outcome == ClaimOutcome::kClaimed);
  CHECK(c2.item.lease_token != c1.item.lease_token);
  CHECK(j.Fail("w1", c1.item.lease_token, "x", true, 0, kT0 + 3).status().code() ==
        Code::kFailedPrecondition);
  // The last attempt fails for good; its holder's retry says dead, once.
  REQUIRE(j.Fail("w1", c2.item.lease_token, "550", false, 0, kT0 + 4)->state == WorkState::kDead);
  StatusOr<WorkItem> dead_again = j.Fail("w1", c2.item.lease_token, "550", false, 0, kT0 + 5);
  REQUIRE(dead_again.ok());
  CHECK(dead_again->state == WorkState::kDead);
  CHECK(dead_again->updated_at_ms == kT0 + 4);
  CHECK(j.DeadLetters(10)->size() == 1);
}

TEST_CASE("fail with no attempts left makes the work dead") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Journal& j = store->journal();
  ClaimRequest r = Req("w1", kT0);
  r.max_attempts = 2;
  ClaimResult c1 = MustClaim(j, r);
  CHECK(j.Fail("w1", c1.item.lease_token, "e1", true, kT0, kT0)->state == WorkState::kFailed);
  ClaimResult c2 = MustClaim(j, r);
  CHECK(c2.item.attempt == 2);
  StatusOr<WorkItem> dead = j.Fail("w1", c2.item.lease_token, "e2", true, kT0, kT0);
  REQUIRE(dead.ok());
  CHECK(dead->state == WorkState::kDead);
  CHECK(dead->last_error == "e2");

  ClaimResult after = MustClaim(j, r);
  CHECK(after.outcome == ClaimOutcome::kDead);
  CHECK(after.item.last_error == "e2");
  std::vector<WorkItem> dlq = j.DeadLetters(10).value();
  REQUIRE(dlq.size() == 1);
  CHECK(dlq[0].work_id == "w1");
  CHECK(j.CountDeadLetters(10).value() == 1);
  CHECK(j.CountDeadLetters(0).value() == 0);  // counted up to the cap
  REQUIRE(j.Requeue("w1", kT0 + 1).ok());
  CHECK(j.CountDeadLetters(10).value() == 0);
}

TEST_CASE(
    "a claim in the same millisecond as the fail that made work dead says it buried nothing: a "
    "dead letter is counted once") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  ClaimRequest r = Req("w1", kT0);
  r.max_attempts = 1;
  ClaimResult c = MustClaim(store->journal(), r);
  REQUIRE(
      store->journal().Fail("w1", c.item.lease_token, "boom", /*retryable=*/true, 0, kT0 + 7).ok());
  r.now_ms = kT0 + 7;  // the fail's own millisecond
  ClaimResult seen = MustClaim(store->journal(), r);
  CHECK(seen.outcome == ClaimOutcome::kDead);
  CHECK(seen.item.updated_at_ms == r.now_ms);
  CHECK_FALSE(seen.buried);
  std::vector<StatusOr<ClaimResult>> many = store->journal().ClaimMany(std::span(&r, 1));
  REQUIRE(many[0].ok());
  CHECK(many[0]->outcome == ClaimOutcome::kDead);
  CHECK_FALSE(many[0]->buried);
}

TEST_CASE("a non-retryable failure makes the work dead at once") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  ClaimResult c = MustClaim(store->journal(), Req("w1", kT0));
  StatusOr<WorkItem> w = store->journal().Fail("w1", c.item.lease_token, "400 bad request",
                                               /*retryable=*/false, 0, kT0);
  REQUIRE(w.ok());
  CHECK(w->state == WorkState::kDead);
  CHECK(w->attempt == 1);
}

TEST_CASE("a crash on the last attempt makes the work dead instead of claimed") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  ClaimRequest r = Req("w1", kT0, 1'000);
  r.max_attempts = 1;
  MustClaim(store->journal(), r);
  r.now_ms = kT0 + 1'000;
  ClaimResult c = MustClaim(store->journal(), r);
  CHECK(c.outcome == ClaimOutcome::kDead);
  CHECK(c.buried);  // this claim wrote the dead letter
  CHECK(c.item.state == WorkState::kDead);
  CHECK(c.item.lease_token.empty());
  CHECK(store->journal().Get("w1")->state == WorkState::kDead);
  // The next claim finds it dead: it buried nothing, even in the same ms.
  ClaimResult again = MustClaim(store->journal(), r);
  CHECK(again.outcome == ClaimOutcome::kDead);
  CHECK_FALSE(again.buried);
  CHECK(Ids(store->journal().DeadLetters(10).value()) == std::set<std::string>{"w1"});
  CHECK(store->journal().Due(kT0 + 10'000, 10)->empty());
}

TEST_CASE(
    "the holder whose lease ran out on the last attempt can still complete it: its effect is "
    "recorded, not run again after a replay") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Journal& j = store->journal();
  ClaimRequest r = Req("w1", kT0, 1'000);
  r.max_attempts = 1;
  ClaimResult slow = MustClaim(j, r);
  // Another caller's claim finds the lease over: dead, no token for it.
  r.now_ms = kT0 + 1'500;
  ClaimResult second = MustClaim(j, r);
  CHECK(second.outcome == ClaimOutcome::kDead);
  CHECK(second.item.lease_token.empty());
  CHECK(second.item.last_error.find("still working") != std::string::npos);
  // The slow holder finishes its charge and completes: taken.
  REQUIRE(
      j.Complete("w1", slow.item.lease_token, Json{{"charge", "ch_1"}}, "ch_1", kT0 + 2'000).ok());
  StatusOr<WorkItem> done = j.Get("w1");
  CHECK(done->state == WorkState::kDone);
  CHECK(done->external_ref == "ch_1");
  CHECK(j.DeadLetters(10)->empty());
  // A made-up token is still refused, and a replay finds nothing dead.
  CHECK_FALSE(j.Complete("w1", "0123456789abcdef0123456789abcdef", 1, "", kT0 + 2'100).ok());
  CHECK(j.Requeue("w1", kT0 + 3'000).status().code() == Code::kFailedPrecondition);

  // A holder's fail whose text reads like the bury is its own: no complete
  // after it.
  ClaimRequest r3 = Req("w3", kT0, 1'000);
  r3.max_attempts = 1;
  ClaimResult own = MustClaim(j, r3);
  REQUIRE(j.Fail("w3", own.item.lease_token, "lease expired on attempt 1 of 1: upstream said so",
                 false, 0, kT0 + 100)
              .ok());
  CHECK_FALSE(j.Complete("w3", own.item.lease_token, 1, "", kT0 + 200).ok());
  CHECK(j.Get("w3")->state == WorkState::kDead);

  // Once the dead letter is replayed, the old lease holds nothing.
  ClaimRequest r2 = Req("w2", kT0, 1'000);
  r2.max_attempts = 1;
  ClaimResult old = MustClaim(j, r2);
  r2.now_ms = kT0 + 1'500;
  CHECK(MustClaim(j, r2).outcome == ClaimOutcome::kDead);
  REQUIRE(j.Requeue("w2", kT0 + 1'600).ok());
  CHECK_FALSE(j.Complete("w2", old.item.lease_token, 1, "", kT0 + 1'700).ok());
}

TEST_CASE("requeue revives a dead item with a fresh attempt budget") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Journal& j = store->journal();
  ClaimRequest r = Req("w1", kT0);
  r.max_attempts = 1;
  ClaimResult c = MustClaim(j, r);
  REQUIRE(j.Fail("w1", c.item.lease_token, "boom", true, 0, kT0)->state == WorkState::kDead);

  StatusOr<WorkItem> requeued = j.Requeue("w1", kT0 + 100);
  REQUIRE(requeued.ok());
  CHECK(requeued->state == WorkState::kPending);
  CHECK(requeued->attempt == 0);
  CHECK(requeued->next_attempt_at_ms == kT0 + 100);
  CHECK(j.DeadLetters(10)->empty());
  CHECK(Ids(j.Due(kT0 + 100, 10).value()) == std::set<std::string>{"w1"});

  r.now_ms = kT0 + 200;
  ClaimResult again = MustClaim(j, r);
  CHECK(again.outcome == ClaimOutcome::kClaimed);
  CHECK(again.item.attempt == 1);

  CHECK(j.Requeue("w1", kT0 + 300).status().code() == Code::kFailedPrecondition);
  CHECK(j.Requeue("nope", kT0 + 300).status().code() == Code::kNotFound);
}

TEST_CASE("a duplicate of done work returns the original result and external_ref") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Journal& j = store->journal();
  ClaimResult c = MustClaim(j, Req("w1", kT0));
  REQUIRE(j.Complete("w1", c.item.lease_token, Json{{"message_id", 42}}, "tg:42", kT0 + 5).ok());

  ClaimResult dup = MustClaim(j, Req("w1", kT0 + 10));
  CHECK(dup.outcome == ClaimOutcome::kDone);
  CHECK(dup.item.result == Json{{"message_id", 42}});
  CHECK(dup.item.external_ref == "tg:42");
  CHECK(dup.item.attempt == 1);
  CHECK(dup.item.lease_token.empty());
  CHECK(dup.item.expires_at_ms == 0);  // window 0: remembered forever
}

TEST_CASE(
    "completing again with the same token changes nothing, and another result than the first's is "
    "refused") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Journal& j = store->journal();
  ClaimResult c = MustClaim(j, Req("w1", kT0));
  REQUIRE(j.Complete("w1", c.item.lease_token, 1, "r1", kT0 + 5).ok());
  CHECK(j.Complete("w1", c.item.lease_token, 1, "r1", kT0 + 6).ok());
  CHECK(j.Complete("w1", c.item.lease_token, 1, "", kT0 + 6).ok());  // no ref: not another one
  Status other_result = j.Complete("w1", c.item.lease_token, 2, "r1", kT0 + 6);
  CHECK(other_result.code() == Code::kFailedPrecondition);
  CHECK(other_result.field() == "/result");
  Status other_ref = j.Complete("w1", c.item.lease_token, 1, "r2", kT0 + 6);
  CHECK(other_ref.code() == Code::kFailedPrecondition);
  CHECK(other_ref.field() == "/external_ref");  // the member that differs
  CHECK(other_ref.message().find("another external_ref") != std::string::npos);
  // A fail by the lease that completed it says so, and changes nothing.
  StatusOr<WorkItem> fail_after = j.Fail("w1", c.item.lease_token, "late", true, 0, kT0 + 7);
  CHECK(fail_after.status().code() == Code::kFailedPrecondition);
  CHECK(fail_after.status().message().find("a fail after a complete") != std::string::npos);
  CHECK(j.Get("w1")->state == WorkState::kDone);
  CHECK(j.Get("w1")->result == 1);
  CHECK(j.Get("w1")->external_ref == "r1");
  CHECK(j.Complete("w1", "not-the-token", 2, "r2", kT0 + 6).code() == Code::kFailedPrecondition);
  CHECK(j.Complete("absent", "t", 2, "r2", kT0 + 6).code() == Code::kNotFound);
}

TEST_CASE("an external ref recorded while running survives a completion without one") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Journal& j = store->journal();
  ClaimResult c = MustClaim(j, Req("w1", kT0));
  REQUIRE(j.RecordExternalRef("w1", c.item.lease_token, "crm:7", kT0 + 1).ok());
  CHECK(j.Get("w1")->external_ref == "crm:7");
  CHECK(j.Get("w1")->state == WorkState::kRunning);
  REQUIRE(j.Complete("w1", c.item.lease_token, Json::object(), "", kT0 + 2).ok());
  CHECK(j.Get("w1")->external_ref == "crm:7");
}

TEST_CASE("window expiry makes done work new again and the sweep forgets it") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Journal& j = store->journal();
  ClaimRequest r = Req("w1", kT0);
  r.window_ms = 1'000;
  ClaimResult c = MustClaim(j, r);
  REQUIRE(j.Complete("w1", c.item.lease_token, "first", "ref-1", kT0 + 10).ok());
  CHECK(j.Get("w1")->expires_at_ms == kT0 + 1'010);

  r.now_ms = kT0 + 1'009;
  CHECK(MustClaim(j, r).outcome == ClaimOutcome::kDone);
  CHECK(j.SweepExpired(kT0 + 1'009, 100).value() == 0);

  r.now_ms = kT0 + 1'010;
  ClaimResult fresh = MustClaim(j, r);
  CHECK(fresh.outcome == ClaimOutcome::kClaimed);
  CHECK(fresh.item.attempt == 1);
  CHECK(fresh.item.result.is_null());
  CHECK(fresh.item.external_ref.empty());
  CHECK(j.DoneWithRef("send_email", 10)->empty());  // the old done index entry went with it
}

TEST_CASE(
    "the call that made work stays with it through claims, failures and completion, and a new "
    "incarnation records its own") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Journal& j = store->journal();
  ClaimRequest r = Req("w1", kT0);
  r.window_ms = 1'000;
  r.call_id = std::string(64, 'a');
  ClaimResult c = MustClaim(j, r);
  CHECK(c.item.call_id == r.call_id);
  REQUIRE(j.Fail("w1", c.item.lease_token, "boom", true, 0, kT0 + 1).ok());
  // Another call's claim takes the work over; the work is still the first call's.
  ClaimRequest other = r;
  other.call_id = std::string(64, 'b');
  other.now_ms = kT0 + 2;
  ClaimResult again = MustClaim(j, other);
  REQUIRE(again.outcome == ClaimOutcome::kClaimed);
  CHECK(again.item.call_id == r.call_id);
  REQUIRE(j.Complete("w1", again.item.lease_token, "sent", "", kT0 + 3).ok());
  CHECK(j.Get("w1")->call_id == r.call_id);
  other.now_ms = kT0 + 4;
  ClaimResult dup = MustClaim(j, other);
  CHECK(dup.outcome == ClaimOutcome::kDone);
  CHECK(dup.item.call_id == r.call_id);
  // Past the window the same identity is new work: the call that claims it made it.
  other.now_ms = kT0 + 1'003;
  ClaimResult fresh = MustClaim(j, other);
  CHECK(fresh.outcome == ClaimOutcome::kClaimed);
  CHECK(fresh.item.call_id == other.call_id);
  CHECK(j.Get("w1")->call_id == other.call_id);
  // A batch claim and an enqueue record theirs; a call without a key, none.
  ClaimRequest batched = Req("w2", kT0);
  batched.call_id = std::string(64, 'c');
  ClaimRequest keyless = Req("w3", kT0);
  std::vector<ClaimRequest> both = {batched, keyless};
  for (const auto& got : j.ClaimMany(both)) REQUIRE(got.ok());
  CHECK(j.Get("w2")->call_id == batched.call_id);
  CHECK(j.Get("w3")->call_id.empty());
  ClaimRequest queued = Req("w4", kT0);
  queued.call_id = std::string(64, 'd');
  REQUIRE(j.Enqueue(queued).ok());
  CHECK(j.Get("w4")->call_id == queued.call_id);
}

TEST_CASE("sweeping removes expired done work and its index entries only") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Journal& j = store->journal();
  for (const char* id : {"a", "b", "c"}) {
    ClaimRequest r = Req(id, kT0);
    r.window_ms = std::string(id) == "c" ? 0 : 1'000;
    r.run_id = "run-1";
    ClaimResult c = MustClaim(j, r);
    REQUIRE(j.Complete(id, c.item.lease_token, 1, std::string("ref-") + id, kT0).ok());
  }
  CHECK(j.SweepExpired(kT0 + 5'000, 1).value() == 1);
  CHECK(j.SweepExpired(kT0 + 5'000, 10).value() == 1);
  CHECK(j.SweepExpired(kT0 + 5'000, 10).value() == 0);
  CHECK(j.Get("a").status().code() == Code::kNotFound);
  CHECK(j.Get("b").status().code() == Code::kNotFound);
  CHECK(j.Get("c").ok());
  CHECK(Ids(j.ByRun("run-1", 10).value()) == std::set<std::string>{"c"});
  CHECK(Ids(j.DoneWithRef("send_email", 10).value()) == std::set<std::string>{"c"});
}

TEST_CASE("Due passes over the kinds it is told to skip, however many are due before the rest") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Journal& j = store->journal();
  for (int i = 0; i < 300; ++i) {
    ClaimRequest r = Req("client-" + std::to_string(i), kT0 + i);
    r.kind = "manual";
    REQUIRE(j.Enqueue(r).ok());
  }
  ClaimRequest mine = Req("daemon-1", kT0 + 1'000);
  mine.kind = "send_reply";
  REQUIRE(j.Enqueue(mine).ok());
  const int64_t now = kT0 + 5'000;
  CHECK(Ids(j.Due(now, 256).value()).count("daemon-1") == 0);  // behind 300 older ones
  std::vector<WorkItem> due = j.Due(now, 256, {"manual"}).value();
  CHECK(Ids(due) == std::set<std::string>{"daemon-1"});
  CHECK(j.Due(now, 256, {"other"})->size() == 256);
}

TEST_CASE("Due returns due and lease-expired items only") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Journal& j = store->journal();
  const int64_t now = kT0 + 10'000;

  REQUIRE(j.Enqueue(Req("pending-due", kT0)).ok());
  REQUIRE(j.Enqueue(Req("pending-later", now + 1)).ok());
  ClaimResult f1 = MustClaim(j, Req("failed-due", kT0));
  REQUIRE(j.Fail("failed-due", f1.item.lease_token, "e", true, now, kT0).ok());
  ClaimResult f2 = MustClaim(j, Req("failed-later", kT0));
  REQUIRE(j.Fail("failed-later", f2.item.lease_token, "e", true, now + 1, kT0).ok());
  MustClaim(j, Req("running-live", now - 1, 2));             // until now + 1
  MustClaim(j, Req("running-expired", now - 1'000, 1'000));  // until now
  ClaimResult d = MustClaim(j, Req("done", kT0));
  REQUIRE(j.Complete("done", d.item.lease_token, 1, "", kT0).ok());
  ClaimResult x = MustClaim(j, Req("dead", kT0));
  REQUIRE(j.Fail("dead", x.item.lease_token, "e", false, 0, kT0).ok());

  std::vector<WorkItem> due = j.Due(now, 100).value();
  CHECK(Ids(due) == std::set<std::string>{"pending-due", "failed-due", "running-expired"});
  for (const WorkItem& w : due) CHECK(w.lease_token.empty());
  CHECK(j.Due(now, 2)->size() == 2);
  CHECK(j.Due(now, 0)->empty());
  CHECK(Ids(j.Due(now + 1, 100).value()) ==
        std::set<std::string>{"pending-due", "pending-later", "failed-due", "failed-later",
                              "running-live", "running-expired"});

  // Claiming a due item takes it out of the due set until its lease ends.
  MustClaim(j, Req("pending-due", now, 5'000));
  CHECK(Ids(j.Due(now, 100).value()) == std::set<std::string>{"failed-due", "running-expired"});
}

TEST_CASE("enqueue creates pending work due now and leaves existing work untouched") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Journal& j = store->journal();
  StatusOr<WorkItem> e = j.Enqueue(Req("w1", kT0));
  REQUIRE(e.ok());
  CHECK(e->state == WorkState::kPending);
  CHECK(e->attempt == 0);
  CHECK(e->next_attempt_at_ms == kT0);

  ClaimResult c = MustClaim(j, Req("w1", kT0 + 1));
  CHECK(c.outcome == ClaimOutcome::kClaimed);
  CHECK(c.item.attempt == 1);
  ClaimRequest other = Req("w1", kT0 + 2);
  other.args = Json{{"subject", "changed"}};
  StatusOr<WorkItem> again = j.Enqueue(other);
  REQUIRE(again.ok());
  CHECK(again->state == WorkState::kRunning);
  CHECK(again->args == Json{{"subject", "hi"}});
  CHECK(again->lease_token.empty());
}

TEST_CASE("ByRun lists the items of one run in creation order") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Journal& j = store->journal();
  for (int i = 0; i < 5; ++i) {
    ClaimRequest r = Req("w" + std::to_string(i), kT0 + 10 - i);  // created in reverse id order
    r.run_id = i % 2 == 0 ? "run-a" : "run-b";
    REQUIRE(j.Enqueue(r).ok());
  }
  std::vector<WorkItem> a = j.ByRun("run-a", 10).value();
  REQUIRE(a.size() == 3);
  CHECK(a[0].work_id == "w4");
  CHECK(a[1].work_id == "w2");
  CHECK(a[2].work_id == "w0");
  CHECK(j.ByRun("run-a", 2)->size() == 2);
  CHECK(Ids(j.ByRun("run-b", 10).value()) == std::set<std::string>{"w1", "w3"});
  CHECK(j.ByRun("run-c", 10)->empty());
  CHECK(j.ByRun("run", 10)->empty());  // a prefix of a run id is another run
}

TEST_CASE(
    "ByRun pages on from a position: each item once, in (created, work_id) order, items taken "
    "in included") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Journal& j = store->journal();
  // Seven items of run-p, three of them made in one millisecond (ordered
  // by work_id there), and one of another run taken in.
  const std::vector<std::pair<std::string, int64_t>> made = {
      {"w5", kT0 + 1}, {"w2", kT0 + 2}, {"w9", kT0 + 3}, {"w1", kT0 + 3},
      {"w7", kT0 + 3}, {"w0", kT0 + 5}, {"w3", kT0 + 6}};
  for (const auto& m : made) {
    ClaimRequest r = Req(m.first, m.second);
    r.run_id = "run-p";
    REQUIRE(j.Enqueue(r).ok());
  }
  ClaimRequest other = Req("w4", kT0 + 4);
  other.run_id = "run-q";
  REQUIRE(j.Enqueue(other).ok());
  REQUIRE(j.AddToRun("w4", "run-p").ok());
  const std::vector<std::string> order = {"w5", "w2", "w1", "w7", "w9", "w4", "w0", "w3"};
  for (size_t page_size : {1u, 2u, 3u, 8u}) {
    CAPTURE(page_size);
    std::vector<std::string> seen;
    RunPosition at;
    for (int pages = 0; pages < 20; ++pages) {
      StatusOr<std::vector<WorkItem>> page = j.ByRun("run-p", page_size, at);
      REQUIRE_MESSAGE(page.ok(), page.status().ToString());
      if (page->empty()) break;
      for (const WorkItem& w : *page) seen.push_back(w.work_id);
      at = RunPosition{page->back().created_at_ms, page->back().work_id};
    }
    CHECK(seen == order);
  }
  // A position between items (one no item has) starts at the next one.
  StatusOr<std::vector<WorkItem>> from = j.ByRun("run-p", 2, RunPosition{kT0 + 3, "w3"});
  REQUIRE(from.ok());
  CHECK(Ids(*from) == std::set<std::string>{"w7", "w9"});
  // After the last: nothing; another run's positions do not leak in.
  CHECK(j.ByRun("run-p", 5, RunPosition{kT0 + 6, "w3"})->empty());
  CHECK(Ids(j.ByRun("run-q", 5, RunPosition{kT0 + 1, "w5"}).value()) ==
        std::set<std::string>{"w4"});
}

TEST_CASE(
    "AddToRun takes existing work into another run: listed once in creation order, through "
    "claims and completion, and no longer once the work is swept or made anew") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Journal& j = store->journal();
  for (int i = 0; i < 3; ++i) {
    ClaimRequest r = Req("w" + std::to_string(i), kT0 + i);
    r.run_id = i == 0 ? "run-a" : i == 1 ? "run-b" : "";
    r.window_ms = 1'000;
    REQUIRE(j.Enqueue(r).ok());
  }
  for (const char* id : {"w2", "w1", "w1", "w0"}) {  // w0 is run-a's own; w1 twice
    CAPTURE(id);
    Status added = j.AddToRun(id, "run-a");
    CHECK_MESSAGE(added.ok(), added.ToString());
  }
  auto listed = [&j](const std::string& run) {
    std::vector<std::string> ids;
    StatusOr<std::vector<WorkItem>> items = j.ByRun(run, 10);
    REQUIRE_MESSAGE(items.ok(), items.status().ToString());
    for (const WorkItem& w : *items) ids.push_back(w.work_id);
    return ids;
  };
  CHECK(listed("run-a") == std::vector<std::string>{"w0", "w1", "w2"});
  CHECK(listed("run-b") == std::vector<std::string>{"w1"});
  CHECK(j.ByRun("run-a", 2)->size() == 2);
  CHECK(j.AddToRun("nope", "run-a").code() == Code::kNotFound);
  CHECK(j.AddToRun("w1", "").code() == Code::kInvalidArgument);

  // Claimed and done: still in both runs.
  ClaimResult c1 = MustClaim(j, Req("w1", kT0 + 10));
  REQUIRE(j.Complete("w1", c1.item.lease_token, 1, "", kT0 + 10).ok());
  ClaimResult c2 = MustClaim(j, Req("w2", kT0 + 10));
  REQUIRE(j.Complete("w2", c2.item.lease_token, 1, "", kT0 + 10).ok());
  CHECK(listed("run-a") == std::vector<std::string>{"w0", "w1", "w2"});

  // w1 swept after its window; w2 made anew after its window, under run-c.
  ClaimRequest anew = Req("w2", kT0 + 5'000);
  anew.run_id = "run-c";
  anew.window_ms = 0;
  ClaimResult fresh = MustClaim(j, anew);
  CHECK(fresh.item.attempt == 1);
  CHECK(j.SweepExpired(kT0 + 5'000, 10).value() == 1);  // w1
  CHECK(listed("run-a") == std::vector<std::string>{"w0"});
  CHECK(listed("run-b").empty());
  CHECK(listed("run-c") == std::vector<std::string>{"w2"});
}

TEST_CASE(
    "work taken into more runs than kMaxOtherRuns stays listed in the newest of them and its "
    "record stays bounded") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Journal& j = store->journal();
  ClaimRequest r = Req("w", kT0);
  r.run_id = "own";
  REQUIRE(j.Enqueue(r).ok());
  const size_t runs = kMaxOtherRuns + 6;
  for (size_t i = 0; i < runs; ++i) {
    Status added = j.AddToRun("w", "run-" + std::to_string(i));
    REQUIRE_MESSAGE(added.ok(), added.ToString());
  }
  StatusOr<WorkItem> w = j.Get("w");
  REQUIRE(w.ok());
  CHECK(w->other_runs.size() <= kMaxOtherRuns);
  CHECK(j.ByRun("own", 10)->size() == 1);  // the run it was made under is never dropped
  for (size_t i = runs - kMaxOtherRuns; i < runs; ++i) {
    CAPTURE(i);
    CHECK(j.ByRun("run-" + std::to_string(i), 10)->size() == 1);
  }
  if (!OnPostgres()) {
    // RocksDB keeps the runs in the record: the oldest left it, and their
    // index entries with them (a run lists only what names it).
    CHECK(w->other_runs.front() == "run-" + std::to_string(runs - kMaxOtherRuns));
    for (size_t i = 0; i < runs - kMaxOtherRuns; ++i) {
      CAPTURE(i);
      CHECK(j.ByRun("run-" + std::to_string(i), 10)->empty());
    }
  }
  // Taking it into a run it is in already changes nothing.
  REQUIRE(j.AddToRun("w", "run-" + std::to_string(runs - 1)).ok());
  CHECK(j.Get("w")->other_runs == w->other_runs);
}

TEST_CASE("DoneWithRef lists done items of a kind that carry an external ref, newest first") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Journal& j = store->journal();
  auto done = [&](const std::string& id, const std::string& kind, const std::string& ref,
                  int64_t at) {
    ClaimRequest r = Req(id, at);
    r.kind = kind;
    ClaimResult c = MustClaim(j, r);
    REQUIRE(j.Complete(id, c.item.lease_token, 1, ref, at).ok());
  };
  done("old", "crm", "crm:1", kT0);
  done("new", "crm", "crm:2", kT0 + 5);
  done("noref", "crm", "", kT0 + 6);
  done("other", "mail", "m:1", kT0 + 7);
  ClaimRequest r = Req("running", kT0);
  r.kind = "crm";
  ClaimResult c = MustClaim(j, r);
  REQUIRE(j.RecordExternalRef("running", c.item.lease_token, "crm:3", kT0).ok());

  std::vector<WorkItem> crm = j.DoneWithRef("crm", 10).value();
  REQUIRE(crm.size() == 2);
  CHECK(crm[0].work_id == "new");
  CHECK(crm[1].work_id == "old");
  CHECK(Ids(j.DoneWithRef("mail", 10).value()) == std::set<std::string>{"other"});
}

TEST_CASE("claims with bad arguments are refused before anything is written") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  ClaimRequest r = Req("", kT0);
  CHECK(store->journal().Claim(r).status().code() == Code::kInvalidArgument);
  r = Req("w", kT0, 0);
  CHECK(store->journal().Claim(r).status().code() == Code::kInvalidArgument);
  r = Req("w", kT0);
  r.max_attempts = 0;
  CHECK(store->journal().Enqueue(r).status().code() == Code::kInvalidArgument);
  CHECK(store->journal().Get("w").status().code() == Code::kNotFound);
}

TEST_CASE("a failing disk write fails the claim and leaves no record") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  REQUIRE(Failpoints::Set("store.write=error").ok());
  StatusOr<ClaimResult> c = store->journal().Claim(Req("w1", kT0));
  Failpoints::Clear();
  CHECK(c.status().code() == Code::kUnavailable);
  CHECK(c.status().retryable());
  CHECK(store->journal().Get("w1").status().code() == Code::kNotFound);
  CHECK(MustClaim(store->journal(), Req("w1", kT0)).outcome == ClaimOutcome::kClaimed);
}

TEST_CASE("duplicate claims and idempotency replays write nothing") {
  TempDir dir;
  auto store = OpenStore(dir.path());
  Journal& j = store->journal();
  ClaimResult done = MustClaim(j, Req("done", kT0));
  REQUIRE(j.Complete("done", done.item.lease_token, 1, "ref", kT0).ok());
  MustClaim(j, Req("busy", kT0, 60'000));
  ClaimRequest dead_req = Req("dead", kT0);
  ClaimResult dead = MustClaim(j, dead_req);
  REQUIRE(j.Fail("dead", dead.item.lease_token, "e", false, 0, kT0).ok());
  REQUIRE(store->idem_keys().Begin("s", "k", "fp", "r", kT0, 60'000, 1'000).ok());
  REQUIRE(store->idem_keys().Finish("s", "k", "fp", 200, "{}", "application/json", kT0).ok());

  // With every write failing, only answers that need no write still work.
  REQUIRE(Failpoints::Set("store.write=error").ok());
  StatusOr<ClaimResult> d = j.Claim(Req("done", kT0 + 1));
  StatusOr<ClaimResult> b = j.Claim(Req("busy", kT0 + 1));
  StatusOr<ClaimResult> x = j.Claim(Req("dead", kT0 + 1));
  StatusOr<WorkItem> e = j.Enqueue(Req("done", kT0 + 1));
  StatusOr<BeginResult> replay =
      store->idem_keys().Begin("s", "k", "fp", "r", kT0 + 1, 60'000, 1'000);
  StatusOr<BeginResult> mismatch =
      store->idem_keys().Begin("s", "k", "other", "r", kT0 + 1, 60'000, 1'000);
  StatusOr<ClaimResult> fresh = j.Claim(Req("fresh", kT0 + 1));
  Failpoints::Clear();
  CHECK((d.ok() && d->outcome == ClaimOutcome::kDone));
  CHECK((b.ok() && b->outcome == ClaimOutcome::kBusy));
  CHECK((x.ok() && x->outcome == ClaimOutcome::kDead));
  CHECK((e.ok() && e->state == WorkState::kDone));
  CHECK((replay.ok() && replay->outcome == BeginOutcome::kReplay));
  CHECK((mismatch.ok() && mismatch->outcome == BeginOutcome::kMismatch));
  CHECK(fresh.status().code() == Code::kUnavailable);  // the failpoint was live
}

TEST_CASE("a stored journal record that cannot be decoded reads as Internal" *
          doctest::test_suite("rocksdb")) {
  TempDir dir;
  {
    auto store = OpenStore(dir.path());
    REQUIRE(store->journal().Enqueue(Req("w1", kT0)).ok());
  }
  testing::WithRawDb(dir.path(), [](rocksdb::DB& db, auto& cfs) {
    REQUIRE(db.Put(rocksdb::WriteOptions(), cfs.at("journal"), "w1", "{not json").ok());
    REQUIRE(db.Put(rocksdb::WriteOptions(), cfs.at("journal"), "w2",
                   R"({"work_id":"w2","state":"running","attempt":"one"})")
                .ok());
  });
  auto store = OpenStore(dir.path());
  CHECK(store->journal().Get("w1").status().code() == Code::kInternal);
  CHECK(store->journal().Claim(Req("w1", kT0)).status().code() == Code::kInternal);
  CHECK(store->journal().Get("w2").status().code() == Code::kInternal);
}

}  // namespace
}  // namespace idem
