// Shared libraries loaded on first use (dlopen) instead of at process start.
//
// Why: libcurl and libpq bring a dozen libraries with them (gnutls, krb5,
// ldap, nghttp2, ...) whose resident pages cost ~4 MB of an idle daemon's
// RSS (issue 9: under 30 MB), though a daemon on the default config may never
// call out over HTTP nor open PostgreSQL. The `idem` binary therefore does not
// link them; the one file that talks to each library loads it through a
// LazyLibrary the first time it is needed. Their headers are still used, for
// types and constants only.
//
// LazyLibrary<Api>: `Api` is a struct of typed function pointers (declare them
// with decltype(&function), which keeps variadic functions variadic) and
// `bind` fills it, resolving each member by name through DynSymbols.
//
// Promises:
//   - Get() opens the library with dlopen(RTLD_NOW | RTLD_LOCAL) and binds the
//     table on its first successful call; every later call returns the same
//     table. A loaded library stays loaded for the life of the process.
//   - The library cannot be opened: FailedPrecondition "<soname> cannot be
//     loaded (<dlerror>); install the Debian package <package>". Not
//     remembered: the next Get() tries again (the package may have been
//     installed since).
//   - A symbol is missing (the library found is not a version idem can use):
//     FailedPrecondition naming the symbol and the library. Remembered: every
//     later Get() returns the same error without loading again.
//   - Messages hold the library's name, its path and dlerror()'s text only:
//     nothing a caller passed (URLs, connection strings) ever reaches them.
//
// Thread-safety: Get() may be called from any number of threads at once; the
// library is opened and bound by one of them, the others wait for it. The
// returned table is immutable.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "daemon/core/mutex.h"
#include "daemon/core/status.h"

namespace idem {

// Resolves symbols of one opened library; remembers the first one missing.
class DynSymbols {
 public:
  DynSymbols(void* handle, std::string soname) : handle_(handle), soname_(std::move(soname)) {}

  // Sets `fn` to the function `name`, or to nullptr (and status() to the
  // error) when the library has no such symbol.
  template <typename Fn>
  void Bind(Fn& fn, const char* name) {
    fn = reinterpret_cast<Fn>(Find(name));
  }

  // OK, or FailedPrecondition naming the first symbol that was missing.
  const Status& status() const { return status_; }

 private:
  void* Find(const char* name);

  void* handle_;
  std::string soname_;
  Status status_;
};

namespace dynlib_internal {
// dlopen(soname, RTLD_NOW | RTLD_LOCAL), or the FailedPrecondition above.
StatusOr<void*> Open(const std::string& soname, const std::string& package);
}  // namespace dynlib_internal

template <typename Api>
class LazyLibrary {
 public:
  using BindFn = void (*)(DynSymbols&, Api&);

  // `soname`: e.g. "libcurl.so.4"; `package`: the Debian package that
  // installs it, named in the error when it cannot be loaded.
  LazyLibrary(std::string soname, std::string package, BindFn bind)
      : soname_(std::move(soname)), package_(std::move(package)), bind_(bind) {}
  LazyLibrary(const LazyLibrary&) = delete;
  LazyLibrary& operator=(const LazyLibrary&) = delete;

  StatusOr<const Api*> Get() {
    if (const Api* api = ready_.load(std::memory_order_acquire)) return api;
    MutexLock lock(mu_);
    if (api_ != nullptr) return static_cast<const Api*>(api_.get());
    if (!failure_.ok()) return failure_;
    ASSIGN_OR_RETURN(void* handle, dynlib_internal::Open(soname_, package_));
    DynSymbols symbols(handle, soname_);
    auto api = std::make_unique<Api>();
    bind_(symbols, *api);
    if (!symbols.status().ok()) {
      // The handle stays open: unloading a library that ran its constructors
      // is not always safe, and this one is never opened again.
      failure_ = symbols.status();
      return failure_;
    }
    api_ = std::move(api);
    ready_.store(api_.get(), std::memory_order_release);
    return static_cast<const Api*>(api_.get());
  }

  const std::string& soname() const { return soname_; }

 private:
  const std::string soname_;
  const std::string package_;
  const BindFn bind_;
  std::atomic<const Api*> ready_{nullptr};  // api_ once bound
  Mutex mu_;
  std::unique_ptr<Api> api_ GUARDED_BY(mu_);
  Status failure_ GUARDED_BY(mu_);
};

}  // namespace idem
