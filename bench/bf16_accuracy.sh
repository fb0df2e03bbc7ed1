#!/usr/bin/env bash
# bf16_accuracy.sh — the accuracy goal for `precision: bf16` on the CPU,
# on whole epochs: LeNet (batch 64), the block network (batch 256) and
# the small ResNet (batch 128), each trained for one epoch on Fashion-MNIST by
# dlbatch-train in float32 and in bf16 with the same seeds (the same initial
# weights and batches), their test accuracies averaged over the seeds. Goal:
# bf16's mean within 0.3 points of float32's. The job files are trainer_bench's
# (bench/jobs/); only the seed and the precision change. The CI test
# (bf16_train_run_test) checks shorter runs of the same networks.
#
#   bench/bf16_accuracy.sh [BUILD_DIR] [SEEDS] [NETS]
#   # default: build/ "1 2 3 4" "lenet blocks resnet"
#
# Needs a CPU with AVX-512 BF16 or AMX (dlbatch-train says so otherwise) and
# Debian's dataset-fashion-mnist. Prints each run, then a Markdown table.
set -euo pipefail
build=${1:-build}
seeds=${2:-1 2 3 4}
nets=${3:-lenet blocks resnet}
here=$(cd "$(dirname "$0")" && pwd)
bin=$build/bin/dlbatch-train
[[ -x $bin ]] || { echo "bf16_accuracy.sh: no $bin; build first" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OPENBLAS_CORETYPE=SkylakeX

# The test accuracy of one run: net $1, precision $2, seed $3.
accuracy() {
  local job=$tmp/$1-$2-$3.yaml out=$tmp/$1-$2-$3
  sed -e "s/^    seed: 1\$/    seed: $3\n    precision: $2/" \
    "$here/jobs/$1.yaml" >"$job"
  grep -q "^    precision: $2\$" "$job" || {
    echo "bf16_accuracy.sh: bench/jobs/$1.yaml has no '    seed: 1' line" >&2
    exit 2
  }
  if ! "$bin" "$job" --output-dir "$out" --threads 2 >"$out.log" 2>&1; then
    echo "bf16_accuracy.sh: $1 $2 seed $3 failed:" >&2
    tail -5 "$out.log" >&2
    exit 1
  fi
  sed -n 's/.*"validation_accuracy": *\([0-9.]*\).*/\1/p' "$out/metrics.json"
}

for net in $nets; do
  for seed in $seeds; do
    for precision in fp32 bf16; do
      a=$(accuracy "$net" "$precision" "$seed")
      echo "$net $precision seed $seed: $a %"
      echo "$net $precision $seed $a" >>"$tmp/runs"
    done
  done
done

echo
echo "| network, 1 epoch | seeds | float32 mean | bf16 mean | Δ (points) | goal | |"
echo "|---|---|---|---|---|---|---|"
awk -v seeds="$seeds" '
  { sum[$1 " " $2] += $4; n[$1 " " $2]++; if (!($1 in seen)) { seen[$1] = 1; order[++k] = $1 } }
  END {
    for (i = 1; i <= k; i++) {
      net = order[i]
      fp32 = sum[net " fp32"] / n[net " fp32"]
      bf16 = sum[net " bf16"] / n[net " bf16"]
      d = bf16 - fp32
      printf "| %s | %s | %.2f %% | %.2f %% | %+.2f | Δ >= -0.3 | %s |\n",
        net, seeds, fp32, bf16, d, (d >= -0.3 ? "met" : "MISSED")
    }
  }' "$tmp/runs"
