// A std::mutex wrapper carrying clang thread-safety annotations, so that
// `GUARDED_BY` / `REQUIRES` are checked with clang's -Wthread-safety. Under
// g++ the annotations compile to nothing.
#pragma once

#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define IDEM_TSA(x) __attribute__((x))
#else
#define IDEM_TSA(x)
#endif

#define CAPABILITY(x) IDEM_TSA(capability(x))
#define SCOPED_CAPABILITY IDEM_TSA(scoped_lockable)
#define GUARDED_BY(x) IDEM_TSA(guarded_by(x))
#define PT_GUARDED_BY(x) IDEM_TSA(pt_guarded_by(x))
#define REQUIRES(...) IDEM_TSA(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) IDEM_TSA(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) IDEM_TSA(acquire_capability(__VA_ARGS__))
#define RELEASE(...) IDEM_TSA(release_capability(__VA_ARGS__))
// For code that holds a set of locks decided at run time (lock striping),
// which the analysis cannot follow; say why wherever it is used.
#define NO_THREAD_SAFETY_ANALYSIS IDEM_TSA(no_thread_safety_analysis)

namespace idem {

class CAPABILITY("mutex") Mutex {
 public:
  void Lock() ACQUIRE() { mu_.lock(); }
  bool TryLock() IDEM_TSA(try_acquire_capability(true)) { return mu_.try_lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  std::mutex& native() { return mu_; }

 private:
  std::mutex mu_;
};

class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~MutexLock() RELEASE() { mu_.Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

}  // namespace idem
