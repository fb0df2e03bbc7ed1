// The scheduler's rendezvous for the trainer's ranks, over the client the
// worker's launched parts use too (common/rendezvous_client.h), so a rank
// that never arrives is reported by key.
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "common/rendezvous_client.h"
#include "common/status.h"
#include "common/tls_client.h"
#include "trainer/comm/communicator.h"

namespace dlbatch::trainer {
namespace {

// The caller's timeouts as deadlines over the shared client.
class SchedulerRendezvous final : public Rendezvous {
 public:
  explicit SchedulerRendezvous(std::unique_ptr<RendezvousClient> client)
      : client_(std::move(client)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    // A scheduler that is restarting is waited for a while.
    return client_->Set(key, value, absl::Now() + kSetPatience);
  }

  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override {
    return client_->Get(key, absl::Now() + timeout);
  }

 private:
  static constexpr absl::Duration kSetPatience = absl::Seconds(10);
  std::unique_ptr<RendezvousClient> client_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Rendezvous>> OpenSchedulerRendezvous(
    const SchedulerRendezvousConfig& config) {
  RendezvousPlace place{.address = config.address,
                        .job_id = config.job_id,
                        .attempt = config.attempt,
                        .secret = config.secret};
  // Over TCP (always TLS) the worker hands over the CA it trusts.
  if (const char* ca = std::getenv(kRendezvousCaEnv); ca != nullptr) {
    place.ca_pem = ca;
    place.ca_name = kRendezvousCaEnv;
  }
  ASSIGN_OR_RETURN(
      std::unique_ptr<RendezvousClient> client,
      RendezvousClient::Open(std::move(place), "a rank of this job"));
  return std::unique_ptr<Rendezvous>(
      new SchedulerRendezvous(std::move(client)));
}

}  // namespace dlbatch::trainer
