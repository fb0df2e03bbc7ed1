// The worker's pure job table, fed events by hand: no threads, no
// processes, no sleeps. Time comes from a fake clock the test moves.
#include "worker/job_table.h"

#include <csignal>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/stop_signals.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/fake_clock.h"

namespace dlbatch::worker {
namespace {

constexpr char kWorkDir[] = "/work";

v1::StartJob Start(int64_t id, int64_t time_limit_s = 0) {
  v1::StartJob s;
  s.set_job_id(id);
  s.set_attempt(1);
  s.set_pool(1);
  s.add_devices(0);
  s.set_max_output_bytes(1234);
  s.mutable_spec()->mutable_command()->add_argv("true");
  s.mutable_spec()->set_time_limit_s(time_limit_s);
  return s;
}

v1::StartJob TrainStart(int64_t id) {
  v1::StartJob s = Start(id);
  s.mutable_spec()->clear_command();
  s.mutable_spec()->mutable_train();
  return s;
}

JobRef Ref(int64_t id) { return JobRef{id, 1, 0}; }

// The scheduler's preemption of job `id`.
v1::CancelJob Preempt(int64_t id, int signal = 0, int64_t grace_ms = 120000) {
  v1::CancelJob c;
  Ref(id).To(&c);
  c.set_preempt(true);
  c.set_signal(signal);
  c.set_grace_ms(grace_ms);
  c.set_reason("preempted by job 7 (priority 10)");
  return c;
}

// What each record is, in order: "diary", "checkpoint 100", "ended".
std::vector<std::string> RecordKinds(const JobEffects& fx) {
  std::vector<std::string> out;
  for (const auto& r : fx.records) {
    if (r.has_diary()) out.push_back("diary");
    if (r.has_progress()) out.push_back("progress");
    if (r.has_checkpoint())
      out.push_back(absl::StrCat("checkpoint ", r.checkpoint().iteration()));
    if (r.has_ended()) out.push_back("ended");
  }
  return out;
}

SubprocessOptions Process() {
  SubprocessOptions p;
  p.argv = {"true"};
  return p;
}

ExitInfo Exit(int code) {
  ExitInfo info;
  info.exited = true;
  info.exit_code = code;
  return info;
}

ExitInfo Killed(int signal) {
  ExitInfo info;
  info.term_signal = signal;
  return info;
}

OutputLine Out(int stream, std::string text,
               OutputLine::Ending ending = OutputLine::kNewline) {
  OutputLine line;
  line.stream = stream;
  line.time_ms = 77;
  line.text = std::move(text);
  line.ending = ending;
  return line;
}

// The trainer's progress line that announces a checkpoint of `iteration`.
OutputLine CheckpointLine(int64_t iteration) {
  return Out(3,
             absl::StrCat(R"({"iteration":")", iteration,
                          R"(","checkpoint_iteration":")", iteration, R"("})"));
}

std::vector<v1::OutputFile> Files() {
  v1::OutputFile f;
  f.set_path("result.txt");
  f.set_sha256("ab");
  return {f};
}

// The diary lines among `fx`'s records, in order.
std::vector<v1::DiaryLine> Diary(const JobEffects& fx) {
  std::vector<v1::DiaryLine> out;
  for (const auto& r : fx.records) {
    if (!r.has_diary()) continue;
    for (const auto& l : r.diary().lines()) out.push_back(l);
  }
  return out;
}

// The end report among `fx`'s records, if any.
std::optional<v1::JobEnded> Ended(const JobEffects& fx) {
  std::optional<v1::JobEnded> out;
  for (const auto& r : fx.records) {
    if (r.has_ended()) out = r.ended();
  }
  return out;
}

std::vector<JobAction::Kind> Kinds(const JobEffects& fx) {
  std::vector<JobAction::Kind> out;
  for (const auto& a : fx.actions) out.push_back(a.kind);
  return out;
}

bool Empty(const JobEffects& fx) {
  return fx.actions.empty() && fx.records.empty();
}

class JobTableTest : public ::testing::Test {
 protected:
  // Assigns job `id` and returns its key.
  int64_t Assign(const v1::StartJob& s) {
    JobEffects fx = table_.Assign(s, clock_.NowMs());
    EXPECT_EQ(Kinds(fx), std::vector<JobAction::Kind>{JobAction::kPrepare});
    return fx.actions.empty() ? -1 : fx.actions[0].key;
  }
  // Assigns `s` and brings it to the point where its process was asked for.
  int64_t Prepared(const v1::StartJob& s) {
    const int64_t key = Assign(s);
    JobEffects fx = table_.Prepared(key, Process(), {}, clock_.NowMs());
    EXPECT_EQ(Kinds(fx), std::vector<JobAction::Kind>{JobAction::kStart});
    return key;
  }
  // ... and running.
  int64_t Running(const v1::StartJob& s) {
    const int64_t key = Prepared(s);
    EXPECT_TRUE(Empty(table_.Started(key, absl::OkStatus(), clock_.NowMs(),
                                     clock_.MonotonicMs())));
    return key;
  }
  JobEffects Uploaded(int64_t key) {
    return table_.OutputsUploaded(key, Files(), {}, clock_.NowMs());
  }

  FakeClock clock_;
  JobTable table_{kWorkDir};
};

TEST_F(JobTableTest, EachLineCarriesItsProcessesRankAndDlbatchsOwnNone) {
  // Part 1 of a two-part command job: its one process is rank 1.
  v1::StartJob command = Start(7);
  command.set_part(1);
  command.set_parts(2);
  command.set_first_rank(1);
  const int64_t key = Assign(command);
  JobEffects fx = table_.Prepared(key, Process(), {"fetched"}, clock_.NowMs());
  ASSERT_EQ(Kinds(fx), std::vector<JobAction::Kind>{JobAction::kStart});
  EXPECT_EQ(fx.actions[0].process.rank, 1);  // set where the stream is
  ASSERT_EQ(Diary(fx).size(), 1u);
  EXPECT_FALSE(Diary(fx)[0].has_rank());  // dlbatch's own note
  ASSERT_TRUE(Empty(table_.Started(key, absl::OkStatus(), clock_.NowMs(),
                                   clock_.MonotonicMs())));
  OutputLine labelled = Out(1, "from rank 1");
  labelled.rank = 1;
  std::vector<v1::DiaryLine> lines = Diary(table_.Line(key, labelled));
  // A process started by a launch of its own names its rank (per slot).
  OutputLine other = Out(2, "from rank 3");
  other.rank = 3;
  for (const auto& l : Diary(table_.Line(key, other))) lines.push_back(l);
  // A line that names none is its part's.
  for (const auto& l : Diary(table_.Line(key, Out(1, "unnamed"))))
    lines.push_back(l);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].rank(), 1);
  EXPECT_EQ(lines[1].rank(), 3);
  EXPECT_EQ(lines[2].rank(), 1);
  EXPECT_LT(lines[0].seq(), lines[1].seq());  // one order per part
  EXPECT_LT(lines[1].seq(), lines[2].seq());
  std::vector<v1::DiaryLine> end =
      Diary(table_.Exited(key, Killed(SIGKILL), clock_.NowMs()));
  for (const auto& l : end) EXPECT_FALSE(l.has_rank()) << l.text();

  // A train job's trainer speaks for its part's ranks: its first one.
  v1::StartJob train = TrainStart(8);
  train.set_part(1);
  train.set_parts(2);
  train.set_first_rank(2);
  const int64_t train_key = Assign(train);
  fx = table_.Prepared(train_key, Process(), {}, clock_.NowMs());
  ASSERT_EQ(fx.actions.size(), 1u);
  EXPECT_EQ(fx.actions[0].process.rank, 2);
  // A rank the launch set is kept.
  SubprocessOptions given = Process();
  given.rank = 5;
  const int64_t given_key = Assign(Start(9));
  fx = table_.Prepared(given_key, given, {}, clock_.NowMs());
  ASSERT_EQ(fx.actions.size(), 1u);
  EXPECT_EQ(fx.actions[0].process.rank, 5);
}

