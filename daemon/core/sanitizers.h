// Which sanitizer the code is built under, the same on GCC and clang: GCC
// says -fsanitize=thread with __SANITIZE_THREAD__, clang 14 only with
// __has_feature(thread_sanitizer).
//
//   IDEM_UNDER_TSAN  defined (1) in a ThreadSanitizer build.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define IDEM_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define IDEM_UNDER_TSAN 1
#endif
#endif
