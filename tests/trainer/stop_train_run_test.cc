// dlbatch-train's checkpoint-and-stop (common/stop_signals.h), as a worker
// preempting a train job asks it: kTrainerStopSignal mid-run stops every
// rank after the same step with its checkpoint written and announced, exit
// kTrainerStoppedExitCode, and the run resumed from it ends with the
// uninterrupted run's model.onnx, bit for bit. Ranks as threads of one
// process, as processes over Gloo signalled one alone, and under the
// launcher; a stop during set-up; SIGTERM, which still stops at once, and
// with --stop-on-term (a worker in a Slurm job) is a stop request too.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/files.h"
#include "common/stop_signals.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"
#include "tests/trainer/train_run_fixture.h"

namespace dlbatch::trainer {
namespace {

using dlbatch::testing::BinDir;
using dlbatch::testing::JsonInt;
using dlbatch::testing::ReadAll;
using dlbatch::testing::Result;
using dlbatch::testing::WaitFor;

// LeNet, no validation, no checkpoint before the end (an epoch is 937
// iterations): the stop's checkpoint is the run's only one until the end.
const char kOptions[] = R"(
    solver: sgdm
    initial_learn_rate: 0.01
    momentum: 0.9
    mini_batch_size: 64
    shuffle: every-epoch
    verbose_frequency: 100
    checkpoint_frequency: 1
    seed: 11
)";
// Long enough that a stop asked once the run reports a step lands well
// before its end, even on a loaded machine (a step is a few milliseconds).
constexpr char kIterations[] = "400";

// "Stopping at iteration N on request": N; nullopt where the diary does
// not say it.
std::optional<int64_t> StopIteration(const std::string& diary) {
  constexpr char kSays[] = "Stopping at iteration ";
  const size_t at = diary.find(kSays);
  if (at == std::string::npos) return std::nullopt;
  const std::string rest = diary.substr(at + sizeof(kSays) - 1);
  int64_t n = 0;
  if (!absl::SimpleAtoi(rest.substr(0, rest.find(' ')), &n)) {
    return std::nullopt;
  }
  return n;
}

// The progress channel's latest iteration and checkpoint_iteration (-1
// where it has no line yet).
struct Channel {
  int64_t iteration = -1;
  int64_t checkpoint = -1;
};
Channel ReadChannel(const std::string& path) {
  Channel c;
  for (const absl::string_view line :
       absl::StrSplit(ReadAll(path), '\n', absl::SkipEmpty())) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;  // a line being written
    c.iteration = JsonInt(j, "iteration");
    c.checkpoint = JsonInt(j, "checkpoint_iteration");
  }
  return c;
}

class StopRun : public testing::TrainRunFixture {
 protected:
  std::string Job() {
    return WriteJob("lenet", testing::FashionMnistJobText(
                                 "lenet", dlbatch::testing::kLenetNetworkYaml,
                                 kOptions, /*validation=*/false));
  }

