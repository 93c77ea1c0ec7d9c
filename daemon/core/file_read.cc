#include "daemon/core/file_read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace idem {
namespace {

std::string Bytes(size_t n) {
  if (n % (1024 * 1024) == 0) return std::to_string(n / (1024 * 1024)) + " MiB";
  if (n % 1024 == 0) return std::to_string(n / 1024) + " KiB";
  return std::to_string(n) + " bytes";
}

}  // namespace

StatusOr<std::string> ReadDescriptorAtMost(int fd, size_t max_bytes, const std::string& name) {
  const std::string what = name.empty() ? "" : name + ": ";
  struct stat st {};
  if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    return InvalidArgument(what + "is a folder, not a file");
  }
  std::string out;
  // A regular file's size is a good first guess; the limit holds anyway.
  if (S_ISREG(st.st_mode) && st.st_size > 0) {
    out.reserve(std::min<size_t>(static_cast<size_t>(st.st_size), max_bytes) + 1);
  }
  char buf[64 * 1024];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return InvalidArgument(what + "cannot read: " + std::strerror(errno));
    }
    if (out.size() + static_cast<size_t>(n) > max_bytes) {
      return InvalidArgument(what + "larger than " + Bytes(max_bytes) + ", the most that is read");
    }
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

StatusOr<std::string> ReadFileAtMost(const std::string& path, size_t max_bytes,
                                     const std::string& name) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return InvalidArgument((name.empty() ? "" : name + ": ") +
                           "cannot read: " + std::strerror(errno));
  }
  StatusOr<std::string> text = ReadDescriptorAtMost(fd, max_bytes, name);
  close(fd);
  return text;
}

}  // namespace idem
