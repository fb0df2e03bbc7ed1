#include "common/blob_transfer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/endpoint.h"
#include "common/files.h"
#include "common/status.h"

namespace dlbatch {
namespace {

constexpr size_t kChunkBytes = 1 << 20;

}  // namespace

absl::StatusOr<LocalBlob> UploadFile(v1::Scheduler::StubInterface* stub,
                                     const std::string& token,
                                     const std::string& path,
                                     const ProgressFn& progress) {
  LocalBlob blob;
  ASSIGN_OR_RETURN(blob.sha256, Sha256File(path, &blob.size));
  {
    grpc::ClientContext ctx;
    AddToken(&ctx, token);
    v1::StatBlobsRequest req;
    req.add_sha256(blob.sha256);
    v1::StatBlobsReply reply;
    RETURN_IF_ERROR(FromGrpcStatus(stub->StatBlobs(&ctx, req, &reply)));
    if (reply.present_size() == 1 && reply.present(0)) {
      if (progress) progress(blob.size, blob.size);
      return blob;
    }
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "open", path);
  grpc::ClientContext ctx;
  AddToken(&ctx, token);
  v1::BlobRef ref;
  auto writer = stub->UploadBlob(&ctx, &ref);
  std::string buf(kChunkBytes, '\0');
  int64_t done = 0;
  bool first = true;
  absl::Status local_error;
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      local_error = ErrnoStatus(errno, "read", path);
      break;
    }
    if (n == 0 && !first) break;
    v1::BlobChunk chunk;
    if (first) {
      chunk.set_sha256(blob.sha256);
      chunk.set_size(blob.size);
      first = false;
    }
    chunk.set_data(buf.data(), static_cast<size_t>(n));
    if (!writer->Write(chunk)) break;  // the server ended the call; see Finish
    done += n;
    if (progress) progress(done, blob.size);
    if (n == 0) break;
  }
  ::close(fd);
  if (!local_error.ok()) {
    ctx.TryCancel();
    (void)writer->Finish();
    return local_error;
  }
  writer->WritesDone();
  RETURN_IF_ERROR(FromGrpcStatus(writer->Finish()));
  return blob;
}

absl::Status DownloadFile(v1::Scheduler::StubInterface* stub,
                          const std::string& token, const std::string& sha256,
                          int64_t size, const std::string& path, uint32_t mode,
                          const ProgressFn& progress) {
  std::string part = path + ".part";
  int fd = ::open(part.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus(errno, "create", part);
  grpc::ClientContext ctx;
  AddToken(&ctx, token);
  v1::DownloadBlobRequest req;
  req.set_sha256(sha256);
  auto reader = stub->DownloadBlob(&ctx, req);
  Sha256 hash;
  int64_t done = 0;
  absl::Status status;
  v1::BlobChunk chunk;
  while (status.ok() && reader->Read(&chunk)) {
    const std::string& data = chunk.data();
    hash.Update(data);
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::write(fd, data.data() + off, data.size() - off);
      if (n < 0) {
        if (errno == EINTR) continue;
        status = ErrnoStatus(errno, "write", part);
        break;
      }
      off += static_cast<size_t>(n);
    }
    done += static_cast<int64_t>(data.size());
    if (progress) progress(done, size);
  }
  if (!status.ok()) ctx.TryCancel();
  absl::Status rpc = FromGrpcStatus(reader->Finish());
  if (status.ok()) status = rpc;
  if (status.ok() && ::fsync(fd) != 0)
    status = ErrnoStatus(errno, "fsync", part);
  ::close(fd);
  if (status.ok()) {
    std::string got = hash.HexDigest();
    if (got != sha256 || done != size) {
      status = absl::DataLossError(
          absl::StrCat("download of ", path, " is corrupt: expected ", size,
                       " bytes with sha256 ", sha256, ", got ", done,
                       " bytes with sha256 ", got));
    }
  }
  if (status.ok()) ::chmod(part.c_str(), mode == 0 ? 0644 : (mode & 07777));
  if (status.ok() && ::rename(part.c_str(), path.c_str()) != 0) {
    status = ErrnoStatus(errno, "rename", part);
  }
  if (!status.ok()) ::unlink(part.c_str());
  return status;
}

}  // namespace dlbatch
