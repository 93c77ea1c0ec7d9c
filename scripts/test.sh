#!/usr/bin/env bash
# Builds idem and runs every test: unit and integration tests in a normal
# build (the default compiler, GCC on Debian) and under AddressSanitizer +
# UndefinedBehaviorSanitizer, the concurrency tests (ctest label
# "concurrency") under ThreadSanitizer, and a short run of every fuzz target.
# The ASan tree is built with clang-14: under clang every target gets
# -Wthread-safety -Werror (see idem_target in CMakeLists.txt), so that tree,
# which builds everything, is also the thread-safety check, and clang builds
# it in about half GCC's time (api_work.cc under ASan+UBSan at -O0: 9.8 s
# against 23.8 s).
# IDEM_TEST_QUICK=1 runs the normal build only.
set -euo pipefail
cd "$(dirname "$0")/.."
IDEM_DEPS_E2E=1 scripts/deps.sh
jobs=$(nproc)
start=$(date +%s)

build() {  # dir, targets ("all" for everything), extra cmake args...
  local dir=$1 targets=$2; shift 2
  cmake -S . -B "$dir" -G Ninja -DIDEM_BENCH=ON "$@" >/dev/null
  if [ "$targets" = all ]; then
    cmake --build "$dir" -j"$jobs"
  else
    cmake --build "$dir" -j"$jobs" --target $targets
  fi
}

echo "== clang-format (.clang-format, Google base)"
git ls-files '*.cc' '*.h' | xargs clang-format --dry-run --Werror

echo "== normal build"
build build all -DCMAKE_BUILD_TYPE=RelWithDebInfo
# The integration tests record every response they see (one JSONL file per
# test process) for the OpenAPI check below.
rm -rf build/responses
# -j3 on two cores: the integration tests (three ctest tests) mostly wait on
# daemons, leases and restarts, so a third test in flight fills the cores
# (ASan tree: 249 s as one test at -j2, 196 s in three at -j2, 127-133 s at
# -j3).
(cd build && IDEM_RESPONSE_LOG="$PWD/responses" ctest --output-on-failure -j3 -LE postgres)

echo "== PostgreSQL: the store conformance suite and the multi-daemon tests (pg_virtualenv)"
# A throwaway cluster for this step only; libpq finds it through the PG*
# variables pg_virtualenv sets.
# IDEM_TEST_PG_URL spells the same server out for the tests that need a
# key=value URL (the outage test relays it).
(cd build && pg_virtualenv -- bash -c 'IDEM_TEST_PG_URL="host=$PGHOST port=$PGPORT user=$PGUSER password=$PGPASSWORD dbname=$PGDATABASE" ctest --output-on-failure -L postgres')

echo "== hostile client: every documented operation with broken input (answers recorded for the OpenAPI check)"
node tests/e2e/hostile_client.mjs build/idem build/responses

echo "== OpenAPI: every recorded response against /openapi.json (ajv)"
node tests/e2e/openapi_check.mjs build/idem build/responses

echo "== browser e2e"
# The operator page in headless Chromium (screenshots in build/e2e-artifacts).
node tests/e2e/ui_approvals.mjs build/idem

if [ "${IDEM_TEST_QUICK:-0}" != 1 ]; then
  echo "== fuzz smoke: every libFuzzer target under ASan+UBSan, ${IDEM_FUZZ_SECONDS:-15} s each"
  IDEM_FUZZ_SECONDS=${IDEM_FUZZ_SECONDS:-15} scripts/fuzz.sh

  echo "== AddressSanitizer + UndefinedBehaviorSanitizer (clang-14, -Wthread-safety -Werror, everything)"
  build build-asan all -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=Debug \
    -DIDEM_SANITIZE=address,undefined
  # UBSAN_OPTIONS (halt_on_error=1) is set on every test by tests/CMakeLists.txt.
  # LeakSanitizer's own stop-the-world tracer sometimes segfaults at a test
  # process's exit after every test passed ("Tracer caught signal 11 ...
  # LeakSanitizer has encountered a fatal error": a runtime flake, not a
  # leak; google/sanitizers#1353, seen in integration_3 in two of four of
  # session 27's CI runs). Only then are the failed tests run again (twice
  # at most); a leak report ("detected memory
  # leaks"), a failed check or any other failure stops the run.
  if ! (cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j3 -LE postgres \
          > ctest.log 2>&1); then
    cat build-asan/ctest.log
    if grep -q "LeakSanitizer has encountered a fatal error" build-asan/ctest.log &&
       ! grep -q "detected memory leaks\|ERROR: AddressSanitizer\|runtime error:\|is NOT correct\|FATAL ERROR" \
         build-asan/ctest.log; then
      echo "== LeakSanitizer's tracer crashed at a test's exit: the failed tests again (twice at most)"
      (cd build-asan && { ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure --rerun-failed ||
                          ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure --rerun-failed; })
    else
      exit 1
    fi
  else
    cat build-asan/ctest.log
  fi

  echo "== hostile client against the ASan+UBSan daemon"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    node tests/e2e/hostile_client.mjs build-asan/idem

  echo "== ThreadSanitizer (concurrency tests)"
  # Only what the concurrency tests need.
  build build-tsan "idem_store_tests idem_decide_tests idem_apply_tests idem_http_tests idem_obs_tests idem_replay_tests idem_outbox_tests" \
    -DCMAKE_BUILD_TYPE=Debug -DIDEM_SANITIZE=thread -DIDEM_BENCH=OFF
  # tests/tsan.supp: the one report from uninstrumented libraries, and why.
  supp="$PWD/tests/tsan.supp"
  (cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$supp" \
     ctest --output-on-failure -j2 -L concurrency)
fi
echo "== all tests passed in $(( $(date +%s) - start )) s"