TEST_F(JobTableTest, AJobRunsFromAssignmentToItsAcknowledgedEnd) {
  JobEffects fx = table_.Assign(Start(7), clock_.NowMs());
  ASSERT_EQ(Kinds(fx), std::vector<JobAction::Kind>{JobAction::kPrepare});
  const JobAction prepare = fx.actions[0];
  EXPECT_EQ(prepare.dir, "/work/jobs/7-1-0");
  EXPECT_EQ(prepare.ref, Ref(7));
  EXPECT_EQ(prepare.start.job_id(), 7);
  EXPECT_TRUE(fx.records.empty());
  EXPECT_EQ(table_.Phase(Ref(7)), JobPhase::kPreparing);
  EXPECT_EQ(table_.BusySlots(), 1);

  fx = table_.Prepared(prepare.key, Process(), {"fetched data.bin"},
                       clock_.NowMs());
  ASSERT_EQ(Kinds(fx), std::vector<JobAction::Kind>{JobAction::kStart});
  EXPECT_EQ(fx.actions[0].key, prepare.key);
  EXPECT_EQ(fx.actions[0].dir, "/work/jobs/7-1-0");
  EXPECT_EQ(fx.actions[0].process.argv, std::vector<std::string>{"true"});
  std::vector<v1::DiaryLine> notes = Diary(fx);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0].text(), "[dlbatch] fetched data.bin");
  EXPECT_EQ(notes[0].stream(), JobTable::kWorkerStream);
  EXPECT_EQ(notes[0].time_ms(), clock_.NowMs());
  EXPECT_EQ(table_.Phase(Ref(7)), JobPhase::kPreparing);

  fx = table_.Started(prepare.key, absl::OkStatus(), clock_.NowMs(),
                      clock_.MonotonicMs());
  EXPECT_TRUE(Empty(fx));
  EXPECT_EQ(table_.Phase(Ref(7)), JobPhase::kRunning);

  std::vector<v1::DiaryLine> lines =
      Diary(table_.Line(prepare.key, Out(1, "hello")));
  for (const auto& l :
       Diary(table_.Line(prepare.key, Out(2, "world", OutputLine::kCrlf))))
    lines.push_back(l);
  for (const auto& l :
       Diary(table_.Line(prepare.key, Out(1, "tail", OutputLine::kNone))))
    lines.push_back(l);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].seq(), 2);  // after the note
  EXPECT_EQ(lines[0].text(), "hello");
  EXPECT_EQ(lines[0].time_ms(), 77);
  EXPECT_EQ(lines[0].ending(), v1::DiaryLine::ENDING_NEWLINE);
  EXPECT_EQ(lines[1].seq(), 3);
  EXPECT_EQ(lines[1].stream(), 2);
  EXPECT_EQ(lines[1].ending(), v1::DiaryLine::ENDING_CRLF);
  EXPECT_EQ(lines[2].ending(), v1::DiaryLine::ENDING_NONE);

  fx = table_.Exited(prepare.key, Exit(0), clock_.NowMs());
  ASSERT_EQ(Kinds(fx), std::vector<JobAction::Kind>{JobAction::kUploadOutputs});
  EXPECT_EQ(fx.actions[0].dir, "/work/jobs/7-1-0");
  EXPECT_EQ(fx.actions[0].max_output_bytes, 1234);
  EXPECT_EQ(table_.Phase(Ref(7)), JobPhase::kFinishing);
  EXPECT_EQ(table_.BusySlots(), 1);

  fx = Uploaded(prepare.key);
  EXPECT_TRUE(fx.actions.empty());
  std::optional<v1::JobEnded> ended = Ended(fx);
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->job_id(), 7);
  EXPECT_EQ(ended->state(), v1::JOB_STATE_FINISHED);
  EXPECT_EQ(ended->exit_code(), 0);
  EXPECT_EQ(ended->reason(), "");
  EXPECT_EQ(ended->last_seq(), 4);
  ASSERT_EQ(ended->outputs_size(), 1);
  EXPECT_EQ(ended->outputs(0).path(), "result.txt");
  EXPECT_EQ(table_.Phase(Ref(7)), JobPhase::kEnded);
  EXPECT_EQ(table_.BusySlots(), 0);  // an ended job holds no slot
  EXPECT_EQ(table_.Jobs(), std::vector<JobRef>{Ref(7)});

  fx = table_.EndedAcked(Ref(7));
  ASSERT_EQ(Kinds(fx), std::vector<JobAction::Kind>{JobAction::kRemove});
  EXPECT_EQ(fx.actions[0].dir, "/work/jobs/7-1-0");
  EXPECT_FALSE(table_.Phase(Ref(7)).has_value());
  EXPECT_EQ(table_.size(), 0u);
  EXPECT_TRUE(table_.Jobs().empty());
  // Acknowledged twice: nothing more to remove.
  EXPECT_TRUE(Empty(table_.EndedAcked(Ref(7))));
}

TEST_F(JobTableTest, AnEndNotYetReachedIsNotAcknowledged) {
  const int64_t key = Running(Start(7));
  EXPECT_TRUE(Empty(table_.EndedAcked(Ref(7))));
  EXPECT_EQ(table_.Phase(Ref(7)), JobPhase::kRunning);
  EXPECT_TRUE(Empty(table_.EndedAcked(Ref(99))));
  (void)key;
}

TEST_F(JobTableTest, FailedExitSaysWhy) {
  const int64_t key = Running(Start(8));
  table_.Exited(key, Exit(3), clock_.NowMs());
  std::optional<v1::JobEnded> ended = Ended(Uploaded(key));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(ended->exit_code(), 3);
  EXPECT_EQ(ended->reason(), "exit code 3");
  EXPECT_EQ(ended->outputs_size(), 1);  // a failed job's outputs are kept
}

TEST_F(JobTableTest, AKilledJobsExitCodeIsTheShells) {
  const int64_t key = Running(Start(8));
  table_.Exited(key, Killed(9), clock_.NowMs());
  std::optional<v1::JobEnded> ended = Ended(Uploaded(key));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(ended->exit_code(), 128 + 9);
  EXPECT_EQ(ended->reason().rfind("killed by signal 9", 0), 0u)
      << ended->reason();
}

