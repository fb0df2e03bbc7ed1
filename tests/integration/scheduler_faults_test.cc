// The scheduler under faults, with the real binaries: a job printing any
// bytes, a kill -9 and slow reconnect with running jobs, a full disk, the
// diary cap, purges and retention under churn.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>
#include <thread>

#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

namespace fs = std::filesystem;

void Sleep(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// A job's diary as stored, read straight from the scheduler's database
// (the CLI may show it escaped).
std::vector<std::string> StoredDiary(const Cluster& c, int64_t id) {
  std::vector<std::string> lines;
  sqlite3* db = nullptr;
  std::string path = c.scheduler_state() + "/dlbatch.db";
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) !=
      SQLITE_OK) {
    ADD_FAILURE() << "cannot open " << path;
    sqlite3_close(db);
    return lines;
  }
  sqlite3_busy_timeout(db, 5000);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db, "SELECT text FROM diary WHERE job_id=? ORDER BY n", -1,
                     &st, nullptr);
  sqlite3_bind_int64(st, 1, id);
  while (sqlite3_step(st) == SQLITE_ROW) {
    const char* p = static_cast<const char*>(sqlite3_column_blob(st, 0));
    lines.emplace_back(p ? p : "", sqlite3_column_bytes(st, 0));
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return lines;
}

int64_t TreeBytes(const std::string& dir) {
  int64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    if (it->is_regular_file(ec))
      total += static_cast<int64_t>(it->file_size(ec));
  }
  return total;
}

bool Alive(pid_t pid) { return pid > 0 && kill(pid, 0) == 0; }

TEST(SchedulerFaults, BinaryOutputIsStoredExactlyAndNeverBlocksTheLink) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 3);
  ASSERT_TRUE(c.WaitWorkers(1));
  int64_t binary = c.Submit(
      c.JobFile("binary.yaml",
                "command: [sh, -c, 'printf \"\\377\\000x\\n\"; echo ok']\n"));
  int64_t plain = c.Submit(
      c.JobFile("plain.yaml", "command: [sh, -c, 'sleep 0.3; echo fine']\n"));
  int64_t slow = c.Submit(c.JobFile("slow.yaml", "command: [sleep, '1000']\n"));
  ASSERT_TRUE(c.WaitState(binary, "JOB_STATE_FINISHED", 20000))
      << c.State(binary) << c.Logs();
  ASSERT_TRUE(c.WaitState(plain, "JOB_STATE_FINISHED", 20000));
  ASSERT_TRUE(c.WaitState(slow, "JOB_STATE_RUNNING", 20000));
  Result cancel = c.Cli({"cancel", std::to_string(slow)});
  EXPECT_EQ(cancel.code, 0) << cancel.err;
  EXPECT_TRUE(c.WaitState(slow, "JOB_STATE_CANCELLED", 20000)) << c.State(slow);
  std::vector<std::string> diary = StoredDiary(c, binary);
  ASSERT_EQ(diary.size(), 2u);
  EXPECT_EQ(diary[0], std::string("\377\000x", 3));
  EXPECT_EQ(diary[1], "ok");
  EXPECT_EQ(StoredDiary(c, plain), std::vector<std::string>{"fine"});
}

TEST(SchedulerFaults, RestartWithSlowWorkersRunsNoJobTwice) {
  Cluster c;
  c.StartScheduler(
      {"--heartbeat-interval", "200ms", "--heartbeat-timeout", "2s"});
  c.StartWorker("w1", 2);
  c.StartWorker("w2", 2);
  ASSERT_TRUE(c.WaitWorkers(2));
  std::string ledger = c.dir() + "/ledger";
  std::vector<int64_t> ids;
  for (int i = 0; i < 4; ++i) {
    ids.push_back(c.Submit(
        c.JobFile("j" + std::to_string(i) + ".yaml",
                  "command: [sh, -c, 'sleep 4; echo $DLBATCH_JOB_ID >> " +
                      ledger + "']\n")));
  }
  for (int64_t id : ids) ASSERT_TRUE(c.WaitState(id, "JOB_STATE_RUNNING"));
  c.KillScheduler(SIGKILL);
  // Workers that take longer than the heartbeat timeout to come back (as a
  // connect stuck before SETTINGS did) must find their jobs kept.
  kill(c.worker_pid(0), SIGSTOP);
  kill(c.worker_pid(1), SIGSTOP);
  Sleep(300);
  c.StartScheduler();
  Sleep(2800);  // over the 2 s timeout, within the 4 s grace
  kill(c.worker_pid(0), SIGCONT);
  kill(c.worker_pid(1), SIGCONT);
  std::vector<std::string> args = {"wait"};
  for (int64_t id : ids) args.push_back(std::to_string(id));
  Result wait = c.Cli(args, {}, 60000);
  ASSERT_EQ(wait.code, 0) << wait.out << wait.err << c.Logs();
  Sleep(500);  // a second run would have had time to start
  std::map<std::string, int> runs;
  std::istringstream in(ReadAll(ledger));
  std::string id;
  while (in >> id) ++runs[id];
  for (int64_t job : ids) {
    EXPECT_EQ(runs[std::to_string(job)], 1) << "job " << job;
    EXPECT_EQ(c.ShowJson(job)["attempt"].get<int>(), 1) << "job " << job;
  }
}

