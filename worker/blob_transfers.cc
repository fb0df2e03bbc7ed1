#include "worker/blob_transfers.h"

#include <grpcpp/channel.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/blob_transfer.h"
#include "common/files.h"
#include "common/status.h"
#include "worker/output_files.h"

namespace dlbatch::worker {
namespace {

constexpr int kFetchTries = 20;
constexpr int kUploadTries = 120;
constexpr int64_t kRetryMs = 500;

bool Retryable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded;
}

class GrpcBlobTransfers final : public BlobTransfers {
 public:
  GrpcBlobTransfers(std::shared_ptr<grpc::Channel> channel, std::string token)
      : stub_(v1::Scheduler::NewStub(channel)), token_(std::move(token)) {}

  absl::Status Fetch(const std::string& sha256, int64_t size,
                     const std::string& dest, uint32_t mode) override {
    RETURN_IF_ERROR(
        MakeDirs(std::filesystem::path(dest).parent_path().string(), 0755));
    for (int tries = 0;; ++tries) {
      absl::Status d =
          DownloadFile(stub_.get(), token_, sha256, size, dest, mode);
      if (d.ok() || !Retryable(d) || tries >= kFetchTries) return d;
      RETURN_IF_ERROR(Pause());
    }
  }

  absl::StatusOr<v1::OutputFile> UploadFile(const std::string& path,
                                            const std::string& rel) override {
    absl::StatusOr<LocalBlob> blob;
    for (int tries = 0;; ++tries) {
      blob = dlbatch::UploadFile(stub_.get(), token_, path, nullptr,
                                 UploadMode::kReadOnce);
      if (blob.ok() || !Retryable(blob.status()) || tries >= kUploadTries)
        break;
      RETURN_IF_ERROR(Pause());
    }
    if (!blob.ok()) return blob.status();
    v1::OutputFile f;
    f.set_path(rel);
    f.set_size(blob->size);
    f.set_sha256(blob->sha256);
    struct stat st;
    f.set_mode(::stat(path.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0644);
    return f;
  }

  absl::StatusOr<std::vector<v1::OutputFile>> UploadOutputs(
      const std::string& output_dir, int64_t max_bytes,
      std::vector<std::string>* notes) override {
    // Read without following symlinks; the size is checked before any byte.
    ASSIGN_OR_RETURN(OutputScan scan, ScanOutputs(output_dir, max_bytes));
    if (notes != nullptr) {
      notes->insert(notes->end(), scan.skipped.begin(), scan.skipped.end());
    }
    return StoreOutputs(
        scan,
        [this](int fd, int64_t size,
               const std::string& what) -> absl::StatusOr<LocalBlob> {
          for (int tries = 0;; ++tries) {
            absl::StatusOr<LocalBlob> blob =
                UploadFd(stub_.get(), token_, fd, size, what);
            if (blob.ok() || !Retryable(blob.status()) ||
                tries >= kUploadTries) {
              return blob;
            }
            RETURN_IF_ERROR(Pause());
          }
        });
  }

  void Stop() override { stopping_ = true; }

 private:
  absl::Status Pause() {
    if (stopping_) return absl::CancelledError("the worker is stopping");
    std::this_thread::sleep_for(std::chrono::milliseconds(kRetryMs));
    if (stopping_) return absl::CancelledError("the worker is stopping");
    return absl::OkStatus();
  }

  std::unique_ptr<v1::Scheduler::Stub> stub_;
  const std::string token_;
  std::atomic<bool> stopping_{false};
};

}  // namespace

std::unique_ptr<BlobTransfers> MakeGrpcBlobTransfers(
    std::shared_ptr<grpc::Channel> channel, std::string token) {
  return std::make_unique<GrpcBlobTransfers>(std::move(channel),
                                             std::move(token));
}

}  // namespace dlbatch::worker
