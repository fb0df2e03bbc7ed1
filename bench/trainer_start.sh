#!/usr/bin/env bash
# trainer_start.sh — what starting dlbatch-train costs a run that trains on
# the CPU, in a build with the GPU backend: wall time and peak memory of
# `dlbatch-train --list-devices` as built (cuBLAS is loaded only when a GPU
# backend is made, trainer/cuda/cublas_library.h) against the same binary with
# cuBLAS preloaded (LD_PRELOAD), which is what linking it used to do: the
# baseline, measured in the same run, alternating.
#
#   bench/trainer_start.sh [BUILD_DIR] [RUNS]     # default: build/ 20
#
# CUBLAS names the library to preload (default: the one CMake found, from
# BUILD_DIR/CMakeCache.txt). Prints a Markdown table.
set -euo pipefail
build=${1:-build}
runs=${2:-20}
bin=$build/bin/dlbatch-train
[[ -x $bin ]] || { echo "trainer_start.sh: no $bin; build first" >&2; exit 2; }
cublas=${CUBLAS:-$(sed -n 's/^CUDA_cublas_LIBRARY:FILEPATH=//p' "$build/CMakeCache.txt" 2>/dev/null)}
[[ -n $cublas && -e $cublas ]] || {
  echo "trainer_start.sh: no cuBLAS to preload (a CPU-only build?); set CUBLAS" >&2
  exit 2
}
[[ -x /usr/bin/time ]] || { echo "trainer_start.sh: needs /usr/bin/time (apt-get install time)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# One start: wall milliseconds and peak RSS in KiB, appended to $1.
start() {
  local out=$1; shift
  local t0 t1
  t0=$(date +%s%N)
  env "$@" /usr/bin/time -f %M -o "$tmp/rss" "$bin" --list-devices >/dev/null
  t1=$(date +%s%N)
  echo "$(( (t1 - t0) / 1000 )) $(cat "$tmp/rss")" >>"$out"
}
median() {  # column $2 of file $1
  sort -n -k"$2" "$1" | awk -v c="$2" '{v[NR]=$c} END {print v[int((NR+1)/2)]}'
}
start "$tmp/warm" CUDA_VISIBLE_DEVICES=  # page cache
start "$tmp/warm" CUDA_VISIBLE_DEVICES= LD_PRELOAD="$cublas"
for ((i = 0; i < runs; i++)); do
  start "$tmp/lazy" CUDA_VISIBLE_DEVICES=
  start "$tmp/linked" CUDA_VISIBLE_DEVICES= LD_PRELOAD="$cublas"
done
lazy_us=$(median "$tmp/lazy" 1); linked_us=$(median "$tmp/linked" 1)
lazy_kb=$(median "$tmp/lazy" 2); linked_kb=$(median "$tmp/linked" 2)
awk -v runs="$runs" -v lu="$lazy_us" -v bu="$linked_us" -v lk="$lazy_kb" -v bk="$linked_kb" 'BEGIN {
  printf "| dlbatch-train --list-devices, median of %d | wall | peak RSS |\n", runs
  print "|---|---|---|"
  printf "| cuBLAS preloaded (as when linked) — baseline | %.1f ms | %d MB |\n", bu / 1000, bk / 1024
  printf "| as built: cuBLAS loaded with a GPU backend only | %.1f ms | %d MB |\n", lu / 1000, lk / 1024
  printf "| ratio, as built / baseline | %.2f× | %.2f× |\n", lu / bu, lk / bk
}'
