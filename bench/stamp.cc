// A job for the start-latency benchmark: appends "<realtime ns> <job id>" to
// the file it is given and exits. No libraries, so its own start is cheap.
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  const char* id = getenv("DLBATCH_JOB_ID");
  char line[64];
  int n =
      snprintf(line, sizeof line, "%lld %s\n",
               static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec,
               id ? id : "0");
  int fd = open(argv[1], O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0 || write(fd, line, static_cast<size_t>(n)) != n) return 1;
  return close(fd);
}
