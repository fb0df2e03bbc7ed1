// How a daemon's log lines look (--log-format). Both formats write one line
// per event to stderr only (journald, or whoever started the daemon, keeps
// it; dlbatch itself writes no log file):
//   text: "2026-11-25 11:22:50.123 info listening on ..." (local time), with
//         any line break or control character in a message escaped;
//   json: {"time":"2026-11-25T11:22:50.123Z","level":"info","msg":"...",
//          "process":"dlbatch-scheduler","pid":123,"tid":456} (UTC).
// gRPC's own log lines (errors, or what GRPC_VERBOSITY asks for) go the same
// way, as "gRPC: MESSAGE (FILE:LINE)": errors as errors, the rest as info.
#ifndef DLBATCH_COMMON_LOG_FORMAT_H_
#define DLBATCH_COMMON_LOG_FORMAT_H_

#include <string>

#include "absl/status/status.h"
#include "grpc/support/log.h"

namespace dlbatch {

// Makes spdlog's default logger write `format` ("text" or "json") to
// stderr, naming `process` in json, and sends gRPC's log lines to it
// (LogGrpcLine). InvalidArgument for another format.
absl::Status SetUpLogging(const std::string& format,
                          const std::string& process);

// Writes one of gRPC's log lines to spdlog's default logger; a daemon that
// looks at some of them itself (gpr_set_log_function) passes the rest here.
void LogGrpcLine(gpr_log_func_args* args);

// `text` as the inside of a JSON string (quotes, backslashes, control
// characters and invalid UTF-8 bytes escaped).
std::string JsonEscape(const std::string& text);

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_LOG_FORMAT_H_
