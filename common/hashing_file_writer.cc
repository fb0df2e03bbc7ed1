#include "common/hashing_file_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "common/status.h"

namespace dlbatch {
namespace {

constexpr int64_t kWritebackBytes = 16 << 20;
// The staging buffers' size (a multiple of any block size), and the
// alignment O_DIRECT asks of addresses, offsets and lengths.
constexpr size_t kStageBytes = 4 << 20;
constexpr size_t kDirectAlign = 4096;

}  // namespace

int OpenForSequentialWrite(int dir_fd, const std::string& path, int flags,
                           unsigned mode, int64_t size) {
  if (size >= kDirectWriteMinBytes) {
    int fd = ::openat(dir_fd, path.c_str(), flags | O_DIRECT, mode);
    if (fd >= 0 || errno != EINVAL) return fd;
    // A filesystem without O_DIRECT: the file was not made.
  }
  return ::openat(dir_fd, path.c_str(), flags, mode);
}

HashingFileWriter::HashingFileWriter(int fd, ErrorFn error, int64_t start)
    : fd_(fd), error_(std::move(error)), flushed_(start), file_offset_(start) {
  const int flags = ::fcntl(fd_, F_GETFL);
  direct_ = flags >= 0 && (flags & O_DIRECT) != 0;
  if (direct_ && start % static_cast<int64_t>(kDirectAlign) != 0) {
    StopDirect();  // O_DIRECT writes start on a block boundary only
  }
  for (auto& stage : stage_) {
    if (!direct_) break;
    void* p = nullptr;
    if (::posix_memalign(&p, kDirectAlign, kStageBytes) != 0) {
      StopDirect();  // no memory to stage in: write as the bytes come
      break;
    }
    stage.reset(static_cast<char*>(p));
  }
}

HashingFileWriter::~HashingFileWriter() { (void)WaitFlush(); }

void HashingFileWriter::StopDirect() {
  direct_ = false;
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_DIRECT);
}

void HashingFileWriter::HashKept(absl::string_view data) {
  hash_.Update(data);
  hash_.Wait();
}

absl::Status HashingFileWriter::Append(absl::string_view data) {
  appended_ += static_cast<int64_t>(data.size());
  return direct_ ? AppendStaged(data) : AppendBuffered(data);
}

absl::Status HashingFileWriter::AppendBuffered(absl::string_view data) {
  RETURN_IF_ERROR(WriteAt(data.data(), data.size(), file_offset_));
  file_offset_ += static_cast<int64_t>(data.size());
  if (file_offset_ - flushed_ >= kWritebackBytes) {
    // Start writeback of the stretch; returns without waiting for it.
    ::sync_file_range(fd_, flushed_, file_offset_ - flushed_,
                      SYNC_FILE_RANGE_WRITE);
    flushed_ = file_offset_;
  }
  return absl::OkStatus();
}

absl::Status HashingFileWriter::AppendStaged(absl::string_view data) {
  while (!data.empty()) {
    const size_t n = std::min(kStageBytes - fill_, data.size());
    std::memcpy(stage_[current_].get() + fill_, data.data(), n);
    fill_ += n;
    data.remove_prefix(n);
    if (fill_ == kStageBytes) RETURN_IF_ERROR(FlushStage());
  }
  return absl::OkStatus();
}

absl::Status HashingFileWriter::FlushStage() {
  RETURN_IF_ERROR(WaitFlush());
  const char* buffer = stage_[current_].get();
  const size_t len = fill_;
  const int64_t offset = file_offset_;
  flusher_.Run([this, buffer, len, offset] {
    flush_status_ = WriteAt(buffer, len, offset);
  });
  file_offset_ += static_cast<int64_t>(len);
  current_ ^= 1;
  fill_ = 0;
  return absl::OkStatus();
}

absl::Status HashingFileWriter::WaitFlush() {
  flusher_.Wait();
  return std::exchange(flush_status_, absl::OkStatus());
}

absl::Status HashingFileWriter::WriteAt(const char* data, size_t len,
                                        int64_t offset) {
  // Hashed on the hash's helper thread while written; done before return,
  // so the caller may reuse `data`.
  hash_.Update(absl::string_view(data, len));
  absl::Status status;
  while (len > 0) {
    ssize_t n = ::pwrite(fd_, data, len, offset);
    if (n < 0 && errno == EINVAL && (::fcntl(fd_, F_GETFL) & O_DIRECT) != 0) {
      // The filesystem took O_DIRECT at open but not for this write.
      ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_DIRECT);
      continue;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      status = error_(errno);
      break;
    }
    data += n;
    len -= static_cast<size_t>(n);
    offset += n;
  }
  hash_.Wait();
  return status;
}

absl::Status HashingFileWriter::Finish() {
  if (!direct_) return absl::OkStatus();
  RETURN_IF_ERROR(WaitFlush());
  const char* buffer = stage_[current_].get();
  const size_t aligned = fill_ / kDirectAlign * kDirectAlign;
  RETURN_IF_ERROR(WriteAt(buffer, aligned, file_offset_));
  file_offset_ += static_cast<int64_t>(aligned);
  if (fill_ > aligned) {
    // O_DIRECT takes whole blocks only; the tail goes through the cache.
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_DIRECT);
    RETURN_IF_ERROR(WriteAt(buffer + aligned, fill_ - aligned, file_offset_));
    file_offset_ += static_cast<int64_t>(fill_ - aligned);
  }
  fill_ = 0;
  return absl::OkStatus();
}

}  // namespace dlbatch
