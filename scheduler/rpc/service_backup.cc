// `dlbatch admin backup` and `dlbatch admin status`: their gRPC face.
#include <string>

#include "common/blob_transfer.h"
#include "common/status.h"
#include "scheduler/rpc/service.h"

namespace dlbatch::scheduler {

grpc::Status SchedulerService::BackupStore(
    grpc::ServerContext* context, const v1::BackupStoreRequest* /*request*/,
    grpc::ServerWriter<v1::BackupChunk>* writer) {
  absl::StatusOr<Caller> caller = IdentifyAdmin(*context, "backing up");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<std::unique_ptr<StagedBackup>> backup =
      scheduler_->admin().StageBackup();
  if (!backup.ok()) return ToGrpcStatus(backup.status());
  v1::BackupChunk chunk;
  chunk.set_archive_bytes((*backup)->archive_bytes());
  chunk.set_jobs((*backup)->jobs());
  chunk.set_blobs((*backup)->blobs());
  absl::Status sent = (*backup)->Send(
      [&](absl::string_view piece) {
        chunk.set_data(piece.data(), piece.size());
        const bool ok = writer->Write(chunk);
        chunk.Clear();
        return ok && !context->IsCancelled();
      },
      kBlobChunkBytes);
  return ToGrpcStatus(sent);
}

grpc::Status SchedulerService::GetStatus(
    grpc::ServerContext* context, const v1::GetStatusRequest* /*request*/,
    v1::SchedulerStatus* reply) {
  if (auto auth = Authorize(*context); !auth.ok()) return ToGrpcStatus(auth);
  absl::StatusOr<v1::SchedulerStatus> status =
      scheduler_->admin().StatusReport();
  if (!status.ok()) return ToGrpcStatus(status.status());
  *reply = std::move(*status);
  return grpc::Status::OK;
}

}  // namespace dlbatch::scheduler