TEST_F(JobTableTest, TheTrainersFirstErrorLineIsTheReason) {
  v1::StartJob s = Start(9);
  s.mutable_spec()->clear_command();
  s.mutable_spec()->mutable_train();
  const int64_t key = Running(s);
  table_.Line(key, Out(JobTable::kStderr, "warming up"));
  table_.Line(key, Out(JobTable::kStderr, "dlbatch-train: out of memory"));
  table_.Line(key, Out(JobTable::kStderr, "dlbatch-train: second error"));
  table_.Exited(key, Exit(1), clock_.NowMs());
  std::optional<v1::JobEnded> ended = Ended(Uploaded(key));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->reason(), "exit code 1: out of memory");
  EXPECT_EQ(ended->last_seq(), 3);  // the error lines are diary lines too
}

TEST_F(JobTableTest, ACommandJobsStderrIsNotTheReason) {
  const int64_t key = Running(Start(9));
  table_.Line(key, Out(JobTable::kStderr, "dlbatch-train: not the trainer"));
  table_.Exited(key, Exit(1), clock_.NowMs());
  std::optional<v1::JobEnded> ended = Ended(Uploaded(key));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->reason(), "exit code 1");
}

TEST_F(JobTableTest, ProgramThatCannotStartFails) {
  const int64_t key = Prepared(Start(9));
  JobEffects fx = table_.Started(key, absl::NotFoundError("cannot run 'nope'"),
                                 clock_.NowMs(), clock_.MonotonicMs());
  EXPECT_TRUE(fx.actions.empty());  // nothing to upload
  std::optional<v1::JobEnded> ended = Ended(fx);
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(ended->reason(), "cannot start the job: cannot run 'nope'");
  EXPECT_EQ(ended->exit_code(), -1);
  std::vector<v1::DiaryLine> lines = Diary(fx);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].text(),
            "[dlbatch] cannot start the job: cannot run 'nope'");
  EXPECT_EQ(ended->last_seq(), 1);
  EXPECT_EQ(table_.Phase(Ref(9)), JobPhase::kEnded);
}

TEST_F(JobTableTest, AJobThatCannotBePreparedFailsWithoutAProcess) {
  const int64_t key = Assign(Start(9));
  JobEffects fx =
      table_.Prepared(key, absl::NotFoundError("attachment data.bin is gone"),
                      {"a note"}, clock_.NowMs());
  EXPECT_TRUE(fx.actions.empty());
  std::vector<v1::DiaryLine> lines = Diary(fx);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].text(), "[dlbatch] a note");
  EXPECT_EQ(lines[1].text(), "[dlbatch] attachment data.bin is gone");
  std::optional<v1::JobEnded> ended = Ended(fx);
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(ended->reason(), "attachment data.bin is gone");
  EXPECT_EQ(ended->last_seq(), 2);
}

TEST_F(JobTableTest, OutputsThatCannotBeUploadedFailTheJob) {
  const int64_t key = Running(Start(9));
  table_.Exited(key, Exit(0), clock_.NowMs());
  JobEffects fx = table_.OutputsUploaded(
      key, absl::ResourceExhaustedError("outputs exceed 1 KiB"), {},
      clock_.NowMs());
  std::optional<v1::JobEnded> ended = Ended(fx);
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(ended->reason(), "outputs exceed 1 KiB");
  EXPECT_EQ(ended->outputs_size(), 0);
  ASSERT_EQ(Diary(fx).size(), 1u);
  EXPECT_EQ(Diary(fx)[0].text(), "[dlbatch] outputs exceed 1 KiB");
}

// The worker is stopping: the scheduler requeues the job, so no report.
TEST_F(JobTableTest, AnUploadCancelledByShutdownReportsNothing) {
  const int64_t key = Running(Start(9));
  table_.Exited(key, Exit(0), clock_.NowMs());
  EXPECT_TRUE(Empty(table_.OutputsUploaded(
      key, absl::CancelledError("stopping"), {"not seen"}, clock_.NowMs())));
  EXPECT_EQ(table_.Phase(Ref(9)), JobPhase::kFinishing);
}

TEST_F(JobTableTest, LeftoverProcessesAreNoted) {
  const int64_t key = Running(Start(9));
  ExitInfo info = Exit(0);
  info.leftover_killed = 2;
  info.leftover_names = "sleep (pid 5), sleep (pid 6)";
  std::vector<v1::DiaryLine> lines =
      Diary(table_.Exited(key, info, clock_.NowMs()));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].text(),
            "[dlbatch] killed 2 process(es) the job left behind: sleep (pid "
            "5), sleep (pid 6)");
}

TEST_F(JobTableTest, CancelWhilePreparingEndsWithoutAProcess) {
  const int64_t key = Assign(Start(10));
  JobEffects fx = table_.Cancel(Ref(10), 3000, "user asked", clock_.NowMs());
  EXPECT_TRUE(fx.actions.empty());  // no process to stop yet
  ASSERT_EQ(Diary(fx).size(), 1u);
  EXPECT_EQ(Diary(fx)[0].text(), "[dlbatch] stopping the job: user asked");
  EXPECT_EQ(table_.Phase(Ref(10)), JobPhase::kPreparing);

  fx = table_.Prepared(key, Process(), {}, clock_.NowMs());
  EXPECT_TRUE(fx.actions.empty());  // no kStart
  std::optional<v1::JobEnded> ended = Ended(fx);
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(ended->reason(), "user asked");
  EXPECT_EQ(ended->exit_code(), -1);
  EXPECT_EQ(ended->last_seq(), 1);
}

TEST_F(JobTableTest, CancelWhileStartingStopsTheProcessOnceStarted) {
  const int64_t key = Prepared(Start(11));
  JobEffects fx = table_.Cancel(Ref(11), 3000, "asked", clock_.NowMs());
  EXPECT_TRUE(fx.actions.empty());
  ASSERT_EQ(Diary(fx).size(), 1u);
  EXPECT_NE(Diary(fx)[0].text().find("stopping the job"), std::string::npos);

  fx = table_.Started(key, absl::OkStatus(), clock_.NowMs(),
                      clock_.MonotonicMs());
  ASSERT_EQ(Kinds(fx), std::vector<JobAction::Kind>{JobAction::kTerminate});
  EXPECT_EQ(fx.actions[0].key, key);
  EXPECT_EQ(fx.actions[0].grace_ms, 3000);

  table_.Exited(key, Killed(15), clock_.NowMs());
  std::optional<v1::JobEnded> ended = Ended(Uploaded(key));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(ended->exit_code(), 128 + 15);
}

