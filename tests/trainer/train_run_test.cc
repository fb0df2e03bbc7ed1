// Whole training runs of the real dlbatch-train on the real Fashion-MNIST
// files: accuracy, outputs, determinism, resume after a kill, 1 rank
// against 4, and the errors a user meets.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/files.h"
#include "dlbatch/v1/job.pb.h"
#include "google/protobuf/util/json_util.h"
#include "tests/integration/harness.h"
#include "tests/trainer/train_run_fixture.h"
#include "trainer/backend_select.h"
#include "trainer/output/checkpoint.h"
#include "trainer/output/history.h"

namespace dlbatch::trainer {
namespace {

using dlbatch::testing::BinDir;
using dlbatch::testing::Exec;
using dlbatch::testing::ReadAll;
using dlbatch::testing::Result;
using dlbatch::testing::WaitFor;
using dlbatch::testing::WriteAll;
using testing::RelativeDifference;

const char* const kLenet = dlbatch::testing::kLenetNetworkYaml;

// A small network that trains in a blink, with batchnorm and dropout.
const char kSmall[] = R"(
  network:
    input: [28, 28, 1]
    layers:
      - {type: conv, filters: 8, size: 5, stride: 2}
      - {type: batchnorm}
      - {type: relu}
      - {type: maxpool, size: 2}
      - {type: dropout, probability: 0.2}
      - {type: fc, units: 10}
      - {type: softmax}
)";

class TrainRun : public testing::TrainRunFixture {
 protected:
  // `data_extra`: more lines of the data section (normalize, augmentation).
  std::string Job(const std::string& name, const std::string& network,
                  const std::string& options, bool validation = true,
                  const std::string& data_extra = "") {
    return WriteJob(name, testing::FashionMnistJobText(name, network, options,
                                                       validation, data_extra));
  }

