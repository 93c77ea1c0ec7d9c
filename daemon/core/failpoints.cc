#include "daemon/core/failpoints.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

namespace idem {
namespace {

struct Action {
  enum Kind { kCrash, kError, kDelay } kind = kError;
  int delay_ms = 0;
  int on_hit = 0;     // 0: every hit
  int until_hit = 0;  // N-M*action: hits on_hit through until_hit
  int hits = 0;
};

std::atomic<bool> g_any{false};
std::mutex g_mu;
std::map<std::string, Action, std::less<>>& Table() {
  static auto* table = new std::map<std::string, Action, std::less<>>();
  return *table;
}

Status ParseInto(std::string_view spec, std::map<std::string, Action, std::less<>>& out) {
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string_view::npos) end = spec.size();
    std::string_view item = spec.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      return InvalidArgument("failpoint '" + std::string(item) + "' is not name=action");
    }
    std::string name(item.substr(0, eq));
    std::string_view act = item.substr(eq + 1);
    Action a;
    size_t star = act.find('*');
    if (star != std::string_view::npos) {
      const std::string hits(act.substr(0, star));
      a.on_hit = std::atoi(hits.c_str());
      const size_t dash = hits.find('-');
      a.until_hit = dash == std::string::npos ? a.on_hit : std::atoi(hits.c_str() + dash + 1);
      if (a.on_hit < 1 || a.until_hit < a.on_hit) {
        return InvalidArgument("failpoint '" + std::string(item) +
                               "': the hits are N or N-M, counted from 1");
      }
      act = act.substr(star + 1);
    }
    if (act == "crash") {
      a.kind = Action::kCrash;
    } else if (act == "error") {
      a.kind = Action::kError;
    } else if (act.starts_with("delay(") && act.ends_with(")")) {
      a.kind = Action::kDelay;
      a.delay_ms = std::atoi(std::string(act.substr(6, act.size() - 7)).c_str());
    } else {
      return InvalidArgument("failpoint action '" + std::string(act) +
                             "' is not crash, error or delay(ms)");
    }
    out[name] = a;
  }
  return Status::Ok();
}

}  // namespace

void Failpoints::InitFromEnv() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* spec = std::getenv("IDEM_FAILPOINTS");
    if (spec != nullptr && *spec != '\0') {
      Status s = Set(spec);
      if (!s.ok()) {
        fprintf(stderr, "IDEM_FAILPOINTS: %s\n", s.ToString().c_str());
        std::exit(2);
      }
    }
  });
}

Status Failpoints::Set(std::string_view spec) {
  std::map<std::string, Action, std::less<>> parsed;
  RETURN_IF_ERROR(ParseInto(spec, parsed));
  std::lock_guard<std::mutex> lock(g_mu);
  Table() = std::move(parsed);
  g_any.store(!Table().empty());
  return Status::Ok();
}

void Failpoints::Clear() {
  std::lock_guard<std::mutex> lock(g_mu);
  Table().clear();
  g_any.store(false);
}

Status Failpoints::Hit(std::string_view name) {
  if (!g_any.load(std::memory_order_relaxed)) return Status::Ok();
  Action a;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = Table().find(name);
    if (it == Table().end()) return Status::Ok();
    it->second.hits++;
    if (it->second.on_hit != 0 &&
        (it->second.hits < it->second.on_hit || it->second.hits > it->second.until_hit)) {
      return Status::Ok();
    }
    a = it->second;
  }
  switch (a.kind) {
    case Action::kCrash:
      ::kill(::getpid(), SIGKILL);
      ::_exit(137);
    case Action::kError:
      return Unavailable("failpoint " + std::string(name));
    case Action::kDelay:
      std::this_thread::sleep_for(std::chrono::milliseconds(a.delay_ms));
      return Status::Ok();
  }
  return Status::Ok();
}

}  // namespace idem
