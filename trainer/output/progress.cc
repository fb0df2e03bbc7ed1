#include "trainer/output/progress.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/files.h"
#include "google/protobuf/util/json_util.h"

namespace dlbatch::trainer {
namespace {

constexpr const char* kRule =
    "|==========================================================="
    "===========================================================|";

}  // namespace

std::string FormatElapsed(double seconds) {
  const int64_t s = static_cast<int64_t>(std::max(0.0, seconds));
  return absl::StrFormat("%02d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
}

void ProgressTable::Header() {
  std::fprintf(out_, "%s\n", kRule);
  std::fprintf(
      out_,
      "|  Epoch  |  Iteration  |  Time Elapsed  |  Mini-batch  |  "
      "Mini-batch  |  Validation  |  Validation  |  Base Learning  |\n"
      "|         |             |   (hh:mm:ss)   |   Accuracy   |  "
      "   Loss     |   Accuracy   |     Loss     |      Rate       |\n");
  std::fprintf(out_, "%s\n", kRule);
  std::fflush(out_);
}

void ProgressTable::Row(const ProgressRow& r) {
  const std::string vacc =
      r.validation_accuracy
          ? absl::StrFormat("%11.2f%%", *r.validation_accuracy)
          : std::string(12, ' ');
  const std::string vloss = r.validation_loss
                                ? absl::StrFormat("%12.4f", *r.validation_loss)
                                : std::string(12, ' ');
  std::fprintf(
      out_,
      "| %7lld | %11lld | %14s | %11.2f%% | %12.4f | %s | %s | %15.4g |\n",
      static_cast<long long>(r.epoch), static_cast<long long>(r.iteration),
      FormatElapsed(r.elapsed_s).c_str(), r.accuracy, r.loss, vacc.c_str(),
      vloss.c_str(), r.learn_rate);
  std::fflush(out_);
}

void ProgressTable::Footer() {
  std::fprintf(out_, "%s\n", kRule);
  std::fflush(out_);
}

absl::StatusOr<ProgressChannel> ProgressChannel::Open(
    const std::string& target) {
  ProgressChannel channel;
  if (target.empty()) return channel;
  if (absl::StartsWith(target, "fd:")) {
    int fd = -1;
    if (!absl::SimpleAtoi(target.substr(3), &fd) || fd < 0 ||
        fcntl(fd, F_GETFD) < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--progress ", target,
                       ": not an open file descriptor; give fd:N "
                       "for an open descriptor N, or a file path"));
    }
    channel.fd_ = fd;
    return channel;
  }
  const int fd =
      open(target.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "opening the progress file", target);
  channel.fd_ = fd;
  channel.owned_ = true;
  return channel;
}

ProgressChannel::ProgressChannel(ProgressChannel&& other) noexcept {
  *this = std::move(other);
}

ProgressChannel& ProgressChannel::operator=(ProgressChannel&& other) noexcept {
  if (this != &other) {
    if (owned_ && fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    owned_ = std::exchange(other.owned_, false);
  }
  return *this;
}

ProgressChannel::~ProgressChannel() {
  if (owned_ && fd_ >= 0) close(fd_);
}

std::string ProgressLine(const v1::TrainProgress& progress) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string line;
  // Printing a message of scalars has nothing to fail on.
  (void)google::protobuf::util::MessageToJsonString(progress, &line, options);
  return line;
}

void ProgressChannel::Emit(const v1::TrainProgress& progress) {
  if (fd_ >= 0) Write(ProgressLine(progress) + "\n");
}

void ProgressChannel::Write(const std::string& line) {
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t n = write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (owned_) close(fd_);
      fd_ = -1;
      return;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace dlbatch::trainer