  Result Train(const std::string& job, const std::string& out,
               const std::vector<std::string>& extra = {},
               std::map<std::string, std::string> env = {}) {
    return RunTrain(job, out, extra, std::move(env));
  }
};

TEST_F(TrainRun, LenetReaches85PercentInTwoEpochsWithEveryOutput) {
  const std::string job = Job("lenet", kLenet, R"(
    solver: sgdm
    initial_learn_rate: 0.01
    momentum: 0.9
    l2_regularization: 0.0005
    learn_rate_schedule: {type: inv, gamma: 0.0001, power: 0.75}
    mini_batch_size: 64
    max_epochs: 2
    shuffle: every-epoch
    validation_frequency: 400
    verbose_frequency: 100
    seed: 1
)");
  const std::string out = dir_ + "/out";
  Result r = Train(job, out, {"--progress", dir_ + "/progress.jsonl"});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  // The diary: MATLAB's table with its columns, and the summary line.
  EXPECT_NE(r.out.find("Mini-batch"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Validation"), std::string::npos);
  EXPECT_NE(r.out.find("Training finished: 1874 iterations"), std::string::npos)
      << r.out;

  nlohmann::json m = nlohmann::json::parse(ReadAll(out + "/metrics.json"));
  EXPECT_EQ(m["iterations"], 1874);
  EXPECT_GE(m["validation_accuracy"].get<double>(), 85.0) << m.dump(2);
  EXPECT_GT(m["images_per_s"].get<double>(), 0);
  // The first step's time is part of the training time; building the
  // network is not.
  EXPECT_GT(m["build_time_s"].get<double>(), 0);
  // Making the backend is part of the build.
  EXPECT_GT(m["backend_time_s"].get<double>(), 0);
  EXPECT_LE(m["backend_time_s"].get<double>(), m["build_time_s"].get<double>());
  EXPECT_GT(m["first_step_s"].get<double>(), 0);
  EXPECT_LT(m["first_step_s"].get<double>(), m["train_time_s"].get<double>());
  EXPECT_LT(m["build_time_s"].get<double>() + m["train_time_s"].get<double>(),
            m["wall_time_s"].get<double>());

  // History: one train row per iteration, validations at 400, 800, 1200,
  // 1600 and 1874.
  const std::string csv = ReadAll(out + "/training_history.csv");
  std::vector<std::string> lines = absl::StrSplit(csv, '\n', absl::SkipEmpty());
  int train_rows = 0, validation_rows = 0;
  for (const std::string& l : lines) {
    if (l.rfind("train,", 0) == 0) ++train_rows;
    if (l.rfind("validation,", 0) == 0) ++validation_rows;
  }
  EXPECT_EQ(train_rows, 1874);
  EXPECT_EQ(validation_rows, 5);
  EXPECT_NE(ReadAll(out + "/training_progress.svg").find("<svg"),
            std::string::npos);
  EXPECT_EQ(FinalParams(out).size(), 431080u);

  // Structured progress: each line the run's whole v1.TrainProgress in
  // protobuf's JSON form (every field written), from the start to done.
  const std::string progress = ReadAll(dir_ + "/progress.jsonl");
  std::vector<std::string> lines_read =
      absl::StrSplit(progress, '\n', absl::SkipEmpty());
  ASSERT_GE(lines_read.size(), 4u);
  std::vector<v1::TrainProgress> reports;
  for (const std::string& l : lines_read) {
    v1::TrainProgress p;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(l, &p).ok()) << l;
    nlohmann::json j = nlohmann::json::parse(l);
    for (const char* key :
         {"time_ms", "iteration", "iterations", "epoch", "epochs", "loss",
          "accuracy", "learn_rate", "images_per_s", "elapsed_s", "eta_s",
          "has_validation", "checkpoint_iteration", "done"}) {
      EXPECT_TRUE(j.contains(key)) << key << " missing in " << l;
    }
    if (!reports.empty()) {
      EXPECT_GE(p.iteration(), reports.back().iteration()) << l;
    }
    EXPECT_EQ(p.iterations(), 1874) << l;
    EXPECT_EQ(p.epochs(), 2) << l;
    EXPECT_GT(p.time_ms(), 0) << l;
    reports.push_back(p);
  }
  EXPECT_EQ(reports.front().iteration(), 0);
  EXPECT_EQ(reports.front().epoch(), 1);
  EXPECT_FALSE(reports.front().done());
  const v1::TrainProgress& done = reports.back();
  EXPECT_TRUE(done.done());
  EXPECT_EQ(done.iteration(), 1874);
  EXPECT_EQ(done.epoch(), 2);
  EXPECT_EQ(done.eta_s(), 0);
  EXPECT_TRUE(done.has_validation());
  EXPECT_DOUBLE_EQ(done.validation_accuracy(),
                   m["validation_accuracy"].get<double>());
  EXPECT_DOUBLE_EQ(done.images_per_s(), m["images_per_s"].get<double>());
  int steps_reported = 0;
  for (const v1::TrainProgress& p : reports) {
    if (p.loss() > 0 && p.learn_rate() > 0 && p.images_per_s() > 0 &&
        p.elapsed_s() > 0) {
      ++steps_reported;
    }
  }
  EXPECT_GE(steps_reported, 1);

  // The ONNX model passes the checker, where Debian's python3-onnx is.
  Result has_onnx = Exec({"/usr/bin/python3", "-c", "import onnx"});
  if (has_onnx.code == 0) {
    Result check = Exec(
        {"/usr/bin/python3", "-c",
         "import onnx,sys; onnx.checker.check_model(onnx.load(sys.argv[1]), "
         "full_check=True); print('ok')",
         out + "/model.onnx"});
    EXPECT_EQ(check.code, 0) << check.out << check.err;
  } else {
    std::printf("python3-onnx missing: the ONNX checker step is skipped\n");
  }
}

const char kSmallOptions[] = R"(
    solver: adam
    mini_batch_size: 32
    shuffle: every-epoch
    validation_frequency: 1000
    verbose_frequency: 1000
    checkpoint_frequency: 10
    checkpoint_frequency_unit: iteration
    seed: 7
)";

TEST_F(TrainRun, SameSeedSameWeightsAndAnotherSeedOthers) {
  const std::string job = Job("small", kSmall, kSmallOptions, false);
  ASSERT_EQ(Train(job, dir_ + "/a", {"--max-iterations", "30"}).code, 0);
  ASSERT_EQ(Train(job, dir_ + "/b", {"--max-iterations", "30"}).code, 0);
  // The second run takes the first one's kernel choices from the machine's
  // tuning cache, so it computes alike: bit for bit.
  const std::vector<float> a = FinalParams(dir_ + "/a");
  EXPECT_EQ(FinalParams(dir_ + "/b"), a);
  const std::string other =
      Job("small2", kSmall,
          absl::StrReplaceAll(kSmallOptions, {{"seed: 7", "seed: 8"}}), false);
  ASSERT_EQ(Train(other, dir_ + "/c", {"--max-iterations", "30"}).code, 0);
  EXPECT_GT(RelativeDifference(FinalParams(dir_ + "/c"), a), 0.1);
}

// Batches that travel as the data set's bytes and become images on the
// backend (Backend::PrepareImages; a GPU's default, which
// DLBATCH_BYTES_BATCHES=1 asks of the CPU too) train to the weights of the
// loader's floats, bit for bit, with augmentation and normalisation, and
// validate alike.
TEST_F(TrainRun, BatchesAsBytesTrainToTheWeightsOfFloats) {
  const std::string job =
      Job("small", kSmall,
          absl::StrReplaceAll(kSmallOptions, {{"validation_frequency: 1000",
                                               "validation_frequency: 25"}}),
          true,
          "    normalize: true\n"
          "    augmentation: {random_x_reflection: true, "
          "random_y_translation: 2, random_crop_padding: 3}\n");
  const std::vector<std::string> args = {"--max-iterations", "50", "--threads",
                                         "1"};
  Result floats =
      Train(job, dir_ + "/floats", args, {{"DLBATCH_BYTES_BATCHES", "0"}});
  ASSERT_EQ(floats.code, 0) << floats.err;
  Result bytes =
      Train(job, dir_ + "/bytes", args, {{"DLBATCH_BYTES_BATCHES", "1"}});
  ASSERT_EQ(bytes.code, 0) << bytes.err;
  const nlohmann::json f =
      nlohmann::json::parse(ReadAll(dir_ + "/floats/metrics.json"));
  const nlohmann::json b =
      nlohmann::json::parse(ReadAll(dir_ + "/bytes/metrics.json"));
  EXPECT_EQ(f["batches"], "floats");
  EXPECT_EQ(b["batches"], "bytes");
  EXPECT_EQ(FinalParams(dir_ + "/bytes"), FinalParams(dir_ + "/floats"));
  EXPECT_EQ(b["train_loss"], f["train_loss"]);
  EXPECT_EQ(b["validation_loss"], f["validation_loss"]);
  EXPECT_EQ(b["validation_accuracy"], f["validation_accuracy"]);
  // Another value is refused, saying what to set.
  Result bad =
      Train(job, dir_ + "/bad", args, {{"DLBATCH_BYTES_BATCHES", "yes"}});
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("DLBATCH_BYTES_BATCHES is \"yes\"; set it to 1"),
            std::string::npos)
      << bad.err;
  // So are the other switches of dlbatch-train's environment, on the CPU
  // too (the GPU backend reads DLBATCH_CONV_LOWERED, but a typo is refused
  // wherever it runs).
  for (const char* name : {"DLBATCH_CUDA_GRAPHS", "DLBATCH_CONV_LOWERED",
                           "DLBATCH_FOLD_RELU", "DLBATCH_SPLIT_BATCH"}) {
    Result refused = Train(job, dir_ + "/bad", args, {{name, "on"}});
    EXPECT_EQ(refused.code, 1) << name;
    EXPECT_NE(refused.err.find(absl::StrCat(name, " is \"on\"; set it to 1 (")),
              std::string::npos)
        << refused.err;
  }
  // Augmentation was on: the weights differ from a run without it.
  const std::string plain =
      Job("plain", kSmall, kSmallOptions, true, "    normalize: true\n");
  ASSERT_EQ(Train(plain, dir_ + "/plain", args).code, 0);
  EXPECT_NE(FinalParams(dir_ + "/plain"), FinalParams(dir_ + "/floats"));
}

