/* Loaded with LD_PRELOAD into a CLI run as another user, it makes the CLI
   believe it is root: what a client says of itself must not change who
   the scheduler takes it for. */
#include <sys/types.h>

uid_t geteuid(void) { return 0; }
uid_t getuid(void) { return 0; }
