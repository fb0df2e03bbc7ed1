// Text a user or a job wrote, in the CLI's human output through the real
// scheduler and worker: escape sequences in job names, drain reasons,
// worker names and what error messages quote are shown escaped, never sent
// to the terminal of whoever looks (another user included); non-ASCII text
// is shown as itself and tables line up by display width.
#include <gtest/gtest.h>
#include <locale.h>
#include <sys/stat.h>
#include <unistd.h>
#include <wchar.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

// An OSC that retitles the terminal, a BEL, and a clear-screen CSI; a C1
// CSI (U+009B) too.
constexpr char kEvil[] =
    "x\x1b]0;pwned\x07\x1b[2J\xc2\x9b"
    "5m";
constexpr char kEvilShown[] = R"(x\x1b]0;pwned\x07\x1b[2J\xc2\x9b5m)";

// The output's characters under C.UTF-8 (L'\xFFFD' for each byte that is
// not UTF-8); the test's own locale stays as it is.
std::wstring Wide(const std::string& text) {
  static const locale_t utf8 =
      newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
  const locale_t before = uselocale(utf8);
  std::wstring out;
  mbstate_t state{};
  for (size_t i = 0; i < text.size();) {
    wchar_t wc = 0;
    const size_t n = mbrtowc(&wc, text.data() + i, text.size() - i, &state);
    if (n == static_cast<size_t>(-1) || n == static_cast<size_t>(-2)) {
      out.push_back(L'\xFFFD');
      state = mbstate_t{};
      ++i;
      continue;
    }
    out.push_back(wc);
    i += n == 0 ? 1 : n;
  }
  uselocale(before);
  return out;
}

// The display cells of `text`, by glibc's wcswidth (the test's oracle).
int Cells(const std::string& text) {
  static const locale_t utf8 =
      newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
  const std::wstring wide = Wide(text);
  const locale_t before = uselocale(utf8);
  const int cells = wcswidth(wide.c_str(), wide.size());
  uselocale(before);
  return cells;
}

// `text` with every byte outside printable ASCII as \xHH: for failure
// messages, which must not drive the terminal of whoever reads them either.
std::string Visible(const std::string& text) {
  std::string out;
  for (char ch : text) {
    const auto b = static_cast<unsigned char>(ch);
    if ((b >= 0x20 && b < 0x7f) || b == '\n') {
      out.push_back(ch);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", b);
      out += hex;
    }
  }
  return out;
}

// Why `text` is not safe for a terminal ("" when it is): it is valid UTF-8
// and holds no control character but newline (C0, DEL, C1).
std::string Unsafe(const std::string& text) {
  for (wchar_t wc : Wide(text)) {
    if (wc == L'\xFFFD') return "a byte that is not UTF-8";
    if ((wc < 0x20 && wc != L'\n') || (wc >= 0x7f && wc < 0xa0)) {
      char hex[32];
      std::snprintf(hex, sizeof hex, "control U+%04X", static_cast<int>(wc));
      return hex;
    }
  }
  return "";
}

#define EXPECT_TERMINAL_SAFE(result, what)                        \
  do {                                                            \
    EXPECT_EQ(Unsafe((result).out), "") << (what) << " stdout:\n" \
                                        << Visible((result).out); \
    EXPECT_EQ(Unsafe((result).err), "") << (what) << " stderr:\n" \
                                        << Visible((result).err); \
  } while (0)

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

class TerminalTextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // As root, the evil job is another user's (nobody's, by setpriv), as
    // on a shared cluster; otherwise the test's own.
    as_nobody_ = geteuid() == 0;
    if (as_nobody_) {
      ASSERT_EQ(chmod(c_.dir().c_str(), 0711), 0);
      c_.StartScheduler({"--socket-mode", "0666"});
    } else {
      c_.StartScheduler();
    }
  }

  // The CLI as the other user (nobody) where the test can be them.
  Result Other(const std::vector<std::string>& args) {
    if (!as_nobody_) return c_.Cli(args);
    std::vector<std::string> argv = {"setpriv", "--reuid=65534",
                                     "--regid=65534", "--clear-groups"};
    for (const std::string& a : c_.CliArgv(args)) argv.push_back(a);
    return Exec(argv, {{"HOME", "/tmp"}, {"XDG_STATE_HOME", "/tmp"}}, 60000);
  }

  int64_t SubmitQ(const std::vector<std::string>& args, bool other) {
    std::vector<std::string> argv = {"submit", "-q"};
    argv.insert(argv.end(), args.begin(), args.end());
    Result r = other ? Other(argv) : c_.Cli(argv);
    EXPECT_EQ(r.code, 0) << Visible(r.out + r.err);
    return r.code == 0 ? std::stoll(r.out) : -1;
  }

  bool as_nobody_ = false;
  Cluster c_;
};

