// The REST API under /api/v1/ (docs/web-api.md): thin handlers that check
// the caller as the gRPC services do (scheduler/rpc/access.h), call the
// same Scheduler, and answer with the CLI's --json shapes
// (proto/json_shapes.h). The server (web_server.h) authenticates and
// passes every /api/v1/ request but its own (login, logout, session).
//
// Split by concern: api.cc routes and holds the shared helpers,
// api_jobs.cc the job listing, a job, its progress and the actions,
// api_diary.cc the diary and its event stream, api_cluster.cc workers,
// profiles, the queue, sweeps, arrays and outputs, api_events.cc the
// cluster's event stream.
//
// Thread-safe: Handle runs on the server's pool threads, any number at
// once; the event streams run on the scheduler's hubs (no thread each).
#ifndef DLBATCH_SCHEDULER_WEB_API_H_
#define DLBATCH_SCHEDULER_WEB_API_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/json_shapes.h"
#include "scheduler/rpc/identity.h"
#include "scheduler/scheduler.h"
#include "scheduler/store/blob_store.h"
#include "scheduler/store/store_reader.h"
#include "scheduler/web/http_message.h"

namespace dlbatch::scheduler::web {

// Bounds of the API's parameters (docs/web-api.md).
constexpr int kMaxJobPage = 1000;  // /jobs?limit=
constexpr int kDefaultJobPage = 100;
constexpr int kMaxDiaryPage = 5000;  // /diary?limit= and ?tail=
constexpr int kDefaultDiaryPage = 1000;
constexpr int kMaxProgressPoints = 10000;  // one /progress reply
constexpr int kMaxActionJobs = 10000;      // ids of one multi-job action
constexpr int kMaxQueueJobs = 1000;        // /queue

class RestApi final : public ApiHandler {
 public:
  // Borrowed; each must outlive the API and every stream it returned.
  // `reader` is the scheduler's. shared_visibility: as SchedulerService's
  // (--shared-visibility).
  RestApi(Scheduler* scheduler, StoreReader* reader, BlobStore* blobs,
          bool shared_visibility)
      : scheduler_(scheduler),
        reader_(reader),
        blobs_(blobs),
        shared_visibility_(shared_visibility) {}

  HttpResponse Handle(const HttpRequest& request,
                      const Caller& caller) override;

 private:
  // The path after /api/v1/, split at '/': {"jobs", "12", "diary"}.
  using Parts = std::vector<std::string>;

  HttpResponse Route(const HttpRequest& request, const Caller& caller,
                     const Parts& parts);

  // api_jobs.cc
  absl::StatusOr<Json> ListJobs(const HttpRequest& request,
                                const Caller& caller);
  absl::StatusOr<Json> GetJob(const Caller& caller, int64_t id);
  absl::StatusOr<Json> Progress(const HttpRequest& request,
                                const Caller& caller, int64_t id);
  // action: cancel, hold, release or requeue; ids from the path or body.
  absl::StatusOr<Json> Act(const std::string& action,
                           const std::vector<int64_t>& ids,
                           const Caller& caller);

  // api_diary.cc
  absl::StatusOr<Json> Diary(const HttpRequest& request, const Caller& caller,
                             int64_t id);
  absl::StatusOr<HttpResponse> DiaryEvents(const HttpRequest& request,
                                           const Caller& caller, int64_t id);

  // api_cluster.cc
  Json Workers();
  Json Profiles();
  absl::StatusOr<Json> Queue(const Caller& caller);
  absl::StatusOr<Json> Sweep(const HttpRequest& request, const Caller& caller,
                             int64_t id, bool array);
  absl::StatusOr<Json> Outputs(const Caller& caller, int64_t id);
  absl::StatusOr<HttpResponse> OutputFile(const Caller& caller, int64_t id,
                                          const std::string& path);

  // api_events.cc
  absl::StatusOr<HttpResponse> Events(const HttpRequest& request,
                                      const Caller& caller);

  // As SchedulerService::MayAccess (MayAccessJob).
  absl::Status MayAccess(const Caller& caller, int64_t id, bool control);

  Scheduler* const scheduler_;
  StoreReader* const reader_;
  BlobStore* const blobs_;
  const bool shared_visibility_;
};

}  // namespace dlbatch::scheduler::web

#endif  // DLBATCH_SCHEDULER_WEB_API_H_
