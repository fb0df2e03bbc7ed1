#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs an example job
# through the embedded local cluster: submit, follow its diary live, fetch
# its outputs.
#
#   deploy/quickstart.sh [JOB_FILE]     (default examples/hello-command.yaml)
set -euo pipefail
cd "$(dirname "$0")/.."
job=${1:-examples/hello-command.yaml}

deploy/bootstrap.sh
export PATH="$PWD/build/bin:$PATH"

echo
echo "== dlbatch submit $job (the local cluster starts on first use)"
id=$(dlbatch submit -q "$job")
echo "job $id queued; following its diary:"
dlbatch diary -f "$id"
echo
dlbatch show "$id" | sed -n '1,3p'
echo
echo "== dlbatch fetch-outputs $id"
dlbatch fetch-outputs "$id" -o "outputs/job-$id"
dlbatch wait "$id" >/dev/null
echo
echo "Done: outputs of job $id are in outputs/job-$id/. The local cluster keeps running;"
echo "stop it with: build/bin/dlbatch local stop"
