#include "worker/worker.h"

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/files.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "worker/job_notes_io.h"
#include "worker/train_job.h"

namespace dlbatch::worker {
namespace {

// The scheduler's address as a job's processes can use it.
std::string RendezvousAddress(const Endpoint& e) {
  if (!e.is_unix) return e.original;
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(e.path, ec);
  return "unix:" + (ec ? e.path : p.string());
}

// Hard links hold a checkpoint's files while the trainer replaces them with
// the next one (it writes a new file and renames it over), and those links
// are uploaded. The output folder is the job's: the snapshot's folder is made
// afresh by the worker, for the worker alone (mkdir follows no link planted
// at its name), and only a regular file is taken (link() links a symlink
// itself, which the upload would follow with the worker's powers).
absl::StatusOr<std::vector<v1::OutputFile>> StoreCheckpoint(
    const std::string& dir, BlobTransfers* transfers) {
  const std::string snap = absl::StrCat(dir, "/", kCheckpointSnapshotDir);
  RETURN_IF_ERROR(RemoveTree(snap));
  if (::mkdir(snap.c_str(), 0700) != 0)
    return ErrnoStatus(errno, "mkdir", snap);
  std::vector<v1::OutputFile> files;
  for (const char* name : kCheckpointFiles) {
    const std::string from = absl::StrCat(dir, "/output/", name);
    const std::string to = absl::StrCat(snap, "/", name);
    if (::link(from.c_str(), to.c_str()) != 0)
      return absl::ErrnoToStatus(errno, absl::StrCat("linking ", from));
    struct stat st;
    if (::lstat(to.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(from, " is not a regular file"));
    }
    absl::StatusOr<v1::OutputFile> f = transfers->UploadFile(to, name);
    if (!f.ok()) return f.status();
    files.push_back(*std::move(f));
  }
  return files;
}

}  // namespace

namespace {

std::string CurrentUserName() {
  long size = ::sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buf(size > 0 ? static_cast<size_t>(size) : 16384);
  struct passwd pw;
  struct passwd* found = nullptr;
  if (::getpwuid_r(::geteuid(), &pw, buf.data(), buf.size(), &found) == 0 &&
      found != nullptr) {
    return pw.pw_name;
  }
  return absl::StrCat("uid", ::geteuid());
}

// Whether this machine has an account named `user` (files, LDAP, ...).
bool KnowsUser(const std::string& user) {
  if (user.empty()) return false;
  long size = ::sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buf(size > 0 ? static_cast<size_t>(size) : 16384);
  struct passwd pw;
  struct passwd* found = nullptr;
  while (true) {
    int rc = ::getpwnam_r(user.c_str(), &pw, buf.data(), buf.size(), &found);
    if (rc != ERANGE || buf.size() > (1u << 20)) break;
    buf.resize(buf.size() * 2);
  }
  return found != nullptr;
}

// A worker started as root runs any user's jobs (as their owner); any other
// runs only its own user's (see job_launch.h), and says so at registration.
LinkOptions MakeLinkOptions(const WorkerOptions& o) {
  LinkOptions l;
  l.name = o.name;
  l.host = o.host;
  l.profile = o.profile;
  l.devices = o.devices;
  l.scheduler = o.channel.endpoint.original;
  l.version = o.version;
  l.runs_as_any_user = ::geteuid() == 0;
  l.user = CurrentUserName();
  l.knows_user = KnowsUser;
  l.slurm_job = o.slurm_job;
  l.read_gpus = o.read_gpus;
  return l;
}

}  // namespace

Worker::Worker(WorkerOptions options, const Clock* clock, ProcessRunner* runner,
               BlobTransfers* transfers, LinkTransport* transport)
    : options_(std::move(options)),
      clock_(clock),
      runner_(runner),
      transfers_(transfers),
      table_(options_.work_dir),
      link_(MakeLinkOptions(options_), transport, clock),
      pool_(options_.max_transfer_threads) {
  launch_.trainer = options_.trainer;
  launch_.python_dir = options_.python_dir;
  launch_.host = options_.host;
  launch_.rendezvous = RendezvousAddress(options_.channel.endpoint);
  launch_.rendezvous_ca = options_.channel.ca_pem;
  launch_.trainer_stop_on_term = options_.slurm_job.has_value();
  for (const auto& d : options_.devices) launch_.gpus |= d.kind() == "gpu";
  launch_.visible_devices = std::getenv("CUDA_VISIBLE_DEVICES");
  launch_.keep_env.assign(std::begin(kJobBaseEnv), std::end(kJobBaseEnv));
  for (const std::string& name : options_.job_env) {
    launch_.keep_env.push_back(name);
  }
  launch_.as_owner = ::geteuid() == 0;
  launch_.worker_user = CurrentUserName();
  launch_.worker_name = options_.name;
  link_.SetHandler(this);
  runner_->Attach(this);
  if (options_.tick_ms > 0) ticker_ = std::thread([this] { TickLoop(); });
}

Worker::~Worker() {
  Shutdown();
  if (ticker_.joinable()) ticker_.join();
  std::thread finisher;
  {
    absl::MutexLock lock(&mu_);
    finisher.swap(finisher_);
  }
  if (finisher.joinable()) finisher.join();
}

absl::Status Worker::Run() {
  absl::Status s = link_.Run();
  Shutdown();
  return s;
}

void Worker::Shutdown() {
  absl::MutexLock done(&shutdown_mu_);
  if (shut_down_) return;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  link_.Stop();
  transfers_->Stop();
  pool_.Stop();
  runner_->Shutdown();
  shut_down_ = true;
}

void Worker::StopForSlurm(int signal, int64_t grace_ms) {
  {
    absl::MutexLock lock(&mu_);
    if (served_ && !stopping_) {
      JobEffects fx = table_.SlurmStopping(signal, grace_ms, clock_->NowMs());
      const bool stopping = !fx.actions.empty() || !fx.records.empty();
      Apply(std::move(fx));
      if (stopping || table_.size() > 0) return;
    }
  }
  Shutdown();
}

std::optional<JobPhase> Worker::Phase(const JobRef& ref) const {
  absl::MutexLock lock(&mu_);
  return table_.Phase(ref);
}

void Worker::Apply(JobEffects effects) {
  mu_.AssertHeld();
  for (const auto& record : effects.records) {
    if (record.has_ended()) {
      const v1::JobEnded& e = record.ended();
      spdlog::info("job {} (attempt {}, part {}) ended: {} {}", e.job_id(),
                   e.attempt(), e.part(), v1::JobState_Name(e.state()),
                   e.reason());
    }
    link_.Post(record);
  }
  busy_slots_.store(table_.BusySlots());
  if (stopping_) return;
  for (auto& a : effects.actions) {
    switch (a.kind) {
      case JobAction::kPrepare:
        pool_.Post(a.key, [this, a] { PrepareTask(a); });
        break;
      case JobAction::kStart:
        runner_->Start(a.key, std::move(a.process));
        break;
      case JobAction::kTerminate:
        // Before the signal, so a job that looks when signalled sees it.
        if (!a.stop_file.empty()) {
          absl::Status s = WriteStopFile(a.stop_file, a.stop_why);
          if (!s.ok())
            spdlog::warn("job {}: {}", a.ref.job_id, std::string(s.message()));
        }
        runner_->Terminate(a.key, a.signal, a.grace_ms);
        break;
      case JobAction::kUploadOutputs:
        pool_.Post(a.key, [this, a] { UploadOutputsTask(a); });
        break;
      case JobAction::kUploadCheckpoint:
        pool_.Post(a.key, [this, a] { CheckpointTask(a); });
        break;
      case JobAction::kRemove:
        if (options_.slurm_job && served_ && table_.size() == 0) {
          FinishSlurmJob(a.dir);
        } else if (!options_.keep_job_dirs) {
          pool_.Post(a.key, [dir = a.dir] { (void)RemoveTree(dir); });
        }
        break;
    }
  }
}

void Worker::FinishSlurmJob(const std::string& dir) {
  mu_.AssertHeld();
  if (finisher_.joinable()) return;
  spdlog::info("job {} attempt {} has ended: this Slurm job's worker leaves",
               options_.slurm_job->job_id(), options_.slurm_job->attempt());
  finisher_ = std::thread([this, dir] {
    if (!options_.keep_job_dirs) (void)RemoveTree(dir);
    Shutdown();
  });
}

void Worker::OnSchedulerMessage(const v1::SchedulerMessage& message) {
  absl::MutexLock lock(&mu_);
  switch (message.msg_case()) {
    case v1::SchedulerMessage::kStart: {
      const v1::StartJob& start = message.start();
      served_ = true;
      spdlog::info("job {} (attempt {}) assigned devices [{}]", start.job_id(),
                   start.attempt(), absl::StrJoin(start.devices(), ","));
      link_.Open(JobRef::Of(start));
      Apply(table_.Assign(start, clock_->NowMs()));
      break;
    }
    case v1::SchedulerMessage::kCancel: {
      const v1::CancelJob& c = message.cancel();
      if (c.preempt()) {
        spdlog::info("job {} (attempt {}, part {}) preempted: {}", c.job_id(),
                     c.attempt(), c.part(), c.reason());
      }
      Apply(table_.Cancel(c, clock_->NowMs()));
      break;
    }
    case v1::SchedulerMessage::kEndedAck:
      Apply(table_.EndedAcked(JobRef::Of(message.ended_ack())));
      break;
    default:
      break;
  }
}

void Worker::ProcessStarted(int64_t key, absl::Status status) {
  absl::MutexLock lock(&mu_);
  Apply(table_.Started(key, std::move(status), clock_->NowMs(),
                       clock_->MonotonicMs()));
}

void Worker::ProcessLine(int64_t key, const OutputLine& line) {
  absl::MutexLock lock(&mu_);
  Apply(table_.Line(key, line));
}

void Worker::ProcessExited(int64_t key, const ExitInfo& info) {
  absl::MutexLock lock(&mu_);
  Apply(table_.Exited(key, info, clock_->NowMs()));
}

void Worker::Tick() {
  absl::MutexLock lock(&mu_);
  Apply(table_.Tick(clock_->NowMs(), clock_->MonotonicMs()));
}

void Worker::TickLoop() {
  absl::MutexLock lock(&mu_);
  auto stopping = [this]()
                      ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_; };
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping),
                               absl::Milliseconds(options_.tick_ms))) {
    Apply(table_.Tick(clock_->NowMs(), clock_->MonotonicMs()));
  }
}

