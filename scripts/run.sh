#!/usr/bin/env bash
# Builds idem and runs the daemon on its embedded default config
# (config/idem.yaml: RocksDB in ./var/idem, the offline scripted provider).
# Extra arguments go to `idem serve`, e.g. --listen 127.0.0.1:7500.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIDEM_BENCH=OFF >/dev/null
cmake --build build --target idem -j"$(nproc)"
exec ./build/idem serve --config config/idem.yaml "$@"
