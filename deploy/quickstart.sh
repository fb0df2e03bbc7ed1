#!/usr/bin/env bash
# The main job: installs what is missing (Debian's dataset-fashion-mnist
# included), builds, and trains LeNet on Fashion-MNIST through the embedded
# local cluster: submit, follow the diary live, fetch the outputs, print the
# test accuracy and where the model and plot are.
#
#   deploy/quickstart.sh [JOB_FILE]   (default examples/lenet-fashion-mnist.yaml)
#
# The job's pool is its own unless the local cluster has fewer slots (GPUs
# where the build has the GPU backend and the machine GPUs, else CPU slots):
# then it uses them all.
set -euo pipefail
cd "$(dirname "$0")/.."
job=${1:-examples/lenet-fashion-mnist.yaml}

# Only what the job needs: the four programs (the test command builds the
# tests and benchmarks).
deploy/bootstrap.sh --programs
export PATH="$PWD/build/bin:$PATH"

# The example attaches data/ next to it: the four IDX files.
data_src=/usr/share/datasets/fashion-mnist
data_dir=$(dirname "$job")/data
if grep -q 'attach:.*data/' "$job"; then
  mkdir -p "$data_dir"
  for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz \
           t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
    [ -s "$data_dir/$f" ] || cp "$data_src/$f" "$data_dir/$f"
  done
fi

dlbatch local start >/dev/null
pool_args=()
want=$(sed -n 's/^pool: *\([0-9]*\).*/\1/p' "$job")
slots=$(dlbatch profiles --json | sed -n 's/.*"max_pool": *\([0-9]*\).*/\1/p' | head -1)
if [ -n "$want" ] && [ -n "$slots" ] && [ "$slots" -gt 0 ] && [ "$want" -gt "$slots" ]; then
  echo "the local cluster has $slots slot(s) (dlbatch profiles); the job asks for $want: using --pool $slots"
  pool_args=(--pool "$slots")
fi

echo
echo "== dlbatch submit ${pool_args[*]} $job"
id=$(dlbatch submit -q "${pool_args[@]}" "$job")
echo "job $id queued; following its diary:"
dlbatch diary -f "$id"
echo
status=0
dlbatch wait "$id" >/dev/null || status=$?
dlbatch show "$id" | sed -n '1,2p'
echo
out="outputs/job-$id"
echo "== dlbatch fetch-outputs $id"
dlbatch fetch-outputs "$id" -o "$out"
if [ "$status" -ne 0 ]; then
  echo "job $id did not finish well (dlbatch show $id says why)" >&2
  exit "$status"
fi
echo
if [ -f "$out/metrics.json" ]; then
  acc=$(sed -n 's/.*"validation_accuracy": *\([0-9.]*\).*/\1/p' "$out/metrics.json" | head -1)
  printf 'Test accuracy (Fashion-MNIST t10k): %.2f%%\n' "$acc"
  echo "Model:    $out/model.onnx (ONNX) and $out/checkpoint.dlbc"
  echo "Plot:     $out/training_progress.svg"
  echo "History:  $out/training_history.csv, metrics in $out/metrics.json"
else
  echo "Outputs of job $id are in $out/."
fi
echo
echo "The local cluster keeps running; watch it with 'dlbatch monitor', stop it with:"
echo "  build/bin/dlbatch local stop"
