#!/usr/bin/env bash
# The Debian package installed for real, and its units under a real systemd,
# with nothing of it reaching this machine: every step runs on an overlay
# whose lower layer is / and whose upper layer is a temp folder, in mount
# namespaces of its own. That root has no CUDA, as a plain Debian machine:
# CUDA's folders (/usr/local/cuda*, and wherever ld.so.cache finds its
# libraries) are empty tmpfs mounts there, and its ld.so.cache is made
# again without them.
#  1. `dpkg -i` in a chroot of the overlay: the maintainer scripts run (the
#     dlbatch user from sysusers.d, the folders from tmpfiles.d, conffiles);
#     dpkg and apt find the package installed and every dependency met.
#     Without CUDA every installed program's libraries resolve; a GPU run
#     is refused, saying what to install (the dlbatch-gpu package; with it
#     installed, where the build made it, CUDA's libraries); and a train job
#     (LeNet on Fashion-MNIST, a few iterations, execution_environment:
#     auto) runs to finished on the CPU through the installed scheduler,
#     worker and CLI.
#  2. systemd 252 booted as PID 1 of new PID, mount, UTS, IPC, network and
#     cgroup namespaces on that root (a container, as systemd-nspawn makes one, with
#     a cgroup2 hierarchy of its own): dlbatch-scheduler.service reaches
#     active through Type=notify as user dlbatch in its sandbox,
#     dlbatch-worker.service joins it, a job submitted with the installed CLI
#     runs in a cgroup under the worker unit's (Delegate=yes), a user's job
#     runs as that user, a restart of the scheduler (and a kill -9, after
#     which systemd restarts it) keeps the jobs (StateDirectory=), stopping
#     the worker leaves no job process (KillMode=mixed), nor does killing it
#     (kill -9; systemd restarts it), and both units stop cleanly. The package installed again over itself (postinst's upgrade
#     path) restarts the running units.
#  3. `dpkg -r` stops the units (under systemd) and keeps the conffiles and
#     state, `dpkg --purge` removes them; then systemd powers off. (Where
#     systemd could not boot, -r and --purge run in the chroot.)
#  4. This machine has no trace of any of it: no dlbatch user, package,
#     files, mounts, cgroups or processes.
# Skips (77) where it cannot run: not root, no overlayfs or unshare, no
# cgroup2 hierarchy, or systemd does not boot in a namespace on this kernel
# (the dpkg part then still runs and must pass).
#   install_test.sh BUILD_DIR        (DLBATCH_DEB=FILE.deb: install this one
#                                     instead of building the `deb` target;
#                                     DLBATCH_GPU_DEB=FILE.deb: with this
#                                     dlbatch-gpu)
set -euo pipefail
build=$(cd "$1" && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/build_deb.sh"
((EUID == 0)) || skip "not root (dpkg -i, mounts and namespaces need root)"
for tool in dpkg dpkg-deb unshare nsenter chroot setpriv timeout; do
  command -v $tool >/dev/null || skip "no $tool"
done
grep -qw overlay /proc/filesystems || modprobe overlay 2>/dev/null \
  || skip "the kernel has no overlayfs"
started=$SECONDS

tmp=$(mktemp -d /tmp/dlbatch-install.XXXXXX)
cg=""      # the cgroup2 folder the booted systemd owns
unshare_pid=""
init_pid=""  # systemd, PID 1 of the namespaces (its pid here)
cleanup() {
  set +e
  if [[ -n $unshare_pid ]] && kill -0 "$unshare_pid" 2>/dev/null; then
    [[ -n $init_pid ]] && kill -9 "$init_pid" 2>/dev/null
    kill -9 "$unshare_pid" 2>/dev/null
    wait "$unshare_pid" 2>/dev/null || true
  fi
  if [[ -n $cg && -d $cg ]]; then
    # Whatever is left in it (nothing unless a step failed), then the folders.
    [[ -e $cg/cgroup.kill ]] && echo 1 >"$cg/cgroup.kill" 2>/dev/null
    for _ in $(seq 50); do
      [[ -z $(find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null) ]] && break
      sleep 0.1
    done
    find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
# A timeout's SIGTERM (ctest's) cleans up too.
trap 'exit 143' TERM
trap 'exit 130' INT
[[ $(stat -f -c %T "$tmp") != overlayfs ]] || skip "/tmp is itself an overlayfs (no upper layer on it)"
mkdir "$tmp/upper" "$tmp/work" "$tmp/root"

# What this machine has of dlbatch before (normally nothing); compared at
# the end. Other tests may run beside this one, so only dlbatch's own traces.
traces() {
  getent passwd dlbatch || true
  getent group dlbatch || true
  getent passwd dlbatch-test-user || true
  dpkg-query -W -f='${Status} ${Version}\n' dlbatch 2>/dev/null || true
  for f in /etc/dlbatch /var/lib/dlbatch /var/lib/dlbatch-worker /run/dlbatch \
    /usr/bin/dlbatch /usr/bin/dlbatch-scheduler /lib/systemd/system/dlbatch-scheduler.service \
    /usr/lib/sysusers.d/dlbatch.conf /usr/lib/tmpfiles.d/dlbatch.conf; do
    [[ -e $f ]] && stat -c '%n %u:%g %a %Y' "$f"
  done
  true
}
traces >"$tmp/traces.before"

if [[ -n ${DLBATCH_DEB:-} ]]; then
  deb=$(readlink -f "$DLBATCH_DEB")
  [[ -f $deb ]] || fail "DLBATCH_DEB=$DLBATCH_DEB is no file"
  gpu_deb=${DLBATCH_GPU_DEB:+$(readlink -f "$DLBATCH_GPU_DEB")}
  [[ -z $gpu_deb || -f $gpu_deb ]] || fail "DLBATCH_GPU_DEB=$DLBATCH_GPU_DEB is no file"
else
  build_deb "$build" "$tmp"
fi
version=$(dpkg-deb -f "$deb" Version)
mkdir -p "$tmp/debs/gpu" && cp "$deb" "$tmp/debs/"
[[ -z $gpu_deb ]] || cp "$gpu_deb" "$tmp/debs/gpu/"
echo "package $(basename "$deb")${gpu_deb:+ and $(basename "$gpu_deb")}"
data=/usr/share/datasets/fashion-mnist
[[ -f $data/t10k-images-idx3-ubyte.gz && -f $data/t10k-labels-idx1-ubyte.gz ]] \
  || fail "no Fashion-MNIST in $data for the train job: apt-get install dataset-fashion-mnist (deploy/bootstrap.sh --test-tools)"

# CUDA's folders, hidden in the overlay root by an empty tmpfs each: NVIDIA's
# /usr/local/cuda*, and the folders where ld.so.cache finds CUDA's libraries.
# Only folders of their own: a system folder (Debian's CUDA packages put
# them in /usr/lib/<triplet>) cannot be hidden, and the check in the root
# then says so.
cuda_libs='lib(cudart|cudnn[a-z_]*|nccl|cublas|cublasLt)\.so'
{
  for d in /usr/local/cuda*; do [[ -d $d && ! -L $d ]] && echo "$d"; done
  ldconfig -p | grep -E "$cuda_libs" | awk '{print $NF}' | xargs -r -n1 dirname \
    | xargs -r -n1 readlink -f
} | grep -E '^/(usr/local|opt)/' | sort -u \
  | awk 'NR == 1 || index($0, kept "/") != 1 { print; kept = $0 }' >"$tmp/hidden"
echo "hidden in the root (no CUDA there): $(tr '\n' ' ' <"$tmp/hidden")"

path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# Runs bash script $1 as root of the overlay, in a chroot in a mount
# namespace of its own (the host's /dev and /proc, a fresh /run and /tmp,
# the package in /tmp/debs). Its output goes to $tmp/chroot.log.
in_chroot() {
  timeout 180 unshare --mount --propagation private bash -c '
    set -e
    tmp=$1 script=$2
    root=$tmp/root
    mount -t overlay overlay -o "lowerdir=/,upperdir=$tmp/upper,workdir=$tmp/work" "$root"
    mount --rbind /dev "$root/dev"
    mount -t proc proc "$root/proc"
    mount -t tmpfs -o mode=755 tmpfs "$root/run"
    mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
    while read -r d; do mount -t tmpfs -o mode=755,size=64k tmpfs "$root$d"; done <"$tmp/hidden"
    cp -r "$tmp/debs" "$root/tmp/"
    exec chroot "$root" /usr/bin/env -i PATH='"$path"' HOME=/root LC_ALL=C.UTF-8 \
      DEBIAN_FRONTEND=noninteractive bash -euo pipefail -c "$script"
  ' in_chroot "$tmp" "$1" >"$tmp/chroot.log" 2>&1
}
chroot_or_fail() {
  in_chroot "$1" || { cat "$tmp/chroot.log"; fail "$2"; }
  cat "$tmp/chroot.log"
}

# Removes, then purges the package; with systemd running, the removal must
# also stop both units (prerm), however they run.
remove_script='
fail() { echo "FAIL: $*" >&2; exit 1; }
dpkg -r dlbatch
if [[ -d /run/systemd/system ]]; then
  for u in dlbatch-scheduler dlbatch-worker; do
    [[ $(systemctl show -P ActiveState $u) == inactive ]] || fail "dpkg -r left $u $(systemctl show -P ActiveState $u)"
  done
  ! pgrep -f "^/usr/bin/dlbatch" || fail "dpkg -r left the processes above"
  echo "dpkg -r stopped both units"
fi
[[ $(dpkg-query -W -f="\${Status}" dlbatch) == "deinstall ok config-files" ]] \
  || fail "after dpkg -r: $(dpkg-query -W -f="\${Status}" dlbatch)"
[[ ! -e /usr/bin/dlbatch && ! -e /lib/systemd/system/dlbatch-scheduler.service ]] || fail "dpkg -r left the programs"
[[ -f /etc/dlbatch/scheduler.yaml && -f /etc/dlbatch/worker.yaml ]] || fail "dpkg -r removed the conffiles"
[[ -d /var/lib/dlbatch ]] || fail "dpkg -r removed the state"
dpkg --purge dlbatch
status=$(dpkg-query -W -f="\${Status}" dlbatch 2>/dev/null) || true
[[ -z $status || $status == *not-installed ]] || fail "after --purge: $status"
for f in /etc/dlbatch /var/lib/dlbatch /var/lib/dlbatch-worker; do
  [[ ! -e $f ]] || fail "dpkg --purge left $f"
done
audit=$(dpkg --audit) && [[ -z $audit ]] || fail "dpkg --audit: $audit"
echo "removed (conffiles and state kept), then purged (gone)"
'

echo "== dpkg -i in the overlay root"
chroot_or_fail '
fail() { echo "FAIL: $*" >&2; exit 1; }
# No man-db index rebuild on each dpkg run (seconds each; nothing of dlbatch).
rm -f /var/lib/man-db/auto-update
dpkg -i /tmp/debs/*.deb
[[ $(dpkg-query -W -f="\${Status} \${Version}" dlbatch) == "install ok installed '"$version"'" ]] \
  || fail "dpkg-query: $(dpkg-query -W dlbatch)"
audit=$(dpkg --audit) && [[ -z $audit ]] || fail "dpkg --audit: $audit"
# Every dependency of every installed package met, from apt'"'"'s cache (offline).
apt-get check -q >/tmp/check 2>&1 || fail "apt-get check: $(cat /tmp/check)"
dpkg-query -W -f="\${Conffiles}\n" dlbatch | awk "NF {print \$1}" | sort >/tmp/conffiles
[[ $(cat /tmp/conffiles) == $(printf "%s\n" /etc/dlbatch/scheduler.yaml /etc/dlbatch/worker.yaml) ]] \
  || fail "conffiles: $(cat /tmp/conffiles)"
IFS=: read -r _ _ uid gid _ home shell < <(getent passwd dlbatch) || fail "no dlbatch user"
((uid < 1000)) || fail "dlbatch is no system user (uid $uid)"
[[ $(getent group dlbatch | cut -d: -f3) == "$gid" ]] || fail "no dlbatch group of gid $gid"
[[ $home == /var/lib/dlbatch && $shell == */nologin ]] || fail "dlbatch home $home shell $shell"
want() { [[ $(stat -c "%U:%G %a" "$1") == "$2" ]] || fail "$1 is $(stat -c "%U:%G %a" "$1"), want $2"; }
want /var/lib/dlbatch "dlbatch:dlbatch 700"
want /var/lib/dlbatch-worker "root:root 700"
want /run/dlbatch "dlbatch:dlbatch 755"
want /etc/dlbatch/scheduler.yaml "root:root 644"
want /etc/dlbatch/worker.yaml "root:root 644"
for b in dlbatch dlbatch-scheduler dlbatch-worker dlbatch-train; do
  /usr/bin/$b --version >/dev/null || fail "$b --version"
