#include "daemon/core/file_read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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

bool IsFolder(int fd) {
  struct stat st {};
  return fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
}

Status ReadChunks(int fd, const std::function<bool(std::string_view)>& each) {
  char buf[64 * 1024];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n == 0) return Status::Ok();
    if (n < 0) {
      if (errno == EINTR) continue;
      return InvalidArgument(std::strerror(errno));
    }
    if (!each(std::string_view(buf, static_cast<size_t>(n)))) return Status::Ok();
  }
}

StatusOr<std::string> ReadDescriptorAtMost(int fd, size_t max_bytes, const std::string& name) {
  const std::string what = name.empty() ? "" : name + ": ";
  if (IsFolder(fd)) return InvalidArgument(what + "is a folder, not a file");
  std::string out;
  bool over = false;
  Status read = ReadChunks(fd, [&](std::string_view chunk) {
    over = out.size() + chunk.size() > max_bytes;
    if (!over) out.append(chunk);
    return !over;
  });
  if (!read.ok()) return InvalidArgument(what + "cannot read: " + read.message());
  if (over) {
    return InvalidArgument(what + "larger than " + Bytes(max_bytes) + ", the most that is read");
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