TEST_F(JobTableTest, CancelWhileRunningTerminatesOnceAndReportsCancelled) {
  const int64_t key = Running(Start(12));
  JobEffects fx = table_.Cancel(Ref(12), 3000, "enough", clock_.NowMs());
  ASSERT_EQ(Kinds(fx), std::vector<JobAction::Kind>{JobAction::kTerminate});
  EXPECT_EQ(fx.actions[0].key, key);
  EXPECT_EQ(fx.actions[0].grace_ms, 3000);
  EXPECT_EQ(fx.actions[0].signal, SIGTERM);
  // A second cancel changes nothing, not even the diary.
  EXPECT_TRUE(Empty(table_.Cancel(Ref(12), 1, "again", clock_.NowMs())));

  table_.Exited(key, Killed(15), clock_.NowMs());
  std::optional<v1::JobEnded> ended = Ended(Uploaded(key));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(ended->reason(), "enough");
  EXPECT_EQ(ended->exit_code(), 128 + 15);
  EXPECT_EQ(ended->outputs_size(), 1);  // a cancelled job keeps its outputs
}

TEST_F(JobTableTest, ACancelledJobThatExitsCleanlyIsStillCancelled) {
  const int64_t key = Running(Start(12));
  table_.Cancel(Ref(12), 3000, "enough", clock_.NowMs());
  table_.Exited(key, Exit(0), clock_.NowMs());
  std::optional<v1::JobEnded> ended = Ended(Uploaded(key));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_CANCELLED);
}

TEST_F(JobTableTest, CancelWhileFinishingKeepsHowTheJobEnded) {
  const int64_t key = Running(Start(13));
  table_.Exited(key, Exit(0), clock_.NowMs());
  EXPECT_TRUE(Empty(table_.Cancel(Ref(13), 3000, "late", clock_.NowMs())));
  std::optional<v1::JobEnded> ended = Ended(Uploaded(key));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_FINISHED);
  EXPECT_EQ(ended->last_seq(), 0);  // no "stopping" line
}

TEST_F(JobTableTest, CancelAfterTheEndOrOfAnUnknownJobIsIgnored) {
  const int64_t key = Running(Start(14));
  table_.Exited(key, Exit(0), clock_.NowMs());
  ASSERT_TRUE(Ended(Uploaded(key)).has_value());
  EXPECT_TRUE(Empty(table_.Cancel(Ref(14), 3000, "late", clock_.NowMs())));
  EXPECT_TRUE(Empty(table_.Cancel(Ref(99), 3000, "who", clock_.NowMs())));
  // The report is made once only.
  EXPECT_TRUE(Empty(Uploaded(key)));
}

TEST_F(JobTableTest, RepeatedStartRunsOnce) {
  Assign(Start(40));
  EXPECT_TRUE(Empty(table_.Assign(Start(40), clock_.NowMs())));
  EXPECT_EQ(table_.size(), 1u);
  // Another attempt of the same job is another job here.
  v1::StartJob again = Start(40);
  again.set_attempt(2);
  EXPECT_EQ(Kinds(table_.Assign(again, clock_.NowMs())),
            std::vector<JobAction::Kind>{JobAction::kPrepare});
  Assign(Start(41));
  EXPECT_EQ(table_.size(), 3u);
  EXPECT_EQ(table_.BusySlots(), 3);
}

// Events that come late, twice, or for a job the table no longer holds
// change nothing.
TEST_F(JobTableTest, StaleAndRepeatedEventsAreIgnored) {
  const int64_t key = Prepared(Start(42));
  EXPECT_TRUE(Empty(table_.Prepared(key, Process(), {"again"},
                                    clock_.NowMs())));  // kStart asked once
  EXPECT_TRUE(Empty(table_.Exited(key, Exit(0), clock_.NowMs())));  // not run
  EXPECT_TRUE(Empty(Uploaded(key)));  // not finishing
  table_.Started(key, absl::OkStatus(), clock_.NowMs(), clock_.MonotonicMs());
  EXPECT_TRUE(Empty(table_.Started(key, absl::OkStatus(), clock_.NowMs(),
                                   clock_.MonotonicMs())));
  table_.Exited(key, Exit(0), clock_.NowMs());
  EXPECT_TRUE(Empty(table_.Exited(key, Exit(1), clock_.NowMs())));
  Uploaded(key);
  EXPECT_TRUE(Empty(table_.Line(key, Out(1, "after the end"))));

  const int64_t unknown = key + 100;
  EXPECT_TRUE(Empty(table_.Prepared(unknown, Process(), {}, clock_.NowMs())));
  EXPECT_TRUE(Empty(table_.Started(unknown, absl::OkStatus(), clock_.NowMs(),
                                   clock_.MonotonicMs())));
  EXPECT_TRUE(Empty(table_.Line(unknown, Out(1, "x"))));
  EXPECT_TRUE(Empty(table_.Exited(unknown, Exit(0), clock_.NowMs())));
  EXPECT_TRUE(Empty(Uploaded(unknown)));
  EXPECT_TRUE(
      Empty(table_.CheckpointStored(unknown, 1, Files(), clock_.NowMs())));
}

TEST_F(JobTableTest, TimeLimitStopsTheJobOnceAndFailsIt) {
  const int64_t key = Running(Start(30, /*time_limit_s=*/5));
  clock_.Advance(4999);
  EXPECT_TRUE(Empty(table_.Tick(clock_.NowMs(), clock_.MonotonicMs())));
  clock_.Advance(1);
  JobEffects fx = table_.Tick(clock_.NowMs(), clock_.MonotonicMs());
  ASSERT_EQ(Kinds(fx), std::vector<JobAction::Kind>{JobAction::kTerminate});
  EXPECT_EQ(fx.actions[0].key, key);
  EXPECT_EQ(fx.actions[0].grace_ms, JobTable::kTimeLimitGraceMs);
  ASSERT_EQ(Diary(fx).size(), 1u);
  EXPECT_EQ(Diary(fx)[0].text(),
            "[dlbatch] time limit 5s reached; stopping the job");
  EXPECT_EQ(Diary(fx)[0].time_ms(), clock_.NowMs());
  clock_.Advance(60000);
  EXPECT_TRUE(Empty(table_.Tick(clock_.NowMs(), clock_.MonotonicMs())));

  table_.Exited(key, Killed(15), clock_.NowMs());
  std::optional<v1::JobEnded> ended = Ended(Uploaded(key));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(ended->reason(), "time limit 5s reached");
  EXPECT_EQ(ended->outputs_size(), 1);
}

// The limit counts from the process's start on the monotonic clock, not
// from the assignment, and not on the wall clock.
TEST_F(JobTableTest, TimeLimitCountsFromTheStartOnTheMonotonicClock) {
  const int64_t key = Prepared(Start(31, /*time_limit_s=*/2));
  clock_.Advance(10000);  // a slow fetch
  table_.Started(key, absl::OkStatus(), clock_.NowMs(), clock_.MonotonicMs());
  clock_.SetNowMs(clock_.NowMs() + 3'600'000);  // the wall clock jumps
  EXPECT_TRUE(Empty(table_.Tick(clock_.NowMs(), clock_.MonotonicMs())));
  clock_.SetMonotonicMs(clock_.MonotonicMs() + 2000);
  EXPECT_EQ(Kinds(table_.Tick(clock_.NowMs(), clock_.MonotonicMs())),
            std::vector<JobAction::Kind>{JobAction::kTerminate});
}

