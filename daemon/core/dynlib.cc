#include "daemon/core/dynlib.h"

#include <dlfcn.h>

namespace idem {

namespace dynlib_internal {

StatusOr<void*> Open(const std::string& soname, const std::string& package) {
  dlerror();  // clear a stale error
  void* handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle != nullptr) return handle;
  const char* why = dlerror();
  return FailedPrecondition(soname + " cannot be loaded (" +
                            (why != nullptr ? why : "dlopen failed") +
                            "); install the Debian package " + package);
}

}  // namespace dynlib_internal

void* DynSymbols::Find(const char* name) {
  dlerror();
  void* p = dlsym(handle_, name);
  if (p != nullptr) return p;
  if (status_.ok()) {
    const char* why = dlerror();
    status_ = FailedPrecondition(soname_ + " has no symbol " + name + " (" +
                                 (why != nullptr ? why : "null") +
                                 "): the installed library is not a version idem can use");
  }
  return nullptr;
}

}  // namespace idem
