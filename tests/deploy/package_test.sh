#!/usr/bin/env bash
# The Debian package: builds it (`deb` target), checks its control fields
# and that every dependency is a Debian 12 runtime package, unpacks it into
# a temp root (dpkg -x), checks that the unpacked programs' libraries resolve
# and that they start, then runs a real job through the unpacked scheduler,
# worker and CLI; and lintian finds no error.
#   package_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
source "$(dirname "${BASH_SOURCE[0]}")/build_deb.sh"
for tool in dpkg-deb dpkg-shlibdeps; do
  command -v $tool >/dev/null || { echo "SKIP: no $tool (not a Debian system)"; exit 77; }
done
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

build_deb "$build" "$tmp"
field() { dpkg-deb -f "$deb" "$1"; }
version=$(field Version)
arch=$(dpkg --print-architecture)
[[ $(basename "$deb") == "dlbatch_${version}_${arch}.deb" ]] || fail "file name $(basename "$deb") is not dlbatch_${version}_${arch}.deb"
[[ $version =~ ^[0-9][A-Za-z0-9.+~]*$ ]] || fail "version '$version' is not a Debian version"
[[ $(field Package) == dlbatch && $(field Architecture) == "$arch" ]] || fail "Package/Architecture: $(field Package) $(field Architecture)"
[[ -n $(field Maintainer) && -n $(field Description) ]] || fail "no Maintainer or Description"
echo "package $(basename "$deb"), version $version"

echo "== dependencies"
depends=$(field Depends)
[[ -n $depends ]] || fail "no Depends (dpkg-shlibdeps did not run?)"
echo "Depends: $depends"
names=$(echo "$depends" | tr ',|' '\n\n' | sed -E 's/\(.*\)//; s/^ +//; s/ +$//' | grep -v '^$')
for need in libc6 libstdc++6 libgrpc++1.51 libsqlite3-0 libssl3; do
  grep -qx "$need" <<<"$names" || fail "Depends lacks $need"
done
for name in $names; do
  [[ $name == *-dev ]] && fail "Depends names a -dev package: $name"
  dpkg-query -W "$name" >/dev/null 2>&1 || apt-cache show "$name" >/dev/null 2>&1 \
    || fail "Depends names $name, which is no Debian package here"
done
# The conffiles are the two default configurations.
dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles >"$tmp/conffiles"
diff <(sort "$tmp/conffiles") <(printf '%s\n' /etc/dlbatch/scheduler.yaml /etc/dlbatch/worker.yaml) \
  || fail "conffiles differ"

echo "== unpacked into a temp root"
root=$tmp/root
dpkg -x "$deb" "$root"
for f in usr/bin/dlbatch usr/bin/dlbatch-scheduler usr/bin/dlbatch-worker usr/bin/dlbatch-train \
  lib/systemd/system/dlbatch-scheduler.service lib/systemd/system/dlbatch-worker.service \
  usr/lib/sysusers.d/dlbatch.conf usr/lib/tmpfiles.d/dlbatch.conf \
  etc/dlbatch/scheduler.yaml etc/dlbatch/worker.yaml \
  usr/share/man/man1/dlbatch.1.gz usr/share/man/man1/dlbatch-train.1.gz \
  usr/share/man/man8/dlbatch-scheduler.8.gz usr/share/man/man8/dlbatch-worker.8.gz \
  usr/share/bash-completion/completions/dlbatch usr/share/zsh/vendor-completions/_dlbatch \
  usr/share/doc/dlbatch/copyright; do
  [[ -e $root/$f ]] || fail "the package lacks /$f"
done
: >"$tmp/libs"
for b in dlbatch dlbatch-scheduler dlbatch-worker dlbatch-train; do
  ldd "$root/usr/bin/$b" >"$tmp/ldd" 2>&1 || fail "ldd $b: $(cat "$tmp/ldd")"
  ! grep -q "not found" "$tmp/ldd" || fail "$b: $(grep 'not found' "$tmp/ldd")"
  awk -v b="$b" '/=> \//{print b, $3}' "$tmp/ldd" >>"$tmp/libs"
  "$root/usr/bin/$b" --help >"$tmp/help" 2>&1 || fail "$b --help: $(cat "$tmp/help")"
  grep -q "Usage:" "$tmp/help" || fail "$b --help printed no usage"
