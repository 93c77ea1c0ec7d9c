// Failpoints: named places in the code where a test can inject a crash, an
// error or a delay, set through the environment variable
//   IDEM_FAILPOINTS="name=crash,other=error,third=delay(50)"
// or programmatically (Failpoints::Set) in unit tests.
//
//   crash      the process dies at once with SIGKILL (as kill -9 would);
//   error      Hit() returns Unavailable("failpoint NAME");
//   delay(ms)  Hit() sleeps for real for ms milliseconds, then returns OK;
//   N*action   the action fires on the Nth hit only (e.g. 3*crash);
//   N-M*action on hits N through M (e.g. 1-3*error: three errors, then OK).
//
// When no failpoint is configured, Hit() costs one relaxed atomic load.
// Thread-safety: Hit() and Set() may be called concurrently.
#pragma once

#include <string>
#include <string_view>

#include "daemon/core/status.h"

namespace idem {

class Failpoints {
 public:
  // Reads IDEM_FAILPOINTS once; later calls are no-ops.
  static void InitFromEnv();
  // Replaces the whole configuration (same syntax as IDEM_FAILPOINTS).
  static Status Set(std::string_view spec);
  static void Clear();
  static Status Hit(std::string_view name);
};

#define IDEM_FAILPOINT(name) RETURN_IF_ERROR(::idem::Failpoints::Hit(name))

}  // namespace idem
