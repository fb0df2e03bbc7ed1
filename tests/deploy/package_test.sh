#!/usr/bin/env bash
# The Debian package: builds it (`deb` target), checks its control fields
# and that every dependency is a Debian 12 runtime package, unpacks it into
# a temp root (dpkg -x), checks that the unpacked programs' libraries resolve,
# that every one of them is a Debian package's (none is CUDA's: the GPU
# backend is a module of its own) and that they start, then runs a real job
# through the unpacked scheduler, worker and CLI. Where the build has the
# GPU backend, the dlbatch-gpu package too: its control fields, the module
# it holds, and that dlbatch-train finds it once unpacked beside it. And
# lintian finds no error in either.
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
# dep_names DEPENDS: the package names of a Depends field, one a line.
dep_names() { echo "$1" | tr ',|' '\n\n' | sed -E 's/\(.*\)//; s/^ +//; s/ +$//' | grep -v '^$'; }
# Debian runtime packages only: no -dev package, none this machine's apt
# does not know (CUDA's are not Debian packages).
debian_packages_only() {
  for name in $(dep_names "$1"); do
    [[ $name == *-dev ]] && fail "Depends names a -dev package: $name"
    dpkg-query -W "$name" >/dev/null 2>&1 || apt-cache show "$name" >/dev/null 2>&1 \
      || [[ $name == dlbatch ]] || fail "Depends names $name, which is no Debian package here"
  done
}
names=$(dep_names "$depends")
for need in libc6 libstdc++6 libgrpc++1.51 libsqlite3-0 libssl3; do
  grep -qx "$need" <<<"$names" || fail "Depends lacks $need"
done
debian_packages_only "$depends"
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
  usr/share/doc/dlbatch/copyright usr/share/dlbatch/python/dlbatch/__init__.py; do
  [[ -e $root/$f ]] || fail "the package lacks /$f"
done
# The dashboard's files, where this build made them (node and npm found).
web_built=0
[[ -f $build/share/dlbatch/web/index.html ]] && web_built=1
if ((web_built)); then
  for f in usr/share/dlbatch/web/index.html usr/share/dlbatch/web/login.html \
    usr/share/dlbatch/web/assets/app.js; do
    [[ -e $root/$f ]] || fail "the package lacks /$f"
  done
fi
: >"$tmp/libs"
for b in dlbatch dlbatch-scheduler dlbatch-worker dlbatch-train; do
  ldd "$root/usr/bin/$b" >"$tmp/ldd" 2>&1 || fail "ldd $b: $(cat "$tmp/ldd")"
  ! grep -q "not found" "$tmp/ldd" || fail "$b: $(grep 'not found' "$tmp/ldd")"
  awk -v b="$b" '/=> \//{print b, $3}' "$tmp/ldd" >>"$tmp/libs"
  "$root/usr/bin/$b" --help >"$tmp/help" 2>&1 || fail "$b --help: $(cat "$tmp/help")"
  grep -q "Usage:" "$tmp/help" || fail "$b --help printed no usage"
done
# Every library they link is a Debian package's: CUDA's are the GPU
# module's alone (dlbatch-gpu), which dlbatch-train loads when a run asks
# for a GPU. (One dpkg -S for all: the path ldd gives, its real path, and
# its other side of the /usr merge.)
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
  awk -v l="$lib" '$1 == l {print $2}' "$tmp/candidates" | grep -qxFf "$tmp/owned" \
    || fail "$b links $lib, which no Debian package holds (a machine without it cannot run $b)"
