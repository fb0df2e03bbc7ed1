// Blob transfer throughput over the scheduler's Unix socket: a 1 GB file
// uploaded to a real dlbatch-scheduler and fetched back, against a local
// copy of the same file (read + write + fsync) measured in the same run.
// Prints a markdown table; the figures are not asserted.
//
//   transfer_bench [--mb N] [--runs N] [--dir DIR]
//
// DLBATCH_SCHEDULER_BIN=PATH measures another dlbatch-scheduler build.
//
// DIR (default /tmp) holds the file, the copies and the scheduler's state,
// so every row writes to the same disk.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/bench_args.h"
#include "common/blob_transfer.h"
#include "common/endpoint.h"
#include "common/files.h"
#include "common/malloc_tuning.h"
#include "dlbatch/v1/scheduler.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;

std::string SelfDir() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path().string();
}

// DLBATCH_SCHEDULER_BIN names another dlbatch-scheduler build to measure.
std::string SchedulerBin() {
  const char* env = std::getenv("DLBATCH_SCHEDULER_BIN");
  return env != nullptr ? std::string(env) : SelfDir() + "/dlbatch-scheduler";
}

void Die(const std::string& what) {
  std::cerr << "transfer_bench: " << what << "\n";
  std::exit(1);
}

void Check(const absl::Status& s, const std::string& what) {
  if (!s.ok()) Die(what + ": " + s.ToString());
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

// Random bytes: nothing on the way may shortcut zeros.
void MakeFile(const std::string& path, int64_t bytes) {
  dlbatch::UniqueFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
  if (!fd.valid()) Die("create " + path);
  std::mt19937_64 gen(7);
  std::vector<uint64_t> buf(1 << 17);
  for (int64_t done = 0; done < bytes;) {
    for (auto& w : buf) w = gen();
    size_t n = static_cast<size_t>(
        std::min<int64_t>(bytes - done, buf.size() * sizeof(uint64_t)));
    Check(dlbatch::WriteFull(fd.get(), {reinterpret_cast<char*>(buf.data()), n},
                             path),
          "write");
    done += static_cast<int64_t>(n);
  }
  fsync(fd.get());
}

// What a user's `cp` and then `sync` would do: the baseline.
void CopyFile(const std::string& from, const std::string& to) {
  dlbatch::UniqueFd in(open(from.c_str(), O_RDONLY));
  dlbatch::UniqueFd out(open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600));
  if (!in.valid() || !out.valid()) Die("copy " + from);
  std::string buf(dlbatch::kBlobChunkBytes, '\0');
  for (;;) {
    ssize_t n = read(in.get(), buf.data(), buf.size());
    if (n < 0) Die("read " + from);
    if (n == 0) break;
    Check(
        dlbatch::WriteFull(out.get(), {buf.data(), static_cast<size_t>(n)}, to),
        "write");
  }
  if (fsync(out.get()) != 0) Die("fsync " + to);
}

void HashFile(const std::string& path) {
  dlbatch::UniqueFd in(open(path.c_str(), O_RDONLY));
  std::string buf(dlbatch::kBlobChunkBytes, '\0');
  dlbatch::Sha256 hash;
  for (;;) {
    ssize_t n = read(in.get(), buf.data(), buf.size());
    if (n <= 0) break;
    hash.Update(buf.data(), static_cast<size_t>(n));
  }
  (void)hash.HexDigest();
}

