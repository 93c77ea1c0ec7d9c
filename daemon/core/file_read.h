// Reading a whole file, or a descriptor such as stdin, with a size limit.
//
// The size a file reports is no bound: /dev/zero, a pipe or a /proc file
// report 0 and read without end. These read at most `max_bytes` and refuse
// past them, so a config or an import named by mistake cannot take all
// memory; a folder (opened, or given as stdin) is an error, not "empty".
//
// Errors: InvalidArgument whose message starts "`name`: " (nothing when
// `name` is empty) and says why: "cannot read: <errno text>", "is a folder,
// not a file", "larger than 4 MiB, the most that is read"; never an
// exception.
// Thread-safety: pure functions over their own descriptors.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "daemon/core/status.h"

namespace idem {

// True when `fd` is a folder (which reads as nothing, or EISDIR).
bool IsFolder(int fd);

// Reads `fd` to its end, handing each chunk read to `each`, which returns
// false to stop there (the caller keeps its own reason). OK at the end or
// once stopped; InvalidArgument with the errno text when a read fails.
Status ReadChunks(int fd, const std::function<bool(std::string_view)>& each);

// The bytes of the file at `path`, at most `max_bytes` of them.
StatusOr<std::string> ReadFileAtMost(const std::string& path, size_t max_bytes,
                                     const std::string& name);

// The bytes read from `fd` (not closed) until its end, at most `max_bytes`.
StatusOr<std::string> ReadDescriptorAtMost(int fd, size_t max_bytes, const std::string& name);

}  // namespace idem