TEST_F(TerminalTextTest, EscapeSequencesInWhatOthersWroteAreShownNotSent) {
  // (Bytes that are not UTF-8 never get this far: a proto string refuses
  // them, and the unit tests show them escaped.)
  const std::string worker = "w\x1b[31m-\xc2\x9b";
  c_.StartWorker(worker, 1);
  ASSERT_TRUE(c_.WaitWorkers(1));
  // Its environment and the name of the output it stores hold escapes too.
  const int64_t id =
      SubmitQ({"--name", kEvil, "--env", std::string("OUT=f\x1b[2J.txt"), "--",
               "sh", "-c", "echo hi > \"$DLBATCH_OUTPUT_DIR/$OUT\""},
              /*other=*/true);
  ASSERT_GT(id, 0);
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_FINISHED")) << c_.Logs();
  const std::string sid = std::to_string(id);

  Result drain = c_.Cli({"admin", "drain", worker, "--reason", kEvil});
  EXPECT_EQ(drain.code, 0) << Visible(drain.err);
  EXPECT_TERMINAL_SAFE(drain, "admin drain");
  EXPECT_NE(drain.out.find(kEvilShown), std::string::npos)
      << Visible(drain.out);
  EXPECT_NE(drain.out.find(R"(w\x1b[31m-\xc2\x9b)"), std::string::npos)
      << Visible(drain.out);

  struct Seen {
    std::vector<std::string> args;
    bool names_job;  // the output shows the job's name
  };
  for (const Seen& seen : std::vector<Seen>{
           {{"jobs"}, true},
           {{"jobs", "--format", "id,name,user,note"}, true},
           {{"show", sid}, true},
           {{"workers"}, false},
           {{"monitor", "--once"}, true},
           {{"wait", sid}, false},
       }) {
    const std::string what = seen.args[0];
    Result r = c_.Cli(seen.args);
    EXPECT_EQ(r.code, 0) << what << ": " << Visible(r.err);
    EXPECT_TERMINAL_SAFE(r, what);
    if (seen.names_job) {
      EXPECT_NE(r.out.find(kEvilShown), std::string::npos) << what << ":\n"
                                                           << Visible(r.out);
    }
  }
  for (const char* what : {"workers", "monitor"}) {
    Result r = std::string_view(what) == "workers"
                   ? c_.Cli({"workers"})
                   : c_.Cli({"monitor", "--once"});
    EXPECT_NE(r.out.find(kEvilShown), std::string::npos)  // the drain reason
        << what << ":\n"
        << Visible(r.out);
    EXPECT_NE(r.out.find(R"(w\x1b[31m-\xc2\x9b)"), std::string::npos)
        << what << ":\n"
        << Visible(r.out);
  }
  // The outputs' file names, listed and fetched.
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{
           {"fetch-outputs", "--list", sid},
           {"fetch-outputs", "-o", c_.dir() + "/fetched", sid}}) {
    Result r = c_.Cli(args);
    EXPECT_EQ(r.code, 0) << Visible(r.out + r.err);
    EXPECT_TERMINAL_SAFE(r, args[1]);
    EXPECT_NE(r.out.find(R"(f\x1b[2J.txt)"), std::string::npos)
        << Visible(r.out);
  }
  // A limit's user name, as the admin typed it.
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{
           {"admin", "limit", "set", kEvil, "--profile", "local", "--slots",
            "2"},
           {"admin", "limit", "list"}}) {
    Result r = c_.Cli(args);
    EXPECT_EQ(r.code, 0) << Visible(r.out + r.err);
    EXPECT_TERMINAL_SAFE(r, args[2]);
    EXPECT_NE(r.out.find(kEvilShown), std::string::npos) << Visible(r.out);
  }

  // The other user sees the same listing, as safely.
  Result theirs = Other({"jobs"});
  EXPECT_EQ(theirs.code, 0) << Visible(theirs.err);
  EXPECT_TERMINAL_SAFE(theirs, "jobs as the other user");

  // Error messages quote what was typed: from the CLI's own checks and
  // from the scheduler's.
  Result bad_env = Other({"submit", "--env", kEvil, "--", "true"});
  EXPECT_NE(bad_env.code, 0);
  EXPECT_TERMINAL_SAFE(bad_env, "submit --env");
  EXPECT_NE(bad_env.err.find(kEvilShown), std::string::npos)
      << Visible(bad_env.err);
  Result no_worker = c_.Cli({"admin", "drain", kEvil});
  EXPECT_NE(no_worker.code, 0);
  EXPECT_TERMINAL_SAFE(no_worker, "admin drain of no worker");
  EXPECT_NE(no_worker.err.find(kEvilShown), std::string::npos)
      << Visible(no_worker.err);
  Result no_profile = Other({"submit", "--profile", kEvil, "--", "true"});
  EXPECT_NE(no_profile.code, 0);
  EXPECT_TERMINAL_SAFE(no_profile, "submit --profile");

  Result resume = c_.Cli({"admin", "resume", worker});
  EXPECT_EQ(resume.code, 0) << Visible(resume.err);
  EXPECT_TERMINAL_SAFE(resume, "admin resume");
}

