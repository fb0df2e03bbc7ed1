// Many `diary -f` followers and `wait` callers on the real scheduler: each
// gets every line and the end, and none holds a scheduler thread.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/endpoint.h"
#include "dlbatch/v1/scheduler.grpc.pb.h"
#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

int Threads(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

// One ReadDiary with follow, on the callback API (no thread of its own).
class Follower final : public grpc::ClientReadReactor<v1::DiaryChunk> {
 public:
  Follower(v1::Scheduler::Stub* stub, int64_t job) {
    request_.set_job_id(job);
    request_.set_follow(true);
    stub->async()->ReadDiary(&ctx_, &request_, this);
    StartRead(&chunk_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& line : chunk_.lines()) texts_.push_back(line.text());
      if (chunk_.end()) end_state_ = chunk_.state();
    }
    StartRead(&chunk_);
  }
  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
    done_ = true;
  }
  size_t lines() {
    absl::MutexLock lock(&mu_);
    return texts_.size();
  }
  // Waits for the stream's end; false if it did not come.
  bool WaitDone() {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&done_), absl::Seconds(30)))
        return true;
    }
    ctx_.TryCancel();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    return false;
  }
  std::vector<std::string> texts() {
    absl::MutexLock lock(&mu_);
    return texts_;
  }
  v1::JobState end_state() {
    absl::MutexLock lock(&mu_);
    return end_state_;
  }
  grpc::Status status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  grpc::ClientContext ctx_;
  v1::ReadDiaryRequest request_;
  v1::DiaryChunk chunk_;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> texts_ ABSL_GUARDED_BY(mu_);
  v1::JobState end_state_ ABSL_GUARDED_BY(mu_) = v1::JOB_STATE_UNSPECIFIED;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

TEST(Followers, TwoHundredFollowersGetEveryLineWithoutAThreadEach) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 2);
  ASSERT_TRUE(c.WaitWorkers(1));
  std::string gate = c.dir() + "/go";
  int64_t id = c.Submit(c.JobFile(
      "lines.yaml", "command: [sh, -c, 'while [ ! -f " + gate +
                        " ]; do sleep 0.05; done; for i in $(seq 1 20); do "
                        "echo line $i; sleep 0.05; done']\n"));
  // A busy job nobody follows, beside it.
  c.Submit(c.JobFile(
      "busy.yaml",
      "command: [sh, -c, 'for i in $(seq 1 400); do echo busy $i; done']\n"));
  ASSERT_TRUE(c.WaitState(id, "JOB_STATE_RUNNING"));

  ChannelConfig config;
  config.endpoint = ParseEndpoint(c.address()).value();
  std::vector<std::unique_ptr<v1::Scheduler::Stub>> stubs;
  for (int i = 0; i < 4; ++i) {
    grpc::ChannelArguments args;
    args.SetInt("dlbatch.test.channel", i);  // a connection each
    stubs.push_back(v1::Scheduler::NewStub(
        grpc::CreateCustomChannel(config.endpoint.GrpcTarget(),
                                  grpc::InsecureChannelCredentials(), args)));
  }
  std::vector<std::unique_ptr<Follower>> followers;
  for (int i = 0; i < 200; ++i)
    followers.push_back(std::make_unique<Follower>(stubs[i % 4].get(), id));
  // A `wait` on the job too, which must not hold a thread either.
  Result wait;
  std::thread waiter([&] { wait = c.Cli({"wait", std::to_string(id)}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  WriteAll(gate, "");
  ASSERT_TRUE(WaitFor(
      [&] {
        for (auto& f : followers) {
          if (f->lines() < 5) return false;
        }
        return true;
      },
      20000))
      << c.Logs();
  // The synchronous handlers held a thread per follower (200 and more).
  EXPECT_LT(Threads(c.scheduler_pid()), 60);

  std::vector<std::string> expected;
  for (int i = 1; i <= 20; ++i) expected.push_back("line " + std::to_string(i));
  for (auto& f : followers) {
    ASSERT_TRUE(f->WaitDone());
    EXPECT_TRUE(f->status().ok()) << f->status().error_message();
    EXPECT_EQ(f->texts(), expected);
    EXPECT_EQ(f->end_state(), v1::JOB_STATE_FINISHED);
  }
  waiter.join();
  EXPECT_EQ(wait.code, 0) << wait.out << wait.err;
  EXPECT_NE(wait.out.find("finished"), std::string::npos) << wait.out;
}

}  // namespace
}  // namespace dlbatch::testing