  // Starts this build's dlbatch-train on `job` into `out` with `extra`,
  // stdout and stderr into `log`, in a process group of its own (as a
  // worker starts it), with the test's tuning cache. `held`: with
  // kTrainerStopSignal blocked, as a launcher starts its ranks: a request
  // sent at once then waits to be taken instead of ending it.
  pid_t Start(const std::string& job, const std::string& out,
              const std::vector<std::string>& extra, const std::string& log,
              bool held = false) {
    std::vector<std::string> store = {BinDir() + "/dlbatch-train", job,
                                      "--output-dir", out};
    store.insert(store.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& s : store) argv.push_back(s.data());
    argv.push_back(nullptr);
    const std::string cache = dir_ + "/cache";
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, kTrainerStopSignal);
    sigprocmask(SIG_BLOCK, &set, &old);
    const pid_t pid = fork();
    if (pid == 0) {
      if (!held) sigprocmask(SIG_SETMASK, &old, nullptr);
      if (freopen(log.c_str(), "w", stdout) == nullptr) _exit(126);
      dup2(fileno(stdout), 2);
      setpgid(0, 0);
      setenv("XDG_CACHE_HOME", cache.c_str(), 1);
      execv(argv[0], argv.data());
      _exit(127);
    }
    sigprocmask(SIG_SETMASK, &old, nullptr);
    return pid;
  }

  // Waits until the channel at `progress` reports a step.
  void WaitForAStep(const std::string& progress) {
    ASSERT_TRUE(
        WaitFor([&] { return ReadChannel(progress).iteration > 0; }, 120000))
        << "no step reported on " << progress;
  }

  // The process's exit code (128 + the signal that ended it).
  static int Wait(pid_t pid) {
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
  }

  std::string OnnxSha(const std::string& out) {
    return Sha256Hex(ReadAll(out + "/model.onnx"));
  }

  // What every stopped run shows: its exit code, the diary's line, the
  // checkpoint of that iteration announced on the channel, and no outputs
  // beyond the checkpoint and its history. Returns the iteration.
  int64_t ExpectStopped(int code, const std::string& diary,
                        const std::string& out, const std::string& progress) {
    EXPECT_EQ(code, kTrainerStoppedExitCode) << diary;
    const std::optional<int64_t> n = StopIteration(diary);
    EXPECT_TRUE(n.has_value()) << diary;
    if (!n) return -1;
    EXPECT_NE(diary.find(absl::StrCat(
                  "Stopping at iteration ", *n,
                  " on request (preempted): checkpoint written; a resumed "
                  "run continues from it.")),
              std::string::npos)
        << diary;
    EXPECT_GT(*n, 0);
    EXPECT_LT(*n, 400) << "the stop came after the run's end";
    EXPECT_EQ(LastCheckpoint(out).iteration, *n);
    EXPECT_EQ(ReadChannel(progress).checkpoint, *n) << ReadAll(progress);
    EXPECT_NE(access((out + "/training_history.csv").c_str(), F_OK), -1);
    EXPECT_EQ(access((out + "/model.onnx").c_str(), F_OK), -1)
        << "a stopped run wrote its outputs";
    return *n;
  }
};

TEST_F(StopRun, ThreadRanksStopAfterOneStepAndResumeToTheSameModel) {
  const std::string job = Job();
  const std::vector<std::string> ranks = {
      "--thread-ranks",   "--ranks",  "2", "--threads", "1",
      "--max-iterations", kIterations};
  Result whole = RunTrain(job, dir_ + "/whole", ranks);
  ASSERT_EQ(whole.code, 0) << whole.out << whole.err;

  const std::string out = dir_ + "/stopped";
  const std::string progress = dir_ + "/stopped.jsonl";
  const std::string log = dir_ + "/stopped.log";
  std::vector<std::string> args = ranks;
  args.insert(args.end(), {"--progress", progress});
  const pid_t pid = Start(job, out, args, log);
  WaitForAStep(progress);
  kill(pid, kTrainerStopSignal);
  const int code = Wait(pid);
  const std::string diary = ReadAll(log);
  const int64_t n = ExpectStopped(code, diary, out, progress);
  ASSERT_FALSE(HasFailure());
  // Where the stop fell, mid-epoch (an epoch is 937 iterations).
  EXPECT_NE(n % 937, 0);

  std::vector<std::string> resume = ranks;
  resume.push_back("--resume");
  Result rest = RunTrain(job, out, resume);
  ASSERT_EQ(rest.code, 0) << rest.out << rest.err;
  EXPECT_NE(rest.out.find(absl::StrCat("Resuming from ", out,
                                       "/checkpoint.dlbc: iteration ", n)),
            std::string::npos)
      << rest.out;
  EXPECT_EQ(rest.out.find("rows missing"), std::string::npos) << rest.out;
  EXPECT_EQ(OnnxSha(out), OnnxSha(dir_ + "/whole"));
  EXPECT_EQ(Metrics(out)["iterations"], 400);
}

