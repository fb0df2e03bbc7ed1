// The worker's link to its scheduler: one stream, opened again after every
// break (scheduler restarts included), registering the worker and the jobs
// it holds, sending what the Outbox owes, heartbeats, and handing the
// scheduler's messages to a LinkHandler.
//
// Threads: Run() connects and reads; a sender thread writes. The Outbox is
// guarded by the link's mutex, which is never held across a stream write
// nor while the handler runs.
#ifndef DLBATCH_WORKER_SCHEDULER_LINK_H_
#define DLBATCH_WORKER_SCHEDULER_LINK_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/endpoint.h"
#include "dlbatch/v1/scheduler.grpc.pb.h"
#include "worker/job_ref.h"
#include "worker/outbox.h"

namespace dlbatch::worker {

// One open stream to the scheduler. Write() and Read() may run at once on
// two threads (one each); Cancel() on any thread makes both fail.
class LinkStream {
 public:
  virtual ~LinkStream() = default;
  virtual bool Write(const v1::WorkerMessage& message) = 0;
  virtual bool Read(v1::SchedulerMessage* message) = 0;
  virtual void Cancel() = 0;
  // After Read() failed: why the stream ended.
  virtual absl::Status Finish() = 0;
};

// Opens streams. Thread-safe.
class LinkTransport {
 public:
  virtual ~LinkTransport() = default;
  // Fails (kUnavailable) when the scheduler cannot be reached within
  // `timeout_ms`.
  virtual absl::StatusOr<std::unique_ptr<LinkStream>> Connect(
      int64_t timeout_ms) = 0;
};

// The real transport over gRPC's WorkerLink.Connect. `channel` is shared
// with the blob transfers; `config` is what it was made from. Over TCP, an
// attempt that does not connect asks a TLS handshake of its own why, so a
// scheduler that came back with a certificate the CA file does not vouch
// for is named as such in the log at each retry, not as "not reachable".
std::unique_ptr<LinkTransport> MakeGrpcLinkTransport(
    std::shared_ptr<grpc::Channel> channel, const ChannelConfig& config);

// Receives the scheduler's messages, on Run()'s thread, with no lock of the
// link held: StartJob, CancelJob, and EndedAck (after the Outbox let go of
// the job). DiaryAcks are the link's own. Registered's cancel list arrives
// as CancelJob messages.
class LinkHandler {
 public:
  virtual ~LinkHandler() = default;
  virtual void OnSchedulerMessage(const v1::SchedulerMessage& message) = 0;
};

struct LinkOptions {
  std::string name;  // stable identity across restarts
  std::string host;
  std::string profile;
  std::vector<v1::Device> devices;
  std::string scheduler;  // for log lines
  std::string version;    // this worker's, told at registration
  // Whose jobs this worker runs, told at registration: any user its machine
  // knows (started as root), or only `user`'s (its own user name). The
  // scheduler asks about users (UserQuery); knows_user answers, on the
  // reading thread (it may wait on a directory service such as LDAP).
  bool runs_as_any_user = false;
  std::string user;
  std::function<bool(const std::string&)> knows_user;
  // A Slurm profile's ephemeral worker says which job attempt it serves.
  std::optional<v1::SlurmJob> slurm_job;
  // The GPUs' readings (NVML), sent on a heartbeat of their own when the
  // session starts and then every gpu_report_ms (none sent where it returns
  // none); called on the sender thread with no lock held, so it may take a
  // few milliseconds. Null: none read.
  std::function<std::vector<v1::GpuReading>()> read_gpus;
  int64_t gpu_report_ms = 3000;
  // Reconnecting: the first wait after a break, doubled up to the most.
  int64_t min_backoff_ms = 50;
  int64_t max_backoff_ms = 500;
  // A connection attempt gives up after this long.
  int64_t connect_timeout_ms = 1000;
};

class SchedulerLink {
 public:
  // `transport` and `clock` must outlive the link. Starts the sender.
  SchedulerLink(LinkOptions options, LinkTransport* transport,
                const Clock* clock);
  ~SchedulerLink();  // Stop()s and joins
  SchedulerLink(const SchedulerLink&) = delete;
  SchedulerLink& operator=(const SchedulerLink&) = delete;

  // REQUIRES: called once, before Run().
  void SetHandler(LinkHandler* handler);
  // Serves until Stop(), or until the scheduler removes this worker (an
  // admin's `dlbatch admin remove`: final, logged; OK is returned). Returns
  // an error only for what reconnecting cannot mend: a wrong token or a
  // refused registration.
  absl::Status Run();
  // Makes Run() return and the sender stop. Thread-safe.
  void Stop();

  // The Outbox, thread-safe. Open() holds a job from its assignment;
  // Post() queues one of its records for the scheduler.
  void Open(const JobRef& ref);
  void Post(const v1::WorkerMessage& record);
  // Jobs held (registered on every connection).
  std::vector<JobRef> Held() const;
  size_t Unacked(const JobRef& ref) const;
  bool connected() const;

 private:
  absl::Status Session();
  void SendLoop();
  // Ends the session's stream: no write is in progress when it returns.
  void Detach(LinkStream* stream);

  const LinkOptions options_;
  LinkTransport* const transport_;
  const Clock* const clock_;
  LinkHandler* handler_ = nullptr;
  // Why the scheduler removed this worker (its `refused` on a registered
  // stream); empty while it has not. Only Run()'s thread touches it.
  std::string removed_;

  mutable absl::Mutex mu_;
  Outbox outbox_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The registered session's stream; the sender writes to it.
  LinkStream* stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  LinkStream* connecting_ ABSL_GUARDED_BY(mu_) = nullptr;  // to cancel
  bool writing_ ABSL_GUARDED_BY(mu_) = false;  // the sender is in Write()
  int64_t heartbeat_ms_ ABSL_GUARDED_BY(mu_) = 1000;
  // Answers to the scheduler's questions, for this session only (a new
  // session is asked again): sent by the sender before the Outbox's due.
  std::vector<v1::WorkerMessage> answers_ ABSL_GUARDED_BY(mu_);
  std::thread sender_;
};

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_SCHEDULER_LINK_H_
