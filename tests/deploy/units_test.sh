#!/usr/bin/env bash
# The systemd units as installed: `cmake --install` into a temp root, then
# `systemd-analyze verify --root` on both units (their ExecStart programs and
# Documentation= man pages resolve inside that root), a deliberately broken
# copy must fail it, the units carry the settings the programs rely on, and
# sysusers.d / tmpfiles.d make the dlbatch user and its folders in the root.
#   units_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v systemd-analyze >/dev/null \
  || { echo "SKIP: no systemd-analyze (deploy/bootstrap.sh --test-tools installs systemd)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
root=$tmp/root
DESTDIR=$root cmake --install "$build" --prefix /usr >"$tmp/install.log" 2>&1 \
  || { cat "$tmp/install.log"; fail "cmake --install (build the programs first)"; }
units=$root/lib/systemd/system
# The targets the units name (multi-user.target, sysinit.target, ...) come
# from this machine's systemd.
for dir in /lib/systemd/system /usr/lib/systemd/system; do
  [[ -d $dir ]] && cp -rn "$dir/." "$units/" 2>/dev/null || true
done
verify() {
  MANPATH=$root/usr/share/man SYSTEMD_LOG_COLOR=0 \
    systemd-analyze verify --root="$root" "$@"
}
verify "$units/dlbatch-scheduler.service" "$units/dlbatch-worker.service" \
  || fail "systemd-analyze verify"
echo "systemd-analyze verify: both units pass"

# A unit whose program is missing must not pass (the check checks).
sed 's|^ExecStart=/usr/bin/dlbatch-scheduler|ExecStart=/usr/bin/dlbatch-missing|' \
  "$units/dlbatch-scheduler.service" >"$units/dlbatch-broken.service"
if verify "$units/dlbatch-broken.service" >"$tmp/broken.log" 2>&1; then
  fail "systemd-analyze verify passed a unit whose ExecStart does not exist"
fi
grep -q "dlbatch-missing" "$tmp/broken.log" || fail "unexpected: $(cat "$tmp/broken.log")"
rm "$units/dlbatch-broken.service"

# What the programs rely on.
has() { grep -qx "$2" "$units/$1" || fail "$1 lacks '$2'"; }
has dlbatch-scheduler.service "Type=notify"
has dlbatch-scheduler.service "User=dlbatch"
has dlbatch-scheduler.service "StateDirectory=dlbatch"
has dlbatch-scheduler.service "RuntimeDirectory=dlbatch"
has dlbatch-scheduler.service "NoNewPrivileges=yes"
has dlbatch-scheduler.service "ProtectSystem=strict"
has dlbatch-worker.service "User=root"
has dlbatch-worker.service "Delegate=yes"
has dlbatch-worker.service "KillMode=mixed"
grep -q '^listen: unix:/run/dlbatch/scheduler.sock$' "$root/etc/dlbatch/scheduler.yaml" \
  || fail "scheduler.yaml does not listen on the RuntimeDirectory's socket"
if systemd-analyze security --help 2>/dev/null | grep -q -- --offline; then
  systemd-analyze security --offline=true --root="$root" \
    "$units/dlbatch-scheduler.service" 2>/dev/null | tail -1 || true
fi

if command -v systemd-sysusers >/dev/null && command -v systemd-tmpfiles >/dev/null; then
  systemd-sysusers --root="$root" >/dev/null 2>&1 || fail "systemd-sysusers"
  grep -q '^dlbatch:x:[0-9]*:[0-9]*:.*:/var/lib/dlbatch:' "$root/etc/passwd" \
    || fail "no dlbatch user: $(cat "$root/etc/passwd")"
  systemd-tmpfiles --root="$root" --create >/dev/null 2>&1 || true
  uid=$(awk -F: '$1 == "dlbatch" {print $3}' "$root/etc/passwd")
  [[ $(stat -c '%u %a' "$root/var/lib/dlbatch") == "$uid 700" ]] \
    || fail "/var/lib/dlbatch: $(stat -c '%u %a' "$root/var/lib/dlbatch"), want $uid 700"
  echo "sysusers.d made user dlbatch ($uid); tmpfiles.d its state folder"
fi
echo PASS
