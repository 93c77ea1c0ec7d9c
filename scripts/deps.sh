#!/usr/bin/env bash
# Installs the Debian 12 packages idem builds and tests with, when missing.
# Does nothing (and needs no network) when they are all present.
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build pkg-config clang-format git curl
  libssl-dev libcurl4-openssl-dev nlohmann-json3-dev libvalijson-dev librocksdb-dev
  libspdlog-dev doctest-dev libcpp-httplib-dev libcli11-dev libyaml-cpp-dev
  libkainjow-mustache-dev libpq-dev libjemalloc-dev libpcre2-dev
)
# The clang build (-Wthread-safety), the libFuzzer targets and the browser
# test of the operator page (tests/e2e/ui_approvals.mjs drives Debian's chromium).
if [ "${IDEM_DEPS_E2E:-0}" = 1 ]; then pkgs+=(clang-14 libclang-rt-14-dev chromium postgresql); fi
if [ "${IDEM_DEPS_BENCH:-0}" = 1 ]; then pkgs+=(wrk); fi

# apt-get install of the named packages, as root or through sudo.
apt_install() {
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
      echo "idem: these Debian packages are missing: $*" >&2
      echo "idem: run this script as root, or install sudo, or install them yourself" >&2
      exit 1
    fi
    sudo="sudo"
  fi
  echo "idem: installing $*" >&2
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then apt_install "${missing[@]}"; fi

# The end-to-end tests (ctest -L e2e, the browser and OpenAPI checks) run
# the npm packages pinned in tests/e2e/package-lock.json under Node (Debian
# 12's nodejs is enough). npm ci runs again whenever the lockfile differs
# from the one last installed, so a checkout that pulls a new pin gets it.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
e2e="$root/tests/e2e"
if [ "${IDEM_DEPS_E2E:-0}" = 1 ] &&
   ! cmp -s "$e2e/package-lock.json" "$e2e/node_modules/.idem-installed-lock.json"; then
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    apt_install nodejs npm
  fi
  echo "idem: npm ci --prefix tests/e2e" >&2
  npm ci --prefix "$e2e" --no-audit --no-fund >/dev/null
  cp "$e2e/package-lock.json" "$e2e/node_modules/.idem-installed-lock.json"
fi
