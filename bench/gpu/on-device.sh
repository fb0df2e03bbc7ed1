#!/usr/bin/env bash
# on-device.sh — on a lent GPU machine, from the repository's root copy with
# bench/out/gpu carried (bench/gpu/pack.sh made it): the GPU tests and the
# GPU benchmark in one call.
#
#   bash bench/gpu/on-device.sh [all|tests|bench|compare|mixed|lease]
#   (default: all)
#
# all: unpack, nvidia-smi, the GPU tests, the benchmark, then the
# comparisons; about 5-6 minutes in all with REPEATS=2, within the device
# tool's 10-minute limit per command; with more repeats run `tests`, `bench`
# and `compare` as three calls.
#   - unpack and device information: about 10 s;
#   - gpu_backend_test, gpu_checks_test, gpu_checkpoint_test, gpu_graph_test,
#     gpu_graph_network_test, gpu_mixed_precision_test (bf16 and fp16 layers
#     and LeNet steps against float32), gpu_mixed_train_run_test (LeNet
#     epochs in bf16 and fp16 against fp32's accuracy, checkpoints across
#     precisions), nccl_communicator_test, backend_select_test, gpu_jobs_test
#     (the real scheduler, worker and CLI: LeNet jobs on the GPU)
#     (--gtest_brief=1, each stopped after 150 s; gpu_jobs_test and
#     gpu_mixed_train_run_test 300 s): about 1 min (52 s on an H100) before
#     the mixed-precision ones, which are not timed yet (estimate 2-3 min);
#   - trainer_bench --gpu, one case at a time (lenet64gpu, lenet1024gpu,
#     blocks256gpu; 2 epochs; REPEATS seeds, default 4, both sides
#     alternating; each case stopped after 200 s): about 1-1.5 min a case,
#     most of it process start-up (import torch, CUDA initialisation, reading
#     the data), which stays outside both sides' timings. CASES overrides the
#     case list; GRAPHS=0|1 sets DLBATCH_CUDA_GRAPHS for every case.
#   - compare: COMPARE (default "lenet64gpu:DLBATCH_CUDA_GRAPHS=0
#     lenet1024gpu:DLBATCH_CONV_LOWERED=0 blocks256gpu:DLBATCH_CONV_LOWERED=0"),
#     each case run again with one variable of dlbatch-train's set, against
#     the table's default run of the same case: every kernel launched (no
#     recorded steps) at batch 64, and convolutions by cuDNN only (no
#     lowered ones raced against it) at batch 1024 and for the blocks;
#     about 1 min each. Batches sent as the host's floats instead of bytes:
#     COMPARE=lenet1024gpu:DLBATCH_BYTES_BATCHES=0.
#   - mixed: the lower precisions, trainer_bench's GPU cases in tf32, bf16
#     and fp16 against PyTorch eager (TF32; AMP with channels_last), MIXED
#     (default "resnet9gpu resnet9gpu-bf16 resnet9gpu-fp16 lenet1024gpu-bf16
#     lenet1024gpu-fp16"; also resnet9gpu-tf32, resnetgpu-bf16,
#     resnetgpu-fp16; against torch.compile: resnet9gpu-compiled,
#     resnet9gpu-tf32-compiled, resnet9gpu-bf16-compiled,
#     resnetgpu-bf16-compiled, skipped where that PyTorch has none), not run
#     by `all`; not timed yet: about a minute a case with REPEATS=2, so split
#     longer lists over several calls.
#   - lease: what one short device lease (15 minutes, the start included)
#     should run, in one call: the tests, the graph and mixed-precision
#     ones first, then LEASE_CASES (default "resnet9gpu-bf16
#     resnet9gpu-bf16-compiled resnet9gpu resnet9gpu-fp16 resnetgpu-bf16
#     resnet9gpu-compiled lenet1024gpu-bf16")
#     with REPEATS (default 2 here) until DEADLINE seconds (default 540) are
#     spent: a case is started only with 60 s left, and is stopped after
#     200 s (300 s against torch.compile, whose first compilation takes a
#     minute or more) or at the deadline; each test is stopped after 120 s
#     (gpu_jobs_test, gpu_mixed_train_run_test 200 s). Every finished case
#     is in gpu-results.md at once, and each run's images/s in
#     on-device.log, so a call stopped at its limit still brings back what
#     ran.
#   TESTS overrides the list of tests.
# Writes to $OUT (default /tmp/gpu-out): gpu-results.md (the tables),
# on-device.log (everything printed), bench-logs.tar.xz (each run's logs and
# JSON, without models or checkpoints). Ends with the tables.
set -uo pipefail
mode=${1:-all}
case $mode in all|tests|bench|compare|mixed|lease) ;; *) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2 ;; esac
here=bench/out/gpu
OUT=${OUT:-/tmp/gpu-out}
if [[ $mode == lease ]]; then
  REPEATS=${REPEATS:-2}
  DEADLINE=${DEADLINE:-540}
