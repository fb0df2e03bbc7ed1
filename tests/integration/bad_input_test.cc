// Bad input gets a clear error and loses nothing.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

class BadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    c_.StartScheduler();
    c_.StartWorker("w1", 4);
    ASSERT_TRUE(c_.WaitWorkers(1));
  }
  Result SubmitYaml(const std::string& yaml,
                    std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"submit", c_.JobFile("job.yaml", yaml)};
    args.insert(args.end(), extra.begin(), extra.end());
    return c_.Cli(args);
  }
  Cluster c_;
};

TEST_F(BadInput, MalformedYamlNamesLineAndColumn) {
  Result r = SubmitYaml("name: x\ncommand: [echo, hi\npool: 2\n");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("job.yaml:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(":3:"), std::string::npos) << r.err;
}

TEST_F(BadInput, UnknownFieldsAreNamed) {
  Result r = SubmitYaml("name: x\npoool: 2\ncommand: [true]\n");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("poool"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("job.yaml:2:1"), std::string::npos) << r.err;
}

TEST_F(BadInput, PoolMustBePositive) {
  Result zero = SubmitYaml("command: [true]\n", {"--pool", "0"});
  EXPECT_NE(zero.code, 0);
  EXPECT_NE(zero.err.find("pool"), std::string::npos) << zero.err;
  Result negative = SubmitYaml("pool: -2\ncommand: [true]\n");
  EXPECT_NE(negative.code, 0);
  EXPECT_NE(negative.err.find("pool"), std::string::npos) << negative.err;
}

TEST_F(BadInput, PoolBeyondTheProfileSaysItsSize) {
  Result r = SubmitYaml("command: [true]\n", {"--pool", "9"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("pool 9 exceeds profile 'local'"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("4 slots"), std::string::npos) << r.err;
  // Nothing was queued.
  EXPECT_EQ(c_.Cli({"jobs", "--json"}).out.find("\"id\""), std::string::npos);
}

// A job cannot pick its own GPUs (or other jobs') by setting what the
// worker sets for it.
TEST_F(BadInput, AJobCannotSetCudaVisibleDevices) {
  Result r =
      SubmitYaml("env: {CUDA_VISIBLE_DEVICES: \"0,1\"}\ncommand: [true]\n");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("env.CUDA_VISIBLE_DEVICES: the worker sets it"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(c_.Cli({"jobs", "--json"}).out.find("\"id\""), std::string::npos);
}

// The workers of `local` here offer CPU slots: a train job asking for GPUs
// could only fail where it started. (With a profile that has GPUs the
// message names it: scheduler_test.)
TEST_F(BadInput, GpuTrainJobOnAProfileOfCpuSlotsIsRefused) {
  // (/data is on no machine here: --data-on-workers lets the scheduler see
  // these jobs.)
  const std::vector<std::string> on_workers = {"--data-on-workers"};
  const std::string job = LenetJob("/data", "    execution_environment: gpu\n",
                                   "name: wants-gpu\n");
  Result r = SubmitYaml(job, on_workers);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(
      r.err.find("execution_environment: gpu asks for GPUs, but the workers of "
                 "profile 'local' offer CPU slots only; use cpu or auto"),
      std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("start a worker with GPUs"), std::string::npos) << r.err;
  EXPECT_EQ(c_.Cli({"jobs", "--json"}).out.find("\"id\""), std::string::npos);

  // cpu and auto are accepted and queued.
  Result cpu = SubmitYaml(
      LenetJob("/data",
               "    execution_environment: cpu\n    max_iterations: 1\n",
               "name: cpu\n"),
      on_workers);
  EXPECT_EQ(cpu.code, 0) << cpu.err;
  Result automatic = SubmitYaml(
      LenetJob("/data", "    max_iterations: 1\n", "name: auto\n"), on_workers);
  EXPECT_EQ(automatic.code, 0) << automatic.err;
}

TEST_F(BadInput, UnknownProfile) {
  Result r = SubmitYaml("command: [true]\n", {"--profile", "gpus"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("unknown profile 'gpus'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("local"), std::string::npos) << r.err;
}

TEST_F(BadInput, UnknownJobId) {
  for (const char* cmd : {"show", "diary", "fetch-outputs", "wait"}) {
    Result r = c_.Cli({cmd, "4242"});
    // wait's own code for it: told apart from a job that failed (1).
    EXPECT_EQ(r.code, std::string(cmd) == "wait" ? 4 : 1) << cmd;
    EXPECT_NE(r.err.find("no job 4242"), std::string::npos)
        << cmd << ": " << r.err;
  }
  Result cancel = c_.Cli({"cancel", "4242"});
  EXPECT_NE(cancel.code, 0);
  EXPECT_NE(cancel.err.find("no job 4242"), std::string::npos) << cancel.err;
}

TEST_F(BadInput, MissingAttachFile) {
  Result r = SubmitYaml("attach: [data/nothing.bin]\ncommand: [true]\n");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("data/nothing.bin"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("not found"), std::string::npos) << r.err;
}

TEST_F(BadInput, MissingJobFile) {
  Result r = c_.Cli({"submit", c_.dir() + "/nope.yaml"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("nope.yaml"), std::string::npos) << r.err;
}

// A train job that could only fail where it starts (perhaps after hours in
// the queue) is refused by submit, at the line of the field at fault, and
// nothing is queued: a data file it does not attach, one missing from this
// machine, a layer that does not fit what it takes.
TEST_F(BadInput, TrainJobsThatCannotRunAreRefusedAtTheirLine) {
  std::filesystem::create_directories(c_.dir() + "/data");
  WriteAll(c_.dir() + "/data/train-images-idx3-ubyte.gz", "not read\n");
  const std::string network =
      "  network:\n"
      "    input: [28, 28, 1]\n"
      "    layers:\n"
      "      - {type: fc, units: 100}\n"
      "      - {type: conv, filters: 8, size: SIZE}\n"
      "      - {type: fc, units: 10}\n"
      "      - softmax\n";
  auto job = [&](const std::string& images, const std::string& labels,
                 const std::string& size) {
    std::string yaml = "name: misfit\nattach: [data/]\ntrain:\n" + network +
                       "  data:\n"
                       "    train:\n"
                       "      format: idx\n"
                       "      images: " +
                       images + "\n      labels: " + labels + "\n";
    return yaml.replace(yaml.find("SIZE"), 4, size);
  };
  const std::string images = "data/train-images-idx3-ubyte.gz";

  Result unattached = SubmitYaml(job(images, "data/train-labels.gz", "1"));
  EXPECT_NE(unattached.code, 0);
  EXPECT_NE(unattached.err.find(
                "job.yaml:15:15: train.data.train.labels: "
                "'data/train-labels.gz' is not among the job's attached files "
                "(attach: [data/], 1 file): data/ is attached, but without "
                "'train-labels.gz'"),
            std::string::npos)
      << unattached.err;

  Result absent = SubmitYaml(job(images, "/nonexistent/labels.gz", "1"));
  EXPECT_NE(absent.code, 0);
  EXPECT_NE(absent.err.find("job.yaml:15:15: train.data.train.labels: "
                            "'/nonexistent/labels.gz' does not exist on this "
                            "machine"),
            std::string::npos)
      << absent.err;
  EXPECT_NE(absent.err.find("submit with --data-on-workers"), std::string::npos)
      << absent.err;

  // What the trainer said when such a job ran, now said at submit.
  Result misfit = SubmitYaml(job(images, images, "5"));
  EXPECT_NE(misfit.code, 0);
  EXPECT_NE(misfit.err.find("job.yaml:8:9: train.network.layers[1] (conv "
                            "'conv_2'): window [5, 5] is larger than its "
                            "input [1, 1, 100] padded to [1, 1]; use a "
                            "smaller size, padding or padding: same"),
            std::string::npos)
      << misfit.err;

  Result jobs = c_.Cli({"jobs", "--json"});
  EXPECT_EQ(nlohmann::json::parse(jobs.out)["jobs"].size(), 0u) << jobs.out;

  // Data on a filesystem only the workers mount is the user's to say.
  Result on_workers = SubmitYaml(job(images, "/nonexistent/labels.gz", "1"),
                                 {"--data-on-workers"});
  EXPECT_EQ(on_workers.code, 0) << on_workers.err;
  jobs = c_.Cli({"jobs", "--json"});
  EXPECT_EQ(nlohmann::json::parse(jobs.out)["jobs"].size(), 1u) << jobs.out;
}

TEST_F(BadInput, ProgramThatCannotRunFailsTheJobWithTheReason) {
  int64_t id =
      c_.Submit(c_.JobFile("bad.yaml", "command: [no-such-program-xyz]\n"));
  Result wait = c_.Cli({"wait", std::to_string(id)});
  EXPECT_EQ(wait.code, 1);
  auto job = c_.ShowJson(id);
  EXPECT_EQ(job["state"], "failed");
  EXPECT_NE(job["reason"].get<std::string>().find("no-such-program-xyz"),
            std::string::npos)
      << job.dump();
}

TEST(BadInputStandalone, UnreachableSchedulerNamesTheAddress) {
  // --retry-for: a scheduler that may be restarting is retried (30s
  // by default) before the CLI gives up.
  Result r =
      Exec({BinDir() + "/dlbatch", "--scheduler",
            "unix:/tmp/dlbatch-nowhere.sock", "--retry-for", "1s", "jobs"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find(
                "cannot reach the scheduler at unix:/tmp/dlbatch-nowhere.sock"),
            std::string::npos)
      << r.err;
  Result tcp = Exec({BinDir() + "/dlbatch", "--scheduler", "127.0.0.1:1",
                     "--retry-for", "1s", "jobs"},
                    {{"DLBATCH_TOKEN", "x"}});
  EXPECT_NE(tcp.code, 0);
  EXPECT_NE(tcp.err.find("127.0.0.1:1"), std::string::npos) << tcp.err;
}

TEST(BadInputStandalone, TcpNeedsTheRightToken) {
  Cluster c;
  c.StartScheduler({}, "127.0.0.1:0");
  std::string token = ReadAll(c.scheduler_state() + "/token");
  ASSERT_FALSE(token.empty());
  struct stat st;
  ASSERT_EQ(stat((c.scheduler_state() + "/token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  Result none =
      Exec({BinDir() + "/dlbatch", "--scheduler", c.address(), "jobs"});
  EXPECT_NE(none.code, 0);
  EXPECT_NE(none.err.find("token"), std::string::npos) << none.err;
  Result wrong =
      Exec({BinDir() + "/dlbatch", "--scheduler", c.address(), "jobs"},
           {{"DLBATCH_TOKEN", "not-the-token"}, {"DLBATCH_CA", c.ca_file()}});
  EXPECT_NE(wrong.code, 0);
  EXPECT_NE(wrong.err.find("token presented is not valid"), std::string::npos)
      << wrong.err;
  Result right =
      Exec({BinDir() + "/dlbatch", "--scheduler", c.address(), "--token-file",
            c.scheduler_state() + "/token", "profiles"});
  EXPECT_EQ(right.code, 0) << right.err;
  // A worker with the wrong token is refused and says so.
  Result worker =
      Exec({BinDir() + "/dlbatch-worker", "--scheduler", c.address(),
            "--work-dir", c.dir() + "/w", "--cpu-slots", "1"},
           {{"DLBATCH_TOKEN", "nope"}, {"DLBATCH_CA", c.ca_file()}}, 20000);
  EXPECT_NE(worker.code, 0);
  EXPECT_NE(worker.err.find("token presented is not valid"), std::string::npos)
      << worker.err;
}

TEST(BadInputStandalone, FullDiskFailsTheJobAndKeepsTheStoreConsistent) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
  Cluster c;
  std::string blobs = c.scheduler_state() + "/blobs";
  ASSERT_EQ(system(("mkdir -p " + blobs).c_str()), 0);
  if (mount("tmpfs", blobs.c_str(), "tmpfs", 0, "size=8m") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here: " << strerror(errno);
  }
  struct Unmount {
    std::string path;
    ~Unmount() { umount2(path.c_str(), MNT_DETACH); }
  } unmount{blobs};
  c.StartScheduler({"--min-free-mb", "1"});
  c.StartWorker("w1", 1);
  ASSERT_TRUE(c.WaitWorkers(1));
  int64_t big = c.Submit(c.JobFile("big.yaml",
                                   "command: [sh, -c, 'head -c 20000000 "
                                   "/dev/zero > $DLBATCH_OUTPUT_DIR/big.bin; "
                                   "echo wrote']\n"));
  Result wait = c.Cli({"wait", std::to_string(big)}, {}, 60000);
  EXPECT_EQ(wait.code, 1) << wait.out << wait.err;
  auto job = c.ShowJson(big);
  EXPECT_EQ(job["state"], "failed");
  EXPECT_NE(job["reason"].get<std::string>().find("full"), std::string::npos)
      << job.dump();
  Result diary = c.Cli({"diary", std::to_string(big)});
  EXPECT_NE(diary.out.find("wrote"), std::string::npos);
  // No partial blob is left, and the store still takes a job with outputs.
  Result tmp = Exec({"sh", "-c", "ls " + blobs + "/tmp | wc -l"});
  EXPECT_EQ(tmp.out, "0\n");
  int64_t small = c.Submit(c.JobFile(
      "small.yaml",
      "command: [sh, -c, 'echo fine > $DLBATCH_OUTPUT_DIR/ok.txt']\n"));
  EXPECT_EQ(c.Cli({"wait", std::to_string(small)}).code, 0);
  Result fetch =
      c.Cli({"fetch-outputs", std::to_string(small), "-o", c.dir() + "/got"});
  EXPECT_EQ(fetch.code, 0) << fetch.err;
  EXPECT_EQ(ReadAll(c.dir() + "/got/ok.txt"), "fine\n");
}

}  // namespace
}  // namespace dlbatch::testing
