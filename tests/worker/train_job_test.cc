// What a worker reads from a trainer's progress channel, and the command
// line it starts a train job's ranks with.
#include "worker/train_job.h"

#include <algorithm>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace dlbatch::worker {
namespace {

TEST(ApplyChannelLine, ReadsTheTrainersLinesIntoTheLatestProgress) {
  v1::TrainProgress p;
  // What the trainer writes (trainer/output/progress.h): the whole message,
  // names as in the proto, 64-bit numbers as strings.
  EXPECT_EQ(
      ApplyChannelLine(R"({"time_ms":"99","iteration":"0","iterations":"937",)"
                       R"("epoch":1,"epochs":1,"loss":0,"done":false})",
                       1, &p)
          .kind,
      ChannelEvent::kProgress);
  EXPECT_EQ(p.iterations(), 937);
  EXPECT_EQ(p.time_ms(), 1);  // the worker's time of the line
  EXPECT_EQ(ApplyChannelLine(
                R"({"iteration":50,"iterations":937,"epoch":1,"epochs":1,)"
                R"("loss":0.69,"accuracy":71.9,"learn_rate":0.01,)"
                R"("images_per_s":2700,"elapsed_s":2.5,"eta_s":40})",
                2, &p)
                .kind,
            ChannelEvent::kProgress);
  EXPECT_EQ(p.iteration(), 50);
  EXPECT_DOUBLE_EQ(p.loss(), 0.69);
  EXPECT_DOUBLE_EQ(p.accuracy(), 71.9);
  EXPECT_DOUBLE_EQ(p.eta_s(), 40);
  EXPECT_EQ(p.time_ms(), 2);
  EXPECT_FALSE(p.has_validation());
  // Each line is the whole progress: what it leaves out is zero.
  ApplyChannelLine(
      R"({"iteration":"100","iterations":"937","has_validation":true,)"
      R"("validation_loss":0.55,"validation_accuracy":80.3})",
      3, &p);
  EXPECT_TRUE(p.has_validation());
  EXPECT_DOUBLE_EQ(p.validation_accuracy(), 80.3);
  EXPECT_EQ(p.iteration(), 100);
  EXPECT_DOUBLE_EQ(p.loss(), 0);
  ApplyChannelLine(
      R"({"iteration":"937","iterations":"937","images_per_s":2800,)"
      R"("done":true})",
      4, &p);
  EXPECT_TRUE(p.done());
  EXPECT_EQ(p.iteration(), 937);
  EXPECT_DOUBLE_EQ(p.eta_s(), 0);
}

TEST(ApplyChannelLine, ANewCheckpointIterationAnnouncesACheckpoint) {
  v1::TrainProgress p;
  ChannelEvent e = ApplyChannelLine(
      R"({"iteration":"400","checkpoint_iteration":"400"})", 1, &p);
  EXPECT_EQ(e.kind, ChannelEvent::kCheckpoint);
  EXPECT_EQ(e.iteration, 400);
  // Later lines that still name it are progress, not a second checkpoint.
  e = ApplyChannelLine(R"({"iteration":"420","checkpoint_iteration":"400"})", 2,
                       &p);
  EXPECT_EQ(e.kind, ChannelEvent::kProgress);
  EXPECT_EQ(p.iteration(), 420);
  e = ApplyChannelLine(R"({"iteration":"800","checkpoint_iteration":"800"})", 3,
                       &p);
  EXPECT_EQ(e.kind, ChannelEvent::kCheckpoint);
  EXPECT_EQ(e.iteration, 800);
}

TEST(ApplyChannelLine, AnythingButATrainProgressIsIgnored) {
  v1::TrainProgress p;
  p.set_iteration(5);
  p.set_time_ms(7);
  for (const char* line :
       {"", "not json", "[1,2]", "3", R"({"event": 3})",
        R"({"event":"progress","iteration":9})", R"({"iteration":9)",
        R"({"iteration":"many"})", R"({"loss":"low"})",
        R"({"iteration":9,"done":[true]})"}) {
    EXPECT_EQ(ApplyChannelLine(line, 1, &p).kind, ChannelEvent::kIgnored)
        << line;
  }
  EXPECT_EQ(p.iteration(), 5);
  EXPECT_EQ(p.time_ms(), 7);
}

TEST(PrepareTrainCommand, RunsThePartsRanksWithTheRendezvousAndChannel) {
  const std::string dir = ::testing::TempDir() + "/train_job_test";
  std::filesystem::create_directories(dir);
  v1::StartJob start;
  start.set_job_id(12);
  start.set_attempt(2);
  start.set_pool(4);
  start.add_devices(0);
  start.add_devices(1);
  start.set_first_rank(2);
  start.set_parts(2);
  start.set_rendezvous_secret("s3cret");
  start.mutable_spec()->set_name("lenet");
  start.mutable_spec()->mutable_train();
  TrainLaunch launch;
  launch.trainer = "/opt/dlbatch/dlbatch-train";
  launch.job_dir = dir;
  launch.output_dir = dir + "/output";
  launch.rendezvous = "unix:/run/s.sock";
  launch.host = "10.0.0.2";
  launch.resume = true;
  SubprocessOptions sp;
  ASSERT_TRUE(PrepareTrainCommand(start, launch, &sp).ok());
  const std::string argv = [&] {
    std::string s;
    for (const auto& a : sp.argv) s += a + " ";
    return s;
  }();
  EXPECT_EQ(sp.argv[0], "/opt/dlbatch/dlbatch-train");
  for (const char* want :
       {"--spec-binary", "--progress fd:3", "--ranks 2", "--first-rank 2",
        "--world 4", "--host 10.0.0.2", "--resume"}) {
    EXPECT_NE(argv.find(want), std::string::npos)
        << want << " missing from " << argv;
  }
  EXPECT_TRUE(sp.channel);
  EXPECT_EQ(sp.cwd, dir);
  bool address = false, secret = false;
  for (const auto& [k, v] : sp.env) {
    address |= k == "DLBATCH_RENDEZVOUS" && v == "unix:/run/s.sock";
    secret |= k == "DLBATCH_RENDEZVOUS_SECRET" && v == "s3cret";
  }
  EXPECT_TRUE(address && secret);
  // The spec the ranks read is the job's.
  v1::JobSpec read;
  std::string bytes;
  {
    FILE* f = fopen((dir + "/" + kTrainSpecFile).c_str(), "rb");
    ASSERT_NE(f, nullptr);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) bytes.append(buf, n);
    fclose(f);
  }
  ASSERT_TRUE(read.ParseFromString(bytes));
  EXPECT_EQ(read.name(), "lenet");
}

