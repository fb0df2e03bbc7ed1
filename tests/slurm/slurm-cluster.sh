#!/usr/bin/env bash
# A real Slurm for tests, under one folder, on this machine:
#   slurm-cluster.sh start DIR [NODES]   munged, slurmctld and NODES slurmd
#                                        (n1, n2, ...; default 2), each with
#                                        two fake GPUs; prints nothing but
#                                        errors; exits 0 once every node is
#                                        idle, 2 when Slurm cannot run here
#                                        (the reason on stderr).
#   slurm-cluster.sh stop DIR            stops them by the pids it started.
#   slurm-cluster.sh env DIR             prints the variables Slurm's commands
#                                        need (SLURM_CONF), for eval.
# Partitions over all nodes: gpu (the default; never preempted), low
# (preempted by Slurm, PreemptMode=CANCEL with a GraceTime of 15 s),
# requeue (the same with PreemptMode=REQUEUE) and high (a higher
# PriorityTier: its jobs preempt low's and requeue's).
# Nothing is written outside DIR: each daemon is pointed at DIR for its
# configuration, state, spool, sockets, pid and log files. Slurm 22.05's
# slurmd drops count-only GRES, so each fake GPU is a character device
# (the same numbers as /dev/null) named in gres.conf.
set -euo pipefail

usage() {
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 1
}

cant_run() {
  echo "slurm-cluster: $*" >&2
  exit 2
}

# A TCP port nobody listens on (the kernel picks it).
free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_for() {  # wait_for SECONDS COMMAND...
  local deadline=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

start() {
  local dir=$1 nodes=${2:-2}
  for tool in munged slurmctld slurmd sinfo; do
    command -v "$tool" >/dev/null ||
      cant_run "$tool is not installed (apt-get install slurm-wlm munge)"
  done
  [[ $(id -u) == 0 ]] || cant_run "slurmd needs root to start jobs as their users"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  # Others may pass through (not list) the folder and munge's: slurmd runs
  # a job's script from its spool folder as the job's user, and that user's
  # srun reaches munged's socket. The key stays root's alone (0400).
  chmod 0711 "$dir"
  mkdir -p "$dir/munge" "$dir/ctld" "$dir/dev"
  chmod 0711 "$dir/munge"

  # munge: its own key and socket.
  head -c 1024 /dev/urandom >"$dir/munge/munge.key"
  chmod 0400 "$dir/munge/munge.key"
  munged --force --key-file="$dir/munge/munge.key" \
    --socket="$dir/munge/munge.sock" --pid-file="$dir/munge/munged.pid" \
    --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed" ||
    cant_run "munged did not start: $(tail -3 "$dir/munge/munged.log" 2>/dev/null)"
  wait_for 10 test -S "$dir/munge/munge.sock" ||
    cant_run "munged made no socket"

  local ctld_port
  ctld_port=$(free_port)
  local node_lines="" gres_lines="" names=""
  for ((i = 1; i <= nodes; i++)); do
    local port
    port=$(free_port)
    for g in 0 1; do
      [[ -e "$dir/dev/n$i-gpu$g" ]] || mknod "$dir/dev/n$i-gpu$g" c 1 3
    done
    node_lines+="NodeName=n$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=$port CPUs=2 RealMemory=2000 Gres=gpu:2 State=UNKNOWN"$'\n'
    gres_lines+="NodeName=n$i Name=gpu File=$dir/dev/n$i-gpu[0-1]"$'\n'
    names+="${names:+,}n$i"
    mkdir -p "$dir/slurmd-n$i"
  done

  cat >"$dir/slurm.conf" <<EOF
ClusterName=dlbt
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.sock
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/slurmd-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=60
KillWait=5
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
$node_lines
PartitionName=gpu Nodes=$names Default=YES MaxTime=INFINITE State=UP PreemptMode=OFF
PartitionName=low Nodes=$names MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=CANCEL GraceTime=15
PartitionName=requeue Nodes=$names MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=15
PartitionName=high Nodes=$names MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
EOF
  printf 'AutoDetect=off\n%s' "$gres_lines" >"$dir/gres.conf"
  # Slurm 22.05 reads cgroup.conf even when no cgroup plugin is used.
  printf 'CgroupPlugin=autodetect\nIgnoreSystemd=yes\n' >"$dir/cgroup.conf"

  export SLURM_CONF="$dir/slurm.conf"
  slurmctld -i >"$dir/slurmctld.out" 2>&1 ||
    cant_run "slurmctld did not start: $(tail -5 "$dir/slurmctld.log" "$dir/slurmctld.out" 2>/dev/null)"
  wait_for 20 sinfo ||
    cant_run "slurmctld does not answer: $(tail -5 "$dir/slurmctld.log" 2>/dev/null)"
  for ((i = 1; i <= nodes; i++)); do
    slurmd -N "n$i" >"$dir/slurmd-n$i.out" 2>&1 ||
      cant_run "slurmd -N n$i did not start: $(tail -5 "$dir/slurmd-n$i.log" "$dir/slurmd-n$i.out" 2>/dev/null)"
  done
  idle() {
    local states
    states=$(sinfo -h -N -o '%t' | sort -u | tr '\n' ' ')
    [[ $states == "idle " ]]
  }
  wait_for 30 idle ||
    cant_run "the nodes did not become idle: $(sinfo -N -o '%N %t %E' 2>&1 | tr '\n' ';') $(tail -3 "$dir"/slurmd-n*.log 2>/dev/null)"
}

stop() {
  local dir=$1
  local pids=()
  for f in "$dir"/slurmd-n*.pid "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
    [[ -f $f ]] && pids+=("$(cat "$f")")
  done
  ((${#pids[@]} > 0)) || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 50); do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    ((alive)) || return 0
    sleep 0.1
  done
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

case "${1:-}" in
  start) [[ $# -ge 2 ]] || usage; start "$2" "${3:-2}" ;;
  stop) [[ $# -eq 2 ]] || usage; stop "$2" ;;
  env) [[ $# -eq 2 ]] || usage; echo "export SLURM_CONF=$(cd "$2" && pwd)/slurm.conf" ;;
  *) usage ;;
esac
