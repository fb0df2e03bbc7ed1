#!/usr/bin/env bash
# deploy/thread-safety.sh fails on a lock annotation broken on purpose
# (thread_safety_fixture.cc built with -DDLBATCH_VIOLATE), passes the same
# file kept, takes a compile database whose commands are GCC's behind
# ccache, and skips, saying why, where clang++ is missing.
#
#   thread_safety_test.sh SOURCE_DIR
set -euo pipefail
src=$(cd "$1" && pwd)
command -v clang++ >/dev/null ||
  { echo "SKIP: no clang++ (deploy/bootstrap.sh installs clang)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fixture=$src/tests/deploy/thread_safety_fixture.cc
fail() { echo "FAIL: $*" >&2; exit 1; }

# A compile database of one entry, as CMake writes it for GCC behind ccache.
database() {  # DIR EXTRA_FLAGS
  mkdir -p "$1"
  cat >"$1/compile_commands.json" <<JSON
[{"directory": "$1",
  "command": "ccache /usr/bin/c++ $2 -O2 -Wall -Wextra -Wno-maybe-uninitialized -std=c++20 -o fixture.o -c $fixture",
  "file": "$fixture"}]
JSON
}

database "$tmp/broken" -DDLBATCH_VIOLATE
rc=0
out=$("$src/deploy/thread-safety.sh" --build-dir "$tmp/broken" 2>&1) || rc=$?
echo "$out"
((rc == 1)) || fail "a read of n_ without mu_ passed (exit $rc)"
grep -q "reading variable 'n_' requires holding mutex 'mu_'" <<<"$out" ||
  fail "clang's diagnostic of the unlocked read is missing"

database "$tmp/kept" ""
out=$("$src/deploy/thread-safety.sh" --build-dir "$tmp/kept" 2>&1) ||
  fail "the kept file failed: $out"
echo "$out"
grep -q "1 files clean" <<<"$out" || fail "no count of the files checked"

out=$(DLBATCH_CLANGXX=/nonexistent/clang++ \
  "$src/deploy/thread-safety.sh" --build-dir "$tmp/broken" 2>&1) ||
  fail "a missing clang++ failed instead of skipping: $out"
echo "$out"
grep -q "skipped: /nonexistent/clang++ is not installed" <<<"$out" ||
  fail "the skip does not say why"
echo "PASS"
