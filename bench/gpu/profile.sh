#!/usr/bin/env bash
# profile.sh — on a lent GPU machine (as on-device.sh: bench/out/gpu carried,
# the bundle unpacked or unpacked here): every kernel's time in a few
# training steps of dlbatch-train and of the PyTorch baseline, by Nsight
# Compute (ncu, which this workplace's GPU image has), summed per kernel
# name. Tells whether a step is bound by the GPU's kernels or by the host.
#
#   bash bench/gpu/profile.sh [CASE...]   # lenet1024 blocks256 lenet64 (default: all)
#
# SIDES="dlbatch" profiles dlbatch-train alone (default: "dlbatch pytorch").
#
# Writes $OUT/profile-CASE-{dlbatch,pytorch}.csv and prints the summaries.
set -uo pipefail
here=bench/out/gpu
OUT=${OUT:-/tmp/gpu-out}
STEPS=${STEPS:-8}
mkdir -p "$OUT"
[[ -x /tmp/dlbatch-bundle/run ]] || tar -xJf "$here/bundle.tar.xz" -C /tmp
run=/tmp/dlbatch-bundle/run
data=$PWD/$here/data
cases=("$@")
[[ ${#cases[@]} -gt 0 ]] || cases=(lenet1024 blocks256 lenet64)
for c in "${cases[@]}"; do
  case $c in
    lenet1024) model=lenet batch=1024 ;;
    lenet64) model=lenet batch=64 ;;
    blocks256) model=blocks batch=256 ;;
    *) echo "profile.sh: unknown case $c" >&2; exit 2 ;;
  esac
  job=/tmp/profile-$model.yaml
  # The carried data, and no validation pass (only training steps).
  sed -e "s#/usr/share/datasets/fashion-mnist#$data#g" -e '/validation:/d' \
    "$here/jobs/$model.yaml" >"$job"
  # Under ncu every kernel runs alone and timed, so the build's timings
  # (cudnnFind, the lowered race) would pick other algorithms than a real
  # run does: a run without ncu fills a tuning cache first, and the
  # profiled run reads its choices from it.
  export XDG_CACHE_HOME=/tmp/profile-cache-$c
  rm -rf "$XDG_CACHE_HOME"
  "$run" dlbatch-train "$job" -o "/tmp/profile-$c-tuning" --execution-environment gpu \
    --mini-batch-size "$batch" --max-iterations "$STEPS" >/tmp/profile-$c-tuning.log 2>&1 ||
    { echo "dlbatch-train failed:"; tail -20 /tmp/profile-$c-tuning.log; }
  echo "== $c: dlbatch-train, $STEPS steps"
  ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    --target-processes all --log-file "$OUT/profile-$c-dlbatch.csv" \
    "$run" dlbatch-train "$job" -o "/tmp/profile-$c" --execution-environment gpu \
    --mini-batch-size "$batch" --max-iterations "$STEPS" >/tmp/profile-$c.log 2>&1 ||
    { echo "dlbatch-train under ncu failed:"; tail -20 /tmp/profile-$c.log; }
  if [[ " ${SIDES:-dlbatch pytorch} " == *" pytorch "* ]]; then
  echo "== $c: PyTorch, $STEPS steps"
  env -u LD_LIBRARY_PATH ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    --target-processes all --log-file "$OUT/profile-$c-pytorch.csv" \
    python3 "$here/pytorch_baseline.py" --model "$model" --batch "$batch" --device cuda \
    --data-dir "$data" --max-iterations "$STEPS" >/tmp/profile-$c-py.log 2>&1 ||
    { echo "PyTorch under ncu failed:"; tail -20 /tmp/profile-$c-py.log; }
  fi
  for side in ${SIDES:-dlbatch pytorch}; do
    python3 - "$OUT/profile-$c-$side.csv" "$STEPS" "$c $side" <<'PY'
import csv, sys, collections
path, steps, title = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = []
with open(path) as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "nsecond")
    v *= {"n": 1e-3, "u": 1.0, "m": 1e3}.get(unit[:1], 1e-3)
    rows.append((int(r["ID"]), r["Kernel Name"][:90], v))
by = collections.OrderedDict()
for _, name, us in rows:
    c, t = by.get(name, (0, 0.0))
    by[name] = (c + 1, t + us)
total = sum(us for _, _, us in rows)
# Kernels run once a step (or more) are the step's; fewer: set-up, search.
step = sum(t for c, t in by.values() if c >= steps - 1)
print(f"-- {title}: {len(rows)} kernels, {total/1e3:.2f} ms in all; "
      f"kernels run >= {steps-1} times: {step/steps:.1f} us per step")
for name, (c, t) in sorted(by.items(), key=lambda kv: -kv[1][1])[:25]:
    print(f"{c:6d} x {t/c:9.1f} us = {t/1e3:8.3f} ms  {name}")
PY
  done
done
