// The scheduler under load, through its real gRPC face: submit throughput,
// start latency, and a scheduler holding 100,000 queued jobs for 1,000
// simulated workers. Prints a markdown table; the figures are not asserted.
//
//   scheduler_bench [--jobs N] [--queued N] [--workers N] [--chain N]
//                   [--only submit|tls|rpc|latency|scale|purge|metrics|backup]
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bench/bench_args.h"
#include "common/endpoint.h"
#include "common/tls_client.h"
#include "dlbatch/v1/scheduler.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string SelfDir() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path().string();
}

pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) {
  std::vector<std::string> store = argv;
  std::vector<char*> args;
  for (auto& a : store) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

// A scheduler process in its own temp folder, on a Unix socket or (tcp)
// on TLS over loopback TCP, where calls carry its token.
struct Scheduler {
  std::string dir;
  std::string address;
  pid_t pid = 0;
  dlbatch::ChannelConfig config;
  std::shared_ptr<grpc::Channel> channel;

  explicit Scheduler(const std::string& root, const std::string& name,
                     bool tcp = false, std::vector<std::string> extra = {}) {
    dir = root + "/" + name;
    std::filesystem::create_directories(dir);
    address = tcp ? "127.0.0.1:0" : "unix:" + dir + "/s.sock";
    std::string ready = dir + "/ready";
    std::vector<std::string> argv = {SelfDir() + "/dlbatch-scheduler",
                                     "--state-dir",
                                     dir + "/state",
                                     "--listen",
                                     address,
                                     "--ready-file",
                                     ready,
                                     "--heartbeat-timeout",
                                     "120s"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    pid = Spawn(argv, dir + "/scheduler.log");
    for (int i = 0; i < 300 && !std::filesystem::exists(ready); ++i)
      usleep(50000);
    if (tcp) {
      std::ifstream in(ready);
      in >> address;
    }
    config.endpoint = *dlbatch::ParseEndpoint(address);
    if (tcp) {
      const std::string token_file = dir + "/state/token";
      config.token = *dlbatch::ReadTokenFile(token_file);
      if (auto s = dlbatch::ResolveCa(&config, "", token_file); !s.ok()) {
        std::cerr << s << "\n";
        exit(1);
      }
    }
    channel = dlbatch::MakeChannel(config);
  }
  // Puts the token (TCP) on a call.
  void Prepare(grpc::ClientContext* ctx) const {
    dlbatch::AddToken(ctx, config.token);
  }
  ~Scheduler() {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  std::unique_ptr<dlbatch::v1::Scheduler::Stub> Stub() const {
    // A channel per client, as separate processes would have.
    return dlbatch::v1::Scheduler::NewStub(dlbatch::MakeChannel(config));
  }
  dlbatch::v1::Stats Stats(bool reset = false) const {
    auto stub = dlbatch::v1::Scheduler::NewStub(channel);
    grpc::ClientContext ctx;
    Prepare(&ctx);
    dlbatch::v1::GetStatsRequest req;
    req.set_reset_max(reset);
    dlbatch::v1::Stats stats;
    (void)stub->GetStats(&ctx, req, &stats);
    return stats;
  }
};

// A worker that registers over the real stream and holds whatever it is given.
class SimWorker {
 public:
  SimWorker(std::shared_ptr<grpc::Channel> channel, std::string name,
            std::string profile, int slots, const std::string& token = "")
      : stub_(dlbatch::v1::WorkerLink::NewStub(channel)) {
    dlbatch::AddToken(&ctx_, token);
    stream_ = stub_->Connect(&ctx_);
    dlbatch::v1::WorkerMessage hello;
    auto* reg = hello.mutable_register_();
    reg->set_name(name);
    reg->set_host("sim");
    reg->set_profile(profile);
    for (int i = 0; i < slots; ++i) {
      auto* d = reg->add_devices();
      d->set_index(i);
      d->set_kind("cpu");
    }
    stream_->Write(hello);
    dlbatch::v1::SchedulerMessage reply;
    stream_->Read(&reply);
    reader_ = std::thread([this] {
      dlbatch::v1::SchedulerMessage m;
      while (stream_->Read(&m)) {
        if (m.has_start()) {
          absl::MutexLock lock(&mu_);
          held_.push_back(m.start());
          ++starts_;
        }
      }
    });
  }
  ~SimWorker() {
    ctx_.TryCancel();
    reader_.join();
  }
  // Ends one held job; false if it holds none.
  bool EndOne() {
    dlbatch::v1::StartJob start;
    {
      absl::MutexLock lock(&mu_);
      if (held_.empty()) return false;
      start = held_.front();
      held_.erase(held_.begin());
    }
    dlbatch::v1::WorkerMessage m;
    auto* e = m.mutable_ended();
    e->set_job_id(start.job_id());
    e->set_attempt(start.attempt());
    e->set_part(start.part());
    e->set_state(dlbatch::v1::JOB_STATE_FINISHED);
    absl::MutexLock lock(&write_mu_);
    return stream_->Write(m);
  }
  void Beat() {
    dlbatch::v1::WorkerMessage m;
    m.mutable_heartbeat()->set_time_ms(1);
    absl::MutexLock lock(&write_mu_);
    stream_->Write(m);
  }
  size_t held() {
    absl::MutexLock lock(&mu_);
    return held_.size();
  }
  // Ends one held job and waits for the start of the next (the placement
  // pass its end runs); returns the seconds between, or -1 if none came
  // within 10 s.
  double EndOneAndWaitStart() {
    int64_t seen;
    {
      absl::MutexLock lock(&mu_);
      seen = starts_;
    }
    auto t0 = Clock::now();
    if (!EndOne()) return -1;
    absl::MutexLock lock(&mu_);
    auto next = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return starts_ > seen;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&next), absl::Seconds(10))) {
      return -1;
    }
    return Seconds(t0, Clock::now());
  }

 private:
  std::unique_ptr<dlbatch::v1::WorkerLink::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<dlbatch::v1::WorkerMessage,
                                           dlbatch::v1::SchedulerMessage>>
      stream_;
  std::thread reader_;
  absl::Mutex mu_;
  absl::Mutex write_mu_;  // one Write at a time on stream_
  std::vector<dlbatch::v1::StartJob> held_ ABSL_GUARDED_BY(mu_);
  int64_t starts_ ABSL_GUARDED_BY(mu_) = 0;
};

