// The folder rendezvous: one file per key, written with WriteFileAtomic, so
// a reader sees either no file or the whole value, never a half-written one.
#include <algorithm>
#include <cctype>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/files.h"
#include "trainer/comm/communicator.h"

namespace dlbatch::trainer {
namespace {

// First and longest pause between two looks for a missing key: short enough
// that a connect is not slowed noticeably, long enough not to spin.
constexpr absl::Duration kFirstPoll = absl::Milliseconds(1);
constexpr absl::Duration kLongestPoll = absl::Milliseconds(50);

// Maps a key to a file name: letters, digits, '_' and '-' stay, every other
// byte becomes %XX. No name has a '.', so none can be mistaken for (or
// collide with) WriteFileAtomic's NAME.tmp.
std::string FileNameForKey(const std::string& key) {
  std::string name;
  name.reserve(key.size());
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '_' || c == '-') {
      name.push_back(static_cast<char>(c));
    } else {
      absl::StrAppendFormat(&name, "%%%02X", c);
    }
  }
  return name;
}

// "rank_3", "x/rank_3" or "rank3" name the rank that writes them: when such
// a key never appears, that rank most likely never arrived.
std::string MissingRankHint(const std::string& key) {
  size_t pos = key.rfind("rank");
  if (pos == std::string::npos) return "";
  size_t digits = pos + 4;
  if (digits < key.size() && (key[digits] == '_' || key[digits] == '-')) {
    ++digits;
  }
  size_t end = digits;
  while (end < key.size() &&
         std::isdigit(static_cast<unsigned char>(key[end]))) {
    ++end;
  }
  if (end == digits || end != key.size()) return "";
  return absl::StrCat("; rank ", key.substr(digits),
                      " likely never arrived (not started, crashed, or "
                      "pointed at another folder)");
}

class FileRendezvous : public Rendezvous {
 public:
  explicit FileRendezvous(std::string dir) : dir_(std::move(dir)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    if (key.empty()) {
      return absl::InvalidArgumentError("rendezvous key must not be empty");
    }
    return WriteFileAtomic(PathFor(key), value);
  }

  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override {
    if (key.empty()) {
      return absl::InvalidArgumentError("rendezvous key must not be empty");
    }
    const std::string path = PathFor(key);
    const absl::Time deadline = absl::Now() + timeout;
    absl::Duration pause = kFirstPoll;
    for (;;) {
      absl::StatusOr<std::string> value = ReadFile(path);
      if (value.ok() || !absl::IsNotFound(value.status())) return value;
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) break;
      std::this_thread::sleep_for(
          absl::ToChronoNanoseconds(std::min(pause, left)));
      pause = std::min(pause * 2, kLongestPoll);
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "rendezvous key '", key, "' was not set within ",
        absl::FormatDuration(absl::Ceil(timeout, absl::Milliseconds(1))),
        " in folder ", dir_, MissingRankHint(key)));
  }

 private:
  std::string PathFor(const std::string& key) const {
    return absl::StrCat(dir_, "/", FileNameForKey(key));
  }

  const std::string dir_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Rendezvous>> OpenFileRendezvous(
    const std::string& dir) {
  if (dir.empty()) {
    return absl::InvalidArgumentError("rendezvous folder must not be empty");
  }
  absl::Status made = MakeDirs(dir, 0700);
  if (!made.ok()) {
    return absl::Status(made.code(), absl::StrCat("opening rendezvous folder ",
                                                  dir, ": ", made.message()));
  }
  std::string clean = dir;
  while (clean.size() > 1 && clean.back() == '/') clean.pop_back();
  return std::make_unique<FileRendezvous>(std::move(clean));
}

}  // namespace dlbatch::trainer
