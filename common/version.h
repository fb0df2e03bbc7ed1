// What this build is: its version, commit, build type and GPU libraries
// (--version on every binary), and which workers a scheduler accepts.
#ifndef DLBATCH_COMMON_VERSION_H_
#define DLBATCH_COMMON_VERSION_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace dlbatch {

// The oldest worker version a scheduler of this build accepts. Raise it when
// the scheduler comes to rely on something a worker must send or do (a
// field of the link protocol, a behaviour), so that such a worker is
// refused at registration, naming both versions, instead of misbehaving.
inline constexpr char kMinWorkerVersion[] = "0.1.0";

// DLBATCH_VERSION of the top-level CMakeLists.txt: "0.1.0+gff959ca",
// "0.2.0+3.gabc1234.dirty".
std::string_view Version();
std::string_view GitCommit();  // full hash, or "unknown"
std::string_view BuildType();  // CMAKE_BUILD_TYPE
// Whether the trainer's GPU backend (CUDA, cuDNN, cuBLAS) is built in.
bool GpuBackendBuilt();
// The versions of the headers built against ("12.4", "9.1.0", "2.21.5"),
// or "" where that library is not part of the build.
std::string CudaVersion();
std::string CudnnVersion();
std::string NcclVersion();

// The lines --version prints: BuildText, then the GPU libraries this build
// was made with (no newline after the last). dlbatch-train prints its
// GPU backend's instead (trainer/backend_select.h).
std::string VersionText(std::string_view program);
// "PROGRAM VERSION", then commit and build type (no newline after the last).
std::string BuildText(std::string_view program);

// Compares the leading dotted numbers of two versions ("0.2.0+3.gabc" is
// 0.2.0; a leading 'v' is skipped; missing parts are 0): <0, 0 or >0.
int CompareVersions(std::string_view a, std::string_view b);

// OK if a worker of `worker_version` may register with a scheduler of
// `scheduler_version` whose oldest accepted worker is `minimum`; else
// FAILED_PRECONDITION naming all three and what to do. An empty worker
// version (a worker from before versions were exchanged) counts as 0.1.0.
absl::Status CheckWorkerVersion(std::string_view worker_version,
                                std::string_view minimum,
                                std::string_view scheduler_version);

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_VERSION_H_
