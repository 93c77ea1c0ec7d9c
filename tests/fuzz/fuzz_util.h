// Shared helpers for the libFuzzer targets in tests/fuzz. A failed invariant
// aborts (libFuzzer then saves the input as a crash), with a message saying
// which invariant broke.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string_view>

#define FUZZ_CHECK(cond)                                                                \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

namespace idem::fuzz {

inline std::string_view AsView(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

// Splits the input at its first NUL-free separator line "\n----\n" (seed
// files stay readable); without one, the whole input is `first`.
inline void SplitTwo(std::string_view in, std::string_view& first, std::string_view& second) {
  constexpr std::string_view kSep = "\n----\n";
  size_t at = in.find(kSep);
  if (at == std::string_view::npos) {
    first = in;
    second = {};
    return;
  }
  first = in.substr(0, at);
  second = in.substr(at + kSep.size());
}

}  // namespace idem::fuzz
