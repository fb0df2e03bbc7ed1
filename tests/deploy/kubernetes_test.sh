#!/usr/bin/env bash
# deploy/kubernetes/ checked offline against the Kubernetes API schemas
# (npm's kubernetes-models, installed at test time into the build folder),
# and the check shown to catch broken copies: a field of the wrong type, a
# selector that misses its pods, a kind that does not exist.
#   kubernetes_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v node >/dev/null && command -v npm >/dev/null \
  || { echo "SKIP: no node/npm (deploy/bootstrap.sh --test-tools installs them)"; exit 77; }
cache=$build/npm-kubernetes
if [[ ! -d $cache/node_modules/kubernetes-models || ! -d $cache/node_modules/js-yaml ]]; then
  mkdir -p "$cache"
  if ! npm install --prefix "$cache" --cache "$cache/.npm" --no-audit --no-fund \
      --no-save kubernetes-models@4.5.1 js-yaml@4.1.0 >"$cache/install.log" 2>&1; then
    tail -5 "$cache/install.log"
    echo "SKIP: npm could not install kubernetes-models (no registry?)"; exit 77
  fi
fi
export NODE_PATH=$cache/node_modules
check=$src/deploy/kubernetes/check-manifests.js
manifests=("$src"/deploy/kubernetes/*.yaml)
node "$check" "${manifests[@]}" || fail "deploy/kubernetes does not pass"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
broken() {  # broken NAME WANT SED-SCRIPT FILE: the edited copy must fail, saying WANT
  local name=$1 want=$2 script=$3 file=$4
  sed "$script" "$src/deploy/kubernetes/$file" >"$tmp/$name.yaml"
  cmp -s "$tmp/$name.yaml" "$src/deploy/kubernetes/$file" && fail "$name: the edit changed nothing"
  if node "$check" "$tmp/$name.yaml" >"$tmp/$name.out" 2>&1; then
    fail "$name: a broken manifest passed"
  fi
  grep -q -- "$want" "$tmp/$name.out" || fail "$name: the error does not say '$want': $(cat "$tmp/$name.out")"
  echo "caught $name: $(head -1 "$tmp/$name.out")"
}
broken replicas "replicas must be integer" 's/^  replicas: 1$/  replicas: one/' scheduler.yaml
broken selector "does not match the pod template" \
  '0,/component: worker/! s/^        app.kubernetes.io\/component: worker$/        app.kubernetes.io\/component: workers/' worker.yaml
broken kind "no schema for apps/v1 StatefullSet" 's/^kind: StatefulSet$/kind: StatefullSet/' scheduler.yaml
broken port "containerPort must be integer" 's/containerPort: 7070/containerPort: "7070x"/' scheduler.yaml
echo PASS
