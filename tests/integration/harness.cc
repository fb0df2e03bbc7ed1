#include "tests/integration/harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_replace.h"
#include "worker/subprocess.h"

extern char** environ;

namespace dlbatch::testing {

const char kLenetNetworkYaml[] = R"(
  network:
    input: [28, 28, 1]
    layers:
      - {type: conv, filters: 20, size: 5}
      - {type: maxpool, size: 2, stride: 2}
      - {type: conv, filters: 50, size: 5}
      - {type: maxpool, size: 2, stride: 2}
      - {type: fc, units: 500}
      - {type: relu}
      - {type: fc, units: 10}
      - {type: softmax}
)";
namespace fs = std::filesystem;

std::string LenetJob(const std::string& data, const std::string& extra_options,
                     const std::string& header) {
  std::string yaml = header + "train:" + kLenetNetworkYaml + R"(
  data:
    train:      {format: idx, images: DATA/train-images-idx3-ubyte.gz, labels: DATA/train-labels-idx1-ubyte.gz}
    validation: {format: idx, images: DATA/t10k-images-idx3-ubyte.gz,  labels: DATA/t10k-labels-idx1-ubyte.gz}
  options:
    solver: sgdm
    initial_learn_rate: 0.01
    momentum: 0.9
    seed: 7
)" + extra_options;
  return absl::StrReplaceAll(yaml, {{"DATA", data}});
}

int64_t JsonInt(const nlohmann::json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) return 0;
  const auto& v = j[key];
  return v.is_string() ? std::stoll(v.get<std::string>()) : v.get<int64_t>();
}

std::string BinDir() {
  if (const char* env = std::getenv("DLBATCH_BIN_DIR")) return env;
  return DLBATCH_BIN_DIR;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteAll(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

bool WaitFor(const std::function<bool()>& ready, int timeout_ms) {
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (ready()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return ready();
}

static std::vector<std::string> Environment(
    const std::map<std::string, std::string>& extra) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv(*e);
    size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : extra) env[k] = v;
  std::vector<std::string> out;
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

Result Exec(const std::vector<std::string>& argv,
            const std::map<std::string, std::string>& env, int timeout_ms) {
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0)
    return {};
  std::vector<std::string> env_store = Environment(env);
  std::vector<char*> envp, args;
  for (auto& e : env_store) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_store = argv;
  for (auto& a : argv_store) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    execvpe(args[0], args.data(), envp.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  Result r;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  bool killed = false;
  while (open_fds > 0) {
    int left =
        static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                             deadline - std::chrono::steady_clock::now())
                             .count());
    if (left <= 0 && !killed) {
      kill(pid, SIGKILL);
      killed = true;
    }
    poll(fds, 2, std::max(left, 100));
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
        continue;
      char buf[65536];
      ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      } else {
        (i == 0 ? r.out : r.err).append(buf, static_cast<size_t>(n));
      }
    }
  }
  int status = 0;
  waitpid(pid, &status, 0);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (killed) r.err += "\n[harness: timed out, killed]";
  return r;
}

Cluster::Cluster() {
  char tmpl[] = "/tmp/dlbt-XXXXXX";
  dir_ = mkdtemp(tmpl);
}

Cluster::~Cluster() {
  for (auto& w : workers_) {
    if (w.pid > 0) {
      kill(w.pid, SIGKILL);
      waitpid(w.pid, nullptr, 0);
    }
  }
  if (scheduler_.pid > 0) {
    kill(scheduler_.pid, SIGKILL);
    waitpid(scheduler_.pid, nullptr, 0);
  }
  // Jobs of killed workers: nothing of a test outlives it.
  worker::KillProcessesUnder(dir_);
  std::error_code ec;
  if (std::getenv("DLBATCH_KEEP_TEST_DIRS") == nullptr) {
    // A tmpfs a test mounted inside is unmounted by the test itself.
    fs::remove_all(dir_, ec);
  }
}

pid_t Cluster::Spawn(const std::vector<std::string>& argv,
                     const std::string& log) {
  return SpawnLogged(argv, log);
}