done <"$tmp/libs"
cuda_libs='^lib(cudart|cudnn[a-z_]*|nccl|cublas|cublasLt|cuda)\.so'
for b in dlbatch dlbatch-scheduler dlbatch-worker dlbatch-train; do
  needed=$(readelf -d "$root/usr/bin/$b" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  ! grep -E "$cuda_libs" <<<"$needed" || fail "$b needs the CUDA libraries above to start"
done
echo "all four programs start; their libraries resolve"

echo "== a job through the unpacked scheduler, worker and CLI"
bin=$root/usr/bin
sock=$tmp/sched.sock
"$bin/dlbatch-scheduler" --state-dir "$tmp/state" --listen "unix:$sock" \
  --web-listen 127.0.0.1:0 --ready-file "$tmp/ready" >"$tmp/scheduler.log" 2>&1 &
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
# The packaged scheduler serves the packaged dashboard: the page its
# one-time login URL leads to is the app, not the "not built" notice.
if ((web_built)); then
  url=$("${cli[@]}" web) || fail "dlbatch web: $url"
  url=$(head -1 <<<"$url" | grep -o 'https://[^ ]*') || fail "dlbatch web printed no URL"
  page=$(curl -sk -L -c "$tmp/jar" -b "$tmp/jar" "$url") || fail "curl $url"
  grep -q 'assets/app.js' <<<"$page" || fail "the packaged dashboard is not served: $page"
  echo "the packaged scheduler serves the packaged dashboard"
fi

echo "== the GPU backend"
"$root/usr/bin/dlbatch-train" --version >"$tmp/version" 2>&1 || fail "dlbatch-train --version: $(cat "$tmp/version")"
if [[ -z $gpu_deb ]]; then
  grep -q "GPU backend: not built" "$tmp/version" || fail "a build without the GPU backend: $(cat "$tmp/version")"
  echo "this build has no GPU backend (no dlbatch-gpu package): $(grep 'GPU backend' "$tmp/version")"
else
  # Without the module beside it, dlbatch-train says which package to install.
  grep -q "GPU backend: not usable.*install the dlbatch-gpu package" "$tmp/version" \
    || fail "dlbatch-train --version without dlbatch-gpu: $(cat "$tmp/version")"
  gfield() { dpkg-deb -f "$gpu_deb" "$1"; }
  [[ $(basename "$gpu_deb") == "dlbatch-gpu_${version}_${arch}.deb" ]] \
    || fail "file name $(basename "$gpu_deb") is not dlbatch-gpu_${version}_${arch}.deb"
  [[ $(gfield Package) == dlbatch-gpu && $(gfield Version) == "$version" && $(gfield Architecture) == "$arch" ]] \
    || fail "dlbatch-gpu's Package/Version/Architecture: $(gfield Package) $(gfield Version) $(gfield Architecture)"
  gdepends=$(gfield Depends)
  echo "dlbatch-gpu Depends: $gdepends"
  # The module is made for this build's dlbatch-train alone.
  [[ ", $gdepends," == *", dlbatch (= $version),"* ]] || fail "dlbatch-gpu does not depend on dlbatch (= $version)"
  debian_packages_only "$gdepends"
  gdescription=$(gfield Description)
  for word in CUDA cuDNN NCCL; do
    [[ $gdescription == *"$word"* ]] || fail "dlbatch-gpu's description does not name $word: $gdescription"
  done
  module=$(dpkg-deb -c "$gpu_deb" | awk '{print $NF}' | grep '/libdlbatch-gpu\.so$') \
    || fail "dlbatch-gpu holds no libdlbatch-gpu.so: $(dpkg-deb -c "$gpu_deb")"
  module=${module#./}
  [[ $module == usr/lib/* ]] || fail "the module is at /$module, not under /usr/lib"
  dpkg -x "$gpu_deb" "$root"
  needed=$(readelf -d "$root/$module" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  for lib in libcudart libcudnn libnccl; do
    grep -q "^$lib\.so" <<<"$needed" || fail "the module does not link $lib: $needed"
  done
  "$root/usr/bin/dlbatch-train" --version >"$tmp/version" 2>&1 || fail "dlbatch-train --version: $(cat "$tmp/version")"
  ldd "$root/$module" >"$tmp/ldd" 2>&1 || true
  if grep -q 'not found' "$tmp/ldd"; then
    # This machine lacks CUDA's libraries: dlbatch-train names them.
    grep -q "GPU backend: not usable.*cannot be loaded" "$tmp/version" || fail "$(cat "$tmp/version")"
  else
    grep -qF "GPU backend: loaded from $root/$module" "$tmp/version" \
      || fail "dlbatch-train did not load the unpacked module: $(cat "$tmp/version")"
  fi
  grep 'GPU backend' "$tmp/version"
fi

echo "== lintian"
if command -v lintian >/dev/null; then
  for d in "$deb" $gpu_deb; do
    lintian --tag-display-limit 0 "$d" >"$tmp/lintian" 2>&1 || true
    cat "$tmp/lintian"
    ! grep -q '^E:' "$tmp/lintian" || fail "lintian reports errors in $(basename "$d")"
    grep -q '^W:' "$tmp/lintian" && echo "(warnings above: fix them or add an override)"
  done
else
  echo "lintian is not installed (deploy/bootstrap.sh --test-tools installs it): not run"
fi
echo PASS
