// Env: the one place time, sleep and randomness come from.
//
// Only RealEnv reads the system clocks, sleeps for real or draws from the
// OS random source. Tests use FakeEnv, whose sleep only moves its clocks,
// so nothing in a unit test waits for real and clock jumps can be staged.
//
// Thread-safety: every method of both implementations may be called from
// any thread concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <random>

namespace idem {

class Env {
 public:
  virtual ~Env() = default;
  // Wall clock, milliseconds since the Unix epoch. May jump (NTP, operator).
  virtual int64_t WallMillis() = 0;
  // Monotonic clock, nanoseconds from an arbitrary origin. Never goes back.
  virtual int64_t MonoNanos() = 0;
  virtual void SleepMillis(int64_t ms) = 0;
  // Uniformly distributed 64 random bits (for jitter and tokens' salt).
  virtual uint64_t Random64() = 0;
  // A uniformly distributed double in [0, 1).
  double RandomUnit() { return static_cast<double>(Random64() >> 11) * 0x1.0p-53; }

  // The process-wide real environment.
  static Env& Real();
};

class RealEnv final : public Env {
 public:
  int64_t WallMillis() override;
  int64_t MonoNanos() override;
  void SleepMillis(int64_t ms) override;
  uint64_t Random64() override;

 private:
  std::mutex mu_;
  std::mt19937_64 rng_{std::random_device{}()};
};

// Names the calling thread (its comm: top -H, ps -L, perf, gdb) "idem-" +
// `role`, cut to the kernel's 15 bytes. Threads the daemon starts name
// themselves by role, so an operator can tell the event loops from the
// store's writer; a thread that does not keeps its parent's name.
void NameThread(const char* role);

// Hands the memory the allocator holds free back to the system, so RSS
// comes down after a burst: jemalloc's arenas are purged when the process
// runs on jemalloc (the daemon binary links it; the libraries and tests do
// not, so it is looked up at run time), glibc's heap is trimmed otherwise.
// Thread-safe.
void ReleaseFreeMemory();

// A controllable Env for tests. Sleep advances both clocks by the slept
// amount; Advance moves both; JumpWall moves only the wall clock (to stage
// NTP steps backwards or forwards).
class FakeEnv final : public Env {
 public:
  explicit FakeEnv(int64_t wall_millis = 1'700'000'000'000, uint64_t seed = 42)
      : wall_ms_(wall_millis), rng_(seed) {}

  int64_t WallMillis() override { return wall_ms_.load(); }
  int64_t MonoNanos() override { return mono_ns_.load(); }
  void SleepMillis(int64_t ms) override {
    slept_ms_ += ms;
    Advance(ms);
  }
  uint64_t Random64() override {
    std::lock_guard<std::mutex> lock(mu_);
    return rng_();
  }

  void Advance(int64_t ms) {
    wall_ms_ += ms;
    mono_ns_ += ms * 1'000'000;
  }
  void JumpWall(int64_t delta_ms) { wall_ms_ += delta_ms; }
  int64_t total_slept_ms() const { return slept_ms_.load(); }

 private:
  std::atomic<int64_t> wall_ms_;
  std::atomic<int64_t> mono_ns_{1'000'000'000};
  std::atomic<int64_t> slept_ms_{0};
  std::mutex mu_;
  std::mt19937_64 rng_;
};

// StableClock: wall-clock milliseconds that follow the monotonic clock.
//
// It reads the wall clock once, at construction, and from then on advances
// with Env::MonoNanos. A wall-clock step (NTP, an operator's `date -s`)
// while the daemon runs therefore neither expires leases early (a forward
// jump) nor keeps them alive forever (a backward jump). It re-anchors only
// on restart. Every lease, TTL and retry timer in the daemon reads this clock.
//
// The anchor may come from elsewhere than env's wall clock: daemons sharing
// one PostgreSQL database anchor to the database's clock, so that leases and
// expiries they compute agree however skewed their hosts' clocks are.
//
// Thread-safety: NowMillis may be called concurrently.
class StableClock {
 public:
  explicit StableClock(Env& env) : StableClock(env, env.WallMillis()) {}
  // Wall-clock milliseconds `wall_anchor_ms` now (e.g. the database's clock).
  StableClock(Env& env, int64_t wall_anchor_ms)
      : env_(env), wall_anchor_ms_(wall_anchor_ms), mono_anchor_ns_(env.MonoNanos()) {}
  int64_t NowMillis() { return wall_anchor_ms_ + (env_.MonoNanos() - mono_anchor_ns_) / 1'000'000; }
  Env& env() { return env_; }

 private:
  Env& env_;
  const int64_t wall_anchor_ms_;
  const int64_t mono_anchor_ns_;
};

}  // namespace idem
