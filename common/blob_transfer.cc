#include "common/blob_transfer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/background_sha256.h"
#include "common/endpoint.h"
#include "common/files.h"
#include "common/hashing_file_writer.h"
#include "common/status.h"

namespace dlbatch {
namespace {

absl::StatusOr<std::string> HashFd(int fd, int64_t size,
                                   const std::string& what) {
  Sha256 hash;
  std::string buf(std::min<int64_t>(size, kBlobChunkBytes), '\0');
  for (int64_t done = 0; done < size;) {
    size_t want =
        static_cast<size_t>(std::min<int64_t>(size - done, buf.size()));
    ASSIGN_OR_RETURN(size_t n, PreadFull(fd, buf.data(), want, done, what));
    if (n < want) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, " shrank while being read: ", size, " bytes expected"));
    }
    hash.Update(buf.data(), n);
    done += static_cast<int64_t>(n);
  }
  return hash.HexDigest();
}

// Streams `size` bytes of `fd`; `known_sha` (may be empty) goes in the
// first chunk.
absl::StatusOr<LocalBlob> Send(v1::Scheduler::StubInterface* stub,
                               const std::string& token, int fd, int64_t size,
                               const std::string& known_sha,
                               const std::string& what,
                               const ProgressFn& progress) {
  grpc::ClientContext ctx;
  AddToken(&ctx, token);
  v1::BlobRef ref;
  auto writer = stub->UploadBlob(&ctx, &ref);
  // Two chunks in turn: one is hashed (on a helper thread) while it is
  // sent, the other read into. Each chunk's own buffer is read into, so the
  // bytes are copied only by the serialisation.
  BackgroundSha256 hash;
  v1::BlobChunk chunks[2];
  chunks[0].set_sha256(known_sha);
  chunks[0].set_size(size);
  int64_t done = 0;
  bool cut_short = false;  // the scheduler ended the call before the end
  absl::Status local;
  int turn = 0;
  do {
    v1::BlobChunk& chunk = chunks[turn++ % 2];
    std::string* data = chunk.mutable_data();
    size_t want =
        static_cast<size_t>(std::min<int64_t>(size - done, kBlobChunkBytes));
    data->resize(want);
    absl::StatusOr<size_t> n = PreadFull(fd, data->data(), want, done, what);
    if (!n.ok()) {
      local = n.status();
      break;
    }
    if (*n < want) {
      local = absl::FailedPreconditionError(
          absl::StrCat(what, " shrank while being uploaded: ", size,
                       " bytes announced, ", done + *n, " found"));
      break;
    }
    hash.Update(*data);  // the buffer is left alone until two turns on
    if (!writer->Write(chunk)) {
      cut_short = true;  // refused, or stored already: Finish says which
      break;
    }
    done += static_cast<int64_t>(want);
    if (progress) progress(done, size);
    if (chunk.size() != 0) {
      chunk.clear_sha256();
      chunk.set_size(0);
    }
  } while (done < size);
  hash.Wait();
  if (!local.ok()) {
    ctx.TryCancel();
    (void)writer->Finish();
    return local;
  }
  if (!cut_short) writer->WritesDone();
  RETURN_IF_ERROR(FromGrpcStatus(writer->Finish()));
  if (cut_short || done < size) {
    // Only a blob the store held already ends an upload early with OK.
    if (known_sha.empty() || ref.sha256() != known_sha) {
      return absl::UnavailableError(
          absl::StrCat("the scheduler ended the upload of ", what, " after ",
                       done, " of ", size, " bytes"));
    }
    if (progress) progress(size, size);
    return LocalBlob{known_sha, size};
  }
  std::string sent = hash.HexDigest();
  if (ref.sha256() != sent || ref.size() != size ||
      (!known_sha.empty() && sent != known_sha)) {
    return absl::DataLossError(
        absl::StrCat("upload of ", what, " is corrupt: sent ", size,
                     " bytes with sha256 ", sent,
                     known_sha.empty() || sent == known_sha
                         ? ""
                         : absl::StrCat(" (hashed before as ", known_sha, ")"),
                     ", the scheduler stored ", ref.size(),
                     " bytes with sha256 ", ref.sha256()));
  }
  return LocalBlob{sent, size};
}

// Opens NAME.part to go on from byte `offset`: its first `offset` bytes are
// kept and anything past them cut off. Invalid where there is no such part
// (missing, not a regular file, shorter than `offset`, a symlink): the
// caller then starts from 0. `kept` is a second, read-only fd on the same
// file, to hash the kept bytes through whatever O_DIRECT does to `fd`.
UniqueFd OpenPartToResume(int dir_fd, const std::string& part, int64_t offset,
                          int64_t size, UniqueFd* kept) {
  constexpr int kNoSurprises = O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
  UniqueFd reader(::openat(dir_fd, part.c_str(), O_RDONLY | kNoSurprises));
  struct stat rs, ws;
  if (!reader.valid() || ::fstat(reader.get(), &rs) != 0 ||
      !S_ISREG(rs.st_mode) || rs.st_size < offset) {
    return UniqueFd();
  }
  UniqueFd fd(OpenForSequentialWrite(dir_fd, part, O_WRONLY | kNoSurprises,
                                     0600, size - offset));
  if (!fd.valid() || ::fstat(fd.get(), &ws) != 0 || ws.st_dev != rs.st_dev ||
      ws.st_ino != rs.st_ino) {
    return UniqueFd();  // swapped between the two opens
  }
  if (ws.st_size > offset && ::ftruncate(fd.get(), offset) != 0) {
    return UniqueFd();
  }
  *kept = std::move(reader);
  return fd;
}