TEST(SchedulerFaults, DiaryPastTheCapKeepsFirstAndLastLines) {
  Cluster c;
  c.StartScheduler({"--max-diary-bytes", "2000"});
  c.StartWorker("w1", 1);
  ASSERT_TRUE(c.WaitWorkers(1));
  int64_t id = c.Submit(c.JobFile(
      "flood.yaml",
      "command: [sh, -c, 'for i in $(seq 1 500); do echo line $i; done']\n"));
  ASSERT_TRUE(c.WaitState(id, "JOB_STATE_FINISHED"));
  Result diary = c.Cli({"diary", std::to_string(id)});
  ASSERT_EQ(diary.code, 0) << diary.err;
  EXPECT_EQ(diary.out.rfind("line 1\nline 2\n", 0), 0u) << diary.out;
  EXPECT_NE(diary.out.find("of this diary were dropped here"),
            std::string::npos)
      << diary.out;
  EXPECT_NE(diary.out.find("line 499\nline 500\n"), std::string::npos);
  EXPECT_EQ(diary.out.find("line 250\n"), std::string::npos);
  EXPECT_LT(diary.out.size(), 2600u);
}

TEST(SchedulerFaults, PurgeByIdAndByDateDeletesRowsDiaryAndBlobs) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 2);
  ASSERT_TRUE(c.WaitWorkers(1));
  auto job = [&](const std::string& name) {
    return c.Submit(c.JobFile(
        name + ".yaml", "command: [sh, -c, 'echo " + name + "; echo unique-" +
                            name + " > $DLBATCH_OUTPUT_DIR/out.txt']\n"));
  };
  int64_t first = job("first");
  int64_t second = job("second");
  int64_t running =
      c.Submit(c.JobFile("run.yaml", "command: [sleep, '1000']\n"));
  ASSERT_TRUE(c.WaitState(first, "JOB_STATE_FINISHED"));
  ASSERT_TRUE(c.WaitState(second, "JOB_STATE_FINISHED"));
  ASSERT_TRUE(c.WaitState(running, "JOB_STATE_RUNNING"));
  const std::string blobs = c.scheduler_state() + "/blobs";
  const int64_t before = TreeBytes(blobs);

  Result purge =
      c.Cli({"admin", "purge", std::to_string(first), std::to_string(running)});
  EXPECT_EQ(purge.code, 1) << "a running job cannot be purged";
  EXPECT_NE(purge.err.find("cancel it first"), std::string::npos) << purge.err;
  EXPECT_NE(purge.out.find("purged 1 job"), std::string::npos) << purge.out;
  EXPECT_NE(c.Cli({"show", std::to_string(first)}).code, 0);
  EXPECT_TRUE(StoredDiary(c, first).empty());
  EXPECT_LT(TreeBytes(blobs), before);
  EXPECT_EQ(c.State(running), "JOB_STATE_RUNNING");

  Sleep(1100);
  purge = c.Cli({"admin", "purge", "--before", "1s"});
  EXPECT_EQ(purge.code, 0) << purge.err;
  EXPECT_NE(purge.out.find("purged 1 job"), std::string::npos) << purge.out;
  EXPECT_NE(c.Cli({"show", std::to_string(second)}).code, 0);
  EXPECT_TRUE(StoredDiary(c, second).empty());
  EXPECT_EQ(TreeBytes(blobs), 0);
  Result help = c.Cli({"admin", "purge", "--help"});
  EXPECT_NE(help.out.find("--before"), std::string::npos);
}