TEST_F(JobTableTest, NoTimeLimitAndCancelledJobsAreNotStoppedByTicks) {
  Running(Start(32));  // no limit
  Running(Start(33, /*time_limit_s=*/1));
  table_.Cancel(Ref(33), 3000, "asked", clock_.NowMs());
  clock_.Advance(86'400'000);
  EXPECT_TRUE(Empty(table_.Tick(clock_.NowMs(), clock_.MonotonicMs())));
}

TEST_F(JobTableTest, ChannelProgressIsARecordNotADiaryLine) {
  const int64_t key = Running(TrainStart(60));
  JobEffects fx = table_.Line(
      key, Out(JobTable::kChannelStream, R"({"iteration":"50","done":true})"));
  EXPECT_TRUE(Diary(fx).empty());
  ASSERT_EQ(fx.records.size(), 1u);
  ASSERT_TRUE(fx.records[0].has_progress());
  EXPECT_EQ(fx.records[0].progress().job_id(), 60);
  EXPECT_EQ(fx.records[0].progress().progress().iteration(), 50);
  EXPECT_TRUE(fx.records[0].progress().progress().done());
  EXPECT_EQ(fx.records[0].progress().progress().time_ms(), 77);
  // A line the trainer garbled changes nothing.
  EXPECT_TRUE(Empty(table_.Line(key, Out(JobTable::kChannelStream, "{"))));
}

TEST_F(JobTableTest, OnlyPartZeroSpeaksForTheJob) {
  v1::StartJob s = TrainStart(61);
  s.set_part(1);
  const int64_t key = Running(s);
  EXPECT_TRUE(Empty(table_.Line(
      key, Out(JobTable::kChannelStream,
               R"({"iteration":"100","checkpoint_iteration":"100"})"))));
  // Its own output is still its diary.
  EXPECT_EQ(Diary(table_.Line(key, Out(1, "rank 1"))).size(), 1u);
}

// One checkpoint is stored at a time; of those announced meanwhile only the
// newest is stored next.
TEST_F(JobTableTest, CheckpointsAreStoredOneAtATimeNewestNext) {
  const int64_t key = Running(TrainStart(62));
  auto checkpoint = [&](int it) {
    return table_.Line(
        key, Out(JobTable::kChannelStream,
                 absl::StrCat(R"({"iteration":")", it,
                              R"(","checkpoint_iteration":")", it, R"("})")));
  };
  JobEffects fx = checkpoint(100);
  ASSERT_EQ(Kinds(fx),
            std::vector<JobAction::Kind>{JobAction::kUploadCheckpoint});
  EXPECT_EQ(fx.actions[0].iteration, 100);
  EXPECT_EQ(fx.actions[0].dir, "/work/jobs/62-1-0");
  EXPECT_TRUE(checkpoint(200).actions.empty());  // one is out
  EXPECT_TRUE(checkpoint(300).actions.empty());

  fx = table_.CheckpointStored(key, 100, Files(), clock_.NowMs());
  ASSERT_EQ(fx.records.size(), 1u);
  ASSERT_TRUE(fx.records[0].has_checkpoint());
  EXPECT_EQ(fx.records[0].checkpoint().iteration(), 100);
  EXPECT_EQ(fx.records[0].checkpoint().files(0).path(), "result.txt");
  ASSERT_EQ(Kinds(fx),
            std::vector<JobAction::Kind>{JobAction::kUploadCheckpoint});
  EXPECT_EQ(fx.actions[0].iteration, 300);

  // A store that fails is noted; the job goes on.
  fx = table_.CheckpointStored(key, 300, absl::UnavailableError("no space"),
                               clock_.NowMs());
  EXPECT_TRUE(fx.actions.empty());
  ASSERT_EQ(Diary(fx).size(), 1u);
  EXPECT_EQ(Diary(fx)[0].text(),
            "[dlbatch] could not store the checkpoint of iteration 300: no "
            "space");
  EXPECT_EQ(table_.Phase(Ref(62)), JobPhase::kRunning);
  // Free again: the next announcement is stored at once.
  EXPECT_EQ(Kinds(checkpoint(400)),
            std::vector<JobAction::Kind>{JobAction::kUploadCheckpoint});
  // Cancelled by a stopping worker: nothing to note.
  EXPECT_TRUE(Empty(table_.CheckpointStored(
      key, 400, absl::CancelledError("stopping"), clock_.NowMs())));
}

TEST_F(JobTableTest, JobsListsEveryHeldJobUntilItsEndIsAcknowledged) {
  const int64_t a = Running(Start(70));
  Assign(Start(71));
  EXPECT_EQ(table_.Jobs(), (std::vector<JobRef>{Ref(70), Ref(71)}));
  table_.Exited(a, Exit(0), clock_.NowMs());
  Uploaded(a);
  EXPECT_EQ(table_.Jobs().size(), 2u);  // ended, not yet acknowledged
  table_.EndedAcked(Ref(70));
  EXPECT_EQ(table_.Jobs(), std::vector<JobRef>{Ref(71)});
}

// The end report waits for every checkpoint the trainer announced before
// it exited, so that the scheduler has the newest when the job is requeued
// (or resumed after a loss); the records keep their order.
TEST_F(JobTableTest, TheEndWaitsForTheCheckpointsStillBeingStored) {
  const int64_t key = Running(TrainStart(63));
  ASSERT_EQ(Kinds(table_.Line(key, CheckpointLine(100))),
            std::vector<JobAction::Kind>{JobAction::kUploadCheckpoint});
  EXPECT_TRUE(table_.Line(key, CheckpointLine(200)).actions.empty());
  table_.Exited(key, Exit(0), clock_.NowMs());
  JobEffects fx = Uploaded(key);
  EXPECT_TRUE(Empty(fx)) << "ended before its checkpoints were stored";
  EXPECT_EQ(table_.Phase(Ref(63)), JobPhase::kFinishing);
  EXPECT_EQ(table_.BusySlots(), 1);
  EXPECT_TRUE(Empty(Uploaded(key))) << "a repeated upload changes nothing";

  fx = table_.CheckpointStored(key, 100, Files(), clock_.NowMs());
  EXPECT_EQ(RecordKinds(fx), std::vector<std::string>{"checkpoint 100"});
  ASSERT_EQ(Kinds(fx),
            std::vector<JobAction::Kind>{JobAction::kUploadCheckpoint});
  EXPECT_EQ(fx.actions[0].iteration, 200);

  fx = table_.CheckpointStored(key, 200, Files(), clock_.NowMs());
  EXPECT_EQ(RecordKinds(fx),
            (std::vector<std::string>{"checkpoint 200", "ended"}));
  std::optional<v1::JobEnded> ended = Ended(fx);
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_FINISHED);
  ASSERT_EQ(ended->outputs_size(), 1);  // the outputs uploaded before
  EXPECT_EQ(ended->outputs(0).path(), "result.txt");
  EXPECT_EQ(table_.Phase(Ref(63)), JobPhase::kEnded);
  EXPECT_TRUE(
      Empty(table_.CheckpointStored(key, 200, Files(), clock_.NowMs())));
}

