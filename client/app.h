// dlbatch's command line as a whole: the global options (global_options.h),
// every command, the configuration file (commands_config.h), and the parse
// that runs the command named.
#ifndef DLBATCH_CLIENT_APP_H_
#define DLBATCH_CLIENT_APP_H_

namespace dlbatch::client {

// Builds the command line, reads the configuration file, parses argv and
// runs the command it names. Returns the process's exit code: the
// command's, kExitUsage (2) for a usage error, 1 for a configuration file
// that cannot be used, 0 after --help or --version. A `submit -- PROGRAM
// ARGS...`'s command is cut from argv (so argc may shrink).
int RunCommandLine(int argc, char** argv);

}  // namespace dlbatch::client

#endif  // DLBATCH_CLIENT_APP_H_
