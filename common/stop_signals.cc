#include "common/stop_signals.h"

#include <csignal>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dlbatch {
namespace {

struct Named {
  const char* name;
  int number;
};
// What a program may catch to stop cleanly; the usual order of preference.
constexpr Named kStopSignals[] = {
    {"TERM", SIGTERM}, {"INT", SIGINT},   {"HUP", SIGHUP},   {"USR1", SIGUSR1},
    {"USR2", SIGUSR2}, {"QUIT", SIGQUIT}, {"ALRM", SIGALRM}, {"XCPU", SIGXCPU},
};

}  // namespace

std::optional<int> StopSignalNumber(absl::string_view name) {
  std::string upper = absl::AsciiStrToUpper(name);
  absl::string_view bare = upper;
  if (absl::StartsWith(bare, "SIG")) bare.remove_prefix(3);
  for (const Named& s : kStopSignals) {
    if (bare == s.name) return s.number;
  }
  return std::nullopt;
}

std::string StopSignalName(int number) {
  for (const Named& s : kStopSignals) {
    if (s.number == number) return s.name;
  }
  return absl::StrCat("signal ", number);
}

std::string StopSignalNames() {
  std::string out;
  for (const Named& s : kStopSignals) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", s.name);
  }
  return out;
}

}  // namespace dlbatch
