// Helpers shared by the apply tests: a fresh RocksDB store in a temp folder,
// a fake effector server on a free port, a FakeEnv clock, and an engine
// built over action kinds the test declares (ActionConfig structs, no
// config loader).
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "daemon/apply/apply_engine.h"
#include "daemon/apply/work_identity.h"
#include "daemon/core/env.h"
#include "daemon/core/failpoints.h"
#include "daemon/core/http_client.h"
#include "daemon/obs/metrics.h"
#include "daemon/store/store.h"
#include "tests/fakes/fake_effector.h"

namespace idem::testing {

class ApplyTempDir {
 public:
  ApplyTempDir() {
    std::string tmpl = "/tmp/idem-apply-test-XXXXXX";
    char* made = mkdtemp(tmpl.data());
    REQUIRE(made != nullptr);
    path_ = made;
  }
  ~ApplyTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ApplyTempDir(const ApplyTempDir&) = delete;
  ApplyTempDir& operator=(const ApplyTempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Clears failpoints when a test ends, whatever happened.
struct FailpointsGuard {
  ~FailpointsGuard() { Failpoints::Clear(); }
};

class ApplyHarness {
 public:
  ApplyHarness() {
    auto store = OpenRocksStore(StoreOptions{dir_.path(), /*sync=*/false});
    REQUIRE_MESSAGE(store.ok(), store.status().ToString());
    store_ = std::move(store).value();
    fake_ = fakes::FakeEffectorServer::Start();
    REQUIRE(fake_ != nullptr);
    http_ = MakeCurlHttpClient();
  }
  ~ApplyHarness() {
    if (engine_) engine_->Stop();
  }

  // Declares an action kind whose effector is `http` (the effector.http node).
  ActionConfig& AddKind(const std::string& name, std::vector<std::string> identity, Json http) {
    ActionConfig a;
    a.name = name;
    a.identity_fields = std::move(identity);
    a.window_ms = 24LL * 3600 * 1000;
    a.effector = Json{{"http", std::move(http)}};
    a.retry.attempts = 5;
    a.retry.base_ms = 1'000;
    a.retry.cap_ms = 10'000;
    a.retry.timeout_ms = 2'000;
    config_.actions[name] = a;
    return config_.actions[name];
  }

  ApplyEngine& engine() {
    if (!engine_) {
      auto made =
          ApplyEngine::Create(config_, store_->journal(), *http_, clock_, metrics_, options_);
      REQUIRE_MESSAGE(made.ok(), made.status().ToString());
      engine_ = std::move(made).value();
    }
    return *engine_;
  }

  std::string WorkId(const std::string& kind, const Json& args) {
    auto id = ActionWorkId(config_.actions.at(kind), args);
    REQUIRE_MESSAGE(id.ok(), id.status().ToString());
    return id->key;
  }

  ActionOutcome Submit(const std::string& kind, const Json& args) {
    auto outcome = engine().Submit(kind, args, "", "req-test");
    REQUIRE_MESSAGE(outcome.ok(), outcome.status().ToString());
    return std::move(outcome).value();
  }

  WorkItem Get(const std::string& work_id) {
    auto item = store_->journal().Get(work_id);
    REQUIRE_MESSAGE(item.ok(), item.status().ToString());
    return std::move(item).value();
  }

  size_t RunDue(size_t max_items = 100) {
    auto n = engine().RunDueOnce(max_items);
    REQUIRE_MESSAGE(n.ok(), n.status().ToString());
    return *n;
  }

  std::string Url(const std::string& path) const { return fake_->base_url() + path; }

  FakeEnv env_;
  StableClock clock_{env_};
  Metrics metrics_;
  Config config_;
  ApplyOptions options_;
  ApplyTempDir dir_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<fakes::FakeEffectorServer> fake_;
  std::unique_ptr<HttpClient> http_;
  std::unique_ptr<ApplyEngine> engine_;

  Journal& journal() { return store_->journal(); }
  fakes::FakeEffectorServer& fake() { return *fake_; }
};

}  // namespace idem::testing
