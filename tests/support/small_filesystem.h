// A small filesystem for disk-full tests: a tmpfs of a given size mounted on
// a fresh folder under /tmp (root or CAP_SYS_ADMIN only; mounted() says
// whether it worked, so a test can skip itself), and FillUp to take all of
// its space. Shared by the store's and the daemon's disk-full tests.
#pragma once

#include <doctest/doctest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace idem::testing {

// Unmounted on destruction, lazily (MNT_DETACH), so that a daemon or store
// still holding files cannot keep it mounted.
class SmallFilesystem {
 public:
  explicit SmallFilesystem(const std::string& size) {
    char tmpl[] = "/tmp/idem-small-fs-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return;
    path_ = tmpl;
    std::string opts = "size=" + size;
    mounted_ = ::mount("tmpfs", path_.c_str(), "tmpfs", 0, opts.c_str()) == 0;
  }
  ~SmallFilesystem() {
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
    if (!path_.empty()) ::rmdir(path_.c_str());
  }
  SmallFilesystem(const SmallFilesystem&) = delete;
  SmallFilesystem& operator=(const SmallFilesystem&) = delete;
  bool mounted() const { return mounted_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool mounted_ = false;
};

// Writes zeros to `path` until the filesystem is full.
inline void FillUp(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  std::string block(64 * 1024, '\0');
  while (std::fwrite(block.data(), 1, block.size(), f) == block.size()) {
  }
  // A partial block may still fit.
  while (std::fwrite(block.data(), 1, 512, f) == 512) {
  }
  std::fclose(f);
}

}  // namespace idem::testing
