# Sourced by package_test.sh and install_test.sh, which both build the
# `deb` target into the same folder (ctest runs them one at a time:
# RESOURCE_LOCK dlbatch_deb). Needs their fail().

# build_deb BUILD_DIR LOG_DIR: builds the packages afresh with the `deb`
# target (its output in LOG_DIR/deb.log, printed where it fails) and sets
# deb to the one dlbatch_*.deb it leaves in BUILD_DIR/packaging, and gpu_deb
# to the one dlbatch-gpu_*.deb (the GPU module, made where the build has
# the GPU backend) or to "" where there is none; fails otherwise.
build_deb() {
  local build=$1 log_dir=$2 debs
  echo "== building the package"
  rm -f "$build"/packaging/dlbatch_*.deb "$build"/packaging/dlbatch-gpu_*.deb
  cmake --build "$build" --target deb >"$log_dir/deb.log" 2>&1 || { cat "$log_dir/deb.log"; fail "the deb target"; }
  debs=("$build"/packaging/dlbatch_*.deb)
  ((${#debs[@]} == 1)) && [[ -f ${debs[0]} ]] || fail "expected one dlbatch_*.deb in $build/packaging, found: ${debs[*]}"
  deb=${debs[0]}
  gpu_deb=""
  debs=("$build"/packaging/dlbatch-gpu_*.deb)
  ((${#debs[@]} <= 1)) || fail "expected at most one dlbatch-gpu_*.deb in $build/packaging, found: ${debs[*]}"
  [[ -f ${debs[0]} ]] && gpu_deb=${debs[0]}
  return 0
}