done
echo "installed: dlbatch $(dpkg-query -W -f="\${Version}" dlbatch), user dlbatch ($uid:$gid), /var/lib/dlbatch 0700"
' "dpkg -i in the overlay root"

echo "== without CUDA: the programs start, a GPU run is refused, a train job runs on the CPU"
chroot_or_fail '
fail() { echo "FAIL: $*" >&2; exit 1; }
pids=()
trap "kill \${pids[*]} 2>/dev/null; wait" EXIT
# CUDA'"'"'s folders are empty here (in_chroot); the cache forgets them.
ldconfig
cached=$(ldconfig -p | grep -E "'"$cuda_libs"'") \
  && fail "CUDA libraries are still reachable through ld.so.cache (in a system folder?): $cached"
for b in dlbatch dlbatch-scheduler dlbatch-worker dlbatch-train; do
  ldd /usr/bin/$b >/tmp/ldd 2>&1 || fail "ldd /usr/bin/$b: $(cat /tmp/ldd)"
  ! grep "not found" /tmp/ldd || fail "/usr/bin/$b lacks the libraries above"
done
echo "no CUDA library is reachable; the libraries of all four programs resolve"
cat >/tmp/lenet.yaml <<JOB
name: lenet-without-cuda
pool: 1
train:
  network:
    input: [28, 28, 1]
    layers:
      - {type: conv, filters: 6, size: 5}
      - {type: relu}
      - {type: maxpool, size: 2, stride: 2}
      - {type: fc, units: 10}
      - {type: softmax}
  data:
    train: {format: idx, images: '"$data"'/t10k-images-idx3-ubyte.gz, labels: '"$data"'/t10k-labels-idx1-ubyte.gz}
  options:
    mini_batch_size: 32
    max_iterations: 4
    execution_environment: auto