done
# Libraries from no Debian package: only the trainer's CUDA ones, which the
# package's description names. (One dpkg -S for all: the path ldd gives, its
# real path, and its other side of the /usr merge.)
known() {
  dpkg -S "$@" 2>/dev/null | sed -E 's/^[^:]+(:[a-z0-9]+)?: //' | tr ', ' '\n\n' | grep '^/' | sort -u
}
mapfile -t libs < <(awk '{print $2}' "$tmp/libs" | sort -u)
{
  for l in "${libs[@]}"; do
    r=$(readlink -f "$l")
    echo "$l $l"; echo "$l $r"
    [[ $r == /usr/* ]] && echo "$l ${r#/usr}" || echo "$l /usr$r"
  done
} >"$tmp/candidates"
known $(awk '{print $2}' "$tmp/candidates" | sort -u) >"$tmp/owned" || true
while read -r b lib; do
  awk -v l="$lib" '$1 == l {print $2}' "$tmp/candidates" | grep -qxFf "$tmp/owned" && continue
  [[ $b == dlbatch-train && $(basename "$lib") =~ ^lib(cudart|cudnn|nccl|cublas|cublasLt)[.] ]] \
    || fail "$b links $lib, which no Debian package holds"
  echo "$b links $lib (not from Debian: allowed for the trainer's GPU backend)"
done <"$tmp/libs"
echo "all four programs start; their libraries resolve"

echo "== a job through the unpacked scheduler, worker and CLI"
bin=$root/usr/bin
sock=$tmp/sched.sock
"$bin/dlbatch-scheduler" --state-dir "$tmp/state" --listen "unix:$sock" \
  --ready-file "$tmp/ready" >"$tmp/scheduler.log" 2>&1 &
pids+=($!)
for _ in $(seq 150); do [[ -s $tmp/ready ]] && break; sleep 0.1; done
[[ -s $tmp/ready ]] || fail "the scheduler did not start: $(cat "$tmp/scheduler.log")"
"$bin/dlbatch-worker" --scheduler "unix:$sock" --work-dir "$tmp/work" \
  --cpu-slots 1 --name packaged >"$tmp/worker.log" 2>&1 &
pids+=($!)
cat >"$tmp/job.yaml" <<'JOB'
name: packaged
pool: 1
command: [sh, -c, 'echo "hello from the package"; echo done > "$DLBATCH_OUTPUT_DIR/out.txt"']
JOB
cli=("$bin/dlbatch" --scheduler "unix:$sock")
export XDG_STATE_HOME=$tmp/xdg
for _ in $(seq 150); do
  "${cli[@]}" workers 2>/dev/null | grep -q "packaged.*online" && break
  sleep 0.1
done
"${cli[@]}" workers | grep -q "packaged.*online" || fail "the worker did not join: $(cat "$tmp/worker.log")"
id=$("${cli[@]}" submit -q "$tmp/job.yaml" 2>&1) || fail "submit: $id"
"${cli[@]}" wait --timeout 60s "$id" || fail "job $id did not finish: $("${cli[@]}" show "$id"; cat "$tmp/worker.log")"
"${cli[@]}" diary "$id" | grep -q "hello from the package" || fail "diary of job $id: $("${cli[@]}" diary "$id")"
"${cli[@]}" fetch-outputs "$id" -o "$tmp/outputs" >/dev/null || fail "fetch-outputs $id"
[[ $(cat "$tmp/outputs/out.txt") == "done" ]] || fail "job $id's outputs: $(ls -R "$tmp/outputs")"
echo "job $id finished through the packaged programs"

echo "== lintian"
if command -v lintian >/dev/null; then
  lintian --tag-display-limit 0 "$deb" >"$tmp/lintian" 2>&1 || true
  cat "$tmp/lintian"
  ! grep -q '^E:' "$tmp/lintian" || fail "lintian reports errors"
  grep -q '^W:' "$tmp/lintian" && echo "(warnings above: fix them or add an override)"
else
  echo "lintian is not installed (deploy/bootstrap.sh --test-tools installs it): not run"
fi
echo PASS
