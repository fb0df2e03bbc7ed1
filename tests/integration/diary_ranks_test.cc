// Each diary line carries the part and rank that wrote it, through the real
// scheduler, two real workers and the CLI: `diary --json`'s part and rank,
// `diary --rank`, the text view's [N] labels (as srun --label) for a job of
// several processes and none for a job of one, and --rank's usage errors.
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

constexpr auto npos = std::string::npos;

// Each part prints five numbered lines, a little apart, so that the two
// parts' lines interleave in the diary.
constexpr char kTwoParts[] =
    "name: two-parts\npool: 2\nmax_nodes: 2\n"
    "command: [sh, -c, 'for i in 1 2 3 4 5; do echo \"part $DLBATCH_PART "
    "line $i\"; sleep 0.05; done']\n";

std::vector<nlohmann::json> JsonLines(const std::string& out) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

class DiaryRanksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    c_.StartScheduler();
    c_.StartWorker("w1", 1);
    c_.StartWorker("w2", 1);
    ASSERT_TRUE(c_.WaitWorkers(2)) << c_.Logs();
  }
  Result Diary(int64_t id, std::vector<std::string> flags = {}) {
    flags.insert(flags.begin(), {"diary", std::to_string(id)});
    Result r = c_.Cli(flags);
    EXPECT_EQ(r.code, 0) << r.err;
    return r;
  }
  Cluster c_;
};

TEST_F(DiaryRanksTest, APartsLinesCarryItsPartAndRankAndKeepTheirOrder) {
  const int64_t id = c_.Submit(c_.JobFile("two.yaml", kTwoParts));
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_FINISHED")) << c_.Logs();
  ASSERT_EQ(c_.ShowJson(id)["placement"].size(), 2u) << c_.ShowJson(id);

  // --json: every line of a process names its part and rank (a command
  // job's one process per part: rank = part); dlbatch's own lines none.
  std::map<int, std::vector<std::string>> texts;  // by rank
  std::map<int, int64_t> last_seq;
  for (const nlohmann::json& line : JsonLines(Diary(id, {"--json"}).out)) {
    if (line["stream"] == 0) {
      EXPECT_TRUE(line["rank"].is_null()) << line;
      continue;
    }
    ASSERT_TRUE(line["rank"].is_number()) << line;
    const int rank = line["rank"];
    EXPECT_EQ(line["part"], rank) << line;
    const std::string text = line["text"];
    EXPECT_EQ(text.rfind("part " + std::to_string(rank) + " ", 0), 0u)
        << "rank " << rank << " labels another part's line: " << line;
    // Each part's lines in the order it printed them.
    const int64_t seq = line["seq"];
    EXPECT_GT(seq, last_seq[rank]) << line;
    last_seq[rank] = seq;
    texts[rank].push_back(text);
  }
  ASSERT_EQ(texts.size(), 2u);
  for (int rank : {0, 1}) {
    std::vector<std::string> want;
    for (int i = 1; i <= 5; ++i)
      want.push_back("part " + std::to_string(rank) + " line " +
                     std::to_string(i));
    EXPECT_EQ(texts[rank], want) << "rank " << rank;
  }

  // --rank 1: only part 1's lines, labelled, in order; none of dlbatch's.
  EXPECT_EQ(Diary(id, {"--rank", "1"}).out,
            "[1] part 1 line 1\n[1] part 1 line 2\n[1] part 1 line 3\n"
            "[1] part 1 line 4\n[1] part 1 line 5\n");
  for (const nlohmann::json& line :
       JsonLines(Diary(id, {"--rank", "1", "--json"}).out)) {
    EXPECT_EQ(line["rank"], 1) << line;
  }
  // --tail counts the selected rank's lines only.
  EXPECT_EQ(Diary(id, {"--rank", "0", "--tail", "2"}).out,
            "[0] part 0 line 4\n[0] part 0 line 5\n");
  // Both, as a list; a rank the job does not have: nothing.
  EXPECT_EQ(JsonLines(Diary(id, {"--rank", "0,1", "--json"}).out).size(), 10u);
  EXPECT_EQ(Diary(id, {"--rank", "7"}).out, "");

  // The text view labels each process's line [N], and only those.
  int labelled = 0;
  std::istringstream all(Diary(id).out);
  for (std::string line; std::getline(all, line);) {
    if (line.rfind("part ", 0) == 0) ADD_FAILURE() << "unlabelled: " << line;
    if (line.rfind("[0] part 0 line ", 0) == 0 ||
        line.rfind("[1] part 1 line ", 0) == 0) {
      ++labelled;
    } else {
      EXPECT_EQ(line.rfind("[dlbatch]", 0), 0u) << line;
    }
  }
  EXPECT_EQ(labelled, 10);
}

TEST_F(DiaryRanksTest, AJobOfOneProcessIsNotLabelled) {
  const int64_t id =
      c_.Submit(c_.JobFile("one.yaml",
                           "name: one\ncommand: [sh, -c, 'echo solo; echo "
                           "again >&2']\n"));
  ASSERT_TRUE(c_.WaitState(id, "JOB_STATE_FINISHED")) << c_.Logs();
  const std::string text = Diary(id).out;
  EXPECT_NE(text.find("solo\n"), npos) << text;
  EXPECT_EQ(text.find("[0]"), npos) << text;
  std::vector<nlohmann::json> lines = JsonLines(Diary(id, {"--json"}).out);
  ASSERT_FALSE(lines.empty());
  int seen = 0;
  for (const nlohmann::json& line : lines) {
    if (line["stream"] == 0) continue;
    EXPECT_EQ(line["rank"], 0) << line;
    EXPECT_EQ(line["part"], 0) << line;
    ++seen;
  }
  EXPECT_EQ(seen, 2);
  EXPECT_EQ(Diary(id, {"--rank", "0"}).out.find("[0]"), npos);
}

TEST_F(DiaryRanksTest, ABadRankIsRefusedSayingWhatToGive) {
  const struct {
    const char* rank;
    const char* says;
  } cases[] = {
      {"x", "--rank x: not a rank; give a rank (a number from 0"},
      {"-1", "--rank -1: ranks are numbered from 0, never negative"},
      {"2-1", "a range goes from the lower rank to the higher"},
      {"1,", "an empty rank"},
  };
  for (const auto& bad : cases) {
    Result r = c_.Cli({"diary", "1", "--rank", bad.rank});
    EXPECT_EQ(r.code, 2) << bad.rank << ": " << r.err;
    EXPECT_NE(r.err.find(bad.says), npos) << bad.rank << ": " << r.err;
    EXPECT_EQ(r.out, "");
  }
}

}  // namespace
}  // namespace dlbatch::testing
