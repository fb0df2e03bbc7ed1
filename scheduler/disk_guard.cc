#include "scheduler/disk_guard.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "spdlog/spdlog.h"

namespace dlbatch::scheduler {

DiskGuard::DiskGuard(std::string dir, int64_t reserve_bytes,
                     FreeBytesFn free_bytes)
    : dir_(std::move(dir)),
      reserve_path_(dir_.empty() ? "" : dir_ + "/reserve.space"),
      reserve_bytes_(reserve_bytes),
      free_bytes_(std::move(free_bytes)) {}

absl::StatusOr<int64_t> DiskGuard::FreeBytes() const {
  if (free_bytes_) return free_bytes_();
  if (dir_.empty()) return INT64_MAX;
  struct statvfs vfs;
  if (::statvfs(dir_.c_str(), &vfs) != 0)
    return ErrnoStatus(errno, "statvfs", dir_);
  return static_cast<int64_t>(vfs.f_bavail) *
         static_cast<int64_t>(vfs.f_frsize);
}

void DiskGuard::Start() {
  absl::MutexLock lock(&mu_);
  if (reserve_path_.empty()) return;
  // A reserve left by an earlier run is ours: it is remade below.
  ::unlink(reserve_path_.c_str());
  if (!MakeReserveLocked()) {
    full_ = true;
    why_ = "no room for the scheduler's reserve at start";
    spdlog::error("{}",
                  "the state folder's disk is full at start; serving "
                  "reads and refusing new work until space returns");
  }
}

bool DiskGuard::full() const {
  absl::MutexLock lock(&mu_);
  return full_;
}

std::string DiskGuard::Reason() const {
  absl::MutexLock lock(&mu_);
  std::string where = dir_.empty() ? "the scheduler's store" : dir_;
  std::string free = free_seen_ >= 0
                         ? absl::StrCat(" (", HumanBytes(free_seen_), " free)")
                         : "";
  return absl::StrCat("the scheduler's disk is full: no room in ", where, free,
                      why_.empty() ? "" : absl::StrCat("; ", why_),
                      ". Free space there (e.g. `dlbatch admin purge --before "
                      "DATE` deletes old jobs) or move --state-dir; the "
                      "scheduler resumes by itself");
}

void DiskGuard::NoteFull(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (!full_) {
    spdlog::error(
        "the state folder's disk is full ({}); refusing new work "
        "until space returns",
        why.ToString());
  }
  full_ = true;
  why_ = std::string(why.message());
  DropReserveLocked();
  if (auto free = FreeBytes(); free.ok()) {
    free_seen_ = *free;
    // A write failed with this much free (a large one may fail with
    // megabytes left): leave full mode only once a reserve's worth more is
    // free, or the same write comes back, fails again, and so on forever.
    leave_at_ = *free + reserve_bytes_;
  }
}

bool DiskGuard::Check() {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<int64_t> free = FreeBytes();
  if (!free.ok()) return false;
  free_seen_ = *free;
  if (!full_) {
    if (*free >= reserve_bytes_ / 2) return false;
    full_ = true;
    why_ = absl::StrCat("less than ", HumanBytes(reserve_bytes_ / 2),
                        " left beside the reserve");
    DropReserveLocked();
    spdlog::error(
        "the state folder's disk is nearly full ({} free); "
        "refusing new work until space returns",
        HumanBytes(*free));
    return true;
  }
  if (*free < std::max(2 * reserve_bytes_, leave_at_)) return false;
  if (!reserve_held_ && !MakeReserveLocked()) return false;
  full_ = false;
  leave_at_ = 0;
  why_.clear();
  spdlog::info("the state folder has room again ({} free); accepting work",
               HumanBytes(*free));
  return true;
}

bool DiskGuard::MakeReserveLocked() {
  mu_.AssertHeld();
  if (reserve_path_.empty() || reserve_held_) return true;
  int fd = ::open(reserve_path_.c_str(),
                  O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  // Written, not only allocated: some filesystems take fallocate lightly.
  std::string zeros(1 << 16, '\0');
  int64_t left = reserve_bytes_;
  bool ok = true;
  while (left > 0 && ok) {
    size_t n = static_cast<size_t>(
        std::min<int64_t>(left, static_cast<int64_t>(zeros.size())));
    ssize_t w = ::write(fd, zeros.data(), n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) ok = false;
    if (w > 0) left -= w;
  }
  if (ok && ::fsync(fd) != 0) ok = false;
  ::close(fd);
  if (!ok) {
    ::unlink(reserve_path_.c_str());
    return false;
  }
  reserve_held_ = true;
  return true;
}

void DiskGuard::DropReserveLocked() {
  mu_.AssertHeld();
  if (reserve_path_.empty()) return;
  ::unlink(reserve_path_.c_str());
  reserve_held_ = false;
}

}  // namespace dlbatch::scheduler
