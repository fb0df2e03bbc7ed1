// dlbatch-worker once its settings are read: the host prepared
// (startup.h), the Worker wired to its real collaborators (the gRPC link
// and transfers, the subprocess runner, the system clock), the metrics
// listener where asked, and the stop signals, then served until the worker
// is stopped.
#ifndef DLBATCH_WORKER_SERVE_H_
#define DLBATCH_WORKER_SERVE_H_

#include "absl/status/status.h"
#include "worker/options.h"

namespace dlbatch::worker {

// Runs the worker until a SIGTERM or SIGINT (it stops the jobs and leaves;
// should stopping wedge, the process exits 1 a minute later), until a Slurm
// job's worker has served its job, or until the scheduler refuses it for
// good. An error is what dlbatch-worker prints before it exits 1.
// REQUIRES: BlockStopSignals() (common/signals.h) was called, and no thread
// has been started.
absl::Status Serve(const DaemonOptions& options);

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_SERVE_H_
