// Diary followers under load, through the real dlbatch-scheduler: N
// `diary -f` streams (ReadDiary with follow) on one job while a simulated
// worker writes lines into that job and into busy unrelated jobs. Each line
// carries the time it was sent; a follower's latency is its arrival minus
// that, so it includes the scheduler's commit. Prints a markdown table:
// followers, the scheduler's threads (most seen), lines delivered, median
// and p99 latency. The figures are not asserted.
//
//   follow_bench [--followers 1,100,1000] [--seconds 3] [--jobs 10]
//                [--interval-ms 10]
// DLBATCH_SCHEDULER_BIN names another dlbatch-scheduler to measure (the
// default is the one built beside the bench); the scheduler's state goes
// under TMPDIR (default /tmp).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bench/bench_args.h"
#include "common/endpoint.h"
#include "dlbatch/v1/scheduler.grpc.pb.h"

namespace {

namespace v1 = dlbatch::v1;
using Clock = std::chrono::steady_clock;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             Clock::now().time_since_epoch())
      .count();
}

std::string SelfDir() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path().string();
}

int Threads(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    int n = 0;
    if (line.rfind("Threads:", 0) == 0 &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(8)), &n)) {
      return n;
    }
  }
  return 0;
}

// A scheduler process in its own temp folder.
struct SchedulerProc {
  pid_t pid = 0;
  std::string address;

  explicit SchedulerProc(const std::string& dir) {
    std::filesystem::create_directories(dir);
    address = "unix:" + dir + "/s.sock";
    std::string ready = dir + "/ready";
    pid = fork();
    if (pid == 0) {
      int fd = open((dir + "/scheduler.log").c_str(),
                    O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      const char* env = std::getenv("DLBATCH_SCHEDULER_BIN");
      std::string bin =
          env != nullptr ? std::string(env) : SelfDir() + "/dlbatch-scheduler";
      execl(bin.c_str(), bin.c_str(), "--state-dir", (dir + "/state").c_str(),
            "--listen", address.c_str(), "--ready-file", ready.c_str(),
            "--heartbeat-timeout", "120s", static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 300 && !std::filesystem::exists(ready); ++i)
      usleep(50000);
  }
  ~SchedulerProc() {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  // A channel of its own (not shared with other channels' connection).
  std::shared_ptr<grpc::Channel> Channel(int n) const {
    grpc::ChannelArguments args;
    args.SetInt("dlbatch.bench.channel", n);
    return grpc::CreateCustomChannel(
        dlbatch::ParseEndpoint(address).value().GrpcTarget(),
        grpc::InsecureChannelCredentials(), args);
  }
};

// A worker over the real stream that holds every job it is given and
// writes diary lines into them.
class SimWorker {
 public:
  SimWorker(std::shared_ptr<grpc::Channel> channel, int slots)
      : stub_(v1::WorkerLink::NewStub(channel)) {
    stream_ = stub_->Connect(&ctx_);
    v1::WorkerMessage hello;
    auto* reg = hello.mutable_register_();
    reg->set_name("sim");
    reg->set_host("sim");
    reg->set_profile("local");
    for (int i = 0; i < slots; ++i) {
      auto* d = reg->add_devices();
      d->set_index(i);
      d->set_kind("cpu");
    }
    stream_->Write(hello);
    reader_ = std::thread([this] {
      v1::SchedulerMessage m;
      while (stream_->Read(&m)) {
        if (m.has_start()) {
          absl::MutexLock lock(&mu_);
          started_.push_back(m.start());
        }
      }
    });
  }
  ~SimWorker() {
    ctx_.TryCancel();
    reader_.join();
  }
  std::vector<v1::StartJob> WaitStarted(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return started_.size() >= n;
    };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(30));
    return started_;
  }
  void Line(const v1::StartJob& job, int64_t seq) {
    v1::WorkerMessage m;
    auto* d = m.mutable_diary();
    d->set_job_id(job.job_id());
    d->set_attempt(job.attempt());
    d->set_part(job.part());
    auto* line = d->add_lines();
    line->set_seq(seq);
    line->set_stream(1);
    line->set_time_ms(1);
    line->set_text(absl::StrCat("sent ", NowNs()));
    stream_->Write(m);
  }

 private:
  std::unique_ptr<v1::WorkerLink::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::WorkerMessage, v1::SchedulerMessage>>
      stream_;
  std::thread reader_;
  absl::Mutex mu_;
  std::vector<v1::StartJob> started_ ABSL_GUARDED_BY(mu_);
};

// One `diary -f`, on the callback API so that a thousand cost no threads.
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
    const int64_t now = NowNs();
    {
      absl::MutexLock lock(&mu_);
      for (const auto& line : chunk_.lines()) {
        int64_t sent = 0;
        if (absl::SimpleAtoi(absl::StripPrefix(line.text(), "sent "), &sent))
          latencies_ms_.push_back(static_cast<double>(now - sent) / 1e6);
      }
    }
    StartRead(&chunk_);
  }
  void OnDone(const grpc::Status&) override {
    absl::MutexLock lock(&mu_);
    done_ = true;
  }
  void Stop() {
    ctx_.TryCancel();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
  }
  std::vector<double> Take() {
    absl::MutexLock lock(&mu_);
    return std::move(latencies_ms_);
  }

 private:
  grpc::ClientContext ctx_;
  v1::ReadDiaryRequest request_;
  v1::DiaryChunk chunk_;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<double> latencies_ms_ ABSL_GUARDED_BY(mu_);
};

double Percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  std::nth_element(v.begin(), v.begin() + static_cast<long>(i), v.end());
  return v[i];
}