TEST(SchedulerFaults, ChurnWithShortRetentionStaysBounded) {
  Cluster c;
  c.StartScheduler({"--keep-ended", "1s"});
  c.StartWorker("w1", 4);
  ASSERT_TRUE(c.WaitWorkers(1));
  const std::string db = c.scheduler_state() + "/dlbatch.db";
  int64_t peak_blobs = 0, after_first_wave = 0;
  std::vector<int64_t> last;
  for (int wave = 0; wave < 4; ++wave) {
    // A wave's jobs end only once all 12 are submitted and `wait` is about
    // to start: on a loaded machine the submits take over --keep-ended, and
    // a job purged before `wait` asks for it is "no job".
    const std::string go = c.dir() + "/go-" + std::to_string(wave);
    std::string file = c.JobFile(
        "churn.yaml", "command: [sh, -c, 'while [ ! -e " + go +
                          " ]; do sleep 0.05; done; sleep 1; head -c 200000 "
                          "/dev/urandom > $DLBATCH_OUTPUT_DIR/data.bin; for i "
                          "in $(seq 1 200); do echo diary line $i of "
                          "$DLBATCH_JOB_ID; done']\n");
    std::vector<int64_t> ids;
    for (int i = 0; i < 12; ++i) ids.push_back(c.Submit(file));
    WriteAll(go, "");
    std::vector<std::string> args = {"wait"};
    for (int64_t id : ids) args.push_back(std::to_string(id));
    Result wait = c.Cli(args, {}, 60000);
    ASSERT_EQ(wait.code, 0) << wait.out << wait.err;
    peak_blobs =
        std::max(peak_blobs, TreeBytes(c.scheduler_state() + "/blobs"));
    if (wave == 0) after_first_wave = TreeBytes(c.scheduler_state());
    last = ids;
    Sleep(700);  // so at most about two waves are younger than --keep-ended
  }
  // Every job ended over a second ago is purged, with its blobs.
  ASSERT_TRUE(WaitFor(
      [&] {
        return c.Cli({"show", std::to_string(last.back())}).code != 0;
      },
      10000));
  EXPECT_TRUE(WaitFor(
      [&] { return TreeBytes(c.scheduler_state() + "/blobs") == 0; }, 5000));
  EXPECT_LE(peak_blobs, 36 * 200000) << "more than three waves of outputs";
  // The database (with its WAL) reuses the space of purged jobs.
  EXPECT_LT(TreeBytes(c.scheduler_state()), 3 * after_first_wave + (8 << 20));
  Result jobs = c.Cli({"jobs"});
  EXPECT_EQ(jobs.code, 0);
}