// A checkpoint that cannot be stored is noted and the end report still
// goes: a requeue resumes from the one before.
TEST_F(JobTableTest, AFailedCheckpointStoreStillEndsTheJob) {
  const int64_t key = Running(TrainStart(64));
  table_.Line(key, CheckpointLine(100));
  table_.Exited(key, Exit(1), clock_.NowMs());
  EXPECT_TRUE(Empty(Uploaded(key)));
  JobEffects fx = table_.CheckpointStored(
      key, 100, absl::UnavailableError("the scheduler refused the blob"),
      clock_.NowMs());
  EXPECT_EQ(RecordKinds(fx), (std::vector<std::string>{"diary", "ended"}));
  ASSERT_EQ(Diary(fx).size(), 1u);
  EXPECT_EQ(Diary(fx)[0].text(),
            "[dlbatch] could not store the checkpoint of iteration 100: the "
            "scheduler refused the blob");
  std::optional<v1::JobEnded> ended = Ended(fx);
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(ended->reason(), "exit code 1");
  EXPECT_EQ(ended->last_seq(), Diary(fx)[0].seq());  // the note included
}

// Stored before the outputs were: the end comes with the outputs, as always.
TEST_F(JobTableTest, ACheckpointStoredBeforeTheOutputsDoesNotHoldTheEnd) {
  const int64_t key = Running(TrainStart(65));
  table_.Line(key, CheckpointLine(100));
  table_.Exited(key, Exit(0), clock_.NowMs());
  EXPECT_EQ(
      RecordKinds(table_.CheckpointStored(key, 100, Files(), clock_.NowMs())),
      std::vector<std::string>{"checkpoint 100"});
  ASSERT_TRUE(Ended(Uploaded(key)).has_value());
}

// A stopping worker gives the store up: no report, as for its outputs (the
// scheduler requeues the job when the worker is gone).
TEST_F(JobTableTest, AStoreGivenUpByAStoppingWorkerEndsNothing) {
  const int64_t key = Running(TrainStart(66));
  table_.Line(key, CheckpointLine(100));
  table_.Exited(key, Exit(0), clock_.NowMs());
  EXPECT_TRUE(Empty(Uploaded(key)));
  EXPECT_TRUE(Empty(table_.CheckpointStored(
      key, 100, absl::CancelledError("stopping"), clock_.NowMs())));
  EXPECT_EQ(table_.Phase(Ref(66)), JobPhase::kFinishing);
}

TEST_F(JobTableTest, APreemptedTrainJobCheckpointsAndEndsCancelled) {
  const int64_t key = Running(TrainStart(80));
  JobEffects fx = table_.Cancel(Preempt(80), clock_.NowMs());
  ASSERT_EQ(Kinds(fx), std::vector<JobAction::Kind>{JobAction::kTerminate});
  EXPECT_EQ(fx.actions[0].key, key);
  EXPECT_EQ(fx.actions[0].signal, SIGUSR1);
  EXPECT_EQ(fx.actions[0].grace_ms, 120000);
  ASSERT_EQ(Diary(fx).size(), 1u);
  EXPECT_EQ(Diary(fx)[0].text(),
            "[dlbatch] preempted by job 7 (priority 10): checkpointing and "
            "stopping (SIGUSR1; killed in 2m00s if still running)");
  EXPECT_TRUE(Empty(table_.Cancel(Preempt(80), clock_.NowMs())));

  // The trainer announces the checkpoint written at the signal, exits 75.
  ASSERT_EQ(Kinds(table_.Line(key, CheckpointLine(1400))),
            std::vector<JobAction::Kind>{JobAction::kUploadCheckpoint});
  table_.Exited(key, Exit(kTrainerStoppedExitCode), clock_.NowMs());
  EXPECT_TRUE(Empty(Uploaded(key)));
  fx = table_.CheckpointStored(key, 1400, Files(), clock_.NowMs());
  EXPECT_EQ(RecordKinds(fx),
            (std::vector<std::string>{"checkpoint 1400", "ended"}));
  std::optional<v1::JobEnded> ended = Ended(fx);
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(ended->reason(), "preempted by job 7 (priority 10)");
  EXPECT_EQ(ended->exit_code(), 75);
  EXPECT_EQ(ended->outputs_size(), 1);
}

TEST_F(JobTableTest, SlurmsSignalCheckpointsATrainJobAndReportsAnEndBySignal) {
  // Slurm preempts (or scancels) the worker's Slurm job: the trainer is
  // asked to checkpoint, and the end is reported as one by Slurm's signal
  // so that the scheduler asks Slurm why.
  const int64_t key = Running(TrainStart(82));
  JobEffects fx = table_.SlurmStopping(SIGTERM, 30000, clock_.NowMs());
  ASSERT_EQ(Kinds(fx), std::vector<JobAction::Kind>{JobAction::kTerminate});
  EXPECT_EQ(fx.actions[0].signal, SIGUSR1);
  EXPECT_EQ(fx.actions[0].grace_ms, 30000);
  EXPECT_TRUE(Empty(table_.SlurmStopping(SIGTERM, 30000, clock_.NowMs())));
  table_.Line(key, CheckpointLine(300));
  table_.Exited(key, Exit(kTrainerStoppedExitCode), clock_.NowMs());
  EXPECT_TRUE(Empty(Uploaded(key)));
  fx = table_.CheckpointStored(key, 300, Files(), clock_.NowMs());
  EXPECT_EQ(RecordKinds(fx),
            (std::vector<std::string>{"checkpoint 300", "ended"}));
  std::optional<v1::JobEnded> ended = Ended(fx);
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(ended->exit_code(), 128 + SIGTERM);
  EXPECT_EQ(ended->reason(),
            "Slurm is ending the job's Slurm job (SIGTERM to its worker)");
}

TEST_F(JobTableTest, APreemptedCommandJobGetsItsSignal) {
  Running(Start(81));
  JobEffects fx =
      table_.Cancel(Preempt(81, /*signal=*/10, 30000), clock_.NowMs());
  ASSERT_EQ(Kinds(fx), std::vector<JobAction::Kind>{JobAction::kTerminate});
  EXPECT_EQ(fx.actions[0].signal, 10);
  EXPECT_EQ(fx.actions[0].grace_ms, 30000);
  ASSERT_EQ(Diary(fx).size(), 1u);
  EXPECT_EQ(Diary(fx)[0].text(),
            "[dlbatch] preempted by job 7 (priority 10): sending SIGUSR1 "
            "(killed in 30s if still running)");

  Running(Start(82));
  fx = table_.Cancel(Preempt(82, /*signal=*/0), clock_.NowMs());
  ASSERT_EQ(fx.actions.size(), 1u);
  EXPECT_EQ(fx.actions[0].signal, SIGTERM);
  EXPECT_EQ(Diary(fx)[0].text(),
            "[dlbatch] preempted by job 7 (priority 10): sending SIGTERM "
            "(killed in 2m00s if still running)");
}