pid_t SpawnLogged(const std::vector<std::string>& argv,
                  const std::string& log) {
  std::vector<std::string> store = argv;
  std::vector<char*> args;
  for (auto& a : store) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    setpgid(0, 0);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

void Cluster::StartScheduler(std::vector<std::string> extra,
                             const std::string& listen) {
  if (!extra.empty() || scheduler_args_.empty()) scheduler_args_ = extra;
  std::string ready = dir_ + "/scheduler.ready";
  unlink(ready.c_str());
  std::string where =
      listen.empty()
          ? (address_.empty() ? "unix:" + dir_ + "/sched.sock" : address_)
          : listen;
  std::vector<std::string> argv = scheduler_prefix_;
  for (const std::string& a :
       {BinDir() + "/dlbatch-scheduler", std::string("--config"),
        std::string(""),  // no /etc/dlbatch file; a test's --config wins
        std::string("--state-dir"), scheduler_state(), std::string("--listen"),
        where, std::string("--ready-file"), ready}) {
    argv.push_back(a);
  }
  argv.insert(argv.end(), scheduler_args_.begin(), scheduler_args_.end());
  scheduler_.pid = Spawn(argv, dir_ + "/scheduler.log");
  ASSERT_TRUE(WaitFor([&] { return !ReadAll(ready).empty(); }, 15000))
      << ReadAll(dir_ + "/scheduler.log");
  std::string bound = ReadAll(ready);
  while (!bound.empty() && (bound.back() == '\n')) bound.pop_back();
  address_ = bound;
}

namespace {

// Sends `sig` and reaps the process. One that has not exited 60 s later
// is a test failure (a daemon that wedges on SIGTERM), and is killed so
// the test ends instead of hanging the run.
void SignalAndReap(pid_t pid, int sig, const std::string& what) {
  kill(pid, sig);
  const bool gone =
      WaitFor([&] { return waitpid(pid, nullptr, WNOHANG) == pid; }, 60000);
  if (gone) return;
  ADD_FAILURE() << what << " (pid " << pid << ") did not exit within 60 s "
                << "of signal " << sig << "; killed";
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

}  // namespace

void Cluster::KillScheduler(int sig) {
  SignalAndReap(scheduler_.pid, sig, "the scheduler");
  scheduler_.pid = 0;
}

bool Cluster::WaitSchedulerExit(int timeout_ms) {
  return WaitFor(
      [&] {
        if (scheduler_.pid <= 0) return true;
        if (waitpid(scheduler_.pid, nullptr, WNOHANG) != scheduler_.pid)
          return false;
        scheduler_.pid = 0;
        return true;
      },
      timeout_ms);
}

std::vector<std::string> Cluster::CliArgv(
    const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {BinDir() + "/dlbatch", "--scheduler",
                                   address_};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

std::map<std::string, std::string> Cluster::CliEnv() const {
  // Never fall back on a local cluster of the user running the tests.
  // Nor on the configuration file of the user running the tests.
  std::map<std::string, std::string> env = {
      {"XDG_STATE_HOME", dir_ + "/xdg"},
      {"XDG_CONFIG_HOME", dir_ + "/xdg-config"}};
  if (is_tcp()) env.emplace("DLBATCH_CA", ca_file());
  return env;
}

int Cluster::StartWorker(const std::string& name, int slots,
                         const std::string& profile,
                         std::vector<std::string> extra,
                         std::vector<std::string> prefix) {
  std::string work = dir_ + "/worker-" + name;
  std::vector<std::string> argv = std::move(prefix);
  for (const std::string& a :
       {BinDir() + "/dlbatch-worker", std::string("--config"), std::string(""),
        std::string("--scheduler"), address_, std::string("--profile"), profile,
        std::string("--work-dir"), work, std::string("--name"), name}) {
    argv.push_back(a);
  }
  if (slots > 0) {
    argv.push_back("--cpu-slots");
    argv.push_back(std::to_string(slots));
  }
  // Jobs start from a clean environment; what a test sets for them (a cache
  // folder) or needs to run them (a GPU bundle's libraries) is passed on as
  // an operator would.
  for (const char* name : {"XDG_CACHE_HOME", "LD_LIBRARY_PATH"}) {
    if (std::getenv(name) != nullptr) {
      argv.push_back("--job-env");
      argv.push_back(name);
    }
  }
  if (is_tcp()) {
    argv.push_back("--ca-file");
    argv.push_back(ca_file());
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  Proc p;
  p.name = name;
  p.argv = argv;
  p.pid = Spawn(argv, dir_ + "/worker-" + name + ".log");
  workers_.push_back(p);
  return static_cast<int>(workers_.size()) - 1;
}

void Cluster::KillWorker(int index, int sig) {
  SignalAndReap(workers_[index].pid, sig, "worker " + workers_[index].name);
  workers_[index].pid = 0;
}

void Cluster::RestartWorker(int index) {
  Proc& p = workers_[index];
  p.pid = Spawn(p.argv, dir_ + "/worker-" + p.name + ".log");
}

Result Cluster::Cli(std::vector<std::string> args,
                    std::map<std::string, std::string> env, int timeout_ms) {
  std::vector<std::string> argv = {BinDir() + "/dlbatch", "--scheduler",
                                   address_};
  argv.insert(argv.end(), args.begin(), args.end());
  // Never fall back on a local cluster of the user running the tests.
  env.emplace("XDG_STATE_HOME", dir_ + "/xdg");
  env.emplace("XDG_CONFIG_HOME", dir_ + "/xdg-config");
  if (is_tcp()) env.emplace("DLBATCH_CA", ca_file());
  return Exec(argv, env, timeout_ms);
}

std::string Cluster::JobFile(const std::string& name, const std::string& yaml) {
  std::string path = dir_ + "/" + name;
  WriteAll(path, yaml);
  return path;
}

int64_t Cluster::Submit(const std::string& job_file,
                        std::vector<std::string> extra) {
  std::vector<std::string> args = {"submit", "-q", job_file};
  args.insert(args.end(), extra.begin(), extra.end());
  Result r = Cli(args);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  return r.code == 0 ? std::stoll(r.out) : -1;
}

nlohmann::json Cluster::ShowJson(int64_t id) {
  Result r = Cli({"show", "--json", std::to_string(id)});
  if (r.code != 0) return nlohmann::json::object();
  return nlohmann::json::parse(r.out, nullptr, false);
}

std::string Cluster::State(int64_t id) {
  nlohmann::json j = ShowJson(id);
  if (!j.is_object() || !j.contains("state")) return "";
  // `show --json` says "running"; tests name states as the proto does.
  std::string state = j["state"].get<std::string>();
  for (char& ch : state) ch = static_cast<char>(toupper(ch));
  return "JOB_STATE_" + state;
}

bool Cluster::WaitState(int64_t id, const std::string& state, int timeout_ms) {
  return WaitFor([&] { return State(id) == state; }, timeout_ms);
}

std::string Cluster::Logs() const {
  std::string out;
  for (const auto& e : fs::directory_iterator(dir_)) {
    if (e.path().extension() == ".log") {
      out += "--- " + e.path().filename().string() + "\n" +
             ReadAll(e.path().string());
    }
  }
  return out;
}

bool Cluster::WaitWorkers(int workers, int timeout_ms) {
  return WaitFor(
      [&] {
        Result r = Cli({"workers", "--json"});
        if (r.code != 0) return false;
        auto j = nlohmann::json::parse(r.out, nullptr, false);
        if (!j.is_object() || !j.contains("workers")) return false;
        int online = 0;
        for (const auto& w : j["workers"])
          online += w.value("online", false) ? 1 : 0;
        return online >= workers;
      },
      timeout_ms);
}

int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return 0;
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

Http Get(int port, const std::string& path) {
  Http r;
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return r;
  }
  std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (::write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return r;
  }
  std::string all;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) all.append(buf, n);
  ::close(fd);
  if (all.rfind("HTTP/1.", 0) != 0 || all.size() < 12) return r;
  r.status = std::atoi(all.c_str() + 9);
  size_t body = all.find("\r\n\r\n");
  if (body != std::string::npos) r.body = all.substr(body + 4);
  return r;
}

double Sample(const std::string& scrape, const std::string& series) {
  std::istringstream in(scrape);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series + " ", 0) == 0) {
      return std::strtod(line.c_str() + series.size() + 1, nullptr);
    }
  }
  return std::nan("");
}

int64_t JsonTimeMs(const nlohmann::json& time) {
  if (!time.is_string()) return 0;
  struct tm tm = {};
  const std::string s = time.get<std::string>();
  if (strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &tm) == nullptr) return 0;
  const int64_t ms = s.size() >= 23 ? std::stoll(s.substr(20, 3)) : 0;
  return static_cast<int64_t>(timegm(&tm)) * 1000 + ms;
}

}  // namespace dlbatch::testing