// Ends a job of `worker` and waits for the next start, again and again,
// until `stop` is set and at least `at_least` cycles ran (or a start does
// not come); each cycle's ms.
std::vector<double> EndStartCycles(SimWorker& worker,
                                   const std::atomic<bool>& stop,
                                   int at_least) {
  std::vector<double> ms;
  while (!stop || static_cast<int>(ms.size()) < at_least) {
    double sec = worker.EndOneAndWaitStart();
    if (sec < 0) break;
    ms.push_back(sec * 1e3);
  }
  return ms;
}

dlbatch::v1::SubmitJobRequest Request(const std::string& profile, int64_t n,
                                      std::vector<std::string> argv = {
                                          "true"}) {
  dlbatch::v1::SubmitJobRequest req;
  req.set_request_id(absl::StrCat("bench-", getpid(), "-", n));
  req.set_user("bench");
  auto* spec = req.mutable_spec();
  spec->set_name(absl::StrCat("job-", n));
  spec->set_profile(profile);
  spec->set_pool(1);
  for (auto& a : argv) spec->mutable_command()->add_argv(a);
  return req;
}

// Submits `total` jobs from `clients` concurrent clients; returns jobs/s.
// A loopback port free now (bound to port 0, then released).
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// The body of GET http://127.0.0.1:PORT/PATH ("" on failure).
std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  std::string all;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    std::string req = "GET " + path + " HTTP/1.0\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[65536];
      ssize_t n;
      while ((n = read(fd, buf, sizeof buf)) > 0) all.append(buf, n);
    }
  }
  close(fd);
  size_t body = all.find("\r\n\r\n");
  return body == std::string::npos ? "" : all.substr(body + 4);
}

// A sample's value in a scrape (0 if absent).
double ScrapeValue(const std::string& scrape, const std::string& series) {
  size_t at = scrape.find("\n" + series + " ");
  return at == std::string::npos
             ? 0
             : std::strtod(scrape.c_str() + at + series.size() + 2, nullptr);
}