// A download cut off by the link or the scheduler, not by what came: the
// bytes received so far are sound.
bool CutOff(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable ||
         status.code() == absl::StatusCode::kDeadlineExceeded ||
         status.code() == absl::StatusCode::kCancelled;
}

// Downloads blob `sha256` into NAME.part (from byte `*offset` of an earlier
// part where `*offset` > 0 and that part is there; `*offset` is set to 0
// where it is not) and renames it to NAME once it hashes to `sha256`.
// `*received` counts the bytes that came. `keep_cut_off`: a cut-off
// download leaves its part; every other failure removes it.
absl::Status DownloadInto(v1::Scheduler::StubInterface* stub,
                          const std::string& token, const std::string& sha256,
                          int64_t size, int dir_fd, const std::string& name,
                          uint32_t mode, const std::string& what,
                          int64_t* offset, bool keep_cut_off,
                          const ProgressFn& progress, int64_t* received) {
  const std::string part = name + ".part";
  UniqueFd kept;
  UniqueFd fd;
  if (*offset > 0 && *offset <= size) {
    fd = OpenPartToResume(dir_fd, part, *offset, size, &kept);
  }
  if (!fd.valid()) {
    *offset = 0;
    // A stale part file (or a symlink planted there) is replaced, never
    // followed.
    ::unlinkat(dir_fd, part.c_str(), 0);
    fd = UniqueFd(OpenForSequentialWrite(
        dir_fd, part, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
        0600, size));
    if (!fd.valid()) return ErrnoStatus(errno, "create", what + ".part");
  }
  const int64_t start = *offset;
  grpc::ClientContext ctx;
  AddToken(&ctx, token);
  // A large file is written past the page cache, hashed beside the write
  // (HashingFileWriter); the chunk read next goes into a message of its own.
  absl::Status status;
  absl::Status rpc;
  int64_t done = 0;
  std::string got;
  {
    HashingFileWriter file(
        fd.get(),
        [&what](int err) { return ErrnoStatus(err, "write", what + ".part"); },
        start);
    // The kept bytes are hashed before the call starts, so that a slow
    // hash cannot stall the scheduler's stream.
    if (start > 0) {
      std::string buf(std::min<int64_t>(start, kBlobChunkBytes), '\0');
      for (int64_t at = 0; status.ok() && at < start;) {
        const size_t want =
            static_cast<size_t>(std::min<int64_t>(start - at, buf.size()));
        absl::StatusOr<size_t> n =
            PreadFull(kept.get(), buf.data(), want, at, what + ".part");
        if (!n.ok()) {
          status = n.status();
        } else if (*n < want) {
          status = absl::FailedPreconditionError(
              absl::StrCat(what, ".part shrank while being read"));
        } else {
          file.HashKept(absl::string_view(buf.data(), want));
          at += static_cast<int64_t>(want);
        }
      }
    }
    if (status.ok()) {
      v1::DownloadBlobRequest req;
      req.set_sha256(sha256);
      req.set_offset(start);
      auto reader = stub->DownloadBlob(&ctx, req);
      v1::BlobChunk chunk;
      while (reader->Read(&chunk)) {
        if (start + file.appended() +
                static_cast<int64_t>(chunk.data().size()) >
            size) {
          status = absl::DataLossError(absl::StrCat(
              "download of ", what, " is corrupt: more than the expected ",
              size, " bytes came"));
          break;
        }
        status = file.Append(chunk.data());
        *received += static_cast<int64_t>(chunk.data().size());
        if (!status.ok()) break;
        if (progress) progress(file.appended(), size - start);
      }
      if (status.ok()) status = file.Finish();
      if (!status.ok()) ctx.TryCancel();
      rpc = FromGrpcStatus(reader->Finish());
      if (status.ok()) status = rpc;
    }
    done = start + file.appended();
    got = file.HexDigest();
  }
  if (status.ok() && ::fsync(fd.get()) != 0)
    status = ErrnoStatus(errno, "fsync", what + ".part");
  if (status.ok() && (got != sha256 || done != size)) {
    status = absl::DataLossError(absl::StrCat(
        "download of ", what, " is corrupt: expected ", size,
        " bytes with sha256 ", sha256, ", got ", done, " bytes with sha256 ",
        got, start > 0 ? absl::StrCat(" (", start, " of them kept)") : ""));
  }
  if (status.ok() &&
      ::fchmod(fd.get(), mode == 0 ? 0644 : (mode & 07777)) != 0) {
    status = ErrnoStatus(errno, "chmod", what + ".part");
  }
  fd.Reset();
  if (status.ok() &&
      ::renameat(dir_fd, part.c_str(), dir_fd, name.c_str()) != 0) {
    status = ErrnoStatus(errno, "rename", what + ".part");
  }
  if (!status.ok() && !(keep_cut_off && status == rpc && CutOff(rpc))) {
    ::unlinkat(dir_fd, part.c_str(), 0);
  }
  return status;
}

