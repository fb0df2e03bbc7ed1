// dlbatch-scheduler: the daemon that owns all state.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/duration.h"
#include "common/endpoint.h"
#include "common/files.h"
#include "common/status.h"
#include "scheduler/service.h"
#include "spdlog/spdlog.h"

namespace dlbatch::scheduler {
namespace {

struct Flags {
  std::string state_dir;
  std::string listen = "127.0.0.1:7070";
  std::vector<std::string> profiles;
  std::string heartbeat_interval = "1s";
  std::string heartbeat_timeout = "10s";
  std::string cancel_grace = "10s";
  int max_attempts = 3;
  bool sync_full = false;
  int64_t min_free_mb = 64;
  std::string ready_file;
};

int Fail(const std::string& message) {
  std::cerr << "dlbatch-scheduler: " << message << "\n";
  return 1;
}

absl::StatusOr<int64_t> DurationMs(const std::string& text, const char* flag) {
  // Sub-second values are allowed here for tests: "500ms".
  if (text.size() > 2 && text.substr(text.size() - 2) == "ms") {
    int64_t ms;
    if (absl::SimpleAtoi(text.substr(0, text.size() - 2), &ms) && ms > 0)
      return ms;
  }
  auto s = ParseDurationSeconds(text);
  if (!s.ok()) return Annotate(s.status(), flag);
  return *s * 1000;
}

int Run(const Flags& flags) {
  auto endpoint = ParseEndpoint(flags.listen);
  if (!endpoint.ok()) return Fail(std::string(endpoint.status().message()));
  if (auto s = MakeDirs(flags.state_dir, 0700); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  // One scheduler per state folder.
  std::string lock_path = flags.state_dir + "/scheduler.lock";
  int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0 || ::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    return Fail(
        absl::StrCat("another scheduler is using ", flags.state_dir,
                     "; stop it first (dlbatch local stop, or kill the pid in ",
                     flags.state_dir, "/scheduler.pid)"));
  }
  (void)WriteFileAtomic(flags.state_dir + "/scheduler.pid",
                        absl::StrCat(::getpid(), "\n"));

  SchedulerOptions options;
  auto interval = DurationMs(flags.heartbeat_interval, "--heartbeat-interval");
  auto timeout = DurationMs(flags.heartbeat_timeout, "--heartbeat-timeout");
  auto grace = DurationMs(flags.cancel_grace, "--cancel-grace");
  for (const auto* d : {&interval, &timeout, &grace}) {
    if (!d->ok()) return Fail(std::string(d->status().message()));
  }
  options.heartbeat_interval_ms = *interval;
  options.heartbeat_timeout_ms = *timeout;
  options.cancel_grace_ms = *grace;
  options.max_attempts = flags.max_attempts;
  for (const std::string& p : flags.profiles) {
    std::pair<std::string, std::string> kv =
        absl::StrSplit(p, absl::MaxSplits('=', 1));
    int max_pool = 0;
    if (!kv.second.empty() &&
        (!absl::SimpleAtoi(kv.second, &max_pool) || max_pool < 0)) {
      return Fail(
          absl::StrCat("--profile ", p, ": write NAME or NAME=MAX_POOL"));
    }
    options.profiles.emplace_back(kv.first, max_pool);
  }

  std::string token;
  if (!endpoint->is_unix) {
    auto t = LoadOrCreateToken(flags.state_dir);
    if (!t.ok()) return Fail(std::string(t.status().message()));
    token = *t;
  }
  std::string db_path = flags.state_dir + "/dlbatch.db";
  auto store = Store::Open(db_path, flags.sync_full);
  if (!store.ok()) return Fail(std::string(store.status().message()));
  StoreReader reader(db_path);
  auto blobs =
      BlobStore::Open(flags.state_dir + "/blobs", flags.min_free_mb << 20);
  if (!blobs.ok()) return Fail(std::string(blobs.status().message()));

  Scheduler scheduler(store->get(), &reader, blobs->get(), SystemClock::Get(),
                      options);
  if (auto s = scheduler.Start(); !s.ok())
    return Fail(std::string(s.message()));

  SchedulerService service(&scheduler, blobs->get(), token);
  WorkerLinkService link(&scheduler, token);
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.SetMaxSendMessageSize(64 << 20);
  if (endpoint->is_unix) ::unlink(endpoint->path.c_str());
  int bound_port = 0;
  builder.AddListeningPort(endpoint->GrpcTarget(),
                           grpc::InsecureServerCredentials(),
                           endpoint->is_unix ? nullptr : &bound_port);
  builder.RegisterService(&service);
  builder.RegisterService(&link);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || (!endpoint->is_unix && bound_port == 0)) {
    return Fail(absl::StrCat(
        "cannot listen on ", flags.listen,
        " (in use, or not an address of this machine); choose another "
        "with --listen"));
  }
  std::string address = flags.listen;
  if (endpoint->is_unix) {
    ::chmod(endpoint->path.c_str(), 0600);
  } else {
    address = absl::StrCat(endpoint->host, ":", bound_port);
  }
  spdlog::info("listening on {} (state in {})", address, flags.state_dir);
  if (!flags.ready_file.empty())
    (void)WriteFileAtomic(flags.ready_file, address + "\n");

  // Signals are taken by one thread with sigwait; every other thread has
  // them blocked (the mask is inherited from here).
  std::thread([&server] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    int sig = 0;
    sigwait(&set, &sig);
    spdlog::info(
        "signal {}: shutting down; running jobs keep running on their workers",
        sig);
    server->Shutdown(std::chrono::system_clock::now() +
                     std::chrono::seconds(2));
  }).detach();
  server->Wait();
  scheduler.Stop();
  return 0;
}

}  // namespace
}  // namespace dlbatch::scheduler

int main(int argc, char** argv) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // Lock-order checking costs a graph lookup on every lock; the scheduler's
  // locks are few and documented.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  dlbatch::scheduler::Flags flags;
  CLI::App app{
      "dlbatch-scheduler: queues dlbatch jobs and places them on workers"};
  app.add_option(
         "--state-dir", flags.state_dir,
         "Folder for the database, blobs and token (created, mode 0700)")
      ->required();
  app.add_option("--listen", flags.listen,
                 "unix:PATH or HOST:PORT (port 0: any free port)")
      ->capture_default_str();
  app.add_option("--profile", flags.profiles,
                 "Declare a profile: NAME or NAME=MAX_POOL (repeatable; "
                 "'local' always exists)");
  app.add_option("--heartbeat-interval", flags.heartbeat_interval,
                 "How often workers report in")
      ->capture_default_str();
  app.add_option("--heartbeat-timeout", flags.heartbeat_timeout,
                 "Silence after which a worker is lost and its jobs requeued")
      ->capture_default_str();
  app.add_option("--cancel-grace", flags.cancel_grace,
                 "SIGTERM to SIGKILL on cancel")
      ->capture_default_str();
  app.add_option("--max-attempts", flags.max_attempts,
                 "Starts of a job (after lost workers) before it fails")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag(
      "--sync-full", flags.sync_full,
      "fsync every commit (survives power loss; slower). Default survives any "
      "crash of the process");
  app.add_option(
         "--min-free-mb", flags.min_free_mb,
         "Refuse uploads that would leave less free disk in the state folder")
      ->capture_default_str();
  app.add_option("--ready-file", flags.ready_file,
                 "Write the listening address here once serving");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
  return dlbatch::scheduler::Run(flags);
}