double SubmitMany(const Scheduler& s, const std::string& profile, int64_t total,
                  int clients, int64_t first) {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> errors{0};
  auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&] {
      auto stub = s.Stub();
      for (;;) {
        int64_t n = next.fetch_add(1);
        if (n >= total) return;
        grpc::ClientContext ctx;
        s.Prepare(&ctx);
        dlbatch::v1::SubmitJobReply reply;
        if (!stub->SubmitJob(&ctx, Request(profile, first + n), &reply).ok())
          ++errors;
      }
    });
  }
  for (auto& t : threads) t.join();
  double secs = Seconds(t0, Clock::now());
  if (errors > 0) std::cerr << "submit errors: " << errors << "\n";
  return static_cast<double>(total) / secs;
}

// CPU seconds (user + system) used so far by process `pid` (0: this one).
double CpuSeconds(pid_t pid) {
  std::ifstream in(pid == 0 ? std::string("/proc/self/stat")
                            : absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(in, line);
  // Fields after the command's closing parenthesis; utime and stime are
  // the 12th and 13th of them.
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 1; i <= 13 && rest >> field; ++i) {
    if (i >= 12) ticks += std::stod(field);
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

struct Row {
  std::string what, value, goal, verdict;
};

}  // namespace

constexpr char kUsage[] =
    "usage: scheduler_bench [--jobs N] [--queued N] [--workers N] [--chain N]"
    " [--purge N]\n"
    "                       [--only "
    "submit|tls|rpc|latency|scale|purge|metrics|backup]\n"
    "Starts a real scheduler (and workers) and times it through its gRPC "
    "face;\n"
    "prints markdown tables (bench/RESULTS.md).\n";

int main(int argc, char** argv) {
  int64_t jobs = 10000, queued = 100000, chain = 200, purge = 100000;
  int workers = 1000;
  std::string only;
  if (int rc; dlbatch::bench::HelpOrBadPairs(argc, argv, kUsage, true, &rc)) {
    return rc;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--only") {
      only = argv[i + 1];
      continue;
    }
    int64_t v = std::stoll(argv[i + 1]);
    if (flag == "--jobs")
      jobs = v;
    else if (flag == "--queued")
      queued = v;
    else if (flag == "--workers")
      workers = static_cast<int>(v);
    else if (flag == "--chain")
      chain = v;
    else if (flag == "--purge")
      purge = v;
    else {
      std::cerr << kUsage;
      return 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  char tmpl[] = "/tmp/dlbb-XXXXXX";
  std::string root = mkdtemp(tmpl);
  std::vector<Row> rows;
  auto verdict = [](bool met) { return std::string(met ? "met" : "MISSED"); };

  auto run = [&](const char* part) { return only.empty() || only == part; };
  // 1. Submit throughput: jobs queue behind one held slot.
  if (run("submit")) {
    Scheduler s(root, "submit");
    SimWorker holder(s.channel, "holder", "local", 1);
    double one = SubmitMany(s, "local", jobs, 1, 0);
    double sixteen = SubmitMany(s, "local", jobs, 16, jobs);
    rows.push_back({absl::StrFormat("submit, 1 client, %d jobs", jobs),
                    absl::StrFormat("%.0f jobs/s", one), ">= 5000 jobs/s",
                    verdict(one >= 5000)});
    rows.push_back({absl::StrFormat("submit, 16 clients, %d jobs", jobs),
                    absl::StrFormat("%.0f jobs/s", sixteen), ">= 5000 jobs/s",
                    verdict(sixteen >= 5000)});
  }

  // 1b. Submit over TLS TCP with a token against the plaintext Unix socket,
  // in the same run: two schedulers, one queue-holding worker each, measured
  // in alternating rounds so that a load that comes and goes on the machine
  // falls on both alike.
  if (run("tls")) {
    Scheduler plain(root, "tls-unix", /*tcp=*/false);
    Scheduler tls(root, "tls-tcp", /*tcp=*/true);
    SimWorker plain_holder(plain.channel, "holder", "local", 1);
    SimWorker tls_holder(tls.channel, "holder", "local", 1, tls.config.token);
    // Warm: each client's connection (and handshake) is made once.
    SubmitMany(plain, "local", 200, 1, 0);
    SubmitMany(tls, "local", 200, 1, 0);
    const int rounds = 5;
    const int64_t per_round = std::max<int64_t>(1, jobs / rounds);
    int64_t first = 1000;
    for (int clients : {1, 16}) {
      double plain_s = 0, tls_s = 0;
      // CPU of the scheduler, and of the clients, in all.
      double plain_cpu[2] = {0, 0}, tls_cpu[2] = {0, 0};
      for (int r = 0; r < rounds; ++r) {
        for (Scheduler* s : {&plain, &tls}) {
          const double sched0 = CpuSeconds(s->pid), self0 = CpuSeconds(0);
          const double secs =
              per_round / SubmitMany(*s, "local", per_round, clients, first);
          double* cpu = s == &plain ? plain_cpu : tls_cpu;
          cpu[0] += CpuSeconds(s->pid) - sched0;
          cpu[1] += CpuSeconds(0) - self0;
          (s == &plain ? plain_s : tls_s) += secs;
        }
        first += per_round;
      }
      const double total = static_cast<double>(per_round * rounds);
      const double ratio = plain_s / tls_s;
      const std::string who =
          absl::StrFormat("%d client%s, %d jobs", clients,
                          clients > 1 ? "s" : "", per_round * rounds);
      auto cpu_text = [&](const double* cpu) {
        return absl::StrFormat("; CPU a job: scheduler %.0f us, client %.0f us",
                               cpu[0] / total * 1e6, cpu[1] / total * 1e6);
      };
      rows.push_back(
          {absl::StrCat("submit, ", who, ", Unix socket (plaintext)"),
           absl::StrFormat("%.0f jobs/s", total / plain_s) +
               cpu_text(plain_cpu),
           "-", "-"});
      rows.push_back({absl::StrCat("submit, ", who, ", TLS TCP with a token"),
                      absl::StrFormat("%.0f jobs/s (%.2fx the socket)",
                                      total / tls_s, ratio) +
                          cpu_text(tls_cpu),
                      ">= 0.7x the socket", verdict(ratio >= 0.7)});
    }
  }

  // 0. The floor: a call that does nothing, from one client.
  if (run("rpc")) {
    Scheduler s(root, "rpc");
    auto stub = s.Stub();
    const int n = 10000;
    auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) {
      grpc::ClientContext ctx;
      dlbatch::v1::StatBlobsReply reply;
      stub->StatBlobs(&ctx, dlbatch::v1::StatBlobsRequest(), &reply);
    }
    double rate = n / Seconds(t0, Clock::now());
    rows.push_back({"empty call (StatBlobs), 1 client",
                    absl::StrFormat("%.0f calls/s", rate), "-", "-"});
  }

  // 2. Start latency: a chain of jobs on one real worker's single slot.
  if (run("latency")) {
    Scheduler s(root, "latency");
    std::string stamps = s.dir + "/stamps";
    pid_t worker = Spawn(
        {SelfDir() + "/dlbatch-worker", "--scheduler", s.address, "--work-dir",
         s.dir + "/work", "--cpu-slots", "1", "--name", "w"},
        s.dir + "/worker.log");
    for (int i = 0; i < 200; ++i) {
      auto stub = s.Stub();
      grpc::ClientContext ctx;
      dlbatch::v1::ListWorkersReply reply;
      stub->ListWorkers(&ctx, dlbatch::v1::ListWorkersRequest(), &reply);
      if (reply.workers_size() > 0 && reply.workers(0).online()) break;
      usleep(50000);
    }
    auto stub = s.Stub();
    std::vector<int64_t> ids;
    for (int64_t n = 0; n < chain; ++n) {
      grpc::ClientContext ctx;
      dlbatch::v1::SubmitJobReply reply;
      stub->SubmitJob(&ctx,
                      Request("local", n, {SelfDir() + "/bench_stamp", stamps}),
                      &reply);
      ids.push_back(reply.job_id());
    }
    grpc::ClientContext ctx;
    dlbatch::v1::WaitJobsRequest wait;
    for (int64_t id : ids) wait.add_job_ids(id);
    dlbatch::v1::WaitJobsReply waited;
    stub->WaitJobs(&ctx, wait, &waited);
    std::ifstream in(stamps);
    std::vector<std::pair<int64_t, int64_t>> seen;  // job id, ns
    int64_t ns, id;
    while (in >> ns >> id) seen.emplace_back(id, ns);
    std::sort(seen.begin(), seen.end());
    std::vector<double> gaps;
    for (size_t i = 6; i < seen.size(); ++i) {
      gaps.push_back(static_cast<double>(seen[i].second - seen[i - 1].second) /
                     1e6);
    }
    double med = Percentile(gaps, 0.5), p99 = Percentile(gaps, 0.99);
    rows.push_back(
        {absl::StrFormat("start latency, median (%d jobs)", gaps.size()),
         absl::StrFormat("%.1f ms", med), "<= 20 ms", verdict(med <= 20)});
    rows.push_back({"start latency, p99", absl::StrFormat("%.1f ms", p99),
                    "<= 100 ms", verdict(p99 <= 100)});
    kill(worker, SIGTERM);
    waitpid(worker, nullptr, 0);
  }

  // 3. Scale: many simulated workers, every slot busy, `queued` jobs waiting.
  if (run("scale")) {
    Scheduler s(root, "scale");
    const int slots = 8;
    std::vector<std::unique_ptr<SimWorker>> sims;
    auto t0 = Clock::now();
    for (int w = 0; w < workers; ++w) {
      sims.push_back(std::make_unique<SimWorker>(
          s.channel, absl::StrCat("sim-", w), "local", slots));
    }
    double join_s = Seconds(t0, Clock::now());
    int64_t total = queued + static_cast<int64_t>(workers) * slots;
    double rate = SubmitMany(s, "local", total, 16, 0);
    std::atomic<bool> stop{false};
    std::thread beats([&] {
      while (!stop) {
        for (auto& w : sims) w->Beat();
        for (int i = 0; i < 50 && !stop; ++i) usleep(100000);
      }
    });
    dlbatch::v1::Stats before = s.Stats(/*reset=*/true);
    // Churn: jobs end one at a time; each end runs a pass that starts one.
    int ended = 0;
    for (int i = 0; i < 200; ++i)
      ended += sims[static_cast<size_t>(i) % sims.size()]->EndOne();
    usleep(500000);
    dlbatch::v1::Stats after = s.Stats();
    auto l0 = Clock::now();
    {
      auto stub = s.Stub();
      grpc::ClientContext ctx;
      dlbatch::v1::ListJobsReply all;
      stub->ListJobs(&ctx, dlbatch::v1::ListJobsRequest(), &all);
    }
    double list_s = Seconds(l0, Clock::now());
    auto c0 = Clock::now();
    std::string cmd = absl::StrCat(SelfDir(), "/dlbatch --scheduler ",
                                   s.address, " jobs > /dev/null");
    int rc = system(cmd.c_str());
    double jobs_s = Seconds(c0, Clock::now());
    auto q0 = Clock::now();
    cmd = absl::StrCat(SelfDir(), "/dlbatch --scheduler ", s.address,
                       " jobs --state running > /dev/null");
    rc |= system(cmd.c_str());
    double running_s = Seconds(q0, Clock::now());
    stop = true;
    beats.join();
    rows.push_back({absl::StrFormat("%d simulated workers join", workers),
                    absl::StrFormat("%.2f s", join_s), "-", "-"});
    rows.push_back({absl::StrFormat("submit %d jobs, 16 clients", total),
                    absl::StrFormat("%.0f jobs/s", rate), "-", "-"});
    rows.push_back({absl::StrFormat("queued / running jobs"),
                    absl::StrFormat("%d / %d", after.queued(), after.running()),
                    "-", "-"});
    rows.push_back(
        {absl::StrFormat("placement pass, max over %d churn passes",
                         after.placement_passes() - before.placement_passes()),
         absl::StrFormat("%.2f ms", after.max_pass_ms()), "<= 10 ms",
         verdict(after.max_pass_ms() <= 10)});
    rows.push_back({"ListJobs call alone (all jobs)",
                    absl::StrFormat("%.2f s", list_s), "-", "-"});
    rows.push_back({"`dlbatch jobs` (all jobs, table)",
                    absl::StrFormat("%.2f s", jobs_s), "<= 1 s",
                    verdict(jobs_s <= 1 && rc == 0)});
    rows.push_back({"`dlbatch jobs --state running`",
                    absl::StrFormat("%.2f s", running_s), "-", "-"});
    double rss_mb = static_cast<double>(after.rss_bytes()) / (1 << 20);
    rows.push_back({"scheduler RSS", absl::StrFormat("%.0f MB", rss_mb),
                    "<= 500 MB", verdict(rss_mb <= 500)});
    (void)ended;
  }

  // 4. Purge: `purge` ended jobs deleted at once while jobs keep ending and
  // starting on a simulated worker; each cycle is one job's end report to
  // the start of the next (a placement pass and its commit, behind the
  // purge's chunks).
  if (run("purge")) {
    Scheduler s(root, "purge");
    auto stub = s.Stub();
    {
      // The ended jobs: queued behind a held slot, then cancelled.
      SimWorker holder(s.channel, "holder", "local", 1);
      SubmitMany(s, "local", purge, 16, 0);
      std::vector<int64_t> ids;
      {
        grpc::ClientContext ctx;
        dlbatch::v1::ListJobsReply all;
        stub->ListJobs(&ctx, dlbatch::v1::ListJobsRequest(), &all);
        for (const auto& j : all.jobs()) {
          if (j.state() == dlbatch::v1::JOB_STATE_QUEUED) ids.push_back(j.id());
        }
      }
      for (size_t i = 0; i < ids.size(); i += 5000) {
        dlbatch::v1::CancelJobsRequest cancel;
        for (size_t k = i; k < std::min(ids.size(), i + 5000); ++k)
          cancel.add_job_ids(ids[k]);
        grpc::ClientContext ctx;
        dlbatch::v1::CancelJobsReply reply;
        stub->CancelJobs(&ctx, cancel, &reply);
      }
    }
    SimWorker churn(s.channel, "churn", "local", 4);
    SubmitMany(s, "local", 20000, 4, purge + 1);
    for (int i = 0; i < 200 && churn.held() < 4; ++i) usleep(10000);
    auto cycles = [&](const std::atomic<bool>& stop, int at_least) {
      return EndStartCycles(churn, stop, at_least);
    };
    std::atomic<bool> stop{true};
    std::vector<double> alone = cycles(stop, 300);
    dlbatch::v1::Stats before = s.Stats(/*reset=*/true);
    stop = false;
    std::vector<double> during;
    std::thread churner([&] { during = cycles(stop, 0); });
    auto p0 = Clock::now();
    dlbatch::v1::PurgeJobsReply purged;
    {
      dlbatch::v1::PurgeJobsRequest req;
      req.set_before_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count());
      grpc::ClientContext ctx;
      stub->PurgeJobs(&ctx, req, &purged);
    }
    double purge_s = Seconds(p0, Clock::now());
    stop = true;
    churner.join();
    dlbatch::v1::Stats after = s.Stats();
    rows.push_back(
        {absl::StrFormat("purge %d ended jobs (one call)", purged.purged()),
         absl::StrFormat("%.2f s (%.0f jobs/s)", purge_s,
                         purged.purged() / purge_s),
         "-", "-"});
    rows.push_back(
        {absl::StrFormat("job end to next start, no purge, median / "
                         "p99 / max (%d cycles) — baseline",
                         alone.size()),
         absl::StrFormat("%.2f / %.2f / %.2f ms", Percentile(alone, 0.5),
                         Percentile(alone, 0.99), Percentile(alone, 1.0)),
         "-", "-"});
    const double worst = Percentile(during, 1.0);
    rows.push_back(
        {absl::StrFormat("job end to next start during the purge, "
                         "median / p99 / max (%d cycles)",
                         during.size()),
         absl::StrFormat("%.2f / %.2f / %.2f ms", Percentile(during, 0.5),
                         Percentile(during, 0.99), worst),
         "-", "-"});
    rows.push_back(
        {absl::StrFormat("placement pass during the purge, max over %d",
                         after.placement_passes() - before.placement_passes()),
         absl::StrFormat("%.2f ms", after.max_pass_ms()), "<= 10 ms",
         verdict(after.max_pass_ms() <= 10)});
  }

  // 5. Metrics (--metrics-listen): one scrape with `queued` jobs in the
  // store, against a /healthz round trip on the same listener; placement
  // passes (their mean from the scheduler's own histogram, their max from
  // GetStats) while jobs end one by one, without and then with a client
  // scraping back to back.
  if (run("metrics")) {
    const int port = FreePort();
    Scheduler s(root, "metrics", false,
                {"--metrics-listen", absl::StrCat("127.0.0.1:", port)});
    SimWorker churn(s.channel, "churn", "local", 4);
    SubmitMany(s, "local", queued, 16, 0);
    auto timed = [&](const std::string& path, int n) {
      std::vector<double> ms;
      for (int i = 0; i < n; ++i) {
        auto t0 = Clock::now();
        std::string body = HttpGet(port, path);
        ms.push_back(Seconds(t0, Clock::now()) * 1000);
        if (body.empty()) std::cerr << "empty answer to " << path << "\n";
      }
      return ms;
    };
    std::vector<double> health = timed("/healthz", 50);
    std::vector<double> scrape = timed("/metrics", 50);
    std::string last = HttpGet(port, "/metrics");
    const double jobs_seen =
        ScrapeValue(last, "dlbatch_jobs{profile=\"local\",state=\"queued\"}") +
        ScrapeValue(last, "dlbatch_jobs{profile=\"local\",state=\"running\"}");
    // Mean and max pass over `ends` job ends, each waiting for the start
    // its pass makes; `cycle_ms`: the median of those end-to-start cycles.
    auto passes = [&](int ends, double* mean_ms, double* max_ms,
                      double* cycle_ms) {
      std::string a = HttpGet(port, "/metrics");
      s.Stats(/*reset=*/true);
      std::vector<double> cycles;
      for (int i = 0; i < ends; ++i) {
        cycles.push_back(churn.EndOneAndWaitStart() * 1000);
      }
      *cycle_ms = Percentile(cycles, 0.5);
      usleep(300000);
      std::string b = HttpGet(port, "/metrics");
      const double n = ScrapeValue(b, "dlbatch_placement_pass_seconds_count") -
                       ScrapeValue(a, "dlbatch_placement_pass_seconds_count");
      const double sum = ScrapeValue(b, "dlbatch_placement_pass_seconds_sum") -
                         ScrapeValue(a, "dlbatch_placement_pass_seconds_sum");
      *mean_ms = n > 0 ? sum / n * 1000 : 0;
      *max_ms = s.Stats().max_pass_ms();
      return static_cast<int>(n);
    };
    double quiet_mean, quiet_max, busy_mean, busy_max, quiet_cycle, busy_cycle;
    const int quiet_n = passes(400, &quiet_mean, &quiet_max, &quiet_cycle);
    std::atomic<bool> stop{false};
    std::atomic<int> scrapes{0};
    std::thread scraper([&] {
      while (!stop) {
        HttpGet(port, "/metrics");
        ++scrapes;
      }
    });
    const int busy_n = passes(400, &busy_mean, &busy_max, &busy_cycle);
    stop = true;
    scraper.join();
    rows.push_back({"GET /healthz on the metrics listener, median — baseline",
                    absl::StrFormat("%.2f ms", Percentile(health, 0.5)), "-",
                    "-"});
    rows.push_back(
        {absl::StrFormat("one scrape with %.0f jobs in the store, median / "
                         "max of 50 (%zu bytes)",
                         jobs_seen, last.size()),
         absl::StrFormat("%.2f / %.2f ms (%.1fx the baseline)",
                         Percentile(scrape, 0.5), Percentile(scrape, 1.0),
                         Percentile(scrape, 0.5) / Percentile(health, 0.5)),
         "<= 50 ms", verdict(Percentile(scrape, 1.0) <= 50)});
    rows.push_back(
        {absl::StrFormat("placement pass, no scrapes, mean / max of %d",
                         quiet_n),
         absl::StrFormat("%.3f / %.2f ms", quiet_mean, quiet_max), "-", "-"});
    rows.push_back({"job end to next start, no scrapes, median",
                    absl::StrFormat("%.2f ms", quiet_cycle), "-", "-"});
    rows.push_back(
        {absl::StrFormat("placement pass, scraped back to back (%d scrapes), "
                         "mean / max of %d",
                         scrapes.load(), busy_n),
         absl::StrFormat("%.3f / %.2f ms (mean %.2fx)", busy_mean, busy_max,
                         quiet_mean > 0 ? busy_mean / quiet_mean : 0),
         "no effect", "-"});
    rows.push_back({"job end to next start, scraped back to back, median",
                    absl::StrFormat("%.2f ms (%.2fx)", busy_cycle,
                                    busy_cycle / quiet_cycle),
                    "-", "-"});
  }

  // 6. Backup (dlbatch admin backup) of a store holding `queued` jobs,
  // received into a file as the CLI does, against a plain copy of the
  // database file (baseline, same run); jobs end and start one by one
  // meanwhile, and placement passes must not wait for it.
  if (run("backup")) {
    Scheduler s(root, "backup");
    SimWorker churn(s.channel, "churn", "local", 4);
    SubmitMany(s, "local", queued, 16, 0);
    for (int i = 0; i < 200 && churn.held() < 4; ++i) usleep(10000);
    const std::string db = s.dir + "/state/dlbatch.db";
    const std::string copy = root + "/copy.db";
    auto c0 = Clock::now();
    std::filesystem::copy_file(db, copy);
    const double copy_s = Seconds(c0, Clock::now());
    const int64_t db_bytes = std::filesystem::file_size(copy);
    std::filesystem::remove(copy);
    auto cycles = [&](const std::atomic<bool>& stop, int at_least) {
      return EndStartCycles(churn, stop, at_least);
    };
    std::atomic<bool> stop{true};
    std::vector<double> alone = cycles(stop, 300);
    s.Stats(/*reset=*/true);
    stop = false;
    std::vector<double> during;
    std::thread churner([&] { during = cycles(stop, 0); });
    auto b0 = Clock::now();
    int64_t received = 0, announced = 0, jobs_in = 0;
    grpc::Status backup_status;
    {
      auto stub = s.Stub();
      grpc::ClientContext ctx;
      s.Prepare(&ctx);
      auto reader = stub->BackupStore(&ctx, dlbatch::v1::BackupStoreRequest());
      std::ofstream out(root + "/backup.tar", std::ios::binary);
      dlbatch::v1::BackupChunk chunk;
      while (reader->Read(&chunk)) {
        if (announced == 0) {
          announced = chunk.archive_bytes();
          jobs_in = chunk.jobs();
        }
        out.write(chunk.data().data(),
                  static_cast<std::streamsize>(chunk.data().size()));
        received += static_cast<int64_t>(chunk.data().size());
      }
      out.flush();
      backup_status = reader->Finish();
    }
    const double backup_s = Seconds(b0, Clock::now());
    stop = true;
    churner.join();
    dlbatch::v1::Stats after = s.Stats();
    if (!backup_status.ok() || received != announced) {
      std::cerr << "backup failed: " << backup_status.error_message() << " ("
                << received << " of " << announced << " bytes)\n";
    }
    rows.push_back(
        {absl::StrFormat("copy of the database file (%.1f MB) — baseline",
                         db_bytes / 1e6),
         absl::StrFormat("%.2f s", copy_s), "-", "-"});
    rows.push_back(
        {absl::StrFormat("admin backup of %d jobs into a file (%.1f MB "
                         "archive)",
                         jobs_in, received / 1e6),
         absl::StrFormat("%.2f s (%.1fx the copy)", backup_s,
                         backup_s / copy_s),
         "-", "-"});
    rows.push_back(
        {absl::StrFormat("job end to next start, no backup, median / max "
                         "(%d cycles) — baseline",
                         alone.size()),
         absl::StrFormat("%.2f / %.2f ms", Percentile(alone, 0.5),
                         Percentile(alone, 1.0)),
         "-", "-"});
    rows.push_back(
        {absl::StrFormat("job end to next start during the backup, median / "
                         "max (%d cycles)",
                         during.size()),
         absl::StrFormat("%.2f / %.2f ms", Percentile(during, 0.5),
                         Percentile(during, 1.0)),
         "-", "-"});
    rows.push_back({"placement pass during the backup, max",
                    absl::StrFormat("%.2f ms", after.max_pass_ms()), "<= 10 ms",
                    verdict(after.max_pass_ms() <= 10)});
  }

  std::printf("| measure | value | goal | |\n|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf("| %s | %s | %s | %s |\n", r.what.c_str(), r.value.c_str(),
                r.goal.c_str(), r.verdict.c_str());
  }
  std::filesystem::remove_all(root);
  return 0;
}
