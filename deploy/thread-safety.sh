#!/usr/bin/env bash
# Checks the lock annotations (ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED,
# ABSL_LOCKS_EXCLUDED, ...): runs Debian's clang++ with -Wthread-safety
# -Werror, syntax only, over every C++ source of the tree in the build's
# compile_commands.json, since GCC, which builds the tree, ignores them.
# The files of a unity unit (DLBATCH_UNITY_BUILD) are checked one by one
# with the unit's flags, so a file that compiles only after its unit's
# other files (a missing #include) fails here.
# Clang's warnings that are on by default fail it too (-Werror), as does
# code clang cannot compile. CUDA sources (nvcc's), C sources and generated
# code (protoc's, in the build folder) are left out; a source built into
# several targets is checked once. Prints how many files it checked and how
# long it took; fails, printing clang's diagnostics, when any file has one.
# Skips, saying why, where clang++ is not installed (deploy/bootstrap.sh
# installs it). Run it after the build: the sources include the generated
# protobuf headers.
#
#   deploy/thread-safety.sh [--build-dir DIR] [--jobs N] [--product-only]
#                           [SOURCE...]
#
# --product-only checks the programs' sources alone (common, proto, client,
# scheduler, worker, trainer), not the tests' and benchmarks'. SOURCEs (paths
# from the tree's root, e.g. common/helper_thread.cc) check those alone.
# DLBATCH_CLANGXX names the clang++ to run (default: clang++ on the PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
case ${1:-} in -h|--help) sed -n '2,24p' "$0"; exit 0 ;; esac

build_dir=build
jobs=$(nproc)
product_only=0
only=()
while (($#)); do
  case $1 in
    --build-dir) build_dir=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --product-only) product_only=1; shift ;;
    -*) echo "thread-safety: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) only+=("$1"); shift ;;
  esac
done

clang=${DLBATCH_CLANGXX:-clang++}
if ! command -v "$clang" >/dev/null; then
  echo "thread-safety: skipped: $clang is not installed" \
    "(apt-get install clang, or run deploy/bootstrap.sh)"
  exit 0
fi
db=$build_dir/compile_commands.json
[[ -f $db ]] || {
  echo "thread-safety: $db is missing; configure the build first" \
    "(deploy/bootstrap.sh, or cmake -S . -B $build_dir)" >&2
  exit 1
}

# One record per source (NUL-terminated): the directory to run in, then the
# clang++ command line, quoted for bash. The build's compiler and its launcher
# give way to clang++; -o and -c to -fsyntax-only; the build's warning flags
# to the thread-safety ones, so that what clang's -Wall -Wextra would add to
# GCC's fails nothing here.
folders="common proto client scheduler worker trainer"
((product_only)) || folders+=" tests bench"
commands=$(mktemp)
trap 'rm -f "$commands"' EXIT
python3 - "$db" "$PWD" "$clang" "$folders" "${only[@]}" >"$commands" <<'EOF'
import json, os, shlex, sys

db, root, clang, folders = sys.argv[1:5]
folders = folders.split()
only = {os.path.normpath(p) for p in sys.argv[5:]}
# GCC's flags that clang++ rejects or warns of as unknown (none is in the
# build today; a new one goes here).
gcc_only = {"-fno-semantic-interposition", "-fconcepts-diagnostics-depth"}
seen = set()
out = sys.stdout

def sources(entry):
    """The sources an entry compiles, each with its command: itself, or
    for a unity unit (DLBATCH_UNITY_BUILD's Unity/unity_N_cxx.cxx) each
    file it includes, checked alone with the unit's command."""
    path = os.path.realpath(os.path.join(entry["directory"], entry["file"]))
    args = entry.get("arguments") or shlex.split(entry["command"])
    if "/Unity/unity_" not in path:
        yield path, args
        return
    for line in open(path):
        line = line.strip()
        if line.startswith('#include "') and line.endswith('"'):
            source = os.path.realpath(line[len('#include "'):-1])
            yield source, [source if a == entry["file"] or a == path else a
                           for a in args]

def entries():
    for entry in json.load(open(db)):
        for path, args in sources(entry):
            yield entry, path, args

for entry, path, args in entries():
    rel = os.path.relpath(path, root)
    if not rel.endswith((".cc", ".cpp", ".cxx")) or rel.split("/")[0] not in folders:
        continue
    if (only and rel not in only) or rel in seen:
        continue
    seen.add(rel)
    while args and os.path.basename(args[0]) in ("ccache", "sccache"):
        args = args[1:]
    kept, skip = [clang], False
    for a in args[1:]:
        if skip:
            skip = False
        elif a == "-o":
            skip = True
        elif a == "-c" or a.split("=")[0] in gcc_only:
            pass
        elif a.startswith("-W") and not a.startswith(("-Wl,", "-Wa,", "-Wp,")):
            pass
        else:
            kept.append(a)
    kept += ["-fsyntax-only", "-Wthread-safety", "-Werror"]
    out.write(entry["directory"] + "\0" + shlex.join(kept) + "\0")
missing = only - seen
if missing:
    sys.exit("thread-safety: not in %s (not C++, or not built): %s"
             % (db, " ".join(sorted(missing))))
EOF
files=$(($(tr -cd '\0' <"$commands" | wc -c) / 2))
what="every C++ source"
((${#only[@]})) && what="the sources named"
((product_only)) && what="the programs' C++ sources (not tests, benchmarks)"
echo "thread-safety: checking $what with $clang -Wthread-safety -Werror" \
  "($files files, $jobs jobs)"
start=$SECONDS
# Each file's diagnostics are printed whole, after it is checked, so that
# parallel checks do not interleave their lines.
rc=0
xargs -0 -n 2 -P "$jobs" bash -c '
  out=$(cd "$1" && eval "$2" 2>&1) && rc=0 || rc=$?
  [[ -z $out ]] || printf "%s\n" "$out"
  exit $((rc ? 1 : 0))' thread-safety <"$commands" || rc=$?
took=$((SECONDS - start))
if ((rc)); then
  echo "thread-safety: FAILED: clang reported the errors above" \
    "($files files, ${took}s)" >&2
  exit 1
fi
echo "thread-safety: $files files clean in ${took}s"
