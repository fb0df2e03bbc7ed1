// The client of the scheduler's rendezvous for one job attempt: Set and Get
// as gRPC calls, authenticated by the attempt's secret. The trainer's ranks
// meet through it (trainer/comm), and so do a launched command job's parts
// (worker/launch_rendezvous.h). A scheduler that is restarting (UNAVAILABLE)
// is waited for; a Get waits on the scheduler in slices (a call is held at
// most a few seconds) until its deadline.
#ifndef DLBATCH_COMMON_RENDEZVOUS_CLIENT_H_
#define DLBATCH_COMMON_RENDEZVOUS_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dlbatch/v1/scheduler.grpc.pb.h"

namespace dlbatch {

struct RendezvousPlace {
  std::string address;  // the scheduler, as the job's processes reach it
  std::string ca_pem;   // TCP: the CA its certificate chains to
  std::string ca_name;  // where ca_pem came from, for messages
  int64_t job_id = 0;
  int attempt = 0;
  std::string secret;  // StartJob.rendezvous_secret
};

class RendezvousClient {
 public:
  // `setter` names who sets the keys this side waits for, for the message
  // of a Get that times out ("a rank of this job").
  static absl::StatusOr<std::unique_ptr<RendezvousClient>> Open(
      RendezvousPlace place, std::string setter);

  // Sets `key` for the attempt, retrying while the scheduler is unavailable
  // until `deadline`.
  absl::Status Set(const std::string& key, const std::string& value,
                   absl::Time deadline);
  // The value of `key` once set; DEADLINE_EXCEEDED, naming the key and the
  // setter, if it is not set by `deadline`.
  absl::StatusOr<std::string> Get(const std::string& key, absl::Time deadline);

  const RendezvousPlace& place() const { return place_; }

 private:
  RendezvousClient(RendezvousPlace place, std::string setter,
                   std::unique_ptr<v1::Scheduler::Stub> stub)
      : place_(std::move(place)),
        setter_(std::move(setter)),
        stub_(std::move(stub)) {}
  std::string Where(const char* doing, const std::string& key) const;

  const RendezvousPlace place_;
  const std::string setter_;
  std::unique_ptr<v1::Scheduler::Stub> stub_;
};

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_RENDEZVOUS_CLIENT_H_