// The history's train rows are 1, 2, ..., n: no gap, no repeat.
void ExpectRowsOneTo(const std::string& csv, int64_t n) {
  std::vector<std::string> lines = absl::StrSplit(csv, '\n', absl::SkipEmpty());
  int64_t expect = 1;
  for (const std::string& l : lines) {
    if (l.rfind("train,", 0) != 0) continue;
    std::vector<std::string> f = absl::StrSplit(l, ',');
    ASSERT_EQ(f[1], std::to_string(expect)) << l;
    ++expect;
  }
  EXPECT_EQ(expect, n + 1);
}

// A checkpoint every 3 iterations: enough progress lines after the 21st
// (over 10 kB) that a killed run fills the test's pipe of 4 kB and blocks
// long before its end.
std::string KillOptions() {
  return absl::StrReplaceAll(
      kSmallOptions, {{"checkpoint_frequency: 10", "checkpoint_frequency: 3"}});
}

// The first progress line that names the checkpoint of iteration 21 is the
// one written with it.
constexpr char kCheckpoint21[] = "\"checkpoint_iteration\":\"21\"";

TEST_F(TrainRun, KilledAndResumedRunEndsWithTheSameWeights) {
  const std::string job = Job("small", kSmall, KillOptions(), false);
  // One thread: a team of two stalls at every barrier on a loaded machine.
  ASSERT_EQ(Train(job, dir_ + "/whole",
                  {"--max-iterations", "400", "--threads", "1", "--progress",
                   dir_ + "/whole.jsonl"})
                .code,
            0);

  // Start the same run with its progress going into a pipe of one page,
  // and SIGKILL it once its checkpoint of iteration 21 is reported. The
  // test reads the pipe up to that line and no further, so the run can go
  // on for at most one pipe's worth of progress lines and then blocks in
  // its next write: it cannot finish before the kill, however the machine
  // schedules the two processes. Where between those points the kill
  // lands (in a step, or between a checkpoint's two files) varies; resume
  // must work from any of them.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const int capacity = fcntl(fds[0], F_SETPIPE_SZ, 4096);
  ASSERT_GT(capacity, 0) << "F_SETPIPE_SZ: " << std::strerror(errno);
  // The uninterrupted run wrote more after that line than the pipe holds.
  const std::string whole_progress = ReadAll(dir_ + "/whole.jsonl");
  const size_t line21 = whole_progress.find(kCheckpoint21);
  ASSERT_NE(line21, std::string::npos) << whole_progress;
  const size_t after21 =
      whole_progress.size() - whole_progress.find('\n', line21) - 1;
  ASSERT_GT(after21, static_cast<size_t>(capacity))
      << "too few progress lines after iteration 21 to block the run";

  const std::string out = dir_ + "/killed";
  const std::string bin = BinDir() + "/dlbatch-train";
  const std::string fd_arg = absl::StrCat("fd:", fds[1]);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    if (freopen("/dev/null", "w", stdout) == nullptr) _exit(126);
    setenv("XDG_CACHE_HOME", (dir_ + "/cache").c_str(), 1);
    execl(bin.c_str(), bin.c_str(), job.c_str(), "--output-dir", out.c_str(),
          "--max-iterations", "400", "--threads", "1", "--progress",
          fd_arg.c_str(), nullptr);
    _exit(127);
  }
  close(fds[1]);
  // One byte at a time, so that nothing after the line leaves the pipe.
  // The poll's limit only keeps a hung run from hanging the test.
  std::string line;
  bool checkpointed = false;
  while (!checkpointed) {
    pollfd p = {fds[0], POLLIN, 0};
    if (poll(&p, 1, 120000) <= 0) break;
    char c;
    if (read(fds[0], &c, 1) != 1) break;  // the run ended or failed
    if (c != '\n') {
      line.push_back(c);
      continue;
    }
    checkpointed = line.find(kCheckpoint21) != std::string::npos;
    line.clear();
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  close(fds[0]);
  ASSERT_TRUE(checkpointed) << "the run reported no checkpoint at 21";
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "the run ended before it was killed, status " << status;

  Result r = Train(job, out,
                   {"--max-iterations", "400", "--threads", "1", "--resume"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("Resuming from"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("rows missing"), std::string::npos) << r.out;
  EXPECT_EQ(FinalParams(out), FinalParams(dir_ + "/whole"));
  nlohmann::json m = nlohmann::json::parse(ReadAll(out + "/metrics.json"));
  EXPECT_EQ(m["resumed"], true);
  EXPECT_EQ(m["iterations"], 400);
  EXPECT_TRUE(m.contains("first_step_s")) << m.dump(2);  // of this process
  // The history continues without a gap or a repeat.
  ExpectRowsOneTo(ReadAll(out + "/training_history.csv"), 400);
}

// A run that stops between a checkpoint's two files (a write that fails
// here, as on a full disk; a kill leaves the same) loses no history rows:
// the history is written first, so the checkpoint is never ahead of it.
TEST_F(TrainRun, RunStoppedBetweenHistoryAndCheckpointResumesWithEveryRow) {
  const std::string job = Job("small", kSmall, kSmallOptions, false);
  const std::string out = dir_ + "/out";
  auto train_to = [&](const char* iterations) {
    return Train(
        job, out,
        {"--threads", "1", "--max-iterations", iterations, "--resume"});
  };
  ASSERT_EQ(train_to("10").code, 0);
  // A directory where the history's temporary file goes: the history of
  // the checkpoint at 20 cannot be written, and the run stops there.
  const std::string blocked_history = out + "/training_history.csv.tmp";
  ASSERT_TRUE(MakeDirs(blocked_history + "/in-the-way").ok());
  Result r = train_to("30");
  ASSERT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.err.find("training_history.csv"), std::string::npos) << r.err;
  absl::StatusOr<Checkpoint> c = ReadCheckpoint(out + "/checkpoint.dlbc");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->iteration, 10) << "a checkpoint ahead of its history";
  ASSERT_TRUE(RemoveTree(blocked_history).ok());
  r = train_to("30");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("iteration 10 of 30"), std::string::npos) << r.out;
  ExpectRowsOneTo(ReadAll(out + "/training_history.csv"), 30);

  // The other way round: the checkpoint of 40 cannot be written after its
  // history was. The history then reaches past the checkpoint of 30, and
  // resuming drops its rows 31 to 40 before it trains them again.
  const std::string blocked_checkpoint = out + "/checkpoint.dlbc.tmp";
  ASSERT_TRUE(MakeDirs(blocked_checkpoint + "/in-the-way").ok());
  r = train_to("50");
  ASSERT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.err.find("checkpoint.dlbc"), std::string::npos) << r.err;
  ExpectRowsOneTo(ReadAll(out + "/training_history.csv"), 40);
  ASSERT_TRUE(RemoveTree(blocked_checkpoint).ok());
  r = train_to("50");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("iteration 30 of 50"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("rows missing"), std::string::npos) << r.out;
  ExpectRowsOneTo(ReadAll(out + "/training_history.csv"), 50);
}

