// What the worker owes the scheduler, driven by hand: records added,
// messages taken, acknowledgements and reconnects (Rewind), no link and no
// threads.
#include "worker/outbox.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dlbatch::worker {
namespace {

const JobRef kJob{1, 1, 0};

v1::WorkerMessage Lines(const JobRef& ref, int64_t first, int64_t last) {
  v1::WorkerMessage m;
  ref.To(m.mutable_diary());
  for (int64_t seq = first; seq <= last; ++seq) {
    v1::DiaryLine* l = m.mutable_diary()->add_lines();
    l->set_seq(seq);
    l->set_text("line " + std::to_string(seq));
  }
  return m;
}

v1::WorkerMessage Progress(const JobRef& ref, int64_t iteration) {
  v1::WorkerMessage m;
  ref.To(m.mutable_progress());
  m.mutable_progress()->mutable_progress()->set_iteration(iteration);
  return m;
}

v1::WorkerMessage Checkpoint(const JobRef& ref, int64_t iteration) {
  v1::WorkerMessage m;
  ref.To(m.mutable_checkpoint());
  m.mutable_checkpoint()->set_iteration(iteration);
  return m;
}

v1::WorkerMessage Ended(const JobRef& ref, int64_t last_seq) {
  v1::WorkerMessage m;
  ref.To(m.mutable_ended());
  m.mutable_ended()->set_state(v1::JOB_STATE_FINISHED);
  m.mutable_ended()->set_last_seq(last_seq);
  return m;
}

// The seqs of the diary lines in `ms`, in order.
std::vector<int64_t> Seqs(const std::vector<v1::WorkerMessage>& ms) {
  std::vector<int64_t> out;
  for (const auto& m : ms) {
    if (!m.has_diary()) continue;
    for (const auto& l : m.diary().lines()) out.push_back(l.seq());
  }
  return out;
}

// What each message is, in order: "diary", "progress", "checkpoint",
// "ended".
std::vector<std::string> Kinds(const std::vector<v1::WorkerMessage>& ms) {
  std::vector<std::string> out;
  for (const auto& m : ms) {
    out.push_back(m.has_diary()        ? "diary"
                  : m.has_progress()   ? "progress"
                  : m.has_checkpoint() ? "checkpoint"
                  : m.has_ended()      ? "ended"
                                       : "other");
  }
  return out;
}

TEST(OutboxTest, RewindSendsTheUnackedAgainInOrder) {
  Outbox box;
  JobRef ref{1, 1, 0};
  box.Open(ref);
  for (int seq : {1, 3, 2}) {  // out of order: put in place
    v1::WorkerMessage m;
    ref.To(m.mutable_diary());
    m.mutable_diary()->add_lines()->set_seq(seq);
    box.Add(m);
  }
  std::vector<v1::WorkerMessage> first = box.TakeDue();
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(first[0].diary().lines_size(), 3);
  EXPECT_EQ(first[0].diary().lines(1).seq(), 2);
  EXPECT_FALSE(box.HasDue());
  box.AckDiary(ref, 2);
  box.Rewind();
  std::vector<v1::WorkerMessage> again = box.TakeDue();
  ASSERT_EQ(again.size(), 1u);
  ASSERT_EQ(again[0].diary().lines_size(), 1);
  EXPECT_EQ(again[0].diary().lines(0).seq(), 3);
  EXPECT_FALSE(box.AckEnded(ref));  // no report yet: still held
  EXPECT_EQ(box.Held().size(), 1u);
}

TEST(OutboxTest, RecordsOfJobsNotHeldAreDropped) {
  Outbox box;
  box.Add(Lines(kJob, 1, 2));
  box.Add(Progress(kJob, 5));
  box.Add(Checkpoint(kJob, 5));
  box.Add(Ended(kJob, 2));
  EXPECT_FALSE(box.HasDue());
  EXPECT_TRUE(box.TakeDue().empty());
  EXPECT_TRUE(box.Held().empty());
  EXPECT_EQ(box.Unacked(kJob), 0u);
  EXPECT_FALSE(box.AckEnded(kJob));
}

// On one connection each message is sent once; only what is added after
// it is taken next.
TEST(OutboxTest, WhatWasTakenIsNotTakenAgainOnTheSameConnection) {
  Outbox box;
  box.Open(kJob);
  box.Add(Lines(kJob, 1, 2));
  EXPECT_TRUE(box.HasDue());
  EXPECT_EQ(Seqs(box.TakeDue()), (std::vector<int64_t>{1, 2}));
  EXPECT_FALSE(box.HasDue());
  EXPECT_TRUE(box.TakeDue().empty());
  box.Add(Lines(kJob, 3, 3));
  EXPECT_EQ(Seqs(box.TakeDue()), std::vector<int64_t>{3});
  // Sent is not acknowledged: all three are still owed.
  EXPECT_EQ(box.Unacked(kJob), 3u);
}

TEST(OutboxTest, AJobsLinesComeBeforeItsProgressCheckpointAndReport) {
  Outbox box;
  box.Open(kJob);
  box.Add(Ended(kJob, 2));
  box.Add(Checkpoint(kJob, 10));
  box.Add(Progress(kJob, 10));
  box.Add(Lines(kJob, 1, 2));
  std::vector<v1::WorkerMessage> due = box.TakeDue();
  EXPECT_EQ(Kinds(due), (std::vector<std::string>{"diary", "progress",
                                                  "checkpoint", "ended"}));
  EXPECT_EQ(due[3].ended().last_seq(), 2);
}

TEST(OutboxTest, LinesGoInBatchesOfAtMostBatchLines) {
  Outbox box;
  box.Open(kJob);
  const int n = 2 * Outbox::kBatchLines + 1;
  box.Add(Lines(kJob, 1, n));
  std::vector<v1::WorkerMessage> due = box.TakeDue();
  ASSERT_EQ(due.size(), 3u);
  EXPECT_EQ(due[0].diary().lines_size(), Outbox::kBatchLines);
  EXPECT_EQ(due[1].diary().lines_size(), Outbox::kBatchLines);
  EXPECT_EQ(due[2].diary().lines_size(), 1);
  EXPECT_EQ(due[2].diary().lines(0).seq(), n);
  EXPECT_EQ(JobRef::Of(due[1].diary()), kJob);
}

TEST(OutboxTest, AcknowledgedLinesAreForgotten) {
  Outbox box;
  box.Open(kJob);
  box.Add(Lines(kJob, 1, 5));
  box.TakeDue();
  box.AckDiary(kJob, 3);
  EXPECT_EQ(box.Unacked(kJob), 2u);
  box.AckDiary(kJob, 2);  // an older acknowledgement changes nothing
  EXPECT_EQ(box.Unacked(kJob), 2u);
  box.AckDiary(kJob, 5);
  EXPECT_EQ(box.Unacked(kJob), 0u);
  box.Rewind();
  EXPECT_FALSE(box.HasDue());
  // Lines acknowledged before they were sent are not sent either.
  box.Add(Lines(kJob, 6, 8));
  box.AckDiary(kJob, 7);
  EXPECT_EQ(Seqs(box.TakeDue()), std::vector<int64_t>{8});
}

// A reconnect while a job's scheduler was away: what it had not
// acknowledged, and what came meanwhile, is sent on the new connection,
// lines before the report.
TEST(OutboxTest, ARewindResendsTheUnacknowledgedLinesAndTheReport) {
  Outbox box;
  box.Open(kJob);
  box.Add(Lines(kJob, 1, 3));
  EXPECT_EQ(Seqs(box.TakeDue()), (std::vector<int64_t>{1, 2, 3}));
  box.AckDiary(kJob, 1);
  box.Add(Lines(kJob, 4, 4));
  box.Add(Ended(kJob, 4));
  box.Rewind();
  std::vector<v1::WorkerMessage> again = box.TakeDue();
  EXPECT_EQ(Seqs(again), (std::vector<int64_t>{2, 3, 4}));
  ASSERT_EQ(Kinds(again).back(), "ended");
  EXPECT_EQ(again.back().ended().last_seq(), 4);
  // Another reconnect before any acknowledgement: all of it again.
  box.Rewind();
  EXPECT_EQ(Kinds(box.TakeDue()), (std::vector<std::string>{"diary", "ended"}));
}

// The scheduler keeps the newest progress and checkpoint: those are sent
// again after every reconnect while the job is held, never older ones.
TEST(OutboxTest, TheNewestProgressAndCheckpointAreSentAfterEachRewind) {
  Outbox box;
  box.Open(kJob);
  box.Add(Progress(kJob, 10));
  box.Add(Progress(kJob, 20));
  box.Add(Checkpoint(kJob, 15));
  std::vector<v1::WorkerMessage> due = box.TakeDue();
  ASSERT_EQ(Kinds(due), (std::vector<std::string>{"progress", "checkpoint"}));
  EXPECT_EQ(due[0].progress().progress().iteration(), 20);
  EXPECT_FALSE(box.HasDue());
  box.Rewind();
  due = box.TakeDue();
  ASSERT_EQ(Kinds(due), (std::vector<std::string>{"progress", "checkpoint"}));
  EXPECT_EQ(due[1].checkpoint().iteration(), 15);
}

TEST(OutboxTest, AnAcknowledgedEndReleasesTheJob) {
  Outbox box;
  box.Open(kJob);
  box.Add(Lines(kJob, 1, 1));
  box.Add(Progress(kJob, 1));
  box.Add(Ended(kJob, 1));
  box.TakeDue();
  EXPECT_EQ(box.Held(), std::vector<JobRef>{kJob});
  EXPECT_TRUE(box.AckEnded(kJob));
  EXPECT_TRUE(box.Held().empty());
  EXPECT_EQ(box.Unacked(kJob), 0u);
  box.Rewind();
  EXPECT_FALSE(box.HasDue());  // nothing of it is sent again
  EXPECT_FALSE(box.AckEnded(kJob));
  // Its late records are dropped.
  box.Add(Lines(kJob, 2, 2));
  EXPECT_FALSE(box.HasDue());
}

TEST(OutboxTest, HeldNamesEveryOpenJobOnceAndJobsAreIndependent) {
  Outbox box;
  const JobRef other{2, 1, 0};
  const JobRef part{1, 1, 1};
  box.Open(other);
  box.Open(kJob);
  box.Open(part);
  box.Add(Lines(kJob, 1, 2));
  box.Open(kJob);  // opened again: keeps what it holds
  EXPECT_EQ(box.Unacked(kJob), 2u);
  EXPECT_EQ(box.Held(), (std::vector<JobRef>{kJob, part, other}));
  box.Add(Lines(other, 1, 1));
  box.AckDiary(kJob, 2);
  EXPECT_EQ(box.Unacked(kJob), 0u);
  EXPECT_EQ(box.Unacked(other), 1u);
  EXPECT_EQ(box.Unacked(part), 0u);
  box.Add(Ended(other, 1));
  EXPECT_TRUE(box.AckEnded(other));
  EXPECT_EQ(box.Held(), (std::vector<JobRef>{kJob, part}));
}

}  // namespace
}  // namespace dlbatch::worker