void Worker::PrepareTask(const JobAction& action) {
  std::vector<std::string> notes;
  absl::StatusOr<SubprocessOptions> process =
      PrepareJob(action.start, action.dir, launch_, transfers_, &notes);
  absl::MutexLock lock(&mu_);
  Apply(
      table_.Prepared(action.key, std::move(process), notes, clock_->NowMs()));
}

void Worker::UploadOutputsTask(const JobAction& action) {
  std::vector<std::string> notes;
  absl::Status history = WriteHistoryFiles(
      action.dir + "/output", action.history, action.history_title);
  if (!history.ok()) {
    notes.push_back(absl::StrCat("could not add the reported history: ",
                                 history.message()));
  }
  absl::StatusOr<std::vector<v1::OutputFile>> files = transfers_->UploadOutputs(
      action.dir + "/output", action.max_output_bytes, &notes);
  absl::MutexLock lock(&mu_);
  Apply(table_.OutputsUploaded(action.key, std::move(files), notes,
                               clock_->NowMs()));
}

void Worker::CheckpointTask(const JobAction& action) {
  std::vector<std::string> skipped;
  // A command job's folder is read as its outputs are: links kept as
  // text, never followed; what is not a file or folder left out.
  absl::StatusOr<std::vector<v1::OutputFile>> files =
      action.checkpoint_dir.empty()
          ? StoreCheckpoint(action.dir, transfers_)
          : transfers_->UploadOutputs(action.checkpoint_dir,
                                      action.max_output_bytes, &skipped);
  absl::MutexLock lock(&mu_);
  Apply(table_.CheckpointStored(action.key, action.iteration, std::move(files),
                                clock_->NowMs()));
}

}  // namespace dlbatch::worker