TEST_F(TrainRun, FourRanksTrainLenetToTheWeightsOfOne) {
  const std::string job = Job("lenet", kLenet, R"(
    solver: sgdm
    initial_learn_rate: 0.01
    momentum: 0.9
    l2_regularization: 0.0005
    mini_batch_size: 64
    shuffle: every-epoch
    verbose_frequency: 1000
    seed: 3
)",
                              false);
  Result one =
      Train(job, dir_ + "/one", {"--max-iterations", "4", "--ranks", "1"});
  ASSERT_EQ(one.code, 0) << one.err;
  Result four =
      Train(job, dir_ + "/four",
            {"--max-iterations", "4", "--ranks", "4", "--threads", "1"});
  ASSERT_EQ(four.code, 0) << four.out << four.err;
  nlohmann::json m =
      nlohmann::json::parse(ReadAll(dir_ + "/four/metrics.json"));
  EXPECT_EQ(m["ranks"], 4);
  const std::vector<float> p1 = FinalParams(dir_ + "/one");
  const std::vector<float> p4 = FinalParams(dir_ + "/four");
  ASSERT_EQ(p1.size(), p4.size());
  // The same global batches and the same initial weights: only the order
  // of float additions differs, about 1e-8 relative. Where two maxpool
  // inputs lie within rounding of each other, the other one may win and
  // route its gradient elsewhere; such a flip makes it up to ~1e-5 within a
  // few steps, and differences grow over long runs as in any float
  // training, so the comparison is made early.
  EXPECT_LT(RelativeDifference(p4, p1), 1e-4);
  // Each step's loss is the global batch's: the ranks' sums, allreduced
  // while backward runs (a rank's own sum would be about a quarter).
  absl::StatusOr<TrainingHistory> h1 =
      ParseHistoryCsv(ReadAll(dir_ + "/one/training_history.csv"));
  absl::StatusOr<TrainingHistory> h4 =
      ParseHistoryCsv(ReadAll(dir_ + "/four/training_history.csv"));
  ASSERT_TRUE(h1.ok()) << h1.status();
  ASSERT_TRUE(h4.ok()) << h4.status();
  ASSERT_EQ(h1->iterations.size(), 4u);
  ASSERT_EQ(h4->iterations.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(h4->iterations[i].loss, h1->iterations[i].loss,
                1e-4 * h1->iterations[i].loss)
        << "iteration " << i + 1;
  }
  // And training moved the weights far more than that.
  ASSERT_EQ(Train(job, dir_ + "/init", {"--max-iterations", "1"}).code, 0);
  EXPECT_GT(RelativeDifference(FinalParams(dir_ + "/init"), p1), 1e-3);
}

