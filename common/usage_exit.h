// The exit code of a command line that could not be parsed, the same for
// every dlbatch program (the CLI, the daemons, dlbatch-train).
#ifndef DLBATCH_COMMON_USAGE_EXIT_H_
#define DLBATCH_COMMON_USAGE_EXIT_H_

#include <CLI/CLI.hpp>
#include <iostream>

namespace dlbatch {

// A usage error (an unknown flag or command, a missing or bad value) exits
// 2, as getopt-based tools and shells' builtins do; CLI11's own codes
// (105 to 116) would say nothing a script could rely on.
inline constexpr int kExitUsage = 2;

// Prints what CLI11 prints for `e` (the help or version on `out`, an
// error on `err`) and returns the exit code: 0 for --help and --version,
// a CLI::RuntimeError's own code, kExitUsage for everything else.
inline int ExitForParseError(const CLI::App& app, const CLI::ParseError& e,
                             std::ostream& out = std::cout,
                             std::ostream& err = std::cerr) {
  const int code = app.exit(e, out, err);
  if (code == 0 || e.get_name() == "RuntimeError") return code;
  return kExitUsage;
}

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_USAGE_EXIT_H_
