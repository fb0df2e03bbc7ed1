#!/usr/bin/env bash
# Man pages and shell completions made from the programs' --help at build
# time (deploy/gen-docs.py): every page renders without a warning (groff
# -ww, and man -l where man is installed) and names its options; the bash
# completion, sourced in a real bash, completes subcommands and options.
#   docs_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
docs=$build/docs
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[[ -f $docs/man/dlbatch.1 ]] || fail "no $docs/man/dlbatch.1: build the dlbatch-docs target"

for page in dlbatch.1 dlbatch-train.1 dlbatch-scheduler.8 dlbatch-worker.8; do
  f=$docs/man/$page
  if command -v groff >/dev/null; then
    warnings=$(groff -man -ww -z -Tutf8 "$f" 2>&1) || fail "groff $page: $warnings"
    [[ -z $warnings ]] || fail "groff warns on $page: $warnings"
  fi
  if command -v man >/dev/null; then
    text=$(MANWIDTH=100 man --warnings -l "$f" 2>"$tmp/warnings") || fail "man -l $page"
    [[ ! -s $tmp/warnings ]] || fail "man warns on $page: $(cat "$tmp/warnings")"
    grep -q "^NAME" <<<"$text" || fail "$page has no NAME section"
  fi
done
grep -q '^\\fB\\-\\-state\\-dir\\fR' "$docs/man/dlbatch-scheduler.8" || fail "dlbatch-scheduler.8 lacks --state-dir"
grep -q '^\.SS diary$' "$docs/man/dlbatch.1" || fail "dlbatch.1 lacks the diary command"
grep -q '^\.SS admin user add$' "$docs/man/dlbatch.1" || fail "dlbatch.1 lacks nested commands"
echo "man pages render without warnings"

# completes WORDS...: what bash's completion offers for the last word.
completes() {
  bash -c 'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1));
           COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}; _dlbatch; echo "${COMPREPLY[*]}"' \
    _ "$docs/bash-completion/dlbatch" "$@"
}
expect() {
  local want=$1; shift
  local got; got=$(completes "$@")
  [[ $got == "$want" ]] || fail "'$*' completes to '$got', want '$want'"
  echo "'$*' -> '$got'"
}
expect diary dlbatch di
expect --pool dlbatch submit --po
expect "add list revoke" dlbatch admin user ""
expect submit dlbatch --scheduler unix:/x.sock subm
expect "--follow" dlbatch diary 3 --fol
# The bash-completion package finds each program's file by its name.
for p in dlbatch dlbatch-scheduler dlbatch-worker dlbatch-train; do
  grep -q "^complete .* $p\$" "$docs/bash-completion/$p" || fail "bash-completion/$p registers no $p"
done
if command -v zsh >/dev/null; then
  zsh -n "$docs/zsh/_dlbatch" || fail "zsh: _dlbatch does not parse"
  # The completer's walk, with zsh's _describe and _files standing in
  # (they need a live completion widget): what it would offer.
  zcompletes() {
    zsh -c '_describe() { print -l -- "${(@P)4}" | cut -d: -f1 }
            _files() { print FILES }
            f=$1; shift; words=("$@"); CURRENT=$#; source "$f"' \
      _ "$docs/zsh/_dlbatch" "$@"
  }
  zcompletes dlbatch di | grep -qx diary || fail "zsh: 'dlbatch di' offers no diary"
  zcompletes dlbatch submit --po | grep -qx -- --pool || fail "zsh: 'dlbatch submit --po' offers no --pool"
  [[ $(zcompletes dlbatch submit --pool "") == FILES ]] || fail "zsh: --pool's value"
  echo "zsh completion walks the same tree"
else
  echo "(no zsh here: its completion file is not parsed)"
fi
echo PASS
