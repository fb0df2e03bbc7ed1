// The kept checkpoints of each job's parts (job_checkpoints): stored and
// replaced by (part, iteration), read back in order on both connections,
// holding their blobs until the job is purged, and made from the one
// checkpoint a file of version 12 kept per job.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/store/store.h"
#include "scheduler/store/store_reader.h"

namespace dlbatch::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

std::string Sha(char c) { return std::string(64, c); }

v1::CheckpointStored Kept(int64_t job, int part, int64_t iteration,
                          const std::string& sha, int attempt = 1) {
  v1::CheckpointStored c;
  c.set_job_id(job);
  c.set_attempt(attempt);
  c.set_part(part);
  c.set_iteration(iteration);
  v1::OutputFile* f = c.add_files();
  f->set_path(absl::StrCat("part", part, ".pt"));
  f->set_size(10);
  f->set_sha256(sha);
  return c;
}

// (part, iteration, attempt) of each.
std::vector<std::string> Keys(const std::vector<v1::CheckpointStored>& kept) {
  std::vector<std::string> out;
  for (const auto& c : kept)
    out.push_back(absl::StrCat(c.part(), "/", c.iteration(), "/", c.attempt()));
  return out;
}

class KeptCheckpointsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "kept_checkpoints.XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
    path_ = dir_ + "/state.db";
    ASSERT_NO_FATAL_FAILURE(Reopen());
    reader_ = std::make_unique<StoreReader>(path_);
  }
  void TearDown() override {
    reader_.reset();
    store_.reset();
    EXPECT_TRUE(RemoveTree(dir_).ok());
  }
  void Reopen() {
    store_.reset();
    auto store = Store::Open(path_, /*sync_full=*/false);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  int64_t Insert(v1::JobState state) {
    JobRecord job;
    job.user = "ada";
    job.spec.set_name("kept");
    job.spec.set_profile("local");
    job.spec.mutable_command()->add_argv("true");
    job.state = state;
    job.submit_ms = 1'000;
    auto id = store_->InsertJob(job);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or(0);
  }
  void End(int64_t id) {
    JobRecord r;
    r.id = id;
    r.state = v1::JOB_STATE_FINISHED;
    ASSERT_TRUE(store_->UpdateJob(r).ok());
  }

  std::string dir_, path_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<StoreReader> reader_;
};

