#!/usr/bin/env bash
# The test Slurm itself: two slurmd on this machine, two fake GPUs each; a
# two-node job gets one task per node and both GPUs of each; a drained node
# shows its reason; stopping leaves no daemon running. Skips (exit 77) with
# the reason where Slurm cannot run here.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d /tmp/dlbatch-slurm-XXXXXX)
cleanup() {
  "$here/slurm-cluster.sh" stop "$dir" || true
  rm -rf "$dir"
}
trap cleanup EXIT
rc=0
"$here/slurm-cluster.sh" start "$dir" 2 || rc=$?
if ((rc == 2)); then
  echo "SKIP: Slurm cannot run here (see above)"
  exit 77
fi
((rc == 0)) || exit "$rc"
eval "$("$here/slurm-cluster.sh" env "$dir")"
pids=$(cat "$dir"/slurmd-n*.pid "$dir/slurmctld.pid" "$dir/munge/munged.pid")

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

out="$dir/two-nodes.out"
id=$(sbatch --parsable --nodes=2 --ntasks=2 --ntasks-per-node=1 --gres=gpu:2 \
  --export=NONE --output="$out" \
  --wrap '/usr/bin/srun /bin/sh -c "echo \$SLURM_PROCID \$SLURMD_NODENAME \$CUDA_VISIBLE_DEVICES"')
for _ in $(seq 100); do
  state=$(squeue -h --states=all -j "$id" -o %T)
  [[ $state == COMPLETED || $state == FAILED ]] && break
  sleep 0.2
done
[[ $state == COMPLETED ]] || fail "the two-node job is $state: $(cat "$out" 2>&1)"
sorted=$(sort "$out")
[[ $sorted == $'0 n1 0,1\n1 n2 0,1' ]] || fail "the ranks printed: $sorted"

scontrol update nodename=n2 state=drain reason=maintenance
id=$(sbatch --parsable --nodes=2 --export=NONE --output=/dev/null --wrap true)
sleep 1
reason=$(squeue -h -j "$id" -o %r)
[[ $reason == *DRAINED* || $reason == *Resources* ]] ||
  fail "a job for the drained node waits for '$reason'"
[[ $(sinfo -h -n n2 -o %E) == maintenance ]] || fail "n2's reason: $(sinfo -h -n n2 -o %E)"
scancel "$id"

"$here/slurm-cluster.sh" stop "$dir"
for p in $pids; do
  ! kill -0 "$p" 2>/dev/null || fail "pid $p is still running after stop"
done
echo "PASS"
