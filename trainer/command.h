// What dlbatch-train does with its command line, as a library: main.cc
// only calls TrainCommand. The parts a test can run without starting a
// process (how many ranks this process starts or is, what the launched
// ranks are told, the rendezvous a worker asks for) are separate.
#ifndef DLBATCH_TRAINER_COMMAND_H_
#define DLBATCH_TRAINER_COMMAND_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/comm/communicator.h"
#include "trainer/launcher.h"

namespace dlbatch::trainer {

// dlbatch-train's options (see its --help).
struct CommandLine {
  std::string job_file;
  std::string output_dir;  // "": <job name>-output
  std::string progress;    // --progress: "", fd:N or a path
  std::string rendezvous;  // --rendezvous DIR of a launched rank
  std::string host = "127.0.0.1";
  int ranks = 0;    // --ranks; 0: the job's pool, else 1
  int threads = 0;  // per rank; 0: the cores / the ranks
  int rank = -1;
  int world = 1;
  bool rank_given = false;   // --rank: a launched rank
  bool world_given = false;  // --world
  int first_rank = 0;
  bool spec_binary = false;
  // --thread-ranks: this machine's ranks as threads of this process.
  bool thread_ranks = false;
  bool resume = false;
  // --stop-on-term: SIGTERM asks for a checkpoint-and-stop, as
  // kTrainerStopSignal does (stop_request.h), instead of stopping at once.
  bool stop_on_term = false;
  bool list_devices = false;
  int64_t max_epochs = 0;
  int64_t max_iterations = 0;
  int mini_batch_size = 0;
  std::string execution_environment;
};

// What this process is: the launcher of a machine's ranks, or one rank.
struct RankPlan {
  bool launch = false;  // start `range` as processes of this program
  RankRange range;      // launch: the ranks to start
  int rank = 0;         // not launch: this process's rank of `world`
  int world = 1;
  int local_ranks = 0;  // ranks on this machine; 0: unknown (--rank by hand)
  // --thread-ranks: ranks rank..rank+thread_ranks-1 of `world` train on
  // this process's threads (trainer/thread_ranks.h); 0: one rank here.
  int thread_ranks = 0;
};
// From the command line and the job's pool. InvalidArgument, saying what
// to change, where the ranks do not fit in the world.
absl::StatusOr<RankPlan> PlanRanks(const CommandLine& cl, int pool);

// The arguments of each rank a launcher starts: the launcher's own `args`
// (argv without the program) less --world and --first-rank (each rank gets
// its own), then --threads and --output-dir.
std::vector<std::string> RankArguments(const std::vector<std::string>& args,
                                       int threads,
                                       const std::string& output_dir);

// DLBATCH_RENDEZVOUS and its companions, as a dlbatch worker sets them;
// nullopt where DLBATCH_RENDEZVOUS is unset or empty.
absl::StatusOr<std::optional<SchedulerRendezvousConfig>>
SchedulerRendezvousFromEnvironment();

// Runs dlbatch-train; returns the process's exit code (0, 1 for a failed
// run, 2 for a bad command line, or a launched rank's code).
int TrainCommand(int argc, char** argv);

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_COMMAND_H_