// KILL follows at the grace anyway, STOP would hold the job there, and a
// number that is no signal cannot be sent: SIGTERM instead, and the diary
// says so.
TEST_F(JobTableTest, APreemptSignalAJobMayNotBeSentBecomesSigterm) {
  Running(Start(83));
  JobEffects fx =
      table_.Cancel(Preempt(83, SIGSTOP, /*grace_ms=*/0), clock_.NowMs());
  ASSERT_EQ(fx.actions.size(), 1u);
  EXPECT_EQ(fx.actions[0].signal, SIGTERM);
  EXPECT_EQ(Diary(fx)[0].text(),
            absl::StrCat("[dlbatch] preempted by job 7 (priority 10): sending "
                         "SIGTERM, as signal ",
                         SIGSTOP,
                         " is not one a job may be sent (killed at once if "
                         "still running)"));
  Running(Start(84));
  EXPECT_EQ(table_.Cancel(Preempt(84, 999), clock_.NowMs()).actions[0].signal,
            SIGTERM);
}

// However the preempted job's processes leave - at its signal, killed at
// the grace, having finished meanwhile, crashing - it is requeued.
TEST_F(JobTableTest, APreemptedJobEndsCancelledHoweverItExits) {
  const std::vector<ExitInfo> exits = {Exit(0), Exit(75), Exit(1),
                                       Killed(SIGKILL), Killed(SIGSEGV)};
  for (size_t i = 0; i < exits.size(); ++i) {
    const int64_t id = 90 + static_cast<int64_t>(i);
    const int64_t key = Running(Start(id));
    table_.Cancel(Preempt(id), clock_.NowMs());
    table_.Exited(key, exits[i], clock_.NowMs());
    std::optional<v1::JobEnded> ended = Ended(Uploaded(key));
    ASSERT_TRUE(ended.has_value()) << exits[i].Describe();
    EXPECT_EQ(ended->state(), v1::JOB_STATE_CANCELLED) << exits[i].Describe();
    EXPECT_EQ(ended->reason(), "preempted by job 7 (priority 10)");
  }
}

TEST_F(JobTableTest, APreemptWhileStartingSignalsTheProcessOnceStarted) {
  const int64_t key = Prepared(TrainStart(85));
  JobEffects fx = table_.Cancel(Preempt(85), clock_.NowMs());
  EXPECT_TRUE(fx.actions.empty());
  ASSERT_EQ(Diary(fx).size(), 1u);
  EXPECT_NE(Diary(fx)[0].text().find("checkpointing and stopping"),
            std::string::npos);
  fx = table_.Started(key, absl::OkStatus(), clock_.NowMs(),
                      clock_.MonotonicMs());
  ASSERT_EQ(Kinds(fx), std::vector<JobAction::Kind>{JobAction::kTerminate});
  EXPECT_EQ(fx.actions[0].signal, SIGUSR1);
  EXPECT_EQ(fx.actions[0].grace_ms, 120000);
}

TEST_F(JobTableTest, APreemptWhilePreparingEndsWithoutAProcess) {
  const int64_t key = Assign(TrainStart(86));
  JobEffects fx = table_.Cancel(Preempt(86), clock_.NowMs());
  EXPECT_TRUE(fx.actions.empty());
  ASSERT_EQ(Diary(fx).size(), 1u);
  EXPECT_EQ(Diary(fx)[0].text(),
            "[dlbatch] preempted by job 7 (priority 10): stopped before it "
            "started");
  std::optional<v1::JobEnded> ended =
      Ended(table_.Prepared(key, Process(), {}, clock_.NowMs()));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(ended->reason(), "preempted by job 7 (priority 10)");
}

// Once its processes are gone a job ends as they left it: one that
// finished (or failed) on its own before the preemption reached it is not
// requeued.
TEST_F(JobTableTest, AJobThatEndedBeforeThePreemptIsNotChanged) {
  const int64_t done = Running(TrainStart(87));
  table_.Exited(done, Exit(0), clock_.NowMs());
  EXPECT_TRUE(Empty(table_.Cancel(Preempt(87), clock_.NowMs())));
  std::optional<v1::JobEnded> ended = Ended(Uploaded(done));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_FINISHED);
  EXPECT_EQ(ended->last_seq(), 0);  // no "preempted" line

  const int64_t failed = Running(Start(88));
  table_.Exited(failed, Exit(3), clock_.NowMs());
  EXPECT_TRUE(Empty(table_.Cancel(Preempt(88), clock_.NowMs())));
  ended = Ended(Uploaded(failed));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(ended->reason(), "exit code 3");

  // Ended and reported: nothing either.
  EXPECT_TRUE(Empty(table_.Cancel(Preempt(87), clock_.NowMs())));
}

// A job already stopping at its time limit fails by it; requeued, it would
// only reach it again.
TEST_F(JobTableTest, AJobPastItsTimeLimitIsNotPreempted) {
  const int64_t key = Running(Start(89, /*time_limit_s=*/5));
  clock_.Advance(5000);
  ASSERT_EQ(Kinds(table_.Tick(clock_.NowMs(), clock_.MonotonicMs())),
            std::vector<JobAction::Kind>{JobAction::kTerminate});
  EXPECT_TRUE(Empty(table_.Cancel(Preempt(89), clock_.NowMs())));
  table_.Exited(key, Killed(SIGTERM), clock_.NowMs());
  std::optional<v1::JobEnded> ended = Ended(Uploaded(key));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(ended->reason(), "time limit 5s reached");
}

// A cancel that does not preempt is the cancel it always was, a train
// job's too, whatever signal it carries.
TEST_F(JobTableTest, ACancelWithoutPreemptIsUnchanged) {
  const int64_t key = Running(TrainStart(100));
  v1::CancelJob c = Preempt(100, SIGUSR2, 3000);
  c.set_preempt(false);
  c.set_reason("user asked");
  JobEffects fx = table_.Cancel(c, clock_.NowMs());
  ASSERT_EQ(Kinds(fx), std::vector<JobAction::Kind>{JobAction::kTerminate});
  EXPECT_EQ(fx.actions[0].signal, SIGTERM);
  EXPECT_EQ(fx.actions[0].grace_ms, 3000);
  ASSERT_EQ(Diary(fx).size(), 1u);
  EXPECT_EQ(Diary(fx)[0].text(), "[dlbatch] stopping the job: user asked");
  table_.Exited(key, Killed(SIGTERM), clock_.NowMs());
  std::optional<v1::JobEnded> ended = Ended(Uploaded(key));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(ended->reason(), "user asked");
  EXPECT_EQ(ended->exit_code(), 128 + SIGTERM);
}

}  // namespace
}  // namespace dlbatch::worker