// CPU slots: the part's ranks are threads of one trainer process, a slot
// each; GPUs: a process per GPU, as before.
TEST(PrepareTrainCommand, CpuSlotsAreThreadsOfOneProcessAndGpusProcesses) {
  const std::string dir = ::testing::TempDir() + "/train_job_test_threads";
  std::filesystem::create_directories(dir);
  v1::StartJob start;
  start.set_pool(2);
  start.add_devices(0);
  start.add_devices(1);
  start.mutable_spec()->mutable_train();
  TrainLaunch launch;
  launch.trainer = "dlbatch-train";
  launch.job_dir = dir;
  launch.output_dir = dir + "/output";
  launch.host = "127.0.0.1";
  for (const bool gpus : {false, true}) {
    launch.gpus = gpus;
    SubprocessOptions sp;
    ASSERT_TRUE(PrepareTrainCommand(start, launch, &sp).ok());
    std::string argv;
    for (const auto& a : sp.argv) argv += a + " ";
    EXPECT_NE(argv.find("--ranks 2 --first-rank 0 --world 2 --threads 1"),
              std::string::npos)
        << argv;
    EXPECT_EQ(argv.find("--thread-ranks") != std::string::npos, !gpus) << argv;
  }
}

// SIGTERM a checkpoint-and-stop only where the worker asks for it (a Slurm
// job's worker).
TEST(PrepareTrainCommand, StopOnTermOnlyWhereAsked) {
  const std::string dir = ::testing::TempDir() + "/train_job_test_term";
  std::filesystem::create_directories(dir);
  v1::StartJob start;
  start.set_pool(1);
  start.add_devices(0);
  start.mutable_spec()->mutable_train();
  TrainLaunch launch;
  launch.trainer = "dlbatch-train";
  launch.job_dir = dir;
  launch.output_dir = dir + "/output";
  for (const bool term : {false, true}) {
    launch.stop_on_term = term;
    SubprocessOptions sp;
    ASSERT_TRUE(PrepareTrainCommand(start, launch, &sp).ok());
    EXPECT_EQ(std::count(sp.argv.begin(), sp.argv.end(), "--stop-on-term"),
              term ? 1 : 0);
  }
}

}  // namespace
}  // namespace dlbatch::worker
