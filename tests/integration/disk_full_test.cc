// A full disk under the daemon's store: writes answer 503, reads keep
// working, /readyz says not ready, and everything recovers by itself once
// space returns. Needs root (a small tmpfs is mounted); skipped otherwise.
#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include "tests/integration/harness.h"
#include "tests/support/small_filesystem.h"

namespace idem::testing {
namespace {

using namespace std::chrono_literals;

const char* kActions = R"(actions:
  send_invoice:
    identity: {fields: [/invoice_id], version: v1}
    window: 24h
    on_duplicate: return_original
)";

Json Claim(const std::string& invoice) {
  return {{"kind", "send_invoice"},
          {"identity", {{"invoice_id", invoice}}},
          {"args", {{"pad", std::string(4096, 'x')}}},
          {"lease", "30s"}};
}

int ReadyStatus(httplib::Client& c) {
  auto r = c.Get("/readyz");
  return r ? r->status : -1;
}

}  // namespace

TEST_CASE("a full disk answers writes 503 and /readyz 503, serves reads, and recovers") {
  SmallFilesystem fs("16m");
  if (!fs.mounted()) {
    MESSAGE("skipped: cannot mount tmpfs (not root, or no CAP_SYS_ADMIN)");
    return;
  }
  TempDir dir;
  std::string config = WriteTestConfig(dir, kQuestionRules, kActions);
  {
    // The 16 MiB filesystem is below the default floor of 64 MiB free.
    std::string text = ReadFile(config);
    const std::string engine = "  engine: rocksdb\n";
    REQUIRE(text.find(engine) != std::string::npos);
    text.insert(text.find(engine) + engine.size(), "  min_free_mb: 1\n");
    config = dir.File("idem-small-disk.yaml", text);
  }
  std::string err;
  auto daemon = DaemonProcess::Start({config, fs.path() + "/data", {}, {}}, &err);
  REQUIRE_MESSAGE(daemon != nullptr, err);
  auto client = daemon->Client();
  auto post = [&](const Json& body) {
    return client->Post("/v1/work/claim", body.dump(), "application/json");
  };

  auto before = post(Claim("INV-before"));
  REQUIRE(before);
  REQUIRE(before->status == 201);
  const std::string work_id = Json::parse(before->body)["work_id"];
  CHECK(ReadyStatus(*client) == 200);

  const std::string filler = fs.path() + "/filler";
  FillUp(filler);
  int failed_status = 0;
  std::string failed_type, failed_body;
  for (int i = 0; i < 2000 && failed_status == 0; ++i) {
    auto r = post(Claim("INV-" + std::to_string(i)));
    REQUIRE(r);
    if (r->status != 201) {
      failed_status = r->status;
      failed_type = r->get_header_value("Content-Type");
      failed_body = r->body;
    }
  }
  REQUIRE_MESSAGE(failed_status != 0, "the disk never filled up");
  CHECK(failed_status == 503);
  CHECK(failed_type == "application/problem+json");
  MESSAGE("answer on a full disk: " << failed_body);

  // Reads are served; readiness says no while writes fail. (Recovery may
  // free space of its own: Resume flushes what the WAL held, compressed.)
  auto read = client->Get(("/v1/work/" + work_id).c_str());
  REQUIRE(read);
  CHECK(read->status == 200);
  CHECK(ReadyStatus(*client) == 503);
  std::filesystem::remove(filler);
  // The daemon's floor (store.min_free_mb) refused the writes before
  // RocksDB met the full disk, so nothing needs RocksDB's Resume (whose
  // wait for a flush can hang in 7.8): writes work again once there is room.
  auto until = std::chrono::steady_clock::now() + 10s;
  while (ReadyStatus(*client) != 200 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(100ms);
  }
  auto ready = client->Get("/readyz");
  REQUIRE(ready);
  CHECK_MESSAGE(ready->status == 200, ready->body);
  auto after = post(Claim("INV-after"));
  REQUIRE(after);
  CHECK(after->status == 201);
  CHECK(daemon->Stop() == 0);
}

}  // namespace idem::testing