// One run of two threads splits LeNet's mini-batch over them, each thread
// a rank (trainer/thread_ranks.h): the same computation as two ranks that
// are processes meeting over Gloo, bit for bit (the same kernels, from the
// test's tuning cache, and a sum of two that does not depend on its
// order), and within rounding of one rank over both threads.
TEST_F(TrainRun, ABatchSplitOverThreadsTrainsAsRanksOfProcessesDo) {
  const std::string job = Job("lenet", kLenet, R"(
    seed: 11
    solver: sgdm
    initial_learn_rate: 0.01
    momentum: 0.9
    mini_batch_size: 64
    checkpoint_frequency: 10
    checkpoint_frequency_unit: iteration
    shuffle: every-epoch
)");
  const std::vector<std::string> args = {"--max-iterations", "30", "--threads",
                                         "2"};
  Result split = Train(job, dir_ + "/split", args);
  ASSERT_EQ(split.code, 0) << split.out << split.err;
  EXPECT_NE(split.out.find("Each mini-batch is split over 2 threads"),
            std::string::npos)
      << split.out;
  // One process of two threads, two replicas: not "1 thread: 2 ranks".
  EXPECT_NE(split.out.find(": 1 process, 2 threads, each mini-batch of 64 "
                           "split over 2 replicas;"),
            std::string::npos)
      << split.out;
  nlohmann::json m =
      nlohmann::json::parse(ReadAll(dir_ + "/split/metrics.json"));
  EXPECT_EQ(m["ranks"], 1);
  EXPECT_EQ(m["replicas"], 2);
  EXPECT_EQ(m["processes"], 1);
  EXPECT_EQ(m["threads_per_process"], 2);
  EXPECT_EQ(m["split_batch"], true);
  EXPECT_EQ(m["iterations"], 30);

  Result processes =
      Train(job, dir_ + "/processes",
            {"--max-iterations", "30", "--ranks", "2", "--threads", "1"});
  ASSERT_EQ(processes.code, 0) << processes.out << processes.err;
  m = nlohmann::json::parse(ReadAll(dir_ + "/processes/metrics.json"));
  EXPECT_EQ(m["split_batch"], false);
  const std::vector<float> p_split = FinalParams(dir_ + "/split");
  EXPECT_EQ(p_split, FinalParams(dir_ + "/processes"));
  EXPECT_EQ(ReadAll(dir_ + "/split/model.onnx"),
            ReadAll(dir_ + "/processes/model.onnx"));
  // The validation both computed, each rank half of it.
  EXPECT_EQ(nlohmann::json::parse(
                ReadAll(dir_ + "/split/metrics.json"))["validation_accuracy"],
            m["validation_accuracy"]);

  // DLBATCH_SPLIT_BATCH=0: one rank over both threads, which sums in
  // another order: compared early, as FourRanksTrainLenetToTheWeightsOfOne
  // does (a tie in max pooling that rounds the other way grows).
  const std::vector<std::string> four = {"--max-iterations", "4", "--threads",
                                         "2"};
  Result whole =
      Train(job, dir_ + "/whole", four, {{"DLBATCH_SPLIT_BATCH", "0"}});
  ASSERT_EQ(whole.code, 0) << whole.err;
  EXPECT_EQ(whole.out.find("split over"), std::string::npos) << whole.out;
  EXPECT_NE(whole.out.find(": 1 process, 2 threads, mini-batch 64;"),
            std::string::npos)
      << whole.out;
  m = nlohmann::json::parse(ReadAll(dir_ + "/whole/metrics.json"));
  EXPECT_EQ(m["ranks"], 1);
  EXPECT_EQ(m["processes"], 1);
  EXPECT_EQ(m["threads_per_process"], 2);
  EXPECT_EQ(m["split_batch"], false);
  ASSERT_EQ(Train(job, dir_ + "/split4", four).code, 0);
  const std::vector<float> p_whole = FinalParams(dir_ + "/whole");
  const std::vector<float> p_split4 = FinalParams(dir_ + "/split4");
  ASSERT_EQ(p_whole.size(), p_split4.size());
  EXPECT_NE(p_whole, p_split4);
  EXPECT_LT(RelativeDifference(p_whole, p_split4), 1e-4);
  EXPECT_GT(RelativeDifference(p_split4, p_split), 1e-3);

  // A split run stopped at its checkpoint of 20 resumes to the weights of
  // the uninterrupted one.
  const std::string out = dir_ + "/resumed";
  Result part = Train(job, out, {"--max-iterations", "20", "--threads", "2"});
  ASSERT_EQ(part.code, 0) << part.err;
  Result rest =
      Train(job, out, {"--max-iterations", "30", "--threads", "2", "--resume"});
  ASSERT_EQ(rest.code, 0) << rest.err;
  EXPECT_NE(rest.out.find("Resuming from"), std::string::npos) << rest.out;
  EXPECT_EQ(FinalParams(out), p_split);
  ExpectRowsOneTo(ReadAll(out + "/training_history.csv"), 30);
}