TEST_F(KeptCheckpointsTest, RoundTripInPartAndIterationOrder) {
  const int64_t job = Insert(v1::JOB_STATE_RUNNING);
  const int64_t other = Insert(v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(store_->PutKeptCheckpoint(job, Kept(job, 1, 20, Sha('a'))).ok());
  ASSERT_TRUE(store_->PutKeptCheckpoint(job, Kept(job, 0, 30, Sha('b'))).ok());
  ASSERT_TRUE(store_->PutKeptCheckpoint(job, Kept(job, 0, 10, Sha('c'))).ok());
  ASSERT_TRUE(store_->PutKeptCheckpoint(job, Kept(job, 1, 10, Sha('d'))).ok());
  ASSERT_TRUE(
      store_->PutKeptCheckpoint(other, Kept(other, 0, 5, Sha('e'))).ok());
  // The same part and step again (a later attempt's): replaced.
  ASSERT_TRUE(
      store_->PutKeptCheckpoint(job, Kept(job, 1, 20, Sha('f'), 2)).ok());
  ASSERT_NO_FATAL_FAILURE(Reopen());
  for (auto got :
       {store_->KeptCheckpoints(job), reader_->KeptCheckpoints(job)}) {
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_THAT(Keys(*got),
                ElementsAre("0/10/1", "0/30/1", "1/10/1", "1/20/2"));
    EXPECT_EQ((*got)[3].files(0).sha256(), Sha('f'));
    EXPECT_EQ((*got)[3].files(0).path(), "part1.pt");
  }
  ASSERT_TRUE(store_->DeleteKeptCheckpoint(job, 0, 10).ok());
  ASSERT_TRUE(store_->DeleteKeptCheckpoint(job, 0, 99).ok());  // none: fine
  EXPECT_THAT(Keys(reader_->KeptCheckpoints(job).value()),
              ElementsAre("0/30/1", "1/10/1", "1/20/2"));
  EXPECT_THAT(Keys(reader_->KeptCheckpoints(other).value()),
              ElementsAre("0/5/1"));
  EXPECT_THAT(reader_->KeptCheckpoints(other + 1).value(), IsEmpty());
}

TEST_F(KeptCheckpointsTest, TheirBlobsAreHeldUntilThePurgeDeletesThem) {
  const int64_t job = Insert(v1::JOB_STATE_RUNNING);
  const int64_t other = Insert(v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(store_->PutKeptCheckpoint(job, Kept(job, 0, 10, Sha('a'))).ok());
  ASSERT_TRUE(store_->PutKeptCheckpoint(job, Kept(job, 1, 10, Sha('b'))).ok());
  ASSERT_TRUE(store_->PutKeptCheckpoint(job, Kept(job, 0, 20, Sha('c'))).ok());
  // Another job stores a file of the same bytes.
  ASSERT_TRUE(
      store_->PutKeptCheckpoint(other, Kept(other, 0, 10, Sha('c'))).ok());
  // Held: the job's owner may name them (as any blob a job holds).
  EXPECT_TRUE(reader_->UserHoldsBlob("ada", Sha('b')).value());
  // A checkpoint dropped from the kept set leaves its blob held by the job
  // for as long as the job is kept: nothing it was given back is deleted
  // under a worker that may still be fetching it.
  ASSERT_TRUE(store_->DeleteKeptCheckpoint(job, 0, 10).ok());
  EXPECT_TRUE(reader_->UserHoldsBlob("ada", Sha('a')).value());
  // Not purged while running.
  auto purged = store_->PurgeJobs({job});
  ASSERT_TRUE(purged.ok()) << purged.status();
  EXPECT_EQ(purged->jobs, 0);
  ASSERT_NO_FATAL_FAILURE(End(job));
  purged = store_->PurgeJobs({job});
  ASSERT_TRUE(purged.ok()) << purged.status();
  EXPECT_EQ(purged->jobs, 1);
  // 'c' is the other job's too.
  EXPECT_THAT(purged->unreferenced_blobs,
              UnorderedElementsAre(Sha('a'), Sha('b')));
  EXPECT_THAT(reader_->KeptCheckpoints(job).value(), IsEmpty());
  EXPECT_THAT(Keys(reader_->KeptCheckpoints(other).value()),
              ElementsAre("0/10/1"));
  ASSERT_NO_FATAL_FAILURE(End(other));
  purged = store_->PurgeJobs({other});
  ASSERT_TRUE(purged.ok());
  EXPECT_THAT(purged->unreferenced_blobs, ElementsAre(Sha('c')));
}

TEST_F(KeptCheckpointsTest, OpensAVersion12FileAndKeepsEachJobsCheckpoint) {
  const int64_t job = Insert(v1::JOB_STATE_QUEUED);
  const int64_t empty = Insert(v1::JOB_STATE_QUEUED);
  const int64_t none = Insert(v1::JOB_STATE_QUEUED);
  // What a version 12 scheduler stored: one checkpoint per job.
  ASSERT_TRUE(store_->PutCheckpoint(job, Kept(job, 0, 40, Sha('a'), 3)).ok());
  v1::CheckpointStored no_files;
  no_files.set_iteration(5);
  ASSERT_TRUE(store_->PutCheckpoint(empty, no_files).ok());
  v1::TrainProgress progress;
  progress.set_iteration(7);
  ASSERT_TRUE(store_->PutProgress(none, progress).ok());
  absl::Status undone = store_->db()->Exec(
      "DROP TABLE job_checkpoints; "
      "UPDATE meta SET value='12' WHERE key='schema'");
  ASSERT_TRUE(undone.ok()) << undone;
  ASSERT_NO_FATAL_FAILURE(Reopen());
  auto version =
      store_->db()->Prepare("SELECT value FROM meta WHERE key='schema'");
  ASSERT_TRUE(version.ok());
  ASSERT_TRUE((*version)->Step().value());
  EXPECT_EQ((*version)->Text(0), "15");
  (*version)->Reset();

  auto kept = store_->KeptCheckpoints(job);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_THAT(Keys(*kept), ElementsAre("0/40/3"));
  EXPECT_EQ((*kept)[0].files(0).sha256(), Sha('a'));
  // Nothing to give back, nothing to keep.
  EXPECT_THAT(store_->KeptCheckpoints(empty).value(), IsEmpty());
  EXPECT_THAT(store_->KeptCheckpoints(none).value(), IsEmpty());
  // The resume point stays where it was.
  EXPECT_EQ(store_->GetTrainState(job).value().checkpoint.iteration(), 40);
  // Opened again (current now): as it is, and purged with its job.
  ASSERT_NO_FATAL_FAILURE(Reopen());
  EXPECT_EQ(store_->KeptCheckpoints(job).value().size(), 1u);
  ASSERT_NO_FATAL_FAILURE(End(job));
  auto purged = store_->PurgeJobs({job});
  ASSERT_TRUE(purged.ok());
  EXPECT_THAT(purged->unreferenced_blobs, ElementsAre(Sha('a')));
  EXPECT_THAT(store_->KeptCheckpoints(job).value(), IsEmpty());
}

}  // namespace
}  // namespace dlbatch::scheduler
