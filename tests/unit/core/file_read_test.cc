#include "daemon/core/file_read.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace idem {
namespace {

// A folder of its own under /tmp, removed at the end.
struct Scratch {
  std::string path;
  Scratch() {
    char tmpl[] = "/tmp/idem-file-read-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~Scratch() { std::filesystem::remove_all(path); }
  std::string File(const std::string& name, const std::string& text) const {
    std::ofstream(path + "/" + name, std::ios::binary) << text;
    return path + "/" + name;
  }
};

TEST_CASE("a file within the limit is read whole, up to the limit exactly") {
  Scratch s;
  const std::string path = s.File("a.txt", "hello\nworld");
  CHECK(*ReadFileAtMost(path, 1 << 20, "a.txt") == "hello\nworld");
  CHECK(*ReadFileAtMost(path, 11, "a.txt") == "hello\nworld");
  StatusOr<std::string> over = ReadFileAtMost(path, 10, "a.txt");
  REQUIRE_FALSE(over.ok());
  CHECK(over.status().message() == "a.txt: larger than 10 bytes, the most that is read");
}

TEST_CASE("a file that reports no size and never ends stops at the limit") {
  // /dev/zero says 0 bytes and reads without end: the size it reports is no
  // bound, the read is.
  StatusOr<std::string> zero = ReadFileAtMost("/dev/zero", 4 << 20, "config");
  REQUIRE_FALSE(zero.ok());
  CHECK(zero.status().message() == "config: larger than 4 MiB, the most that is read");
}

TEST_CASE("a folder, or a file that cannot be opened, is an error that says so") {
  Scratch s;
  StatusOr<std::string> folder = ReadFileAtMost(s.path, 1 << 20, "x");
  REQUIRE_FALSE(folder.ok());
  CHECK(folder.status().message() == "x: is a folder, not a file");
  StatusOr<std::string> missing = ReadFileAtMost(s.path + "/nope", 1 << 20, "");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message() == "cannot read: No such file or directory");
}

TEST_CASE("a descriptor is read to its end, a pipe's included") {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  REQUIRE(write(fds[1], "abc", 3) == 3);
  close(fds[1]);
  CHECK(*ReadDescriptorAtMost(fds[0], 16, "stdin") == "abc");
  close(fds[0]);
}

}  // namespace
}  // namespace idem