JOB
# refused NEEDLE: a GPU run of the job fails before it trains, saying NEEDLE.
refused() {
  ! dlbatch-train /tmp/lenet.yaml --output-dir /tmp/gpu-run --execution-environment gpu \
    >/tmp/gpu.out 2>&1 || fail "a GPU run started without CUDA: $(cat /tmp/gpu.out)"
  grep -q "$1" /tmp/gpu.out || fail "a GPU run without CUDA said: $(cat /tmp/gpu.out)"
  [[ ! -e /tmp/gpu-run/checkpoint.dlbc ]] || fail "the refused GPU run trained"
  echo "a GPU run is refused: $(cat /tmp/gpu.out)"
}
if [[ $(dlbatch-train --version) == *"GPU backend: not built"* ]]; then
  refused "built without the GPU backend"
else
  refused "install the dlbatch-gpu package"
fi
gpu_deb=$(ls /tmp/debs/gpu/*.deb 2>/dev/null) || true
if [[ -n $gpu_deb ]]; then
  dpkg -i "$gpu_deb"
  apt-get check -q >/tmp/check 2>&1 || fail "apt-get check with dlbatch-gpu: $(cat /tmp/check)"
  dlbatch-train --version >/tmp/version
  grep -q "GPU backend: not usable.*cannot be loaded.*install NVIDIA" /tmp/version \
    || fail "dlbatch-train --version with dlbatch-gpu but no CUDA: $(cat /tmp/version)"
  refused "install NVIDIA"
fi
# The job through the installed scheduler, worker and CLI.
dlbatch-scheduler --state-dir /tmp/state --listen unix:/tmp/sched.sock --ready-file /tmp/ready \
  >/tmp/scheduler.log 2>&1 &
pids+=($!)
for _ in $(seq 150); do [[ -s /tmp/ready ]] && break; sleep 0.1; done
[[ -s /tmp/ready ]] || fail "the scheduler did not start: $(cat /tmp/scheduler.log)"
dlbatch-worker --scheduler unix:/tmp/sched.sock --work-dir /tmp/work --cpu-slots 1 \
  --name without-cuda >/tmp/worker.log 2>&1 &
pids+=($!)
dl() { XDG_STATE_HOME=/tmp/xdg dlbatch --scheduler unix:/tmp/sched.sock "$@"; }
for _ in $(seq 150); do dl workers 2>/dev/null | grep -q "without-cuda.*online" && break; sleep 0.1; done
dl workers | grep -q "without-cuda.*online" || fail "the worker did not join: $(cat /tmp/worker.log)"
id=$(dl submit -q /tmp/lenet.yaml 2>&1) || fail "submit: $id"
dl wait --timeout 120s "$id" >/dev/null || fail "train job $id: $(dl show "$id"; dl diary "$id"; cat /tmp/worker.log)"
[[ $(dl show "$id") == *finished* ]] || fail "train job $id: $(dl show "$id")"
dl diary "$id" >/tmp/diary
grep -q "Training on cpu" /tmp/diary || fail "train job $id did not train on the CPU: $(cat /tmp/diary)"
dl fetch-outputs "$id" -o /tmp/outputs >/dev/null || fail "fetch-outputs $id"
[[ -s /tmp/outputs/metrics.json ]] || fail "train job $id left no metrics.json: $(ls -R /tmp/outputs)"
echo "train job $id finished on the CPU: $(grep -m1 "Training on" /tmp/diary)"
if [[ -n $gpu_deb ]]; then
  dpkg --purge dlbatch-gpu
fi
' "the programs without CUDA"

echo "== systemd in namespaces of its own on the overlay root"
# Returns non-zero with the reason in $boot_error where systemd cannot be
# booted here; the test then skips this part.
boot_error=""
boot() {
  [[ -x /lib/systemd/systemd ]] || { boot_error="no /lib/systemd/systemd"; return 1; }
  # A cgroup2 folder for the container's own hierarchy: under this process's
  # cgroup in the cgroup2 mount (a hybrid host's /sys/fs/cgroup/unified).
  local mnt own
  mnt=$(awk '{ for (i = 7; i < NF; i++) if ($i == "-") break }
    $(i + 1) == "cgroup2" { print $5; exit }' /proc/self/mountinfo)
  [[ -n $mnt ]] || { boot_error="no cgroup2 hierarchy mounted"; return 1; }
  own=$(sed -n 's/^0:://p' /proc/self/cgroup)
  cg=$mnt${own%/}/dlbatch-install.$$
  mkdir "$cg" 2>"$tmp/mkdir.err" || { boot_error="mkdir $cg: $(cat "$tmp/mkdir.err")"; cg=""; return 1; }
  # The units the container boots into: sysinit.target and nothing of this
  # machine's services. Masked: units that would change the kernel's
  # settings for the host (and /proc/sys is read-only, CAP_SYS_MODULE and
  # CAP_SYS_TIME dropped, as systemd-nspawn does), what this machine's
  # administrator added to sysinit.target, and network-online.target, which
  # both units want: the container has a network namespace of its own with
  # only loopback, where waiting for the network would wait in vain.
  local units=$tmp/upper/etc/systemd/system
  mkdir -p "$units"
  printf '%s\n' "[Unit]" "Description=dlbatch install test" \
    "Requires=sysinit.target" "After=sysinit.target" >"$units/dlbatch-test.target"
  for u in systemd-sysctl.service systemd-modules-load.service systemd-binfmt.service \
    proc-sys-fs-binfmt_misc.automount systemd-timesyncd.service kmod-static-nodes.service \
    apparmor.service network-online.target $(ls /etc/systemd/system/sysinit.target.wants 2>/dev/null); do
    ln -sf /dev/null "$units/$u"
  done
  : >"$tmp/console"
  # The package again, for the upgrade and the removal under systemd.
  mkdir -p "$tmp/upper/var/cache/dlbatch-install-test"
  cp "$tmp"/debs/*.deb "$tmp/upper/var/cache/dlbatch-install-test/"
  cat >"$tmp/init.sh" <<'INIT'
# PID 1 of the new namespaces until it execs systemd.
set -e
tmp=$1 cg=$2
root=$tmp/root
echo 0 >"$cg/cgroup.procs"
mount -t overlay overlay -o "lowerdir=/,upperdir=$tmp/upper,workdir=$tmp/work" "$root"
mount -t proc proc "$root/proc"
mount --bind "$root/proc/sys" "$root/proc/sys"
mount -o remount,bind,ro "$root/proc/sys"
if [ -e "$root/proc/sysrq-trigger" ]; then
  mount --bind "$root/proc/sysrq-trigger" "$root/proc/sysrq-trigger"
  mount -o remount,bind,ro "$root/proc/sysrq-trigger"
fi
mount -t sysfs -o ro sysfs "$root/sys"
mount -t tmpfs -o mode=755,nosuid tmpfs "$root/dev"
for n in null zero full random urandom tty; do
  touch "$root/dev/$n"
  mount --bind "/dev/$n" "$root/dev/$n"
done
touch "$root/dev/console"
mount --bind "$tmp/console" "$root/dev/console"
mkdir "$root/dev/pts" "$root/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$root/dev/pts"
ln -s pts/ptmx "$root/dev/ptmx"
mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
mount -t tmpfs -o mode=755 tmpfs "$root/run"
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
while read -r d; do mount -t tmpfs -o mode=755,size=64k tmpfs "$root$d"; done <"$tmp/hidden"
# A cgroup namespace rooted at $cg, and its hierarchy as the root's.
exec unshare --cgroup sh -c '
  mount -t cgroup2 cgroup2 "$1/sys/fs/cgroup" && cd "$1" &&
  exec chroot . /usr/bin/env -i container=dlbatch-test \
    setpriv --bounding-set -sys_module,-sys_time,-sys_rawio \
    /lib/systemd/systemd --unit=dlbatch-test.target' init "$root"
INIT
  # --kill-child: if this test dies, systemd (and with it every process of
  # its PID namespace) is killed.
  unshare --mount --propagation private --uts --net --ipc --pid --fork --kill-child \
    bash "$tmp/init.sh" "$tmp" "$cg" >"$tmp/init.log" 2>&1 &
  unshare_pid=$!
  for _ in $(seq 50); do
    init_pid=$(tr -d ' ' <"/proc/$unshare_pid/task/$unshare_pid/children" 2>/dev/null)
    [[ -n $init_pid ]] && break
    sleep 0.1
  done
  [[ -n $init_pid ]] || { boot_error="unshare started nothing: $(cat "$tmp/init.log")"; return 1; }
  local state="" how="in 30 s"
  for _ in $(seq 60); do
    state=$(inside systemctl is-system-running 2>/dev/null) || true
    [[ $state == running || $state == degraded ]] && break
    if ! kill -0 "$unshare_pid" 2>/dev/null; then
      wait "$unshare_pid" && how="it exited" || how="it exited with status $?"
      unshare_pid=""
      break
    fi
    sleep 0.5
  done
  if [[ $state != running && $state != degraded ]]; then
    boot_error="systemd did not reach running ($how; state '$state'): $(cat "$tmp/init.log" "$tmp/console" | tail -20)"
    return 1
  fi
  [[ $state == running ]] || echo "systemd is $state: $(inside systemctl --failed --no-legend --plain)"
  echo "systemd booted as PID 1 of its namespaces (pid $init_pid here) in $((SECONDS - t0)) s"
}
# Runs a command inside the container, as root, bounded.
inside() {
  timeout 60 nsenter -t "$init_pid" -a -r -w /usr/bin/env -i PATH=$path HOME=/root \
    LC_ALL=C.UTF-8 "$@"
}
t0=$SECONDS
booted=0
if boot; then booted=1; else
  echo "systemd could not be booted here: $boot_error"
  [[ -z $init_pid ]] || kill -9 "$init_pid" 2>/dev/null || true
  [[ -z $unshare_pid ]] || wait "$unshare_pid" 2>/dev/null || true
  unshare_pid=""
fi

if ((booted)); then
  prop() { inside systemctl show -P "$2" "$1"; }
  journal() { inside journalctl --no-pager -q -n 30 -u "$1" 2>&1 || true; }
  dl() { inside dlbatch --scheduler unix:/run/dlbatch/scheduler.sock "$@"; }
  active() {
    [[ $(prop "$1" ActiveState) == active ]] \
      || fail "$1 is $(prop "$1" ActiveState): $(inside systemctl status --no-pager "$1"; journal "$1")"
  }
  # Submits a job that runs until killed (a setsid'd process among its
  # three) and prints its id once it runs.
  start_long() {
    local job
    job=$(dl submit -q --name long -- \
      sh -c 'setsid sleep 600 & sleep 600 & echo "started in $(grep ^0:: /proc/self/cgroup)"; wait') \
      || fail "submit: $job"
    for _ in $(seq 100); do
      grep -q started <(dl diary "$job" 2>/dev/null) && break
      sleep 0.2
    done
    grep -q started <(dl diary "$job") || fail "job $job did not start: $(dl show "$job")"
    echo "$job"
  }
  # The pids in job $1's cgroup (which it printed), 3 expected.
  job_procs() {
    local dir pids
    dir=$(dl diary "$1" | sed -n 's/^.*started in 0::\(\/[^ ]*\).*$/\1/p' | tail -1)
    [[ $dir == "$unit_cg"/?* ]] || fail "job $1 runs in cgroup '$dir', not under $unit_cg"
    pids=$(inside cat "/sys/fs/cgroup$dir/cgroup.procs") || true
    (($(wc -w <<<"$pids") == 3)) || fail "expected job $1's 3 processes in $dir, found: $pids"
    echo "$pids"
  }
  gone() {
    for p in "$@"; do
      ! inside test -e "/proc/$p" || fail "job process $p ($(inside cat "/proc/$p/cmdline" | tr '\0' ' ')) is left"
    done
  }
  # Kills unit $1's main process (the $2) with SIGKILL; systemd must start
  # it again, active under another pid, within $3 tries 0.2 s apart.
  kill_and_restarted() {
    local pid
    pid=$(prop "$1" MainPID)
    inside kill -9 "$pid"
    for _ in $(seq "$3"); do
      [[ $(prop "$1" ActiveState) == active && $(prop "$1" MainPID) != "$pid" ]] && break
      sleep 0.2
    done
    active "$1"
    [[ $(prop "$1" MainPID) != "$pid" ]] || fail "systemd did not restart the killed $2"
  }
  # Stops unit $1; it must end inactive (not failed), by itself, in time.
  stop_clean() {
    local t=$SECONDS
    inside systemctl stop "$1" || fail "systemctl stop $1: $(journal "$1")"
    [[ $(prop "$1" ActiveState) == inactive && $(prop "$1" Result) == success ]] \
      || fail "$1 after stop: $(prop "$1" ActiveState), result $(prop "$1" Result): $(journal "$1")"
    echo "$1 stopped cleanly in $((SECONDS - t)) s"
  }

  echo "== dlbatch-scheduler.service"
  inside systemctl start dlbatch-scheduler.service \
    || fail "start dlbatch-scheduler: $(inside systemctl status --no-pager dlbatch-scheduler; journal dlbatch-scheduler)"
  active dlbatch-scheduler.service
  [[ $(prop dlbatch-scheduler.service Type) == notify ]] || fail "the scheduler unit is no Type=notify"
  spid=$(prop dlbatch-scheduler.service MainPID)
  [[ $(inside stat -c %U "/proc/$spid") == dlbatch ]] || fail "the scheduler runs as $(inside stat -c %U "/proc/$spid")"
  [[ $(inside stat -c '%F %a' /run/dlbatch/scheduler.sock) == "socket 666" ]] \
    || fail "/run/dlbatch/scheduler.sock: $(inside stat -c '%F %a' /run/dlbatch/scheduler.sock)"
  # The sandbox is in effect: no privileges to gain, no capabilities, a
  # seccomp filter, a mount namespace of its own (ProtectSystem=strict).
  inside grep -E '^(NoNewPrivs|Seccomp|CapBnd|CapEff):' "/proc/$spid/status" >"$tmp/status"
  for want in 'NoNewPrivs:.1' 'Seccomp:.2' 'CapBnd:.0000000000000000' 'CapEff:.0000000000000000'; do
    grep -q "^$want\$" "$tmp/status" || fail "the scheduler's sandbox: want $want in $(cat "$tmp/status")"
  done
  [[ $(inside readlink "/proc/$spid/ns/mnt") != $(inside readlink /proc/1/ns/mnt) ]] \
    || fail "the scheduler shares PID 1's mount namespace (no ProtectSystem=)"
  inside sh -c "! touch /proc/$spid/root/usr/lib/dlbatch-write-test 2>/dev/null" \
    || fail "the scheduler could write to /usr"
  echo "active (Type=notify: READY=1 reached systemd), pid $spid as user dlbatch, sandboxed"

  echo "== dlbatch-worker.service"
  inside systemctl start dlbatch-worker.service || fail "start dlbatch-worker: $(journal dlbatch-worker)"
  active dlbatch-worker.service
  wpid=$(prop dlbatch-worker.service MainPID)
  unit_cg=$(prop dlbatch-worker.service ControlGroup)
  [[ $(prop dlbatch-worker.service Delegate) == yes && $(prop dlbatch-worker.service KillMode) == mixed ]] \
    || fail "the worker unit lacks Delegate=yes or KillMode=mixed"
  # A worker the scheduler knows offline is no capacity until it joins
  # again: wait for it before submitting.
  joined() {
    for _ in $(seq 100); do
      [[ $(dl workers 2>/dev/null) == *online* ]] && return 0
      sleep 0.2
    done
    fail "the worker did not join: $(dl workers; journal dlbatch-worker)"
  }
  joined
  echo "active, pid $wpid as root in $unit_cg; joined the scheduler"

  echo "== a job through the installed CLI"
  id=$(dl submit -q --name hello -- sh -c 'echo "hi from the service"; cat /proc/self/cgroup') \
    || fail "submit: $id"
  dl wait --timeout 60s "$id" >/dev/null || fail "job $id: $(dl show "$id"; journal dlbatch-worker)"
  dl diary "$id" >"$tmp/diary" || fail "diary $id"
  grep -q "hi from the service" "$tmp/diary" || fail "job $id's diary: $(cat "$tmp/diary")"
  job_cg=$(sed -n 's/.*0::\(\/[^ ]*\).*/\1/p' "$tmp/diary" | head -1)
  [[ $job_cg == "$unit_cg"/?* ]] || fail "job $id ran in cgroup '$job_cg', not under $unit_cg: $(cat "$tmp/diary")"
  echo "job $id finished; it ran in $job_cg (Delegate=yes)"
  # A user's job: the socket lets every local user in, the root worker runs
  # it as that user (through /var/lib/dlbatch-worker, 0700 by the unit).
  inside useradd --create-home dlbatch-test-user || fail "useradd in the container"
  user_job=$(inside runuser -u dlbatch-test-user -- dlbatch --scheduler unix:/run/dlbatch/scheduler.sock \
    submit -q --name mine -- sh -c 'echo "I am $(id -un) in $PWD"') || fail "a user's submit: $user_job"
  dl wait --timeout 60s "$user_job" >/dev/null || fail "job $user_job: $(dl show "$user_job"; journal dlbatch-worker)"
  grep -q "I am dlbatch-test-user in /var/lib/dlbatch-worker/" <(dl diary "$user_job") \
    || fail "job $user_job's diary: $(dl diary "$user_job")"
  echo "job $user_job of user dlbatch-test-user ran as that user"

  echo "== the scheduler restarted keeps its jobs"
  long=$(start_long)
  inside systemctl restart dlbatch-scheduler.service || fail "restart dlbatch-scheduler: $(journal dlbatch-scheduler)"
  active dlbatch-scheduler.service
  [[ $(prop dlbatch-scheduler.service MainPID) != "$spid" ]] || fail "the scheduler's pid did not change"
  dl show "$id" >"$tmp/show" || fail "show $id after the restart"
  grep -qi finished "$tmp/show" || fail "job $id after the restart: $(cat "$tmp/show")"
  grep -q "hi from the service" <(dl diary "$id") || fail "job $id's diary lost in the restart"
  inside test -s /var/lib/dlbatch/dlbatch.db || fail "no store in /var/lib/dlbatch: $(inside ls -la /var/lib/dlbatch)"
  echo "job $id is still there, finished with its diary"
  # Killed outright, it is started again (Restart=on-failure) on its store.
  kill_and_restarted dlbatch-scheduler.service scheduler 50
  grep -q "hi from the service" <(dl diary "$id") || fail "job $id's diary lost in the kill -9"
  echo "killed with SIGKILL, systemd started it again; job $id is still there"

  echo "== stopping the worker stops its jobs"
  job_pids=$(job_procs "$long")
  since=$(inside date +%s)
  stop_clean dlbatch-worker.service
  # KillMode=mixed: the worker stopped the job itself; systemd's SIGKILL
  # for what is left must have found none of the job's processes.
  inside journalctl --no-pager -q -o cat -u dlbatch-worker.service --since "@$since" >"$tmp/stop.log"
  for p in $job_pids; do
    ! grep -q "Killing process $p " "$tmp/stop.log" \
      || fail "systemd, not the worker, killed job process $p: $(cat "$tmp/stop.log")"
  done
  gone $job_pids
  left=$(inside sh -c "find /sys/fs/cgroup$unit_cg -name cgroup.procs -exec cat {} + 2>/dev/null" || true)
  [[ -z $left ]] || fail "processes left in $unit_cg: $left"
  echo "no process of job $long is left ($(wc -w <<<"$job_pids") were running)"

  echo "== a worker killed outright takes its jobs along; systemd restarts it"
  inside systemctl start dlbatch-worker.service || fail "start dlbatch-worker again: $(journal dlbatch-worker)"
  joined
  long=$(start_long)
  job_pids=$(job_procs "$long")
  kill_and_restarted dlbatch-worker.service worker 75
  gone $job_pids
  # (The restarted worker may run the lost jobs again as new attempts.)
  dl cancel "$long" >/dev/null || fail "cancel $long"
  echo "no process of job $long is left; the worker runs again"
  stop_clean dlbatch-worker.service
  stop_clean dlbatch-scheduler.service
  [[ -n $(inside journalctl --no-pager -q -u dlbatch-scheduler.service) ]] \
    || fail "the scheduler logged nothing to the journal: $(inside journalctl --no-pager -n 40 2>&1)"
  for u in dlbatch-scheduler dlbatch-worker; do
    [[ $(inside systemctl is-enabled $u.service) == disabled ]] || fail "the package enabled $u"
  done

  echo "== an upgrade under systemd (the package over itself) restarts the running units"
  # As on a machine of its own: no policy-rc.d forbidding service actions
  # (images and build machines have one, this machine among them).
  inside rm -f /usr/sbin/policy-rc.d
  inside systemctl start dlbatch-scheduler.service dlbatch-worker.service || fail "start both again"
  spid=$(prop dlbatch-scheduler.service MainPID) wpid=$(prop dlbatch-worker.service MainPID)
  inside sh -c 'dpkg -i /var/cache/dlbatch-install-test/*.deb' >"$tmp/upgrade.log" 2>&1 \
    || fail "dpkg -i again: $(cat "$tmp/upgrade.log")"
  active dlbatch-scheduler.service
  active dlbatch-worker.service
  [[ $(prop dlbatch-scheduler.service MainPID) != "$spid" && $(prop dlbatch-worker.service MainPID) != "$wpid" ]] \
    || fail "postinst did not restart the running units: $(cat "$tmp/upgrade.log")"
  grep -q "hi from the service" <(dl diary "$id") || fail "job $id lost in the upgrade"
  echo "postinst restarted both; job $id is still there"

  echo "== dpkg -r, then dpkg --purge, under systemd"
  inside bash -euo pipefail -c "$remove_script" || fail "removal under systemd"

  echo "== systemd powers off"
  kill -s RTMIN+4 "$init_pid"
  for _ in $(seq 100); do kill -0 "$unshare_pid" 2>/dev/null || break; sleep 0.2; done
  kill -0 "$unshare_pid" 2>/dev/null && fail "systemd did not power off in 20 s"
  wait "$unshare_pid" 2>/dev/null || true
  unshare_pid=""
  left=$(find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null || true)
  [[ -z $left ]] || fail "processes left in the container's cgroup: $left"
  find "$cg" -depth -type d -exec rmdir {} \; || fail "could not remove $cg"
  cg=""
  echo "it ended; no process of it is left"
fi

if ((!booted)); then
  echo "== dpkg -r, then dpkg --purge"
  chroot_or_fail "$remove_script"
fi

echo "== nothing reached this machine"
traces >"$tmp/traces.after"
diff "$tmp/traces.before" "$tmp/traces.after" || fail "this machine's dlbatch traces changed (above)"
! grep -q "$tmp" /proc/self/mountinfo || fail "mounts left: $(grep "$tmp" /proc/self/mountinfo)"
[[ -z $init_pid ]] || ! kill -0 "$init_pid" 2>/dev/null || fail "the container's systemd ($init_pid) is left"
if [[ ! -e /usr/bin/dlbatch-scheduler ]]; then
  for p in /proc/[0-9]*; do
    exe=$(readlink "$p/exe" 2>/dev/null) || continue
    [[ $exe != /usr/bin/dlbatch* ]] || fail "process ${p#/proc/} ($exe) of the test is left"
  done
fi
echo "no user, package, file, mount or process of the test outside it"

echo "done in $((SECONDS - started)) s"
if ((!booted)); then
  skip "the units were not run under systemd: $boot_error (the dpkg -i/-r/--purge part passed)"
fi
echo PASS