// The display column at which `field` starts in `line` ("" not in it: -1).
int ColumnOf(const std::string& line, const std::string& field) {
  const size_t at = line.rfind(field);
  if (at == std::string::npos) return -1;
  return Cells(line.substr(0, at));
}

TEST_F(TerminalTextTest, NonAsciiNamesShowAsThemselvesAndTablesLineUp) {
  const std::string worker = "wörker-日本";
  c_.StartWorker(worker, 1);
  ASSERT_TRUE(c_.WaitWorkers(1));
  // Latin with a precomposed and a combining accent, CJK (two cells each).
  const std::vector<std::string> names = {
      "plain", "grüße-ü", "résnet-日本", "e\xcc\x81-combining", "日本語の名前"};
  std::vector<int64_t> ids;
  for (const std::string& name : names) {
    ids.push_back(SubmitQ({"--name", name, "--", "true"}, /*other=*/false));
    ASSERT_GT(ids.back(), 0);
  }
  for (int64_t id : ids) ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_FINISHED"));

  // jobs: the USER column (after NAME) starts at one display column.
  Result jobs = c_.Cli({"jobs", "--format", "id,name,user"});
  ASSERT_EQ(jobs.code, 0) << jobs.err;
  std::vector<std::string> lines = Lines(jobs.out);
  ASSERT_EQ(lines.size(), names.size() + 1) << jobs.out;
  const int user_column = ColumnOf(lines[0], "USER");
  ASSERT_GT(user_column, 0);
  const std::string user = c_.ShowJson(ids[0]).value("user", "");
  ASSERT_FALSE(user.empty());
  for (size_t i = 1; i < lines.size(); ++i) {
    EXPECT_EQ(ColumnOf(lines[i], user), user_column) << jobs.out;
  }
  for (const std::string& name : names) {
    EXPECT_NE(jobs.out.find(name), std::string::npos) << jobs.out;
  }

  // workers: HOST (after NAME) lines up under its header.
  Result workers = c_.Cli({"workers"});
  ASSERT_EQ(workers.code, 0) << workers.err;
  lines = Lines(workers.out);
  ASSERT_EQ(lines.size(), 2u) << workers.out;
  EXPECT_NE(lines[1].find(worker), std::string::npos) << workers.out;
  const size_t name_end = lines[1].find(worker) + worker.size();
  const size_t host = lines[1].find_first_not_of(' ', name_end);
  ASSERT_NE(host, std::string::npos) << workers.out;
  EXPECT_EQ(Cells(lines[1].substr(0, host)), ColumnOf(lines[0], "HOST"))
      << workers.out;

  // monitor --once: the names as themselves, never as '?', and its jobs
  // table lines up too (USER after NAME).
  Result monitor = c_.Cli({"monitor", "--once"});
  ASSERT_EQ(monitor.code, 0) << monitor.err;
  EXPECT_NE(monitor.out.find("résnet-日本"), std::string::npos) << monitor.out;
  EXPECT_NE(monitor.out.find(worker), std::string::npos) << monitor.out;
  EXPECT_EQ(monitor.out.find('?'), std::string::npos) << monitor.out;
  lines = Lines(monitor.out);
  int header_user = -1;
  int rows = 0;
  for (const std::string& line : lines) {
    if (line.rfind("ID ", 0) == 0 && line.find("NAME") != std::string::npos) {
      header_user = ColumnOf(line, "USER");
      continue;
    }
    if (header_user < 0) continue;
    for (const std::string& name : names) {
      if (line.find(name) == std::string::npos) continue;
      const size_t user_at = line.find(" " + user + " ");
      ASSERT_NE(user_at, std::string::npos) << line;
      EXPECT_EQ(Cells(line.substr(0, user_at + 1)), header_user) << monitor.out;
      ++rows;
    }
  }
  EXPECT_EQ(rows, static_cast<int>(names.size())) << monitor.out;
}

}  // namespace
}  // namespace dlbatch::testing