bool IsFileName(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name != "." &&
         name != "..";
}

absl::Status NotAFileName(const std::string& name) {
  return absl::InvalidArgumentError(
      absl::StrCat("'", name, "' is not a file name"));
}

}  // namespace

absl::StatusOr<LocalBlob> UploadFd(v1::Scheduler::StubInterface* stub,
                                   const std::string& token, int fd,
                                   int64_t size, const std::string& what,
                                   const ProgressFn& progress) {
  return Send(stub, token, fd, size, "", what, progress);
}

absl::StatusOr<LocalBlob> UploadFdKnown(v1::Scheduler::StubInterface* stub,
                                        const std::string& token, int fd,
                                        int64_t size, const std::string& sha256,
                                        const std::string& what,
                                        const ProgressFn& progress) {
  grpc::ClientContext ctx;
  AddToken(&ctx, token);
  v1::StatBlobsRequest req;
  req.add_sha256(sha256);
  v1::StatBlobsReply reply;
  RETURN_IF_ERROR(FromGrpcStatus(stub->StatBlobs(&ctx, req, &reply)));
  if (reply.present_size() == 1 && reply.present(0)) {
    if (progress) progress(size, size);
    return LocalBlob{sha256, size};
  }
  return Send(stub, token, fd, size, sha256, what, progress);
}

absl::StatusOr<LocalBlob> UploadFile(v1::Scheduler::StubInterface* stub,
                                     const std::string& token,
                                     const std::string& path,
                                     const ProgressFn& progress,
                                     UploadMode mode) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; the type is
  // checked on what was opened, so a swap after a stat cannot fool it.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(errno, "open", path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "stat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is ", DescribeFileType(st.st_mode),
                     ", not a regular file; only files and folders of "
                     "files can be sent"));
  }
  const int64_t size = static_cast<int64_t>(st.st_size);
  if (mode == UploadMode::kReadOnce) {
    return UploadFd(stub, token, fd.get(), size, path, progress);
  }
  ASSIGN_OR_RETURN(std::string sha256, HashFd(fd.get(), size, path));
  return UploadFdKnown(stub, token, fd.get(), size, sha256, path, progress);
}

absl::StatusOr<std::string> Sha256Fd(int fd, int64_t size,
                                     const std::string& what) {
  return HashFd(fd, size, what);
}

absl::Status DownloadFile(v1::Scheduler::StubInterface* stub,
                          const std::string& token, const std::string& sha256,
                          int64_t size, const std::string& path, uint32_t mode,
                          const ProgressFn& progress) {
  int64_t offset = 0, received = 0;
  return DownloadInto(stub, token, sha256, size, AT_FDCWD, path, mode, path,
                      &offset, /*keep_cut_off=*/false, progress, &received);
}

absl::Status DownloadFileAt(v1::Scheduler::StubInterface* stub,
                            const std::string& token, const std::string& sha256,
                            int64_t size, int dir_fd, const std::string& name,
                            uint32_t mode, const std::string& what,
                            const ProgressFn& progress) {
  if (!IsFileName(name)) return NotAFileName(name);
  int64_t offset = 0, received = 0;
  return DownloadInto(stub, token, sha256, size, dir_fd, name, mode, what,
                      &offset, /*keep_cut_off=*/false, progress, &received);
}

absl::Status ResumeDownloadAt(v1::Scheduler::StubInterface* stub,
                              const std::string& token,
                              const std::string& sha256, int64_t size,
                              int dir_fd, const std::string& name,
                              uint32_t mode, int64_t offset,
                              const std::string& what, DownloadReport* report,
                              const ProgressFn& progress) {
  *report = DownloadReport();
  if (!IsFileName(name)) return NotAFileName(name);
  report->kept = offset;
  absl::Status s = DownloadInto(stub, token, sha256, size, dir_fd, name, mode,
                                what, &report->kept, /*keep_cut_off=*/true,
                                progress, &report->received);
  if (s.code() == absl::StatusCode::kDataLoss && report->kept > 0) {
    // The kept bytes (or what came after them) are not the blob's: the
    // part is gone, and the whole file comes again.
    report->discarded = std::exchange(report->kept, 0);
    const int64_t before = report->received;
    ProgressFn again;
    if (progress) {
      again = [&](int64_t done, int64_t total) {
        progress(before + done, before + total);
      };
    }
    s = DownloadInto(stub, token, sha256, size, dir_fd, name, mode, what,
                     &report->kept, /*keep_cut_off=*/true, again,
                     &report->received);
  }
  return s;
}

}  // namespace dlbatch