// CPU seconds (user + system) process `pid` has used, its threads included.
double CpuSeconds(pid_t pid) {
  std::string stat;
  if (FILE* f = fopen(absl::StrFormat("/proc/%d/stat", pid).c_str(), "r")) {
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    stat.assign(buf, n);
    fclose(f);
  }
  // Fields after the command's closing parenthesis; utime and stime are
  // the 12th and 13th of them.
  std::istringstream in(stat.substr(stat.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 1; i <= 13 && in >> field; ++i) {
    if (i >= 12) ticks += std::stod(field);
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

struct Timing {
  double seconds = 0;    // wall, median of the runs
  double cpu_self = 0;   // per run, this process
  double cpu_other = 0;  // per run, the scheduler
};

// Times `runs` calls of `fn`; `reset` runs before each, untimed.
Timing Time(int runs, pid_t other, const std::function<void()>& fn,
            const std::function<void()>& reset = nullptr) {
  std::vector<double> seconds;
  Timing t;
  for (int i = 0; i < runs; ++i) {
    if (reset) reset();
    double self0 = CpuSeconds(getpid()), other0 = CpuSeconds(other);
    auto t0 = Clock::now();
    fn();
    seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    t.cpu_self += (CpuSeconds(getpid()) - self0) / runs;
    t.cpu_other += (CpuSeconds(other) - other0) / runs;
  }
  std::sort(seconds.begin(), seconds.end());
  t.seconds = seconds[seconds.size() / 2];
  return t;
}

}  // namespace

constexpr char kUsage[] =
    "usage: transfer_bench [--mb N] [--runs N] [--dir DIR]\n"
    "Times blob uploads and fetches of N MiB (default 1024) over a real\n"
    "scheduler's Unix socket; prints a markdown table (bench/RESULTS.md).\n";

int main(int argc, char** argv) {
  // As the CLI and the worker, whose sides of a transfer this one times.
  dlbatch::KeepChunkBuffersInProcess();
  int64_t mb = 1024;
  int runs = 3;
  std::string base = "/tmp";
  if (int rc; dlbatch::bench::HelpOrBadPairs(argc, argv, kUsage, true, &rc)) {
    return rc;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--mb") {
      mb = std::stoll(argv[i + 1]);
    } else if (flag == "--runs") {
      runs = std::max(1, std::stoi(argv[i + 1]));
    } else if (flag == "--dir") {
      base = argv[i + 1];
    } else {
      std::cerr << kUsage;
      return 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  std::string tmpl = base + "/dltb-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) Die("mkdtemp in " + base);
  const std::string root = tmpl;
  const int64_t bytes = mb << 20;
  const std::string file = root + "/file";
  MakeFile(file, bytes);

  const std::string address = "unix:" + root + "/s.sock";
  const std::string ready = root + "/ready";
  pid_t scheduler = Spawn({SchedulerBin(), "--state-dir", root + "/state",
                           "--listen", address, "--ready-file", ready},
                          root + "/scheduler.log");
  for (int i = 0; i < 300 && !std::filesystem::exists(ready); ++i)
    usleep(50000);
  if (!std::filesystem::exists(ready)) Die("the scheduler did not start");
  dlbatch::ChannelConfig config;
  config.endpoint = *dlbatch::ParseEndpoint(address);
  auto stub = dlbatch::v1::Scheduler::NewStub(dlbatch::MakeChannel(config));

  const std::string copy = root + "/copy";
  const std::string fetched = root + "/fetched";
  auto remove = [&] {
    std::filesystem::remove(copy);
    std::filesystem::remove(fetched);
  };
  Timing hash_s = Time(runs, scheduler, [&] { HashFile(file); });
  Timing copy_s = Time(
      runs, scheduler, [&] { CopyFile(file, copy); }, remove);
  dlbatch::LocalBlob blob;
  Timing upload_s = Time(runs, scheduler, [&] {
    auto b = dlbatch::UploadFile(stub.get(), "", file, nullptr,
                                 dlbatch::UploadMode::kReadOnce);
    Check(b.status(), "upload");
    blob = *b;
  });
  Timing fetch_s = Time(
      runs, scheduler,
      [&] {
        Check(dlbatch::DownloadFile(stub.get(), "", blob.sha256, blob.size,
                                    fetched, 0600),
              "fetch");
      },
      remove);
  // The store holds it now: hash here, ask, send nothing.
  Timing dedupe_s = Time(runs, scheduler, [&] {
    Check(dlbatch::UploadFile(stub.get(), "", file).status(), "upload again");
  });
  kill(scheduler, SIGKILL);
  waitpid(scheduler, nullptr, 0);
  std::filesystem::remove_all(root);

  const double mbytes = static_cast<double>(bytes) / 1e6;
  const double copy_rate = mbytes / copy_s.seconds;
  std::cout << absl::StrFormat(
      "| measure (%d MiB file, median of %d) | MB/s | x local copy | CPU s "
      "per run: this side + scheduler | goal | |\n"
      "|---|---|---|---|---|---|\n",
      mb, runs);
  auto row = [&](const std::string& name, const Timing& t, bool goal) {
    double rate = mbytes / t.seconds;
    std::cout << absl::StrFormat(
        "| %s | %.0f | %.2f | %.2f + %.2f in %.2f s | %s | %s |\n", name, rate,
        rate / copy_rate, t.cpu_self, t.cpu_other, t.seconds,
        goal ? ">= 500 MB/s" : "-",
        goal ? (rate >= 500 ? "met" : "MISSED") : "");
  };
  row("local copy: read + write + fsync — baseline", copy_s, false);
  row("sha256 of the file alone (page cache)", hash_s, false);
  row("upload, read once (outputs)", upload_s, true);
  row("fetch (fetch-outputs, attachments to a worker)", fetch_s, true);
  row("upload again, hashed first, stored already (attachments)", dedupe_s,
      false);
  return 0;
}