// conv -> batchnorm -> relu -> fc: no pooling (whose ties may flip) and no
// dropout (drawn per rank), so 1 and 2 ranks differ only where batchnorm's
// statistics do.
const char kConvBn[] = R"(
  network:
    input: [28, 28, 1]
    layers:
      - {type: conv, filters: 8, size: 5, stride: 2}
      - {type: batchnorm, sync: true}
      - {type: relu}
      - {type: fc, units: 10}
      - {type: softmax}
)";

TEST_F(TrainRun, TwoRanksWithSyncedBatchnormTrainToTheWeightsOfOne) {
  const char options[] = R"(
    solver: sgdm
    initial_learn_rate: 0.05
    momentum: 0.9
    mini_batch_size: 32
    shuffle: every-epoch
    verbose_frequency: 1000
    seed: 5
)";
  const std::vector<std::string> steps = {"--max-iterations", "6"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), steps.begin(), steps.end());
    return more;
  };
  const std::string synced = Job("synced", kConvBn, options, false);
  Result one = Train(synced, dir_ + "/one", with({"--ranks", "1"}),
                     {{"DLBATCH_SPLIT_BATCH", "0"}});
  ASSERT_EQ(one.code, 0) << one.err;
  Result two =
      Train(synced, dir_ + "/two", with({"--ranks", "2", "--threads", "1"}));
  ASSERT_EQ(two.code, 0) << two.out << two.err;
  const std::vector<float> p1 = FinalParams(dir_ + "/one");
  const std::vector<float> p2 = FinalParams(dir_ + "/two");
  ASSERT_EQ(p1.size(), p2.size());
  const double synced_diff = RelativeDifference(p2, p1);
  EXPECT_LT(synced_diff, 1e-4);
  // The running statistics moved by the global batch's, as on one rank.
  absl::StatusOr<Checkpoint> c1 = ReadCheckpoint(dir_ + "/one/checkpoint.dlbc");
  absl::StatusOr<Checkpoint> c2 = ReadCheckpoint(dir_ + "/two/checkpoint.dlbc");
  ASSERT_TRUE(c1.ok() && c2.ok());
  ASSERT_EQ(c1->state.size(), 16u);  // running mean and variance of 8
  ASSERT_EQ(c2->state.size(), c1->state.size());
  EXPECT_LT(RelativeDifference(c2->state, c1->state), 1e-4);

  // One rank's batch split over two threads: its batch norm's statistics
  // span them (oneDNN's passes with the totals' statistics, the relu
  // folded), synced or not in the spec.
  for (const std::string& job :
       {synced, Job("plain",
                    absl::StrReplaceAll(kConvBn, {{"{type: batchnorm, sync: "
                                                   "true}",
                                                   "{type: batchnorm}"}}),
                    options, false)}) {
    const std::string out = dir_ + "/split-" + std::to_string(job.size());
    Result split = Train(job, out, with({"--ranks", "1", "--threads", "2"}));
    ASSERT_EQ(split.code, 0) << split.out << split.err;
    EXPECT_NE(split.out.find("split over 2 threads"), std::string::npos)
        << split.out;
    EXPECT_LT(RelativeDifference(FinalParams(out), p1), 1e-4) << job;
    absl::StatusOr<Checkpoint> cs = ReadCheckpoint(out + "/checkpoint.dlbc");
    ASSERT_TRUE(cs.ok()) << cs.status();
    EXPECT_LT(RelativeDifference(cs->state, c1->state), 1e-4) << job;
  }

  // Per-rank statistics (as DDP): each rank normalises its 16 samples by
  // their own mean and variance, and training takes another path.
  const std::string per_rank = Job(
      "per_rank",
      absl::StrReplaceAll(
          kConvBn, {{"{type: batchnorm, sync: true}", "{type: batchnorm}"}}),
      options, false);
  Result ddp =
      Train(per_rank, dir_ + "/ddp", with({"--ranks", "2", "--threads", "1"}));
  ASSERT_EQ(ddp.code, 0) << ddp.out << ddp.err;
  const double ddp_diff = RelativeDifference(FinalParams(dir_ + "/ddp"), p1);
  std::printf("relative difference from 1 rank: synced %.3g, per-rank %.3g\n",
              synced_diff, ddp_diff);
  EXPECT_GT(ddp_diff, 1e-3);
  EXPECT_GT(ddp_diff, 100 * synced_diff);
  // `sync` changes how a step computes, not what a model holds: the same
  // arrays in the checkpoint, and the ONNX model of 2 synchronised ranks
  // the size of 1 rank's (which runs plain batchnorm).
  EXPECT_EQ(FinalParams(dir_ + "/ddp").size(), p1.size());
  EXPECT_EQ(ReadAll(dir_ + "/one/model.onnx").size(),
            ReadAll(dir_ + "/two/model.onnx").size());
  EXPECT_GT(ReadAll(dir_ + "/two/model.onnx").size(), 4 * p1.size());
}

