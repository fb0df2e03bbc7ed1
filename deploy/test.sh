#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test: unit tests in
# parallel, then the integration tests (real binaries on loopback) one by one.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/bootstrap.sh
cd build
ctest --output-on-failure -LE integration -j "$(nproc)"
ctest --output-on-failure -L integration