fi
REPEATS=${REPEATS:-4}
DEADLINE=${DEADLINE:-}
THREADS=${THREADS:-4}
mkdir -p "$OUT"
[[ -f $here/bundle.tar.xz ]] || {
  echo "on-device.sh: no $here/bundle.tar.xz; run bench/gpu/pack.sh on the" \
       "build machine and carry bench/out/gpu" >&2
  exit 2
}

# A test stopped by its timeout leaves its cluster behind (scheduler,
# worker, a trainer on the GPU): none of it may run into what follows.
leftovers() {
  command -v pkill >/dev/null || return 0
  pkill -9 -f '^/tmp/dlbatch-bundle/bin/' && echo "== stopped leftover processes"
  return 0
}

# Sets `limit` to at most what is left of DEADLINE (seconds since t0), if
# set; fails, saying so of `what`, where less than `least` seconds are left.
within_deadline() {
  local what=$1 least=$2
  [[ -n $DEADLINE ]] || return 0
  local left=$((DEADLINE - (SECONDS - t0)))
  if ((left < least)); then
    echo "== $what: not started, ${left} s left of DEADLINE=$DEADLINE"
    return 1
  fi
  ((left < limit)) && limit=$left
  return 0
}

main() {
  local t0=$SECONDS status=0
  leftovers
  tar -xJf "$here/bundle.tar.xz" -C /tmp || return 1
  local run=/tmp/dlbatch-bundle/run
  echo "== device"
  nvidia-smi
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,pstate --format=csv
  nproc
  python3 -c 'import torch; print("PyTorch", torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version(), torch.cuda.get_device_name(0))'
  for b in dlbatch-train trainer_bench gpu_backend_test gpu_checks_test gpu_checkpoint_test gpu_graph_test gpu_graph_network_test gpu_mixed_precision_test gpu_mixed_train_run_test nccl_communicator_test backend_select_test gpu_jobs_test dlbatch dlbatch-scheduler dlbatch-worker; do
    echo -n "$b: "; "$run" --check "$b"
  done
  "$run" dlbatch-train --list-devices
  echo "== device information took $((SECONDS - t0)) s"

  if [[ $mode == all || $mode == tests || $mode == lease ]]; then
    # gpu_checkpoint_test runs the bundle's dlbatch-train on the carried data.
    export DLBATCH_BIN_DIR=/tmp/dlbatch-bundle/bin
    export DLBATCH_TEST_DATA_DIR=$PWD/$here/data
    local tests="gpu_backend_test gpu_checks_test gpu_checkpoint_test gpu_graph_test gpu_graph_network_test gpu_mixed_precision_test gpu_mixed_train_run_test nccl_communicator_test backend_select_test gpu_jobs_test"
    [[ $mode == lease ]] &&
      tests="gpu_graph_test gpu_graph_network_test gpu_mixed_precision_test gpu_mixed_train_run_test gpu_backend_test gpu_checks_test gpu_checkpoint_test nccl_communicator_test backend_select_test gpu_jobs_test"
    for t in ${TESTS:-$tests}; do
      local t1=$SECONDS limit=150 long=300
      [[ $mode == lease ]] && limit=120 long=200
      [[ $t == gpu_jobs_test || $t == gpu_mixed_train_run_test ]] && limit=$long
      within_deadline "$t" 30 || { status=1; continue; }
      echo "== $t"
      timeout "$limit" "$run" "$t" --gtest_brief=1
      local rc=$?
      echo "== $t: exit $rc, $((SECONDS - t1)) s"
      [[ $rc == 0 ]] || status=1
      leftovers
    done
  fi

  if [[ $mode != tests ]]; then
    # PyTorch runs with this machine's own library path, not the bundle's
    # (which `run` puts first for dlbatch-train and trainer_bench).
    local py=/tmp/dlbatch-python3
    printf '#!/bin/sh\n%s\nexec python3 "$@"\n' \
      "$( [[ -n ${LD_LIBRARY_PATH:-} ]] &&
          printf 'export LD_LIBRARY_PATH=%q' "$LD_LIBRARY_PATH" ||
          echo 'unset LD_LIBRARY_PATH' )" >"$py"
    chmod +x "$py"
    : >"$OUT/gpu-results.md"
    local marker
    marker=$(mktemp /tmp/on-device-start.XXXXXX)  # the runs' folders are newer
    # Each entry: case[:VARIABLE=value], the variable set for that run.
    local cases=
    if [[ $mode == mixed ]]; then
      cases=" ${MIXED:-resnet9gpu resnet9gpu-bf16 resnet9gpu-fp16 lenet1024gpu-bf16 lenet1024gpu-fp16}"
    elif [[ $mode == lease ]]; then
      cases=" ${LEASE_CASES:-resnet9gpu-bf16 resnet9gpu-bf16-compiled resnet9gpu resnet9gpu-fp16 resnetgpu-bf16 resnet9gpu-compiled lenet1024gpu-bf16}"
    elif [[ $mode != compare ]]; then
      for c in ${CASES:-lenet64gpu lenet1024gpu blocks256gpu}; do
        cases+=" $c${GRAPHS:+:DLBATCH_CUDA_GRAPHS=$GRAPHS}"
      done
    fi
    if [[ $mode != bench && $mode != mixed && $mode != lease ]]; then
      cases+=" ${COMPARE-lenet64gpu:DLBATCH_CUDA_GRAPHS=0 lenet1024gpu:DLBATCH_CONV_LOWERED=0 blocks256gpu:DLBATCH_CONV_LOWERED=0}"
    fi
    for entry in $cases; do
      local c=${entry%%:*} setting=
      [[ $entry == *:* ]] && setting=${entry#*:}
      local t1=$SECONDS limit=200
      # torch.compile's first compilation of a ResNet takes a minute or more.
      [[ $c == *-compiled ]] && limit=300
      within_deadline "$c" 60 || { status=1; continue; }
      echo "== trainer_bench --gpu --only $c (repeats $REPEATS," \
           "${setting:-defaults}, stopped after $limit s)"
      ( if [[ -n $setting ]]; then export "${setting?}"; fi
        timeout "$limit" "$run" trainer_bench --gpu --only "$c" \
          --repeats "$REPEATS" --vary-seed --threads "$THREADS" --timeout 90 \
          --python "$py" --data-dir "$here/data" --jobs-dir "$here/jobs" \
          --baseline "$here/pytorch_baseline.py" >"$OUT/$c.md" )
      local rc=$?
      echo "== $c: exit $rc, $((SECONDS - t1)) s"
      [[ $rc == 0 ]] || status=1
      { echo "### $c${setting:+ ($setting)}"; echo
        cat "$OUT/$c.md"; echo; } >>"$OUT/gpu-results.md"
      rm -f "$OUT/$c.md"
    done
    local dirs
    dirs=$(cd /tmp && find . -maxdepth 1 -name 'trainer-bench-*' -newer "$marker")
    [[ -z $dirs ]] || tar -cJf "$OUT/bench-logs.tar.xz" --exclude='*.dlbc' \
      --exclude='*.onnx' -C /tmp $dirs
    echo "== results ($((SECONDS - t0)) s in all; $OUT/gpu-results.md)"
    cat "$OUT/gpu-results.md"
  fi
  echo "== on-device.sh $mode: $([[ $status == 0 ]] && echo ok || echo FAILED)," \
       "$((SECONDS - t0)) s"
  return $status
}

main 2>&1 | tee "$OUT/on-device.log"
exit "${PIPESTATUS[0]}"
