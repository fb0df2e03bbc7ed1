// How the parts of a launched command job learn each other's addresses and
// part 0's MASTER_PORT: through the scheduler's rendezvous for the
// attempt (as a train job's ranks meet), before the job's processes start.
// The worker does it, with the attempt's secret; the job gets only the
// result (worker/launch_env.h).
#ifndef DLBATCH_WORKER_LAUNCH_RENDEZVOUS_H_
#define DLBATCH_WORKER_LAUNCH_RENDEZVOUS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dlbatch::worker {

struct MeetingPlace {
  std::string address;  // the scheduler, as a job's processes reach it
  std::string ca_pem;   // TCP: the CA its certificate chains to
  int64_t job_id = 0;
  int attempt = 0;
  std::string secret;  // StartJob.rendezvous_secret
};

struct PartsMet {
  std::vector<std::string> hosts;  // every part's address, part order
  int master_port = 0;             // free on part 0's machine
};

// Part `part` of `parts` says its `host`; part 0 also finds a free port
// and says it; then each waits up to `timeout` for the others (the attempt
// ending ends the wait at once, as an error).
absl::StatusOr<PartsMet> MeetParts(const MeetingPlace& place, int part,
                                   int parts, const std::string& host,
                                   absl::Duration timeout);

// A TCP port no socket of this machine holds now (bound to port 0 on every
// address, then released): what torchrun does to find a master port.
absl::StatusOr<int> FreeTcpPort();

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_LAUNCH_RENDEZVOUS_H_
