#!/usr/bin/env bash
# Installs what is missing, checks the tree's format, builds, checks the lock
# annotations with clang (deploy/thread-safety.sh), and runs every test: unit
# tests in parallel, then the integration tests (real binaries on
# loopback) one by one, then the tests that run a real Slurm.
# Where the build has the GPU backend (CUDA, cuDNN and cuBLAS were found), it
# then builds the trainer as a machine without them gets it (CPU-only, in
# build-cpu-only/: no GPU module; the four programs too, as the quick start
# builds them there) and runs the trainer tests whose outcome
# depends on that, GPU runs refused saying the build has no GPU backend
# among them. (The main build's tests cover a machine where the module or
# CUDA's libraries are missing at run time: gpu_module_run_test, and
# tests/deploy/install_test.sh installs the packages where CUDA is hidden.)
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/bootstrap.sh --test-tools --no-build
deploy/check-format.sh
deploy/bootstrap.sh
# The lock annotations, checked by clang (GCC builds the tree and ignores
# them): a syntax-only pass over the programs' sources, before the tests.
# The tests' and benchmarks' sources are left out for time: the programs'
# 181 files take about 8 CPU-minutes (4 on CI's 2 cores), all 310 about 15
# (8); `deploy/thread-safety.sh` without --product-only checks them all.
deploy/thread-safety.sh --product-only
cd build
ctest --output-on-failure -LE 'integration|slurm' -j "$(nproc)"
ctest --output-on-failure -L integration
# A real Slurm on this machine (tests/slurm/slurm-cluster.sh): its tests
# skip, saying why, where Slurm cannot start.
ctest --output-on-failure -L slurm
cd ..

if grep -q '^DLBATCH_GPU_BACKEND_BUILT:INTERNAL=ON$' build/CMakeCache.txt; then
  echo "test: the CPU-only trainer (what a machine without CUDA builds)"
  cmake -S . -B build-cpu-only -DCMAKE_BUILD_TYPE=Release -DDLBATCH_WITH_CUDA=OFF \
    >build-cpu-only.configure.log 2>&1 || { cat build-cpu-only.configure.log; exit 1; }
  grep -E '^-- dlbatch:' build-cpu-only.configure.log || true
  # The four programs as the quick start builds them on such a machine
  # (its units, DLBATCH_UNITY_BUILD, differ from this build's), then the
  # trainer tests.
  cmake --build build-cpu-only -j "$(nproc)" --target \
    dlbatch dlbatch-scheduler dlbatch-worker \
    dlbatch-train train_run_test backend_select_test nccl_communicator_test \
    gpu_module_run_test
  cd build-cpu-only
  ctest --output-on-failure -j "$(nproc)" \
    -R '^(backend_select_test:|nccl_communicator_test:|gpu_module_run_test:|train_run_test:TrainRun\.(NoGpuSaysWhy|BadSpecs))'
fi