TEST_F(TrainRun, NonFiniteLossStopsWithTheIteration) {
  const std::string job = Job("explode", kLenet, R"(
    solver: sgdm
    initial_learn_rate: 1000000
    mini_batch_size: 64
    verbose_frequency: 1000
)",
                              false);
  Result r = Train(job, dir_ + "/out", {"--max-iterations", "200"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("at iteration"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("initial_learn_rate"), std::string::npos) << r.err;
}

TEST_F(TrainRun, RanksOfAFailingRunAllStopAndSayWhy) {
  const std::string job = Job("explode4", kLenet, R"(
    solver: sgdm
    initial_learn_rate: 1000000
    mini_batch_size: 64
    verbose_frequency: 1000
)",
                              false);
  Result r =
      Train(job, dir_ + "/out",
            {"--max-iterations", "200", "--ranks", "2", "--threads", "1"});
  EXPECT_NE(r.code, 0);
  // Each rank names itself; the launcher does not hang on the others.
  EXPECT_NE(r.err.find("rank 0: the training loss became"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("at iteration"), std::string::npos) << r.err;
  // No rank is left behind.
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc", ec), end;
       !ec && it != end; it.increment(ec)) {
    const std::string cmdline = ReadAll(it->path().string() + "/cmdline");
    EXPECT_EQ(cmdline.find(dir_ + "/explode4.yaml"), std::string::npos)
        << "a rank is still running: " << it->path();
  }
}

TEST_F(TrainRun, BadSpecsAndDataSayWhatToChange) {
  // Network input that does not match the images.
  std::string net = absl::StrReplaceAll(
      kSmall, {{"input: [28, 28, 1]", "input: [32, 32, 3]"}});
  Result r =
      Train(Job("shape", net, "    max_epochs: 1\n", false), dir_ + "/o1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("[28, 28, 1]"), std::string::npos) << r.err;
  // Fewer classes than the labels have.
  net = absl::StrReplaceAll(kSmall, {{"units: 10", "units: 5"}});
  r = Train(Job("classes", net, "    max_epochs: 1\n", false), dir_ + "/o2");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("10 units"), std::string::npos) << r.err;
  // A batch larger than the data set.
  r = Train(Job("batch", kSmall, "    mini_batch_size: 100000\n", false),
            dir_ + "/o3");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("exceeds the 60000 training images"), std::string::npos)
      << r.err;
  // A missing data file is named.
  const std::string missing = dir_ + "/missing.yaml";
  WriteAll(missing,
           absl::StrCat("train:\n", kSmall,
                        "  data:\n    train: {format: idx, images: nothere.gz, "
                        "labels: nothere-labels.gz}\n"));
  r = Train(missing, dir_ + "/o4");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("nothere.gz"), std::string::npos) << r.err;
  // A layer that does not fit its input names the layer and both shapes.
  net = absl::StrReplaceAll(kSmall, {{"size: 5, stride: 2", "size: 40"}});
  r = Train(Job("window", net, "    max_epochs: 1\n", false), dir_ + "/o5");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("layers[0]"), std::string::npos) << r.err;
  // A job file without train:.
  const std::string command = dir_ + "/command.yaml";
  WriteAll(command, "command: [true]\n");
  r = Train(command, dir_ + "/o6");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("no train: section"), std::string::npos) << r.err;
}