// Asked while the ranks start (here before the process takes requests:
// the request waits for it, as in a launched rank): they agree once built,
// before the first step, and stop without a checkpoint. A resumed run
// asked so keeps the checkpoint it resumed from, unchanged.
TEST_F(StopRun, AStopDuringSetUpEndsBeforeTheFirstStepWithoutACheckpoint) {
  const std::string job = Job();
  const std::vector<std::string> ranks = {"--thread-ranks", "--ranks", "2",
                                          "--threads", "1"};
  const std::string out = dir_ + "/out";
  std::vector<std::string> args = ranks;
  args.insert(args.end(), {"--max-iterations", "20"});
  pid_t pid = Start(job, out, args, dir_ + "/fresh.log", /*held=*/true);
  kill(pid, kTrainerStopSignal);
  ASSERT_EQ(Wait(pid), kTrainerStoppedExitCode) << ReadAll(dir_ + "/fresh.log");
  std::string diary = ReadAll(dir_ + "/fresh.log");
  EXPECT_NE(diary.find("Stopping before the first step on request "
                       "(preempted): no step ran and no checkpoint was "
                       "written; a resumed run starts from the beginning."),
            std::string::npos)
      << diary;
  EXPECT_EQ(access((out + "/checkpoint.dlbc").c_str(), F_OK), -1);
  EXPECT_EQ(access((out + "/model.onnx").c_str(), F_OK), -1);

  // A checkpoint at 20, then a resumed run to 40 stopped during set-up.
  Result first = RunTrain(job, out, args);
  ASSERT_EQ(first.code, 0) << first.out << first.err;
  const std::string before = ReadAll(out + "/checkpoint.dlbc");
  args = ranks;
  args.insert(args.end(), {"--max-iterations", "40", "--resume"});
  pid = Start(job, out, args, dir_ + "/resumed.log", /*held=*/true);
  kill(pid, kTrainerStopSignal);
  ASSERT_EQ(Wait(pid), kTrainerStoppedExitCode)
      << ReadAll(dir_ + "/resumed.log");
  diary = ReadAll(dir_ + "/resumed.log");
  EXPECT_NE(diary.find("a resumed run continues from iteration 20"),
            std::string::npos)
      << diary;
  EXPECT_EQ(ReadAll(out + "/checkpoint.dlbc"), before);
}

// SIGTERM keeps its meaning: the run ends at once, by the signal, with no
// checkpoint of where it was.
TEST_F(StopRun, SigtermStillStopsAtOnce) {
  const std::string out = dir_ + "/out";
  const std::string progress = dir_ + "/progress.jsonl";
  const pid_t pid =
      Start(Job(), out,
            {"--thread-ranks", "--ranks", "2", "--threads", "1",
             "--max-iterations", kIterations, "--progress", progress},
            dir_ + "/log");
  WaitForAStep(progress);
  kill(pid, SIGTERM);
  EXPECT_EQ(Wait(pid), 128 + SIGTERM) << ReadAll(dir_ + "/log");
  EXPECT_EQ(ReadAll(dir_ + "/log").find("Stopping"), std::string::npos);
  EXPECT_EQ(access((out + "/checkpoint.dlbc").c_str(), F_OK), -1);
}

// --stop-on-term, as a worker inside a Slurm allocation starts it (Slurm's
// preemption sends SIGTERM to every process of the job, and SIGKILL only
// at its GraceTime): SIGTERM is a stop request, with the checkpoint
// written at the step's end, and the resumed run ends with the
// uninterrupted run's model.
TEST_F(StopRun, WithStopOnTermSigtermCheckpointsAndResumesToTheSameModel) {
  const std::string job = Job();
  const std::vector<std::string> ranks = {
      "--thread-ranks",   "--ranks",  "2", "--threads", "1",
      "--max-iterations", kIterations};
  Result whole = RunTrain(job, dir_ + "/whole", ranks);
  ASSERT_EQ(whole.code, 0) << whole.out << whole.err;

  const std::string out = dir_ + "/stopped";
  const std::string progress = dir_ + "/stopped.jsonl";
  const std::string log = dir_ + "/stopped.log";
  std::vector<std::string> args = ranks;
  args.insert(args.end(), {"--stop-on-term", "--progress", progress});
  const pid_t pid = Start(job, out, args, log);
  WaitForAStep(progress);
  kill(pid, SIGTERM);
  const int code = Wait(pid);
  const int64_t n = ExpectStopped(code, ReadAll(log), out, progress);
  ASSERT_FALSE(HasFailure());

  std::vector<std::string> resume = ranks;
  resume.insert(resume.end(), {"--stop-on-term", "--resume"});
  Result rest = RunTrain(job, out, resume);
  ASSERT_EQ(rest.code, 0) << rest.out << rest.err;
  EXPECT_NE(rest.out.find(absl::StrCat("Resuming from ", out,
                                       "/checkpoint.dlbc: iteration ", n)),
            std::string::npos)
      << rest.out;
  EXPECT_EQ(OnnxSha(out), OnnxSha(dir_ + "/whole"));
}