struct Options {
  std::vector<int> followers = {1, 100, 1000};
  int seconds = 3;
  int jobs = 10;  // the followed one and the busy unrelated ones
  int interval_ms = 10;
};

void RunOne(const std::string& root, const Options& o, int followers) {
  SchedulerProc sched(absl::StrCat(root, "/f", followers));
  auto channel = sched.Channel(0);
  SimWorker worker(channel, o.jobs);
  auto stub = v1::Scheduler::NewStub(channel);
  for (int j = 0; j < o.jobs; ++j) {
    v1::SubmitJobRequest req;
    req.set_request_id(absl::StrCat("follow-bench-", j));
    req.set_user("bench");
    req.mutable_spec()->set_name(absl::StrCat("busy-", j));
    req.mutable_spec()->set_pool(1);
    req.mutable_spec()->mutable_command()->add_argv("true");
    grpc::Status s;
    // Refused until the simulated worker's registration is processed.
    for (int tries = 0; tries < 100; ++tries) {
      grpc::ClientContext ctx;
      v1::SubmitJobReply reply;
      s = stub->SubmitJob(&ctx, req, &reply);
      if (s.ok()) break;
      usleep(50000);
    }
    if (!s.ok()) {
      std::cerr << "submit: " << s.error_message() << "\n";
      return;
    }
  }
  std::vector<v1::StartJob> jobs = worker.WaitStarted(o.jobs);
  if (static_cast<int>(jobs.size()) < o.jobs) {
    std::cerr << "only " << jobs.size() << " jobs started\n";
    return;
  }
  const int64_t followed = jobs[0].job_id();
  // Followers spread over a few connections, as many clients would be.
  std::vector<std::unique_ptr<v1::Scheduler::Stub>> stubs;
  for (int c = 0; c < 8; ++c)
    stubs.push_back(v1::Scheduler::NewStub(sched.Channel(c + 1)));
  std::vector<std::unique_ptr<Follower>> fs;
  for (int i = 0; i < followers; ++i) {
    fs.push_back(std::make_unique<Follower>(
        stubs[static_cast<size_t>(i) % stubs.size()].get(), followed));
  }
  usleep(1000000);  // every follower connected and caught up
  // Warm-up, not measured: the first lines meet a cold store and cold
  // streams (one stall of ~100 ms here, in the old scheduler too).
  int64_t seq = 0;
  for (int i = 0; i < 50; ++i) {
    ++seq;
    for (const auto& job : jobs) worker.Line(job, seq);
    std::this_thread::sleep_for(std::chrono::milliseconds(o.interval_ms));
  }
  usleep(500000);
  for (auto& f : fs) f->Take();
  int max_threads = Threads(sched.pid);
  const auto end = Clock::now() + std::chrono::seconds(o.seconds);
  int64_t sent = 0;
  while (Clock::now() < end) {
    ++seq;
    for (const auto& job : jobs) worker.Line(job, seq);
    ++sent;
    max_threads = std::max(max_threads, Threads(sched.pid));
    std::this_thread::sleep_for(std::chrono::milliseconds(o.interval_ms));
  }
  usleep(500000);
  max_threads = std::max(max_threads, Threads(sched.pid));
  std::vector<double> all;
  for (auto& f : fs) {
    f->Stop();
    auto v = f->Take();
    all.insert(all.end(), v.begin(), v.end());
  }
  const double expected =
      static_cast<double>(sent) * static_cast<double>(followers);
  const double p50 = Percentile(all, 0.5);
  const double p90 = Percentile(all, 0.9);
  const double p99 = Percentile(all, 0.99);
  std::cout << absl::StrFormat("| %d | %d | %d/%.0f | %.2f | %.2f | %.2f |\n",
                               followers, max_threads, all.size(), expected,
                               p50, p90, p99)
            << std::flush;
}

}  // namespace

constexpr char kUsage[] =
    "usage: follow_bench [--followers 1,100,1000] [--seconds 3] [--jobs 10] "
    "[--interval-ms 10]\n"
    "Times `dlbatch diary -f` followers of jobs writing lines, through a real\n"
    "scheduler and worker; prints a markdown table (bench/RESULTS.md).\n";

int main(int argc, char** argv) {
  Options o;
  if (int rc; dlbatch::bench::HelpOrBadPairs(argc, argv, kUsage, true, &rc)) {
    return rc;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    std::string value = argv[i + 1];
    if (flag == "--followers") {
      o.followers.clear();
      for (absl::string_view part : absl::StrSplit(value, ',')) {
        int n = 0;
        if (absl::SimpleAtoi(part, &n)) o.followers.push_back(n);
      }
    } else if (flag == "--seconds") {
      o.seconds = std::stoi(value);
    } else if (flag == "--jobs") {
      o.jobs = std::max(1, std::stoi(value));
    } else if (flag == "--interval-ms") {
      o.interval_ms = std::stoi(value);
    } else {
      std::cerr << kUsage;
      return 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  // TMPDIR=/dev/shm puts the scheduler's state on a tmpfs: no fsync.
  const char* tmpdir = std::getenv("TMPDIR");
  std::string tmpl =
      absl::StrCat(tmpdir != nullptr ? tmpdir : "/tmp", "/dlbf-XXXXXX");
  std::string root = mkdtemp(tmpl.data());
  std::cout << absl::StrFormat(
      "%d jobs each get a line every %d ms for %d s; the followers follow "
      "one of them.\n\n",
      o.jobs, o.interval_ms, o.seconds);
  std::cout << "| followers | scheduler threads (most) | lines received/sent "
               "| median ms | p90 ms | p99 ms |\n|---|---|---|---|---|---|\n";
  for (int n : o.followers) RunOne(root, o, n);
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
  return 0;
}