// Where no GPU is visible (CUDA_VISIBLE_DEVICES empty), or in a CPU-only
// build (the one a machine without the CUDA toolkit gets): asking for a GPU
// fails before anything trains, saying which of the two and what to write
// instead; --list-devices says the same; auto trains on the CPU.
TEST_F(TrainRun, NoGpuSaysWhyAndAutoTrainsOnTheCpu) {
  const std::map<std::string, std::string> no_gpu = {
      {"CUDA_VISIBLE_DEVICES", ""}, {"XDG_CACHE_HOME", dir_ + "/cache"}};
  const std::string why = GpuBackendBuilt() ? "no CUDA device is visible"
                                            : "built without the GPU backend";
  Result r = Exec({BinDir() + "/dlbatch-train", "--list-devices"}, no_gpu);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("training runs on the CPU"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("without the GPU backend") != std::string::npos,
            !GpuBackendBuilt())
      << r.out;

  const std::string options = "    mini_batch_size: 64\n    max_epochs: 1\n";
  const std::string job = Job("where", kSmall, options, false);
  for (const char* gpu : {"gpu", "multi-gpu"}) {
    r = Exec({BinDir() + "/dlbatch-train", job, "--output-dir",
              dir_ + "/" + gpu, "--execution-environment", gpu},
             no_gpu);
    EXPECT_NE(r.code, 0) << gpu;
    EXPECT_NE(r.err.find(why), std::string::npos) << gpu << ": " << r.err;
    EXPECT_NE(r.err.find("use cpu or auto"), std::string::npos)
        << gpu << ": " << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir_ + "/" + gpu + "/checkpoint.dlbc"))
        << gpu;
  }

  // The dynamic linker lists every library it loads (LD_DEBUG=files): a
  // run on the CPU loads no cuBLAS, which the GPU backend loads when made.
  std::map<std::string, std::string> listing = no_gpu;
  listing["LD_DEBUG"] = "files";
  r = Exec({BinDir() + "/dlbatch-train", job, "--output-dir", dir_ + "/auto",
            "--execution-environment", "auto", "--max-iterations", "30"},
           listing);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("file=libgomp"), std::string::npos)
      << "no LD_DEBUG listing:\n"
      << r.err.substr(0, 2000);
  const size_t blas = r.err.find("libcublas");
  EXPECT_EQ(blas, std::string::npos) << r.err.substr(
      blas == std::string::npos || blas < 300 ? 0 : blas - 300, 600);
  EXPECT_NE((r.out + r.err).find("Training on cpu"), std::string::npos)
      << r.out << r.err;
  absl::StatusOr<Checkpoint> c = ReadCheckpoint(dir_ + "/auto/checkpoint.dlbc");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->params.empty());
}

TEST_F(TrainRun, ValidationPatienceStopsEarly) {
  // A learning rate too small to change any weight, and no batchnorm
  // whose running statistics would move: the validation loss stays where
  // it was, which is no improvement.
  const std::string net =
      absl::StrReplaceAll(kSmall, {{"      - {type: batchnorm}\n", ""}});
  ASSERT_EQ(net.find("batchnorm"), std::string::npos);
  const std::string job = Job("patient", net, R"(
    solver: sgdm
    initial_learn_rate: 1e-30
    mini_batch_size: 100
    validation_frequency: 5
    validation_patience: 2
    verbose_frequency: 1000
    max_epochs: 1
)");
  Result r = Train(job, dir_ + "/out");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("stopping early at iteration 15"), std::string::npos)
      << r.out;
  nlohmann::json m = nlohmann::json::parse(ReadAll(dir_ + "/out/metrics.json"));
  EXPECT_EQ(m["stopped_early"], true);
  EXPECT_EQ(m["iterations"], 15);
}

TEST_F(TrainRun, ResumeRefusesAnotherNetworksCheckpoint) {
  const std::string job = Job("small", kSmall, kSmallOptions, false);
  ASSERT_EQ(Train(job, dir_ + "/out", {"--max-iterations", "10"}).code, 0);
  const std::string other =
      Job("other", absl::StrReplaceAll(kSmall, {{"filters: 8", "filters: 4"}}),
          kSmallOptions, false);
  Result r =
      Train(other, dir_ + "/out", {"--max-iterations", "20", "--resume"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("another network"), std::string::npos) << r.err;
  // A damaged checkpoint is reported, not trained from.
  std::string bytes = ReadAll(dir_ + "/out/checkpoint.dlbc");
  bytes[bytes.size() / 2] ^= 1;
  WriteAll(dir_ + "/out/checkpoint.dlbc", bytes);
  r = Train(job, dir_ + "/out", {"--max-iterations", "20", "--resume"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("checksum"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dlbatch::trainer
