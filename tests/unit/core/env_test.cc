#include "daemon/core/env.h"

#include <doctest/doctest.h>

namespace idem {
namespace {

TEST_CASE("a fake sleep advances both clocks without waiting") {
  FakeEnv env(1'000'000);
  const int64_t mono = env.MonoNanos();
  env.SleepMillis(1500);
  CHECK(env.WallMillis() == 1'001'500);
  CHECK(env.MonoNanos() - mono == 1'500'000'000);
  CHECK(env.total_slept_ms() == 1500);
}

TEST_CASE("the stable clock follows the monotonic clock across wall-clock jumps") {
  FakeEnv env(1'000'000);
  StableClock clock(env);
  CHECK(clock.NowMillis() == 1'000'000);
  env.JumpWall(-3'600'000);
  CHECK(clock.NowMillis() == 1'000'000);
  env.JumpWall(+7'200'000);
  CHECK(clock.NowMillis() == 1'000'000);
  env.Advance(250);
  CHECK(clock.NowMillis() == 1'000'250);
}

TEST_CASE("fake randomness is reproducible from its seed") {
  FakeEnv a(0, 7), b(0, 7);
  CHECK(a.Random64() == b.Random64());
  const double u = a.RandomUnit();
  CHECK(u >= 0.0);
  CHECK(u < 1.0);
}

}  // namespace
}  // namespace idem
