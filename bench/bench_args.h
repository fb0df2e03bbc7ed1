// What the benchmarks' command lines share: --help, and flags that come in
// pairs (--name value).
#ifndef DLBATCH_BENCH_BENCH_ARGS_H_
#define DLBATCH_BENCH_BENCH_ARGS_H_

#include <cstdio>
#include <cstring>

namespace dlbatch::bench {

// Where argv asks for --help or -h: prints `usage` on stdout, sets *rc to 0
// and returns true. Where `paired` and a flag lacks its value: says so and
// prints `usage` on stderr, sets *rc to 2 and returns true. Else false: the
// benchmark reads its flags and runs.
inline bool HelpOrBadPairs(int argc, char** argv, const char* usage,
                           bool paired, int* rc) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 ||
        std::strcmp(argv[i], "-h") == 0) {
      std::fputs(usage, stdout);
      *rc = 0;
      return true;
    }
  }
  if (paired && (argc - 1) % 2 != 0) {
    std::fprintf(stderr, "%s needs a value\n%s", argv[argc - 1], usage);
    *rc = 2;
    return true;
  }
  return false;
}

}  // namespace dlbatch::bench

#endif  // DLBATCH_BENCH_BENCH_ARGS_H_