TEST(SchedulerFaults, FullDiskKeepsTheSchedulerUpAndItRecovers) {
  Cluster c;
  const std::string state = c.scheduler_state();
  ASSERT_EQ(mkdir(state.c_str(), 0700), 0);
  if (mount("tmpfs", state.c_str(), "tmpfs", 0, "size=20m,mode=0700") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs for the state folder ("
                 << strerror(errno) << "); needs root";
  }
  struct Unmount {
    std::string path;
    ~Unmount() { umount2(path.c_str(), MNT_DETACH); }
  } unmount{state};
  // Room to give back later.
  WriteAll(state + "/filler", std::string(6 << 20, 'f'));
  c.StartScheduler({"--min-free-mb", "1", "--heartbeat-timeout", "5s"});
  c.StartWorker("w1", 2);
  ASSERT_TRUE(c.WaitWorkers(1));
  const pid_t pid = c.scheduler_pid();
  // 30 MB of diary into a 20 MB filesystem.
  int64_t flood = c.Submit(c.JobFile(
      "flood.yaml",
      "command: [sh, -c, 'head -c 30000000 /dev/zero | tr \"\\000\" x | "
      "fold -w 1000; echo flood done']\n"));
  // And an output larger than the whole filesystem.
  int64_t big = c.Submit(
      c.JobFile("big.yaml",
                "command: [sh, -c, 'sleep 2; head -c 25000000 /dev/urandom > "
                "$DLBATCH_OUTPUT_DIR/big.bin']\n"));
  ASSERT_TRUE(WaitFor(
      [&] {
        std::string s = c.State(flood);
        return s == "JOB_STATE_FINISHED" || s == "JOB_STATE_FAILED";
      },
      60000))
      << c.State(flood) << ReadAll(c.dir() + "/scheduler.log");
  EXPECT_TRUE(Alive(pid)) << ReadAll(c.dir() + "/scheduler.log");
  EXPECT_EQ(c.Cli({"jobs"}).code, 0);
  ASSERT_TRUE(c.WaitState(big, "JOB_STATE_FAILED", 60000)) << c.State(big);
  std::string reason = c.ShowJson(big)["reason"].get<std::string>();
  EXPECT_FALSE(reason.empty());
  EXPECT_TRUE(Alive(pid));
  Result diary = c.Cli({"diary", std::to_string(flood)});
  EXPECT_NE(diary.out.find("the scheduler's disk was full"), std::string::npos)
      << diary.out.substr(diary.out.size() > 2000 ? diary.out.size() - 2000
                                                  : 0);

  // A new job is refused, saying why and where.
  Result refused = c.Cli({"submit", c.JobFile("x.yaml", "command: [true]\n")});
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.err.find("disk is full"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find(state), std::string::npos) << refused.err;

  // A scheduler started on the full disk serves too (it used to abort in a
  // loop).
  c.KillScheduler(SIGKILL);
  c.StartScheduler();
  const pid_t restarted = c.scheduler_pid();
  Sleep(1000);
  EXPECT_TRUE(Alive(restarted)) << ReadAll(c.dir() + "/scheduler.log");
  EXPECT_EQ(c.Cli({"jobs"}).code, 0);
  EXPECT_EQ(c.State(big), "JOB_STATE_FAILED");
  refused = c.Cli({"submit", c.JobFile("y.yaml", "command: [true]\n")});
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.err.find("disk is full"), std::string::npos) << refused.err;

  // Space returns: new work runs again, by itself.
  ASSERT_EQ(unlink((state + "/filler").c_str()), 0);
  int64_t after = -1;
  ASSERT_TRUE(WaitFor(
      [&] {
        Result r = c.Cli(
            {"submit", "-q", c.JobFile("ok.yaml", "command: [echo, hi]\n")});
        if (r.code != 0) return false;
        after = std::stoll(r.out);
        return true;
      },
      15000));
  EXPECT_TRUE(c.WaitState(after, "JOB_STATE_FINISHED")) << c.State(after);
  EXPECT_TRUE(Alive(restarted));
}

// The loopback address of a scheduler listening on 127.0.0.1:PORT.
struct sockaddr_in LoopbackAddress(const Cluster& c) {
  const int port = std::stoi(c.address().substr(c.address().rfind(':') + 1));
  struct sockaddr_in addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

TEST(SchedulerFaults, ListenerKeepsAcceptingAfterAnIdleConnectionFlood) {
  Cluster c;
  c.StartScheduler({}, "127.0.0.1:0");
  const pid_t pid = c.scheduler_pid();
  // Fewer descriptors than the flood has connections: accept hits EMFILE.
  struct rlimit low = {256, 256};
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, &low, nullptr), 0) << strerror(errno);
  const struct sockaddr_in addr = LoopbackAddress(c);
  std::vector<int> idle;
  for (int i = 0; i < 1500; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    // Plain connects that never speak: no token, no HTTP/2.
    if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) !=
        0) {
      close(fd);
      continue;
    }
    idle.push_back(fd);
  }
  EXPECT_GT(idle.size(), 256u);
  Sleep(1500);
  for (int fd : idle) close(fd);
  const auto start = std::chrono::steady_clock::now();
  Result last;
  EXPECT_TRUE(WaitFor(
      [&] {
        last = c.Cli({"--token-file", c.scheduler_state() + "/token", "jobs"},
                     {}, 3000);
        return last.code == 0;
      },
      10000))
      << last.err << ReadAll(c.dir() + "/scheduler.log");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_TRUE(Alive(pid));
}