// Under the launcher, with SIGTERM to the whole process group as Slurm
// sends it to each process of a job: the launcher is not ended by it and
// sets no deadline, the ranks agree on a step, and it leaves with their
// code; no rank is stopped at once.
TEST_F(StopRun, WithStopOnTermTheLauncherAndItsRanksTakeSigtermAsAStop) {
  const std::string out = dir_ + "/out";
  const std::string progress = dir_ + "/progress.jsonl";
  const std::string log = dir_ + "/log";
  const pid_t pid =
      Start(Job(), out,
            {"--ranks", "2", "--threads", "1", "--max-iterations", kIterations,
             "--stop-on-term", "--progress", progress},
            log);
  WaitForAStep(progress);
  kill(-pid, SIGTERM);  // Start made it the leader of its own group
  const int code = Wait(pid);
  ExpectStopped(code, ReadAll(log), out, progress);
  EXPECT_EQ(ReadAll(log).find("rank 1:"), std::string::npos) << ReadAll(log);
}

// Ranks as processes meeting over Gloo through a rendezvous folder, as
// ranks on several machines do: the request reaches rank 1 alone, and rank
// 0 (which writes the checkpoint) stops after the same step.
TEST_F(StopRun, RanksAsProcessesAgreeWhenOnlyOneIsAsked) {
  const std::string job = Job();
  const std::vector<std::string> common = {"--threads", "1", "--max-iterations",
                                           kIterations};
  std::vector<std::string> launched = common;
  launched.insert(launched.end(), {"--ranks", "2"});
  Result whole = RunTrain(job, dir_ + "/whole", launched);
  ASSERT_EQ(whole.code, 0) << whole.out << whole.err;

  const std::string out = dir_ + "/stopped";
  const std::string progress = dir_ + "/stopped.jsonl";
  pid_t pids[2];
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> args = common;
    args.insert(args.end(), {"--rank", absl::StrCat(r), "--world", "2",
                             "--rendezvous", dir_ + "/rendezvous"});
    if (r == 0) args.insert(args.end(), {"--progress", progress});
    pids[r] = Start(job, out, args, absl::StrCat(dir_, "/rank", r, ".log"));
  }
  WaitForAStep(progress);
  kill(pids[1], kTrainerStopSignal);
  const int code0 = Wait(pids[0]);
  const int code1 = Wait(pids[1]);
  EXPECT_EQ(code1, kTrainerStoppedExitCode) << ReadAll(dir_ + "/rank1.log");
  ExpectStopped(code0, ReadAll(dir_ + "/rank0.log"), out, progress);
  ASSERT_FALSE(HasFailure());

  // Resumed by the launcher: the launched run's model.
  launched.push_back("--resume");
  Result rest = RunTrain(job, out, launched);
  ASSERT_EQ(rest.code, 0) << rest.out << rest.err;
  EXPECT_EQ(OnnxSha(out), OnnxSha(dir_ + "/whole"));
}

// The launcher passes the request on to its ranks, is not ended by it, and
// leaves with their code.
TEST_F(StopRun, TheLauncherForwardsTheRequestToItsRanks) {
  const std::string out = dir_ + "/out";
  const std::string progress = dir_ + "/progress.jsonl";
  const std::string log = dir_ + "/log";
  const pid_t pid = Start(Job(), out,
                          {"--ranks", "2", "--threads", "1", "--max-iterations",
                           kIterations, "--progress", progress},
                          log);
  WaitForAStep(progress);
  kill(pid, kTrainerStopSignal);  // the launcher alone, not its group
  const int code = Wait(pid);
  ExpectStopped(code, ReadAll(log), out, progress);
  EXPECT_EQ(ReadAll(log).find("rank 1:"), std::string::npos) << ReadAll(log);
}

}  // namespace
}  // namespace dlbatch::trainer
