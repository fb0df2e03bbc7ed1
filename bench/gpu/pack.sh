#!/usr/bin/env bash
# pack.sh — on the build machine: gather what bench/gpu/on-device.sh needs on a
# lent GPU machine into bench/out/gpu/ (git-ignored; it travels as a carried
# path) and print the one command to run there.
#
#   bench/gpu/pack.sh [BUILD_DIR]        # default: build/
#
# Builds nothing: build first (cd build && make -j2 dlbatch-train trainer_bench
# gpu_backend_test gpu_checks_test gpu_checkpoint_test gpu_graph_test
# gpu_graph_network_test gpu_mixed_precision_test gpu_mixed_train_run_test
# nccl_communicator_test backend_select_test gpu_jobs_test; gpu_jobs_test's dependencies bring
# dlbatch, dlbatch-scheduler and dlbatch-worker; dlbatch-train brings the GPU
# module, libdlbatch-gpu.so, which goes beside it). Refuses a build
# without the GPU backend or NCCL. Writes bench/out/gpu/{bundle.tar.xz (the
# binaries and the libraries the GPU machine lacks, by gpu-bundle.sh), data/
# (the four Fashion-MNIST .gz files), jobs/ (bench/jobs/*.yaml),
# pytorch_baseline.py}. Environment: FASHION_MNIST_DIR (default
# /usr/share/datasets/fashion-mnist), GPU_BUNDLE (default
# ../shared/tools/gpu-bundle.sh beside the repository).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$repo/build}" && pwd)
out=$repo/bench/out/gpu
data=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
bundler=${GPU_BUNDLE:-$repo/../shared/tools/gpu-bundle.sh}
bins=(dlbatch-train trainer_bench gpu_backend_test gpu_checks_test gpu_checkpoint_test gpu_graph_test
      gpu_graph_network_test gpu_mixed_precision_test gpu_mixed_train_run_test nccl_communicator_test backend_select_test gpu_jobs_test
      dlbatch dlbatch-scheduler dlbatch-worker libdlbatch-gpu.so)

die() { echo "pack.sh: $*" >&2; exit 1; }

[[ -x $bundler ]] || die "no gpu-bundle.sh at $bundler; set GPU_BUNDLE"
paths=()
targets=${bins[*]/libdlbatch-gpu.so/dlbatch-gpu}
for b in "${bins[@]}"; do
  [[ -x $build/bin/$b ]] ||
    die "$build/bin/$b is missing; build it first (make -j2 $targets; a" \
        "build without the GPU backend has no dlbatch-gpu)"
  paths+=("$build/bin/$b")
done
# The GPU module links cuDNN (cuBLAS it loads when a backend is made);
# dlbatch-train loads the module from its own folder (bin/ in the bundle
# too). A CPU-only build says so itself.
# (ldd's output is taken whole first: grep -q stops reading at the first
# match, and under pipefail ldd's SIGPIPE would fail the check.)
module_libs=$(ldd "$build/bin/libdlbatch-gpu.so")
grep -q 'libcudnn\.' <<<"$module_libs" ||
  die "$build/bin/libdlbatch-gpu.so does not link cuDNN: this build has no GPU" \
      "backend (configure where CUDA, cuDNN and cuBLAS are found)"
if grep -q 'without the GPU backend' <<<"$("$build/bin/dlbatch-train" --list-devices)"; then
  die "$build/bin/dlbatch-train says it was built without the GPU backend"
fi
nccl_libs=$(ldd "$build/bin/nccl_communicator_test")
grep -q 'libnccl\.' <<<"$nccl_libs" ||
  die "nccl_communicator_test does not link NCCL: this build has no NCCL"
# Stale binaries would measure old code: warn where a source is newer.
newer=$( (find "$repo/trainer" "$repo/proto" "$repo/common" \
             -newer "$build/bin/dlbatch-train" \
             \( -name '*.cc' -o -name '*.cu' -o -name '*.h' \) -print
           find "$repo/bench/trainer_bench.cc" -newer "$build/bin/trainer_bench"
           find "$repo/scheduler" "$repo/worker" "$repo/client" \
             -newer "$build/bin/gpu_jobs_test" \( -name '*.cc' -o -name '*.h' \) -print
         ) | head -5)
[[ -z $newer ]] || echo "pack.sh: warning: newer than dlbatch-train (rebuild?):" \
  $newer >&2
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz \
         t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
  [[ -f $data/$f ]] || die "no $data/$f; set FASHION_MNIST_DIR"
done

rm -rf "$out"
mkdir -p "$out/data" "$out/jobs"
"$bundler" "$out" "${paths[@]}"
cp "$data"/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz "$out/data/"
cp "$repo"/bench/jobs/*.yaml "$out/jobs/"
cp "$repo/bench/pytorch_baseline.py" "$out/"

echo "pack.sh: bundle.tar.xz $(du -h "$out/bundle.tar.xz" | cut -f1)," \
     "bench/out/gpu in all $(du -sh "$out" | cut -f1) (the carry limit is" \
     "64 MiB with the working tree)"
cat <<'MSG'
On the device, with 15 minutes of device time in all (the machine's start
included), one call; $OUT brings back on-device.log, gpu-results.md and
bench-logs.tar.xz, also from a call stopped at its limit:
  run(command="bash bench/gpu/on-device.sh lease", carry=["bench/out/gpu"], timeout_s=600)
      (every GPU test, the graph and mixed-precision ones first, then the
      mixed-precision benchmark cases with 2 repeats until 540 s: ResNet-9
      in bf16 against eager AMP and against torch.compile, float32, fp16,
      the small ResNet in bf16, ...)
With more device time, three calls (each inside the 10-minute limit):
  run(command="bash bench/gpu/on-device.sh tests", carry=["bench/out/gpu"], timeout_s=600)
      (every GPU test, about 1 min)
  run(command="REPEATS=5 bash bench/gpu/on-device.sh bench", carry=["bench/out/gpu"], timeout_s=600)
      (the benchmark table, about 4 min)
  run(command="REPEATS=3 bash bench/gpu/on-device.sh compare", carry=["bench/out/gpu"], timeout_s=600)
      (LeNet b64 with every kernel launched, LeNet b1024 and the blocks with
      cuDNN's convolutions only, against the table's default runs; about 3 min)
"bash bench/gpu/on-device.sh" (all) runs all three in one call where REPEATS
is 2; `mixed` runs the mixed-precision cases (MIXED="..."). GRAPHS=1 (or 0)
sets DLBATCH_CUDA_GRAPHS for the benchmark, CASES="lenet64gpu ..." picks
cases, COMPARE="case:VARIABLE=value ..." the comparisons.
MSG