// Opening a TCP connection takes no token: connections that have not
// authenticated are bounded in number (the oldest goes) and in time, while
// the worker's stream and a follower, which authenticated, stay.
TEST(SchedulerFaults,
     SilentConnectionsAreBoundedAndClosedAuthenticatedOnesStay) {
  Cluster c;
  c.StartScheduler({"--max-unauthenticated", "20", "--auth-deadline", "2s"},
                   "127.0.0.1:0");
  const struct sockaddr_in addr = LoopbackAddress(c);
  std::vector<int> silent;
  for (int i = 0; i < 100; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(
        connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0)
        << strerror(errno);
    silent.push_back(fd);
    Sleep(2);  // accepted in this order
  }
  // The scheduler speaks first (HTTP/2 settings): what it sent is read
  // and dropped until the end or nothing more.
  auto closed = [](int fd) {
    char buf[4096];
    for (;;) {
      ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) continue;
      return n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
    }
  };
  auto count_closed = [&] {
    int n = 0;
    for (int fd : silent) n += closed(fd);
    return n;
  };
  EXPECT_TRUE(WaitFor([&] { return count_closed() >= 80; }, 1500))
      << count_closed() << " of 100 closed";
  EXPECT_FALSE(closed(silent.back())) << "the newest waits for its deadline";
  EXPECT_TRUE(closed(silent.front())) << "the oldest makes room";

  const std::string token = c.scheduler_state() + "/token";
  c.StartWorker("w1", 1, "local", {"--token-file", token});
  ASSERT_TRUE(WaitFor(
      [&] {
        return c.Cli({"--token-file", token, "workers"}).out.find("online") !=
               std::string::npos;
      },
      15000))
      << c.Logs();
  const std::string job = c.JobFile(
      "slow.yaml", "command: [sh, -c, 'echo one; sleep 4; echo two']\n");
  Result submitted = c.Cli({"--token-file", token, "submit", "-q", job});
  ASSERT_EQ(submitted.code, 0) << submitted.err << c.Logs();
  const std::string id =
      submitted.out.substr(0, submitted.out.find_first_not_of("0123456789"));
  ASSERT_FALSE(id.empty()) << submitted.out;
  // The follower's one call lasts past the deadline.
  Result followed =
      c.Cli({"--token-file", token, "diary", "-f", id}, {}, 30000);
  EXPECT_EQ(followed.code, 0) << followed.err;
  EXPECT_NE(followed.out.find("one"), std::string::npos) << followed.out;
  EXPECT_NE(followed.out.find("two"), std::string::npos) << followed.out;
  Result shown = c.Cli({"--token-file", token, "show", "--json", id});
  EXPECT_NE(shown.out.find("\"state\": \"finished\""), std::string::npos)
      << shown.out << c.Logs();
  EXPECT_NE(shown.out.find("\"attempt\": 1"), std::string::npos) << shown.out;
  // The worker's stream, open all along, is still the same one.
  EXPECT_EQ(ReadAll(c.dir() + "/worker-w1.log").find("reconnect"),
            std::string::npos)
      << ReadAll(c.dir() + "/worker-w1.log");
  EXPECT_EQ(count_closed(), 100);
  for (int fd : silent) close(fd);
  // Silent connections never finish TLS's handshake: the gate, which holds
  // every connection from its accept, closes them and says so.
  EXPECT_NE(ReadAll(c.dir() + "/scheduler.log")
                .find("did not finish a TLS handshake"),
            std::string::npos)
      << ReadAll(c.dir() + "/scheduler.log");
}

TEST(SchedulerFaults, StateFolderIsPrivateWhateverTheUmask) {
  Cluster c;
  const std::string state = c.scheduler_state();
  ASSERT_EQ(mkdir(state.c_str(), 0755), 0);
  ASSERT_EQ(chmod(state.c_str(), 0755), 0);
  const mode_t old = umask(0);  // inherited by the scheduler
  c.StartScheduler();
  umask(old);
  c.StartWorker("w1", 1);
  ASSERT_TRUE(c.WaitWorkers(1));
  int64_t id = c.Submit(c.JobFile("env.yaml", "command: [echo, hi]\n"));
  ASSERT_TRUE(c.WaitState(id, "JOB_STATE_FINISHED"));
  auto mode = [](const std::string& path) -> int {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return -1;
    return st.st_mode & 07777;
  };
  EXPECT_EQ(mode(state), 0700);
  EXPECT_EQ(mode(state + "/dlbatch.db"), 0600);
  EXPECT_EQ(mode(state + "/dlbatch.db-wal"), 0600);
  EXPECT_EQ(mode(state + "/dlbatch.db-shm"), 0600);
  std::string socket = c.address().substr(c.address().find(':') + 1);
  EXPECT_EQ(mode(socket) & 0077, 0) << socket;
}

}  // namespace
}  // namespace dlbatch::testing
