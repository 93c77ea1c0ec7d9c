#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang-14 under ASan + UBSan
# in build-fuzz, and runs each for IDEM_FUZZ_SECONDS (default 20) on a copy
# of its seed corpus (the committed corpus does not grow), one target per
# core at a time (IDEM_FUZZ_JOBS to change it). Fails if any
# target finds a crash, a leak, an invariant break, a timeout or an
# out-of-memory; the input is left in build-fuzz/artifacts/<target>/.
#   IDEM_FUZZ_SECONDS=300 scripts/fuzz.sh            # a longer local run
#   scripts/fuzz.sh http1 jcs                        # some targets only
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${IDEM_FUZZ_SECONDS:-20}
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(http1 json jcs idempotency_key jsonlogic config provider_openai provider_anthropic
           provider_ollama records json_writer json_schema)
fi

CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -G Ninja -DIDEM_FUZZ=ON -DIDEM_BENCH=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo $(command -v ccache >/dev/null && echo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache) >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]/#/fuzz_}"

# A small quarantine: -rss_limit_mb should measure our memory, not ASan's.
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1:quarantine_size_mb=64
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# One target per core at a time (IDEM_FUZZ_JOBS, default nproc): each run is
# single-threaded and time-bound, so two cores halve the stage.
jobs=${IDEM_FUZZ_JOBS:-$(nproc)}
run_one() {  # target: exit status 0 when the run found nothing
  local t=$1 work=build-fuzz/corpus/$1 artifacts=build-fuzz/artifacts/$1 dict=()
  rm -rf "$work" && mkdir -p "$work" "$artifacts"
  cp tests/fuzz/corpus/"$t"/* "$work"/
  [ -f tests/fuzz/dict/"$t".dict ] && dict=(-dict=tests/fuzz/dict/"$t".dict)
  build-fuzz/fuzz/fuzz_"$t" "$work" "${dict[@]}" -max_total_time="$seconds" \
    -rss_limit_mb=512 -max_len=8192 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$artifacts"/ >build-fuzz/fuzz_"$t".log 2>&1
}
declare -A pids=()
failed=()
report() {  # target pid
  local t=$1
  if ! wait "$2"; then
    tail -40 build-fuzz/fuzz_"$t".log
    failed+=("$t")
  fi
  echo "== fuzz_$t ran ${seconds} s"
  grep -E '^#[0-9]+ +DONE|stat::number_of_executed_units' build-fuzz/fuzz_"$t".log || true
}
pending=("${targets[@]}")
order=()
while [ ${#pending[@]} -gt 0 ] || [ ${#order[@]} -gt 0 ]; do
  while [ ${#pending[@]} -gt 0 ] && [ ${#order[@]} -lt "$jobs" ]; do
    t=${pending[0]}; pending=("${pending[@]:1}")
    run_one "$t" & pids[$t]=$!
    order+=("$t")
  done
  # The oldest run ends first: every run takes the same time.
  t=${order[0]}; order=("${order[@]:1}")
  report "$t" "${pids[$t]}"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "== fuzzing found problems in: ${failed[*]}"
  exit 1
fi
echo "== all fuzz targets ran ${seconds} s without a finding"
