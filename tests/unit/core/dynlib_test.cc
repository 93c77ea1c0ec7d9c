#include "daemon/core/dynlib.h"

#include <dlfcn.h>
#include <doctest/doctest.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

namespace idem {
namespace {

// A table over libm, which every test process has: a real library, real
// symbols, no side effects.
struct MathApi {
  double (*cos)(double);
  double (*sqrt)(double);
};

std::atomic<int> math_binds{0};

void BindMath(DynSymbols& s, MathApi& a) {
  ++math_binds;
  s.Bind(a.cos, "cos");
  s.Bind(a.sqrt, "sqrt");
}

struct BrokenApi {
  double (*cos)(double);
  void (*missing)();
  double (*sqrt)(double);
};

std::atomic<int> broken_binds{0};

void BindBroken(DynSymbols& s, BrokenApi& a) {
  ++broken_binds;
  s.Bind(a.cos, "cos");
  s.Bind(a.missing, "idem_no_such_symbol");
  s.Bind(a.sqrt, "sqrt");
}

// The file libm was loaded from ("/lib/x86_64-linux-gnu/libm.so.6").
std::string LibmPath() {
  Dl_info info{};
  double (*fn)(double) = &::cos;
  REQUIRE(dladdr(reinterpret_cast<void*>(fn), &info) != 0);
  REQUIRE(info.dli_fname != nullptr);
  return info.dli_fname;
}

TEST_CASE("a library that does not exist gives FailedPrecondition naming it and its package") {
  LazyLibrary<MathApi> lib("libidem-no-such-library.so.7", "libidem-nothing7", &BindMath);
  StatusOr<const MathApi*> api = lib.Get();
  REQUIRE_FALSE(api.ok());
  CHECK(api.status().code() == Code::kFailedPrecondition);
  const std::string& msg = api.status().message();
  CHECK(msg.find("libidem-no-such-library.so.7 cannot be loaded") != std::string::npos);
  CHECK(msg.find("install the Debian package libidem-nothing7") != std::string::npos);
  // dlerror()'s reason is in the message too.
  CHECK(msg.find("No such file") != std::string::npos);
}

TEST_CASE("loading twice returns the same table, bound once, whose functions work") {
  const int binds = math_binds.load();
  LazyLibrary<MathApi> lib("libm.so.6", "libc6", &BindMath);
  StatusOr<const MathApi*> first = lib.Get();
  REQUIRE(first.ok());
  StatusOr<const MathApi*> second = lib.Get();
  REQUIRE(second.ok());
  CHECK(*first == *second);
  CHECK(math_binds.load() == binds + 1);
  CHECK((*first)->cos(0.0) == 1.0);
  CHECK((*first)->sqrt(81.0) == 9.0);
}

TEST_CASE("threads asking at once all get the one table, bound once") {
  const int binds = math_binds.load();
  LazyLibrary<MathApi> lib("libm.so.6", "libc6", &BindMath);
  std::vector<const MathApi*> seen(8, nullptr);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < seen.size(); ++i) {
    threads.emplace_back([&lib, &seen, i] {
      StatusOr<const MathApi*> api = lib.Get();
      if (api.ok()) seen[i] = *api;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(seen[0] != nullptr);
  for (const MathApi* api : seen) CHECK(api == seen[0]);
  CHECK(math_binds.load() == binds + 1);
}

TEST_CASE("a missing symbol gives FailedPrecondition naming it, every time, without rebinding") {
  const int binds = broken_binds.load();
  LazyLibrary<BrokenApi> lib("libm.so.6", "libc6", &BindBroken);
  StatusOr<const BrokenApi*> api = lib.Get();
  REQUIRE_FALSE(api.ok());
  CHECK(api.status().code() == Code::kFailedPrecondition);
  CHECK(api.status().message().find("libm.so.6 has no symbol idem_no_such_symbol") !=
        std::string::npos);
  StatusOr<const BrokenApi*> again = lib.Get();
  REQUIRE_FALSE(again.ok());
  CHECK(again.status().message() == api.status().message());
  CHECK(broken_binds.load() == binds + 1);
}

TEST_CASE("a library that could not be opened is tried again on the next call") {
  // A path that is missing at first, then appears (as when the package is
  // installed while the daemon runs).
  char dir_template[] = "/tmp/idem-dynlib-XXXXXX";
  REQUIRE(mkdtemp(dir_template) != nullptr);
  const std::string dir = dir_template;
  const std::string path = dir + "/libidem-late.so.1";
  LazyLibrary<MathApi> lib(path, "libidem-late1", &BindMath);
  StatusOr<const MathApi*> before = lib.Get();
  REQUIRE_FALSE(before.ok());
  CHECK(before.status().message().find(path) != std::string::npos);

  REQUIRE(symlink(LibmPath().c_str(), path.c_str()) == 0);
  StatusOr<const MathApi*> after = lib.Get();
  unlink(path.c_str());
  rmdir(dir.c_str());
  REQUIRE_MESSAGE(after.ok(), after.status().ToString());
  CHECK((*after)->cos(0.0) == 1.0);
}

}  // namespace
}  // namespace idem