namespace dlbatch::worker {
namespace {

// A command job's $DLBATCH_PROGRESS: its reports become progress records,
// at most one per interval (the latest wins; a tick sends what waited).
TEST_F(JobTableTest, ACommandJobsProgressIsSentAtMostOncePerInterval) {
  const int64_t key = Running(Start(90));
  OutputLine line = Out(JobTable::kChannelStream, R"({"step":1,"loss":2})");
  line.time_ms = 1000;
  EXPECT_EQ(RecordKinds(table_.Line(key, line)),
            std::vector<std::string>{"progress"});
  line.text = R"({"step":2,"loss":1.5,"tokens":7})";
  line.time_ms = 1050;
  EXPECT_TRUE(Empty(table_.Line(key, line))) << "within the interval";
  JobEffects fx = table_.Tick(1100, clock_.MonotonicMs());
  EXPECT_TRUE(Empty(fx)) << "still within it";
  fx = table_.Tick(1200, clock_.MonotonicMs());
  ASSERT_EQ(RecordKinds(fx), std::vector<std::string>{"progress"});
  const v1::TrainProgress& p = fx.records[0].progress().progress();
  EXPECT_EQ(p.iteration(), 2);
  EXPECT_DOUBLE_EQ(p.loss(), 1.5);
  EXPECT_DOUBLE_EQ(p.metrics().at("tokens"), 7);
  EXPECT_TRUE(Empty(table_.Tick(1500, clock_.MonotonicMs())));
}

TEST_F(JobTableTest, ACommandJobsBadProgressLinesAreNotedThenCounted) {
  const int64_t key = Running(Start(91));
  std::vector<std::string> noted;
  for (int i = 0; i < 5; ++i) {
    for (const auto& d :
         Diary(table_.Line(key, Out(JobTable::kChannelStream, "garbage"))))
      noted.push_back(d.text());
  }
  ASSERT_EQ(noted.size(), 3u);
  EXPECT_EQ(noted[0], "[dlbatch] $DLBATCH_PROGRESS line 1 ignored: not JSON");
  EXPECT_THAT(noted[2], ::testing::HasSubstr("further bad lines are counted"));
  table_.Line(key, Out(JobTable::kChannelStream, R"({"loss":1})"));
  JobEffects fx = table_.Exited(key, Exit(0), clock_.NowMs());
  ASSERT_EQ(Diary(fx).size(), 1u);
  EXPECT_EQ(Diary(fx)[0].text(),
            "[dlbatch] $DLBATCH_PROGRESS: 6 line(s) read, 5 ignored");
  // The reported history goes with the outputs' upload.
  ASSERT_EQ(Kinds(fx), std::vector<JobAction::Kind>{JobAction::kUploadOutputs});
  EXPECT_EQ(fx.actions[0].history.iterations.size(), 1u);
  EXPECT_EQ(fx.actions[0].history_title, "job 91");
}

TEST_F(JobTableTest, ACommandJobsLastReportIsSentWhenItExits) {
  const int64_t key = Running(Start(92));
  OutputLine line = Out(JobTable::kChannelStream, R"({"step":1})");
  line.time_ms = 1000;
  table_.Line(key, line);
  line.text = R"({"step":9})";
  line.time_ms = 1010;
  table_.Line(key, line);
  JobEffects fx = table_.Exited(key, Exit(0), 1020);
  ASSERT_EQ(RecordKinds(fx), std::vector<std::string>{"progress"});
  EXPECT_EQ(fx.records[0].progress().progress().iteration(), 9);
}

TEST_F(JobTableTest, AStopOfACommandJobWritesItsStopFileWithWhy) {
  const int64_t key = Running(Start(93));
  JobEffects fx = table_.Cancel(Preempt(93), clock_.NowMs());
  ASSERT_EQ(Kinds(fx), std::vector<JobAction::Kind>{JobAction::kTerminate});
  EXPECT_EQ(fx.actions[0].stop_file, "/work/jobs/93-1-0/.dlbatch-stop");
  EXPECT_EQ(fx.actions[0].stop_why, "preempted");
  (void)key;
  Running(Start(94));
  fx = table_.Cancel(Ref(94), 5000, "cancelled by alice", clock_.NowMs());
  ASSERT_EQ(fx.actions.size(), 1u);
  EXPECT_EQ(fx.actions[0].stop_why, "cancelled");
  Running(Start(95, /*time_limit_s=*/1));
  fx = table_.Tick(clock_.NowMs(), clock_.MonotonicMs() + 2000);
  ASSERT_EQ(Kinds(fx), std::vector<JobAction::Kind>{JobAction::kTerminate});
  EXPECT_EQ(fx.actions[0].stop_why, "time_limit");
  EXPECT_EQ(fx.actions[0].signal, SIGTERM);
  EXPECT_EQ(fx.actions[0].grace_ms, JobTable::kTimeLimitGraceMs);
  // A trainer has its own way to stop.
  Running(TrainStart(96));
  fx = table_.Cancel(Preempt(96), clock_.NowMs());
  ASSERT_EQ(fx.actions.size(), 1u);
  EXPECT_TRUE(fx.actions[0].stop_file.empty());
}

// A command job's {"checkpoint": STEP} is part 0's to store, unless the job
// says `checkpoint: per-part`: then every part stores its own folder.
TEST_F(JobTableTest, ACommandJobsCheckpointIsPartZerosUnlessPerPart) {
  const OutputLine announce =
      Out(JobTable::kChannelStream, R"({"step":20,"checkpoint":20})");
  auto part = [&](int64_t id, int index, const std::string& mode) {
    v1::StartJob s = Start(id);
    s.set_part(index);
    s.set_parts(2);
    s.mutable_spec()->set_checkpoint(mode);
    return Running(s);
  };
  const int64_t zero = part(101, 0, "");
  JobEffects fx = table_.Line(zero, announce);
  ASSERT_EQ(Kinds(fx),
            std::vector<JobAction::Kind>{JobAction::kUploadCheckpoint});
  EXPECT_EQ(fx.actions[0].iteration, 20);
  EXPECT_EQ(fx.actions[0].checkpoint_dir, "/work/jobs/101-1-0/checkpoint");
  EXPECT_TRUE(Kinds(table_.Line(part(102, 1, ""), announce)).empty());
  const int64_t one = part(103, 1, "per-part");
  fx = table_.Line(one, announce);
  ASSERT_EQ(Kinds(fx),
            std::vector<JobAction::Kind>{JobAction::kUploadCheckpoint});
  EXPECT_EQ(fx.actions[0].checkpoint_dir, "/work/jobs/103-1-1/checkpoint");
  fx = table_.CheckpointStored(one, 20, Files(), clock_.NowMs());
  ASSERT_EQ(RecordKinds(fx), std::vector<std::string>{"checkpoint 20"});
  EXPECT_EQ(fx.records[0].checkpoint().part(), 1);
}

}  // namespace
}  // namespace dlbatch::worker

namespace dlbatch::worker {
namespace {

// What is left of a preemption's grace when the cancel is sent is a few ms
// under the profile's; the diary names the grace, not 1m59s.
TEST_F(JobTableTest, APreemptsGraceLeftIsShownInWholeSecondsRoundedUp) {
  Running(Start(97));
  JobEffects fx =
      table_.Cancel(Preempt(97, SIGTERM, /*grace_ms=*/119997), clock_.NowMs());
  ASSERT_EQ(Diary(fx).size(), 1u);
  EXPECT_NE(Diary(fx)[0].text().find("(killed in 2m00s if still running)"),
            std::string::npos)
      << Diary(fx)[0].text();
}

}  // namespace
}  // namespace dlbatch::worker
