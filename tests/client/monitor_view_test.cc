// The monitor's screen as pure functions: rows, the cluster panel, the
// whole 80x24 screen, the plain snapshot, and key decoding.
#include "client/monitor_view.h"

#include <string>

#include "client/diary_text.h"
#include "client/format.h"
#include "client/monitor_terminal.h"
#include "client/terminal_text.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dlbatch::client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kNow = 1'700'000'100'000;

v1::Job TrainJob() {
  v1::Job job;
  job.set_id(42);
  job.set_user("alice");
  job.set_state(v1::JOB_STATE_RUNNING);
  job.mutable_spec()->set_name("lenet-fashion");
  job.mutable_spec()->set_pool(4);
  job.set_start_time_ms(kNow - 125'000);
  auto* part = job.add_placement();
  part->set_worker_id(1);
  for (int d : {0, 1, 2, 3}) part->add_devices(d);
  v1::TrainProgress* p = job.mutable_progress();
  p->set_iteration(470);
  p->set_iterations(940);
  p->set_loss(0.3456);
  p->set_accuracy(87.5);
  p->set_eta_s(130);
  return job;
}

v1::WorkerInfo Worker(int64_t id, const std::string& name, int slots,
                      bool online) {
  v1::WorkerInfo w;
  w.set_id(id);
  w.set_name(name);
  w.set_online(online);
  for (int i = 0; i < slots; ++i) {
    auto* d = w.add_devices();
    d->set_index(i);
    d->set_kind("cpu");
  }
  w.set_free_slots(slots);
  return w;
}

ClusterModel Model() {
  ClusterModel model;
  v1::ClusterEvent e;
  *e.mutable_worker() = Worker(1, "gpu-node-1", 8, true);
  e.mutable_worker()->set_free_slots(4);
  model.Apply(e);
  *e.mutable_worker() = Worker(2, "gpu-node-2", 2, false);
  model.Apply(e);
  e.Clear();
  *e.mutable_job() = TrainJob();
  model.Apply(e);
  v1::Job queued;
  queued.set_id(43);
  queued.set_user("bob");
  queued.set_state(v1::JOB_STATE_QUEUED);
  queued.mutable_spec()->set_name("resnet-sweep");
  queued.mutable_spec()->set_pool(8);
  queued.set_wait_reason("waiting for 8 slots on 'local': 4 free");
  *e.mutable_job() = queued;
  model.Apply(e);
  v1::Job done;
  done.set_id(41);
  done.set_user("carol");
  done.set_state(v1::JOB_STATE_CANCELLED);
  done.mutable_spec()->set_name("cmd");
  done.mutable_spec()->set_pool(1);
  done.set_start_time_ms(kNow - 60'000);
  done.set_end_time_ms(kNow - 30'000);
  done.set_reason("cancelled by request");
  *e.mutable_job() = done;
  model.Apply(e);
  return model;
}

TEST(MonitorView, TrainJobRowShowsBarLossAccuracyAndTimesIn80Columns) {
  std::string row = JobRow(TrainJob(), kNow, 80, /*selected=*/true);
  EXPECT_LE(row.size(), 80u) << row;
  EXPECT_THAT(row, HasSubstr("   42 "));
  EXPECT_THAT(row, HasSubstr("alice"));
  EXPECT_THAT(row, HasSubstr("running"));
  EXPECT_THAT(row, HasSubstr("[###....]  50%"));
  EXPECT_THAT(row, HasSubstr("0.346"));
  EXPECT_THAT(row, HasSubstr("87.5"));
  EXPECT_THAT(row, HasSubstr("2:05/2:10"));  // elapsed / ETA
  EXPECT_EQ(row[0], '>');
  EXPECT_EQ(JobRow(TrainJob(), kNow, 80, false)[0], ' ');
}

TEST(MonitorView, RowsCutToNarrowTerminalsAndWidenTheNameOnWideOnes) {
  v1::Job job = TrainJob();
  job.mutable_spec()->set_name("a-rather-long-job-name-for-a-sweep");
  for (int cols : {20, 40, 79, 80, 120, 200}) {
    std::string row = JobRow(job, kNow, cols, false);
    EXPECT_LE(static_cast<int>(row.size()), cols) << row;
    EXPECT_LE(static_cast<int>(JobsHeader(cols).size()), cols);
  }
  EXPECT_THAT(JobRow(job, kNow, 200, false),
              HasSubstr("a-rather-long-job-name-for-a-sweep"));
  EXPECT_THAT(JobRow(job, kNow, 80, false), Not(HasSubstr("for-a-sweep")));
}

TEST(MonitorView, QueuedRowsSayWhyTheyWaitAndTextIsMadePrintable) {
  ClusterModel model = Model();
  std::string row = JobRow(model.jobs.at(43), kNow, 80, false);
  EXPECT_THAT(row, HasSubstr("queued"));
  EXPECT_THAT(row, HasSubstr("waiting for 8 slots"));
  v1::Job evil = model.jobs.at(43);
  evil.mutable_spec()->set_name("x\x1b[2Jy\xc3\xa9\xff");
  evil.set_wait_reason("held\x07\xc2\x9b");
  std::string cleaned = JobRow(evil, kNow, 120, false);
  EXPECT_EQ(cleaned.find('\x1b'), std::string::npos);
  // Escaped as `dlbatch diary` shows them; the valid é stays itself.
  EXPECT_THAT(cleaned, HasSubstr(R"(x\x1b[2Jy)"
                                 "\xc3\xa9"
                                 R"(\xff)"));
  EXPECT_THAT(cleaned, HasSubstr(R"(held\x07\xc2\x9b)"));
  EXPECT_EQ(TerminalText(cleaned), cleaned);
}

// Text that is not ASCII shows as itself, laid out by display width: wide
// (CJK) characters take two cells, combining marks none, and a cut never
// falls inside a character.
TEST(MonitorView, NonAsciiNamesShowAsThemselvesInTheirCells) {
  const std::string name =
      "r\xc3\xa9snet-\xe6\x97\xa5\xe6\x9c\xac";  // résnet-日本
  v1::Job job = TrainJob();
  job.mutable_spec()->set_name(name);
  job.set_user("j\xc3\xbcrgen");  // jürgen
  const std::string row = JobRow(job, kNow, 120, false);
  EXPECT_THAT(row, HasSubstr(name));
  // At 80 columns NAME has 9 cells: résnet-日, never half of 本.
  EXPECT_THAT(JobRow(job, kNow, 80, false),
              HasSubstr(" r\xc3\xa9snet-\xe6\x97\xa5 j\xc3\xbcrgen "));
  EXPECT_THAT(row, HasSubstr("j\xc3\xbcrgen"));
  EXPECT_THAT(row, Not(HasSubstr("?")));
  // Every column after NAME starts where the header's does.
  const std::string header = JobsHeader(120);
  const std::string plain = JobRow(TrainJob(), kNow, 120, false);
  EXPECT_EQ(DisplayWidth(row.substr(0, row.find("j\xc3\xbcrgen"))),
            DisplayWidth(header.substr(0, header.find("USER"))));
  EXPECT_EQ(DisplayWidth(row), DisplayWidth(plain)) << row;
  for (int cols : {20, 33, 34, 35, 40, 80}) {
    const std::string cut = JobRow(job, kNow, cols, false);
    EXPECT_LE(DisplayWidth(cut), cols) << cut;
    EXPECT_EQ(ValidUtf8(cut), cut) << cols;
  }
  // A name cut in its cell: 日本 whole or 日 alone, never half of 本.
  job.mutable_spec()->set_name(
      "\xe6\x97\xa5\xe6\x9c\xac\xe6\x97\xa5\xe6\x9c\xac");
  for (int cols = 30; cols < 60; ++cols) {
    const std::string cut = JobRow(job, kNow, cols, false);
    EXPECT_EQ(ValidUtf8(cut), cut) << cols;
    EXPECT_LE(DisplayWidth(cut), cols);
  }
  EXPECT_EQ(Fit(name, 9), "r\xc3\xa9snet-\xe6\x97\xa5");
  EXPECT_EQ(Fit(name, 8), "r\xc3\xa9snet- ");  // 日 does not fit
  EXPECT_EQ(Clip(name, 8), "r\xc3\xa9snet-");

  ClusterModel model = Model();
  v1::ClusterEvent e;
  *e.mutable_worker() = Worker(3, "w\xc3\xb6rker-\xe6\x97\xa5", 2, true);
  model.Apply(e);
  e.Clear();
  *e.mutable_job() = job;
  e.mutable_job()->mutable_spec()->set_name(name);
  model.Apply(e);
  MonitorScreen screen;
  screen.cols = 100;
  auto lines = RenderMain(model, screen, kNow);
  std::string all;
  for (const auto& line : lines) {
    EXPECT_LE(DisplayWidth(line), 100) << line;
    all += line + "\n";
  }
  EXPECT_THAT(all, HasSubstr(name));
  EXPECT_THAT(all, HasSubstr("w\xc3\xb6rker-\xe6\x97\xa5"));
  const std::string text = PlainSnapshot(model, kNow);
  EXPECT_THAT(text, HasSubstr(name));
  EXPECT_THAT(text, HasSubstr("w\xc3\xb6rker-\xe6\x97\xa5"));
  EXPECT_THAT(text, Not(HasSubstr("?")));
}

TEST(MonitorView, PlainSnapshotEscapesWhatJobsAndAdminsWrote) {
  ClusterModel model = Model();
  v1::ClusterEvent e;
  v1::WorkerInfo w = Worker(3, "w\x1b]0;x\x07", 1, true);
  w.set_draining(true);
  w.set_drain_reason("disk\x1b[2J");
  *e.mutable_worker() = w;
  model.Apply(e);
  const std::string text = PlainSnapshot(model, kNow);
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << TerminalText(text);
  EXPECT_EQ(text.find('\x07'), std::string::npos) << TerminalText(text);
  EXPECT_THAT(text, HasSubstr(R"(w\x1b]0;x\x07)"));
  EXPECT_THAT(text, HasSubstr(R"(disk\x1b[2J)"));
}

TEST(MonitorView, WorkerLinesMarkEachSlotWithTheJobHoldingIt) {
  ClusterModel model = Model();
  auto lines = WorkerLines(model, 80);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_THAT(lines[0], HasSubstr("gpu-node-1"));
  EXPECT_THAT(lines[0], HasSubstr("online"));
  EXPECT_THAT(lines[0], HasSubstr("[1111....]"));
  EXPECT_THAT(lines[0], HasSubstr("1=#42"));
  EXPECT_THAT(lines[1], HasSubstr("offline"));
  EXPECT_THAT(lines[1], HasSubstr("[--]"));
}

TEST(MonitorView, MainScreenFillsExactly80x24) {
  ClusterModel model = Model();
  MonitorScreen screen;
  screen.title = "unix:/tmp/sock";
  screen.selected_job = 43;
  screen.footer = " q quit";
  auto lines = RenderMain(model, screen, kNow);
  ASSERT_EQ(lines.size(), 24u);
  for (const auto& line : lines) EXPECT_LE(line.size(), 80u) << line;
  std::string all;
  for (const auto& line : lines) all += line + "\n";
  EXPECT_THAT(all, HasSubstr("gpu-node-1"));
  EXPECT_THAT(all, HasSubstr(">   43"));
  EXPECT_THAT(all, HasSubstr("cancelled by request"));
  // Running first, then queued, then ended.
  EXPECT_LT(all.find("   42 "), all.find("   43 "));
  EXPECT_LT(all.find("   43 "), all.find("   41 "));
  EXPECT_EQ(lines.back(), " q quit");
}

TEST(MonitorView, FilterMatchesNameUserOrState) {
  ClusterModel model = Model();
  EXPECT_EQ(ListedJobs(model, "").size(), 3u);
  ASSERT_EQ(ListedJobs(model, "BOB").size(), 1u);
  EXPECT_EQ(ListedJobs(model, "BOB")[0]->id(), 43);
  ASSERT_EQ(ListedJobs(model, "runn").size(), 1u);
  EXPECT_EQ(ListedJobs(model, "runn")[0]->id(), 42);
  EXPECT_EQ(ListedJobs(model, "lenet")[0]->id(), 42);
  EXPECT_TRUE(ListedJobs(model, "nothing-like-it").empty());
}

TEST(MonitorView, EndedJobsBeyondTheLimitAreDropped) {
  ClusterModel model;
  v1::ClusterEvent e;
  for (int id = 1; id <= 10; ++id) {
    e.mutable_job()->set_id(id);
    e.mutable_job()->set_state(id == 3 ? v1::JOB_STATE_RUNNING
                                       : v1::JOB_STATE_FINISHED);
    model.Apply(e, /*keep_ended=*/4);
  }
  std::vector<int64_t> ids;
  for (const auto& [id, job] : model.jobs) ids.push_back(id);
  EXPECT_EQ(ids, (std::vector<int64_t>{3, 7, 8, 9, 10}));
}

TEST(MonitorView, PlainSnapshotListsWorkersAndJobs) {
  std::string text = PlainSnapshot(Model(), kNow);
  EXPECT_THAT(text, HasSubstr("gpu-node-1"));
  EXPECT_THAT(text, HasSubstr("[1111....]"));
  EXPECT_THAT(text, HasSubstr("lenet-fashion"));
  EXPECT_THAT(text, HasSubstr("50%"));
  EXPECT_THAT(text, HasSubstr("waiting for 8 slots"));
}

// An open monitor drops a worker an admin removed (or the scheduler forgot)
// instead of showing it offline until restarted.
TEST(MonitorView, ARemovedWorkerLeavesTheModel) {
  ClusterModel model = Model();
  ASSERT_THAT(PlainSnapshot(model, kNow), HasSubstr("gpu-node-2"));
  v1::ClusterEvent e;
  *e.mutable_worker() = Worker(2, "gpu-node-2", 2, false);
  e.mutable_worker()->set_removed(true);
  model.Apply(e);
  EXPECT_EQ(model.workers.count(2), 0u);
  EXPECT_THAT(PlainSnapshot(model, kNow), Not(HasSubstr("gpu-node-2")));
  EXPECT_THAT(PlainSnapshot(model, kNow), HasSubstr("gpu-node-1"));
}

TEST(MonitorView, ShortDurations) {
  EXPECT_EQ(ShortDuration(42'000), "42s");
  EXPECT_EQ(ShortDuration(725'000), "12:05");
  EXPECT_EQ(ShortDuration(3'720'000), "1h02m");
  EXPECT_EQ(ShortDuration(3 * 86'400'000LL + 4 * 3'600'000LL), "3d04h");
  EXPECT_EQ(ShortDuration(-1), "-");
}

TEST(MonitorKeys, DecodesArrowsEscapeAndCharacters) {
  auto keys = DecodeKeys("j\x1b[A\x1b[B\x1bOAq\x1b\x7f\r\x1b[5~");
  ASSERT_EQ(keys.size(), 9u);
  EXPECT_EQ(keys[0].kind, KeyKind::kChar);
  EXPECT_EQ(keys[0].ch, 'j');
  EXPECT_EQ(keys[1].kind, KeyKind::kUp);
  EXPECT_EQ(keys[2].kind, KeyKind::kDown);
  EXPECT_EQ(keys[3].kind, KeyKind::kUp);
  EXPECT_EQ(keys[4].ch, 'q');
  EXPECT_EQ(keys[5].kind, KeyKind::kEscape);
  EXPECT_EQ(keys[6].kind, KeyKind::kBackspace);
  EXPECT_EQ(keys[7].kind, KeyKind::kEnter);
  EXPECT_EQ(keys[8].kind, KeyKind::kPageUp);
}

// The NOTE of `jobs` and the monitor while a job is preempted, and after.
TEST(JobNoteTest, SaysAPreemptionUnderWayAndByWhomAQueuedJobWasPreempted) {
  v1::Job job = TrainJob();
  job.set_attempt(1);
  v1::Preemption* p = job.add_preemptions();
  p->set_by_job(7);
  p->set_by_priority(10);
  p->set_kind("priority");
  p->set_attempt(1);
  EXPECT_EQ(JobNote(job), "preempted by job 7: stopping");
  job.mutable_spec()->mutable_train();
  EXPECT_EQ(JobNote(job), "preempted by job 7: stopping at a checkpoint");
  // Stopped and queued again: the wait, and by whom, from where.
  p->set_done(true);
  p->set_resume_iteration(1400);
  job.set_state(v1::JOB_STATE_QUEUED);
  job.set_wait_reason("waiting for 4 slots on 'gpu': 0 free");
  EXPECT_EQ(JobNote(job),
            "waiting for 4 slots on 'gpu': 0 free; preempted by job 7, "
            "resumes from iteration 1400");
  // Started again since: only what it is now.
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_attempt(2);
  job.set_reason("");
  EXPECT_EQ(JobNote(job), "");
  job.set_state(v1::JOB_STATE_FAILED);
  job.set_reason("exit code 1");
  EXPECT_EQ(JobNote(job), "exit code 1");
  // A stopping job's record with times: the show line says them.
  p->set_done(false);
  p->set_attempt(2);
  p->set_time_ms(kNow);
  p->set_deadline_ms(kNow + 120'000);
  const std::string text = PreemptionText(*p, /*train=*/true);
  EXPECT_THAT(text, HasSubstr("preempted by job 7 (priority 10) at "));
  EXPECT_THAT(text, HasSubstr("; attempt 2 is stopping at a checkpoint "
                              "(killed at "));
  p->set_kind("reclaim");
  EXPECT_THAT(PreemptionText(*p, false),
              HasSubstr("(a fair-share reclaim at priority 10)"));
}

}  // namespace
}  // namespace dlbatch::client
