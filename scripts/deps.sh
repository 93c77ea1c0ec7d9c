#!/usr/bin/env bash
# Installs the Debian 12 packages idem builds and tests with, when missing.
# Does nothing (and needs no network) when they are all present.
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build pkg-config clang-format git curl
  libssl-dev libcurl4-openssl-dev nlohmann-json3-dev libvalijson-dev librocksdb-dev
  libspdlog-dev doctest-dev libcpp-httplib-dev libcli11-dev libyaml-cpp-dev
  libkainjow-mustache-dev libpq-dev
)
# The clang build (-Wthread-safety), the libFuzzer targets and the browser
# test of the operator page (tests/e2e/ui_approvals.mjs drives Debian's chromium).
if [ "${IDEM_DEPS_E2E:-0}" = 1 ]; then pkgs+=(clang-14 libclang-rt-14-dev chromium postgresql); fi
if [ "${IDEM_DEPS_BENCH:-0}" = 1 ]; then pkgs+=(wrk); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "idem: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The JSONLogic differential test (ctest -L e2e) runs json-logic-js under
# Node and the browser test drives chromium with playwright-core; install the
# pinned versions from tests/e2e/package-lock.json.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ "${IDEM_DEPS_E2E:-0}" = 1 ] && { [ ! -d "$root/tests/e2e/node_modules/json-logic-js" ] ||
                                       [ ! -d "$root/tests/e2e/node_modules/playwright-core" ]; }; then
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "idem: installing nodejs npm" >&2
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
  fi
  echo "idem: npm ci --prefix tests/e2e" >&2
  npm ci --prefix "$root/tests/e2e" --no-audit --no-fund >/dev/null
fi
