#!/usr/bin/env bash
# Installs the Debian 12 packages dlbatch needs that are missing (and only
# those), then configures and builds. Safe to run again: it installs nothing
# twice and rebuilds only what changed.
#
#   deploy/bootstrap.sh [--build-dir DIR] [--no-build] [--jobs N] [--test-tools]
#                       [--programs]
#
# By default it installs what the tests and benchmarks need too (clang, for
# the check of the lock annotations, among them) and builds every target.
# --programs (the quick start's) installs only what the four programs need
# and builds only them (dlbatch, dlbatch-scheduler, dlbatch-worker,
# dlbatch-train and what they link, and the web dashboard); a build folder
# it makes then has no tests or benchmarks until a plain run turns them on.
# --test-tools also installs what only the test command uses (clang-format,
# for the tree's format check; Slurm and munge, for tests/slurm).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build
do_build=1
jobs=$(nproc)
test_tools=0
programs_only=0
while (($#)); do
  case $1 in
    --build-dir) build_dir=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --jobs) jobs=$2; shift 2 ;;
    --test-tools) test_tools=1; shift ;;
    --programs) programs_only=1; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "bootstrap: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

packages=(
  build-essential cmake pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libsqlite3-dev libspdlog-dev libyaml-cpp-dev libcli11-dev nlohmann-json3-dev
  libabsl-dev libssl-dev
  libdnnl-dev libgloo-dev zlib1g-dev libpng-dev libjpeg62-turbo-dev
  dataset-fashion-mnist
)
packages+=(prometheus-cpp-dev)  # metrics (--metrics-listen): prometheus-cpp core + pull
packages+=(libboost-dev)  # the web face (--web-listen): Boost.Beast and Asio, headers only
# The web dashboard is bundled at build time by npm's esbuild (node is not
# needed to run it); the Kubernetes manifests' check runs on node too.
! command -v npm >/dev/null && packages+=(nodejs npm)
# The tests and benchmarks: GoogleTest; the ONNX checks of exported models;
# tmux drives the monitor.
((programs_only)) || packages+=(libgtest-dev libgmock-dev python3-onnx python3-numpy tmux)
# clang checks the lock annotations (deploy/thread-safety.sh); libomp-dev
# gives it omp.h for the trainer's OpenMP sources.
((programs_only)) || packages+=(clang libomp-dev)
((test_tools)) && packages+=(clang-format)
# A real Slurm (and munge) for the Slurm profile tests, tests/slurm/.
((test_tools)) && packages+=(slurmctld slurmd slurm-client munge)
# The package's and units' tests: lintian, systemd-analyze, groff (man pages),
# zsh (its completion).
((test_tools)) && packages+=(lintian systemd groff-base zsh)
((test_tools)) && packages+=(prometheus)  # promtool and the server for the metrics tests
((test_tools)) && packages+=(python3-torch)  # PyTorch jobs (tests/integration/launch_test)
((test_tools)) && packages+=(chromium)  # the dashboard's browser tests (tests/web, headless)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "bootstrap: installing ${#missing[@]} missing package(s): ${missing[*]}"
  sudo=()
  if ((EUID != 0)); then
    command -v sudo >/dev/null || { echo "bootstrap: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "bootstrap: all ${#packages[@]} packages already installed"
fi

((do_build)) || exit 0
configure=(-DCMAKE_BUILD_TYPE=Release)
targets=()
if ((programs_only)); then
  targets=(--target dlbatch dlbatch-scheduler dlbatch-worker dlbatch-train
    dlbatch-web-ui)
  # A folder the test command configured keeps its tests; a new one has
  # none, since GoogleTest may not be installed.
  [[ -f $build_dir/CMakeCache.txt ]] ||
    configure+=(-DDLBATCH_BUILD_TESTS=OFF -DDLBATCH_BUILD_BENCH=OFF)
else
  configure+=(-DDLBATCH_BUILD_TESTS=ON -DDLBATCH_BUILD_BENCH=ON)
fi
echo "bootstrap: configuring in $build_dir"
cmake -S . -B "$build_dir" "${configure[@]}" >"$build_dir.configure.log" 2>&1 \
  || { cat "$build_dir.configure.log"; exit 1; }
grep -E '^-- dlbatch:' "$build_dir.configure.log" || true
echo "bootstrap: building ${targets[*]:-every target} with $jobs job(s)"
cmake --build "$build_dir" -j "$jobs" "${targets[@]}"
echo "bootstrap: built into $build_dir/"
