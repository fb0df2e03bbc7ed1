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
      blob = dlbatch::UploadFile(stub_.get(), token_, path);
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
    (void)notes;
    std::error_code ec;
    std::vector<std::filesystem::path> files;
    int64_t total = 0;
    for (auto it =
             std::filesystem::recursive_directory_iterator(output_dir, ec);
         !ec && it != std::filesystem::recursive_directory_iterator();
         it.increment(ec)) {
      if (!it->is_regular_file(ec)) continue;
      files.push_back(it->path());
      total += static_cast<int64_t>(it->file_size(ec));
    }
    if (max_bytes > 0 && total > max_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the outputs hold ", total, " bytes, more than the job's quota of ",
          max_bytes, " bytes; write less to DLBATCH_OUTPUT_DIR"));
    }
    std::sort(files.begin(), files.end());
    std::vector<v1::OutputFile> out;
    for (const auto& path : files) {
      std::string rel =
          std::filesystem::relative(path, output_dir, ec).string();
      absl::StatusOr<v1::OutputFile> f = UploadFile(path.string(), rel);
      if (!f.ok()) {
        if (f.status().code() == absl::StatusCode::kCancelled)
          return f.status();
        return Annotate(f.status(),
                        absl::StrCat("uploading output '", rel, "'"));
      }
      out.push_back(*std::move(f));
    }
    return out;
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
