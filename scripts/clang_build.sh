#!/usr/bin/env bash
# Builds the daemon and every test with clang-14 in build-clang. Under clang
# the targets get -Wthread-safety on top of -Wall -Wextra -Werror (see
# idem_target in CMakeLists.txt), so GUARDED_BY / REQUIRES / ACQUIRE in
# daemon/core/mutex.h are checked, not just written down.
#   IDEM_CLANG_TESTS=1 scripts/clang_build.sh    # also run the unit tests
set -euo pipefail
cd "$(dirname "$0")/.."
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
CC=clang-14 CXX=clang++-14 cmake -S . -B build-clang -G Ninja -DIDEM_BENCH=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" >/dev/null
cmake --build build-clang -j"$(nproc)"
if [ "${IDEM_CLANG_TESTS:-0}" = 1 ]; then
  (cd build-clang && ctest --output-on-failure -j2 -L unit)
fi
echo "== clang build with -Wthread-safety -Werror passed"
