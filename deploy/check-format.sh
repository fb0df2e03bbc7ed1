#!/usr/bin/env bash
# Fails when a tracked C++ or CUDA file differs from what clang-format makes
# of it under the project's .clang-format (Debian 12's clang-format 14, which
# deploy/test.sh installs). Prints each such file and the command that mends
# them all.
#
#   deploy/check-format.sh
set -euo pipefail
cd "$(dirname "$0")/.."
case ${1:-} in -h|--help) sed -n '2,7p' "$0"; exit 0 ;; esac

command -v clang-format >/dev/null || {
  echo "check-format: clang-format is not installed (apt-get install clang-format)" >&2
  exit 1
}
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
differ=()
for f in "${files[@]}"; do
  clang-format --style=file "$f" | cmp -s - "$f" || differ+=("$f")
done
if ((${#differ[@]})); then
  echo "check-format: ${#differ[@]} file(s) differ from .clang-format:" >&2
  printf '  %s\n' "${differ[@]}" >&2
  echo "mend them with: clang-format -i ${differ[*]}" >&2
  exit 1
fi
echo "check-format: all ${#files[@]} C++ files follow .clang-format"
