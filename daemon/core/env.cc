#include "daemon/core/env.h"

#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

namespace idem {

Env& Env::Real() {
  static RealEnv* env = new RealEnv();  // never destroyed: used by detached threads at exit
  return *env;
}

int64_t RealEnv::WallMillis() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

int64_t RealEnv::MonoNanos() {
  using namespace std::chrono;
  return duration_cast<nanoseconds>(steady_clock::now().time_since_epoch()).count();
}

void RealEnv::SleepMillis(int64_t ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

uint64_t RealEnv::Random64() {
  std::lock_guard<std::mutex> lock(mu_);
  return rng_();
}

void NameThread(const char* role) {
  std::string name = std::string("idem-") + role;
  name.resize(std::min<size_t>(name.size(), 15));
  pthread_setname_np(pthread_self(), name.c_str());
}

void ReleaseFreeMemory() {
  using Mallctl = int (*)(const char*, void*, size_t*, void*, size_t);
  static const auto mallctl = reinterpret_cast<Mallctl>(dlsym(RTLD_DEFAULT, "mallctl"));
  if (mallctl != nullptr) {
    // 4096 is MALLCTL_ARENAS_ALL (jemalloc.h): every arena.
    mallctl("arena.4096.purge", nullptr, nullptr, nullptr, 0);
  } else {
    malloc_trim(0);
  }
}

}  // namespace idem
