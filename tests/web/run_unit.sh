#!/usr/bin/env bash
# web_ui_unit_test: node --test on tests/web/unit/. Exit 77 (a skip, with
# its reason) where node is missing.
#   run_unit.sh TESTS_WEB_DIR
set -euo pipefail
command -v node >/dev/null ||
  { echo "SKIP: no node (deploy/bootstrap.sh installs Debian's nodejs)"; exit 77; }
cd "$1"
exec node --test unit/*.test.mjs
