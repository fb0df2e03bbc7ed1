// Unit tests for the scheduler's durable state: the SQLite store and its
// reader, the thin SQLite layer, and the content-addressed blob store.
#include "scheduler/store/store.h"

#include <google/protobuf/util/message_differencer.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/store/blob_store.h"
#include "scheduler/store/sqlite.h"

namespace dlbatch::scheduler {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

// A fresh folder per test, removed afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "store_test.XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
  }
  void TearDown() override { EXPECT_TRUE(RemoveTree(dir_).ok()); }

  std::string dir_;
};

v1::JobSpec Spec(const std::string& name, int pool = 1, int priority = 0) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.set_profile("local");
  spec.set_pool(pool);
  spec.set_priority(priority);
  spec.set_time_limit_s(3600);
  spec.mutable_command()->add_argv("python3");
  spec.mutable_command()->add_argv("train.py");
  (*spec.mutable_env())["SEED"] = "7";
  v1::Attachment* a = spec.add_attach();
  a->set_path("data/x.bin");
  a->set_sha256(std::string(64, 'a'));
  a->set_size(10);
  a->set_mode(0644);
  return spec;
}

JobRecord NewJob(const std::string& name, const std::string& request_id = "",
                 v1::JobState state = v1::JOB_STATE_QUEUED) {
  JobRecord job;
  job.request_id = request_id;
  job.user = "ada";
  job.spec = Spec(name);
  job.state = state;
  job.submit_ms = 1'000;
  return job;
}

v1::OutputFile Output(const std::string& path, int64_t size) {
  v1::OutputFile f;
  f.set_path(path);
  f.set_size(size);
  f.set_sha256(Sha256Hex(path));
  f.set_mode(0640);
  return f;
}

class StoreTest : public TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    path_ = dir_ + "/state.db";
    Reopen();
    reader_ = std::make_unique<StoreReader>(path_);
  }

  void Reopen() {
    store_.reset();
    auto store = Store::Open(path_, /*sync_full=*/false);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }

  // Makes the file what a version `version` scheduler left (`undo` takes
  // out what later versions added) and reopens it, which migrates it. Call
  // it inside ASSERT_NO_FATAL_FAILURE.
  void ReopenAsVersion(int version, absl::string_view undo) {
    absl::Status undone = store_->db()->Exec(absl::StrCat(
        undo, "UPDATE meta SET value='", version, "' WHERE key='schema'"));
    ASSERT_TRUE(undone.ok()) << undone;
    ASSERT_NO_FATAL_FAILURE(Reopen());
  }

  void TearDown() override {
    reader_.reset();
    store_.reset();
    TempDirTest::TearDown();
  }

  StoreReader& reader() { return *reader_; }

  int64_t Insert(const JobRecord& job) {
    auto id = store_->InsertJob(job);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or(0);
  }

  std::vector<int64_t> ListedIds(const std::vector<v1::JobState>& states,
                                 int limit, bool newest_first) {
    v1::ListJobsReply reply;
    absl::Status s =
        reader().ListJobSummaries(states, limit, newest_first, &reply);
    EXPECT_TRUE(s.ok()) << s;
    std::vector<int64_t> ids;
    for (const v1::Job& job : reply.jobs()) ids.push_back(job.id());
    return ids;
  }

  std::string path_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<StoreReader> reader_;
};

// ---- Parts ----

TEST(PartsTest, EncodeAndDecode) {
  std::vector<Part> parts = {{3, {0, 1}}, {7, {2}}};
  EXPECT_EQ(EncodeParts(parts), "3:0,1;7:2");
  EXPECT_EQ(DecodeParts("3:0,1;7:2"), parts);
  EXPECT_EQ(EncodeParts({}), "");
  EXPECT_THAT(DecodeParts(""), IsEmpty());

  std::vector<Part> cpu_only = {{5, {}}};
  EXPECT_EQ(DecodeParts(EncodeParts(cpu_only)), cpu_only);
}

// ---- Open and schema ----

TEST_F(StoreTest, OpenCreatesTheSchemaAndReopensIt) {
  auto count = store_->CountJobs();
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 0);
  Insert(NewJob("a"));
  Reopen();
  EXPECT_EQ(store_->CountJobs().value(), 1);
  Reopen();  // a second reopen finds the version it wrote
  EXPECT_EQ(store_->CountJobs().value(), 1);
}

TEST_F(StoreTest, RefusesAnotherSchemaVersion) {
  ASSERT_TRUE(
      store_->db()->Exec("UPDATE meta SET value='99' WHERE key='schema'").ok());
  store_.reset();
  auto reopened = Store::Open(path_, false);
  ASSERT_FALSE(reopened.ok());
  EXPECT_EQ(reopened.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(reopened.status().message()),
              HasSubstr("schema version 99"));
  EXPECT_THAT(std::string(reopened.status().message()),
              HasSubstr("reads version 15"));
  EXPECT_THAT(std::string(reopened.status().message()), HasSubstr(path_));
}

TEST_F(StoreTest, RefusesANewerLayoutBeforeTouchingIt) {
  // A file written by a later scheduler whose tables differ: the version
  // check must come first and must not add this version's tables to it.
  store_.reset();
  std::string newer = dir_ + "/newer.db";
  {
    auto db = Database::Open(newer, false, false);
    ASSERT_TRUE(db.ok()) << db.status();
    ASSERT_TRUE(
        (*db)
            ->Exec(
                "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
                "INSERT INTO meta VALUES('schema', '99');"
                "CREATE TABLE diary(n INTEGER PRIMARY KEY, body BLOB);")
            .ok());
  }
  auto opened = Store::Open(newer, false);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(opened.status().message()),
              HasSubstr("schema version 99"));

  auto db = Database::Open(newer, false, false);
  ASSERT_TRUE(db.ok());
  auto st =
      (*db)->Prepare("SELECT COUNT(*) FROM sqlite_master WHERE name='jobs'");
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE((*st)->Step().value());
  EXPECT_EQ((*st)->Int(0), 0) << "Open added tables to a file it refused";
}

TEST_F(StoreTest, OpensAVersion1FileAndAddsTheSweepColumn) {
  const int64_t old = Insert(NewJob("from-v1"));
  // Version 1 had no sweep column.
  ASSERT_NO_FATAL_FAILURE(ReopenAsVersion(
      1, "DROP INDEX jobs_by_sweep; ALTER TABLE jobs DROP COLUMN sweep_id;"));
  auto version =
      store_->db()->Prepare("SELECT value FROM meta WHERE key='schema'");
  ASSERT_TRUE(version.ok());
  ASSERT_TRUE((*version)->Step().value());
  EXPECT_EQ((*version)->Text(0), "15");
  (*version)->Reset();
  auto job = reader().GetJob(old);
  ASSERT_TRUE(job.ok() && job->has_value()) << job.status();
  EXPECT_EQ((*job)->spec.name(), "from-v1");
  EXPECT_EQ((*job)->sweep_id, 0);
  JobRecord swept = NewJob("swept");
  swept.sweep_id = 1;
  const int64_t id = Insert(swept);
  EXPECT_EQ(store_->SweepIdOf(id).value(), 1);
  EXPECT_EQ(store_->NextSweepId().value(), 2);
  Reopen();  // the migrated file reopens as version 2
  EXPECT_EQ(store_->CountJobs().value(), 2);
}

TEST_F(StoreTest, OpensAVersion5FileAndAddsDrainsAndJobControl) {
  const int64_t old = Insert(NewJob("from-v5"));
  ASSERT_NO_FATAL_FAILURE(
      ReopenAsVersion(5, "DROP TABLE worker_drains; DROP TABLE job_control;"));
  ASSERT_TRUE(store_->PutDrain({"w1", "fans", 7}).ok());
  JobControlRecord control;
  control.job_id = old;
  control.held = true;
  control.after = {3, 4};
  ASSERT_TRUE(store_->PutJobControl(control).ok());
  Reopen();
  auto drains = store_->Drains();
  ASSERT_TRUE(drains.ok()) << drains.status();
  ASSERT_EQ(drains->size(), 1u);
  EXPECT_EQ((*drains)[0].reason, "fans");
  auto controls = store_->JobControls();
  ASSERT_TRUE(controls.ok()) << controls.status();
  ASSERT_EQ(controls->size(), 1u);
  EXPECT_TRUE((*controls)[0].held);
  EXPECT_THAT((*controls)[0].after, ElementsAre(3, 4));
  // Nothing left set: the row goes.
  control.held = false;
  control.after.clear();
  ASSERT_TRUE(store_->PutJobControl(control).ok());
  EXPECT_THAT(store_->JobControls().value(), IsEmpty());
  ASSERT_TRUE(store_->DeleteDrain("w1").ok());
  EXPECT_THAT(store_->Drains().value(), IsEmpty());
}

TEST_F(StoreTest, OpensAVersion10FileAndKeepsEachJobsPreemptions) {
  const int64_t old = Insert(NewJob("from-v10", "", v1::JOB_STATE_FINISHED));
  ASSERT_NO_FATAL_FAILURE(ReopenAsVersion(10, "DROP TABLE preemptions;"));
  v1::Preemption first;
  first.set_by_job(7);
  first.set_by_priority(10);
  first.set_kind("priority");
  first.set_attempt(1);
  first.set_time_ms(1000);
  ASSERT_TRUE(store_->PutPreemption(old, 0, first).ok());
  // The preemption under way, then done: the row is replaced.
  first.set_done(true);
  first.set_resume_iteration(1400);
  ASSERT_TRUE(store_->PutPreemption(old, 0, first).ok());
  v1::Preemption second;
  second.set_by_job(9);
  second.set_kind("reclaim");
  second.set_attempt(2);
  ASSERT_TRUE(store_->PutPreemption(old, 1, second).ok());
  Reopen();
  for (auto got : {store_->Preemptions(old), reader().Preemptions(old)}) {
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), 2u);
    EXPECT_EQ((*got)[0].by_job(), 7);
    EXPECT_TRUE((*got)[0].done());
    EXPECT_EQ((*got)[0].resume_iteration(), 1400);
    EXPECT_EQ((*got)[1].kind(), "reclaim");
  }
  EXPECT_THAT(reader().Preemptions(old + 1).value(), IsEmpty());
  // Only queued and running jobs' are loaded at a start.
  EXPECT_THAT(store_->ActivePreemptions().value(), IsEmpty());
  const int64_t running = Insert(NewJob("running", "", v1::JOB_STATE_RUNNING));
  ASSERT_TRUE(store_->PutPreemption(running, 0, second).ok());
  ASSERT_TRUE(store_->PutPreemption(running, 1, first).ok());
  auto active = store_->ActivePreemptions();
  ASSERT_TRUE(active.ok()) << active.status();
  ASSERT_EQ(active->size(), 1u);
  ASSERT_EQ(active->at(running).size(), 2u);
  EXPECT_EQ(active->at(running)[1].by_job(), 7);
  ASSERT_TRUE(store_->DeletePreemption(running, 1).ok());
  EXPECT_EQ(store_->Preemptions(running).value().size(), 1u);
  ASSERT_TRUE(store_->PurgeJobs({old}).ok());
  EXPECT_THAT(reader().Preemptions(old).value(), IsEmpty());
}

TEST_F(StoreTest, OpensAVersion6FileAndKeepsEachJobsSlurmJob) {
  const int64_t old = Insert(NewJob("from-v6"));
  ASSERT_NO_FATAL_FAILURE(ReopenAsVersion(6, "DROP TABLE slurm_jobs;"));
  // Before sbatch: the intent; after it: the id, replacing it.
  slurm::SlurmJobRecord record;
  record.job_id = old;
  record.attempt = 1;
  record.profile = "cluster";
  record.submitted_ms = 5;
  record.token_sha256 = "ab12";
  ASSERT_TRUE(store_->PutSlurmJob(record).ok());
  record.slurm_id = 4242;
  ASSERT_TRUE(store_->PutSlurmJob(record).ok());
  Reopen();
  auto jobs = store_->SlurmJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].job_id, old);
  EXPECT_EQ((*jobs)[0].attempt, 1);
  EXPECT_EQ((*jobs)[0].slurm_id, 4242);
  EXPECT_EQ((*jobs)[0].profile, "cluster");
  EXPECT_EQ((*jobs)[0].submitted_ms, 5);
  EXPECT_EQ((*jobs)[0].token_sha256, "ab12");
  ASSERT_TRUE(store_->DeleteSlurmJob(old).ok());
  EXPECT_THAT(store_->SlurmJobs().value(), IsEmpty());
}

TEST_F(StoreTest, OpensAVersion7FileAndKeepsPartEndsAndResubmissions) {
  const int64_t old = Insert(NewJob("from-v7"));
  ASSERT_NO_FATAL_FAILURE(
      ReopenAsVersion(7, "DROP TABLE part_ends; DROP TABLE slurm_resubmits;"));
  PartEnd end;
  end.job_id = old;
  end.attempt = 2;
  end.part = 1;
  end.exit_code = 143;
  end.failure = "exit code 143";
  ASSERT_TRUE(store_->PutPartEnd(end).ok());
  ASSERT_TRUE(store_->PutSlurmResubmits(old, 2).ok());
  Reopen();
  auto ends = store_->PartEnds();
  ASSERT_TRUE(ends.ok()) << ends.status();
  ASSERT_EQ(ends->size(), 1u);
  EXPECT_EQ((*ends)[0].job_id, old);
  EXPECT_EQ((*ends)[0].attempt, 2);
  EXPECT_EQ((*ends)[0].part, 1);
  EXPECT_EQ((*ends)[0].exit_code, 143);
  EXPECT_EQ((*ends)[0].failure, "exit code 143");
  EXPECT_EQ(store_->SlurmResubmits().value().at(old), 2);
  ASSERT_TRUE(store_->DeletePartEnds(old).ok());
  ASSERT_TRUE(store_->PutSlurmResubmits(old, 0).ok());
  EXPECT_THAT(store_->PartEnds().value(), IsEmpty());
  EXPECT_THAT(store_->SlurmResubmits().value(), IsEmpty());
}

TEST_F(StoreTest, CredentialsAreKeptByHashReplacedByNameAndDeleted) {
  CredentialRecord alice;
  alice.name = "alice";
  alice.admin = true;
  alice.token_sha256 = TokenSha256("dlbu_a");
  alice.created_ms = 5;
  CredentialRecord nodes;
  nodes.name = "alice";  // the same name as a worker credential: another row
  nodes.worker = true;
  nodes.token_sha256 = TokenSha256("dlbw_n");
  ASSERT_TRUE(store_->PutCredential(alice).ok());
  ASSERT_TRUE(store_->PutCredential(nodes).ok());
  Reopen();
  auto all = store_->Credentials();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].name, "alice");
  EXPECT_FALSE((*all)[0].worker);
  EXPECT_TRUE((*all)[0].admin);
  EXPECT_EQ((*all)[0].token_sha256, TokenSha256("dlbu_a"));
  EXPECT_EQ((*all)[0].created_ms, 5);
  EXPECT_TRUE((*all)[1].worker);
  // No token is stored, only its hash.
  auto raw = store_->db()->Prepare(
      "SELECT COUNT(*) FROM credentials WHERE token_sha256 LIKE 'dlb%'");
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE((*raw)->Step().value());
  EXPECT_EQ((*raw)->Int(0), 0);
  (*raw)->Reset();

  alice.token_sha256 = TokenSha256("dlbu_b");
  ASSERT_TRUE(store_->PutCredential(alice).ok());
  EXPECT_EQ(store_->Credentials()->size(), 2u);
  EXPECT_EQ(store_->Credentials()->at(0).token_sha256, TokenSha256("dlbu_b"));
  EXPECT_TRUE(store_->DeleteCredential("alice", /*worker=*/false).value());
  EXPECT_FALSE(store_->DeleteCredential("alice", /*worker=*/false).value());
  ASSERT_EQ(store_->Credentials()->size(), 1u);
  EXPECT_TRUE(store_->Credentials()->at(0).worker);
}

TEST_F(StoreTest, UserLimitsAndUsageSurviveAReopen) {
  ASSERT_TRUE(store_->PutUserLimit({"alice", "gpu", {2, 5}}).ok());
  ASSERT_TRUE(store_->PutUserLimit({"bob", "gpu", {kNoLimit, 3}}).ok());
  ASSERT_TRUE(store_->PutUsage({"alice", 7200000, 1000}).ok());
  ASSERT_TRUE(store_->PutUsage({"alice", 3600000, 2000}).ok());  // replaces
  Reopen();
  auto limits = store_->UserLimits();
  ASSERT_TRUE(limits.ok()) << limits.status();
  ASSERT_EQ(limits->size(), 2u);
  EXPECT_EQ((*limits)[0].user, "alice");
  EXPECT_EQ((*limits)[0].limit, (UserLimit{2, 5}));
  EXPECT_EQ((*limits)[1].limit, (UserLimit{kNoLimit, 3}));
  // Unlimited in both: removed.
  ASSERT_TRUE(store_->PutUserLimit({"bob", "gpu", {}}).ok());
  EXPECT_EQ(store_->UserLimits()->size(), 1u);
  auto usages = store_->Usages();
  ASSERT_TRUE(usages.ok()) << usages.status();
  ASSERT_EQ(usages->size(), 1u);
  EXPECT_EQ((*usages)[0].user, "alice");
  EXPECT_EQ((*usages)[0].slot_ms, 3600000);
  EXPECT_EQ((*usages)[0].at_ms, 2000);
}

TEST_F(StoreTest, OpensAVersion3FileAndAddsTheLimitTables) {
  const int64_t old = Insert(NewJob("from-v3"));
  ASSERT_NO_FATAL_FAILURE(
      ReopenAsVersion(3, "DROP TABLE user_limits; DROP TABLE user_usage;"));
  EXPECT_TRUE(store_->PutUserLimit({"alice", "local", {1, kNoLimit}}).ok());
  EXPECT_TRUE(store_->PutUsage({"alice", 10, 20}).ok());
  EXPECT_EQ(store_->UserLimits()->size(), 1u);
  auto job = reader().GetJob(old);
  ASSERT_TRUE(job.ok() && job->has_value()) << job.status();
  EXPECT_EQ((*job)->spec.name(), "from-v3");
}

TEST_F(StoreTest, RefusesAFileThatIsNotADatabase) {
  std::string junk = dir_ + "/junk.db";
  ASSERT_TRUE(WriteFileAtomic(junk, std::string(4096, 'j')).ok());
  EXPECT_FALSE(Store::Open(junk, false).ok());
}

// ---- Jobs ----

TEST_F(StoreTest, JobsRoundTrip) {
  JobRecord job = NewJob("train-resnet", "req-1");
  int64_t id = Insert(job);
  ASSERT_GT(id, 0);

  auto active = store_->ActiveJobs();
  ASSERT_TRUE(active.ok()) << active.status();
  ASSERT_EQ(active->size(), 1u);
  const JobRecord& got = (*active)[0];
  EXPECT_EQ(got.id, id);
  EXPECT_EQ(got.request_id, "req-1");
  EXPECT_EQ(got.user, "ada");
  EXPECT_TRUE(MessageDifferencer::Equals(got.spec, job.spec))
      << got.spec.DebugString();
  EXPECT_EQ(got.state, v1::JOB_STATE_QUEUED);
  EXPECT_EQ(got.attempt, 0);
  EXPECT_EQ(got.submit_ms, 1'000);
  EXPECT_THAT(got.parts, IsEmpty());

  JobRecord running = got;
  running.state = v1::JOB_STATE_RUNNING;
  running.attempt = 2;
  running.start_ms = 5'000;
  running.parts = {{3, {0, 1, 2, 3}}, {9, {4, 5}}};
  ASSERT_TRUE(store_->UpdateJob(running).ok());
  active = store_->ActiveJobs();
  ASSERT_TRUE(active.ok());
  ASSERT_EQ(active->size(), 1u);
  EXPECT_EQ((*active)[0].state, v1::JOB_STATE_RUNNING);
  EXPECT_EQ((*active)[0].attempt, 2);
  EXPECT_EQ((*active)[0].start_ms, 5'000);
  EXPECT_EQ((*active)[0].parts, running.parts);
  EXPECT_TRUE(MessageDifferencer::Equals((*active)[0].spec, job.spec));

  JobRecord failed = running;
  failed.state = v1::JOB_STATE_FAILED;
  failed.end_ms = 9'000;
  failed.exit_code = 3;
  failed.reason = "exit status 3";
  failed.parts.clear();
  ASSERT_TRUE(store_->UpdateJob(failed).ok());
  EXPECT_THAT(store_->ActiveJobs().value(), IsEmpty());

  auto read = reader().GetJob(id);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_TRUE(read->has_value());
  EXPECT_EQ((*read)->state, v1::JOB_STATE_FAILED);
  EXPECT_EQ((*read)->end_ms, 9'000);
  EXPECT_EQ((*read)->exit_code, 3);
  EXPECT_EQ((*read)->reason, "exit status 3");
  EXPECT_TRUE(MessageDifferencer::Equals((*read)->spec, job.spec));

  auto missing = reader().GetJob(id + 100);
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->has_value());
}

TEST_F(StoreTest, ActiveJobsAreQueuedRunningAndCancelling) {
  int64_t queued = Insert(NewJob("q", "", v1::JOB_STATE_QUEUED));
  Insert(NewJob("f", "", v1::JOB_STATE_FINISHED));
  int64_t running = Insert(NewJob("r", "", v1::JOB_STATE_RUNNING));
  int64_t cancelling = Insert(NewJob("c", "", v1::JOB_STATE_CANCELLING));
  Insert(NewJob("x", "", v1::JOB_STATE_CANCELLED));
  auto active = store_->ActiveJobs();
  ASSERT_TRUE(active.ok()) << active.status();
  std::vector<int64_t> ids;
  for (const JobRecord& job : *active) ids.push_back(job.id);
  EXPECT_THAT(ids, ElementsAre(queued, running, cancelling));
}

// The job id a request made, or nullopt.
std::optional<int64_t> RequestJob(Store& store, const std::string& user,
                                  const std::string& request_id) {
  auto match = store.JobForRequest(user, request_id);
  EXPECT_TRUE(match.ok()) << match.status();
  if (!match.ok() || !match->has_value()) return std::nullopt;
  return (*match)->job_id;
}

TEST_F(StoreTest, JobForRequestFindsByUserAndRequestId) {
  JobRecord a = NewJob("a", "req-a");
  a.request_sha256 = std::string(64, '1');
  int64_t first = Insert(a);
  int64_t second = Insert(NewJob("b", "req-b"));
  EXPECT_EQ(RequestJob(*store_, "ada", "req-a"), first);
  EXPECT_EQ(RequestJob(*store_, "ada", "req-b"), second);
  EXPECT_EQ(store_->JobForRequest("ada", "req-a").value()->request_sha256,
            std::string(64, '1'));
  EXPECT_EQ(RequestJob(*store_, "ada", "req-c"), std::nullopt);
  // Jobs without a request id do not collide with each other.
  Insert(NewJob("c"));
  Insert(NewJob("d"));
  EXPECT_EQ(store_->CountJobs().value(), 4);
  EXPECT_EQ(RequestJob(*store_, "ada", ""), std::nullopt);

  auto duplicate = store_->InsertJob(NewJob("again", "req-a"));
  EXPECT_EQ(duplicate.status().code(), absl::StatusCode::kAlreadyExists);
  // Another user's request id is another request.
  EXPECT_EQ(RequestJob(*store_, "bob", "req-a"), std::nullopt);
  JobRecord bobs = NewJob("bobs", "req-a");
  bobs.user = "bob";
  const int64_t third = Insert(bobs);
  EXPECT_EQ(RequestJob(*store_, "bob", "req-a"), third);
  EXPECT_EQ(RequestJob(*store_, "ada", "req-a"), first);
  // A purged job's request id is free again.
  JobRecord ended = NewJob("ended", "req-e", v1::JOB_STATE_FINISHED);
  const int64_t fourth = Insert(ended);
  ASSERT_TRUE(store_->PurgeJobs({fourth}).ok());
  EXPECT_EQ(RequestJob(*store_, "ada", "req-e"), std::nullopt);
}

TEST_F(StoreTest, OpensAVersion8FileAndKeepsItsRequestIds) {
  const int64_t old = Insert(NewJob("from-v8"));
  // Version 8 kept request ids in jobs.request_id, unique across users.
  ASSERT_NO_FATAL_FAILURE(ReopenAsVersion(
      8, absl::StrCat("DROP TABLE job_requests; UPDATE jobs SET "
                      "request_id='nightly' WHERE id=",
                      old, ";")));
  auto match = store_->JobForRequest("ada", "nightly");
  ASSERT_TRUE(match.ok()) << match.status();
  ASSERT_TRUE(match->has_value());
  EXPECT_EQ((*match)->job_id, old);
  EXPECT_EQ((*match)->request_sha256, "");  // none was kept
  auto active = store_->ActiveJobs();
  ASSERT_TRUE(active.ok()) << active.status();
  ASSERT_EQ(active->size(), 1u);
  EXPECT_EQ((*active)[0].request_id, "nightly");
  // The same user may not use it again; another user may.
  EXPECT_EQ(store_->InsertJob(NewJob("again", "nightly")).status().code(),
            absl::StatusCode::kAlreadyExists);
  JobRecord bobs = NewJob("bobs", "nightly");
  bobs.user = "bob";
  const int64_t id = Insert(bobs);
  Reopen();
  EXPECT_EQ(RequestJob(*store_, "bob", "nightly"), id);
  EXPECT_EQ(RequestJob(*store_, "ada", "nightly"), old);
}

// ---- Events ----

TEST_F(StoreTest, HistoryIsInOrderPerJob) {
  int64_t a = Insert(NewJob("a"));
  int64_t b = Insert(NewJob("b"));
  ASSERT_TRUE(
      store_->AddEvent(a, v1::JOB_STATE_QUEUED, 0, 100, "submitted").ok());
  ASSERT_TRUE(
      store_->AddEvent(b, v1::JOB_STATE_QUEUED, 0, 110, "submitted").ok());
  ASSERT_TRUE(store_->AddEvent(a, v1::JOB_STATE_RUNNING, 1, 120, "").ok());
  // Same time stamp: order of insertion still decides.
  ASSERT_TRUE(
      store_->AddEvent(a, v1::JOB_STATE_QUEUED, 1, 120, "worker lost").ok());

  auto history = reader().History(a);
  ASSERT_TRUE(history.ok()) << history.status();
  ASSERT_EQ(history->size(), 3u);
  EXPECT_EQ((*history)[0].state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ((*history)[0].time_ms(), 100);
  EXPECT_EQ((*history)[0].reason(), "submitted");
  EXPECT_EQ((*history)[1].state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ((*history)[1].attempt(), 1);
  EXPECT_EQ((*history)[2].state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ((*history)[2].reason(), "worker lost");
  EXPECT_EQ(reader().History(b).value().size(), 1u);
  EXPECT_TRUE(reader().History(b + 1).value().empty());
}

TEST_F(StoreTest, EventsContinueInOrderAfterReopen) {
  int64_t a = Insert(NewJob("a"));
  ASSERT_TRUE(store_->AddEvent(a, v1::JOB_STATE_QUEUED, 0, 100, "one").ok());
  ASSERT_TRUE(store_->AddEvent(a, v1::JOB_STATE_RUNNING, 1, 200, "two").ok());
  Reopen();
  // A fresh Store must number new events after the stored ones.
  ASSERT_TRUE(store_->AddEvent(a, v1::JOB_STATE_FINISHED, 1, 50, "three").ok());
  auto history = reader().History(a);
  ASSERT_TRUE(history.ok()) << history.status();
  std::vector<std::string> reasons;
  for (const auto& change : *history) reasons.push_back(change.reason());
  EXPECT_THAT(reasons, ElementsAre("one", "two", "three"));
}

// ---- Diary ----

TEST_F(StoreTest, DiaryTailStartSkipsAllButTheLastLinesOfOneJob) {
  int64_t job = Insert(NewJob("a"));
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(store_->AddDiary(job, 1, 0, i, 10 + i, 1, "line").ok());
    ASSERT_TRUE(store_->AddDiary(job + 1, 1, 0, i, 10 + i, 1, "other").ok());
  }
  auto lines = reader().ReadDiary(job, 0, 100);
  ASSERT_TRUE(lines.ok() && lines->size() == 5u);
  // Reading after the start gives exactly the last two lines.
  EXPECT_EQ(reader().DiaryTailStart(job, 2).value(), (*lines)[2].n());
  EXPECT_EQ(reader().DiaryTailStart(job, 5).value(), 0);
  EXPECT_EQ(reader().DiaryTailStart(job, 50).value(), 0);
  EXPECT_EQ(reader().DiaryTailStart(job + 2, 3).value(), 0);  // no lines
}

TEST_F(StoreTest, DiaryLinesAreNumberedWithinTheirJobAndKeepTheirEnding) {
  const int64_t a = Insert(NewJob("a"));
  const int64_t b = Insert(NewJob("b"));
  ASSERT_TRUE(store_->AddDiary(a, 1, 0, 0, 10, 1, "a1").ok());
  ASSERT_TRUE(store_->AddDiary(b, 1, 0, 0, 11, 1, "b1").ok());
  ASSERT_TRUE(
      store_->AddDiary(a, 1, 0, 1, 12, 1, "a2", v1::DiaryLine::ENDING_NONE)
          .ok());
  // A line stored before takes no number.
  EXPECT_FALSE(store_->AddDiary(a, 1, 0, 1, 13, 1, "a2 again").value());
  ASSERT_TRUE(
      store_
          ->AddDiary(a, 2, 0, 0, 14, 1, "attempt 2", v1::DiaryLine::ENDING_CRLF)
          .ok());
  ASSERT_TRUE(store_->AddDiary(a, 2, 0, -1, 15, 0, "dlbatch's").ok());
  auto lines = reader().ReadDiary(a, 0, 100);
  ASSERT_TRUE(lines.ok()) << lines.status();
  std::vector<int64_t> numbers;
  std::vector<int> endings;
  for (const v1::DiaryLine& line : *lines) {
    numbers.push_back(line.line());
    endings.push_back(line.ending());
  }
  EXPECT_THAT(numbers, ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(
      endings,
      ElementsAre(v1::DiaryLine::ENDING_NEWLINE, v1::DiaryLine::ENDING_NONE,
                  v1::DiaryLine::ENDING_CRLF, v1::DiaryLine::ENDING_NEWLINE));
  auto other = reader().ReadDiary(b, 0, 100);
  ASSERT_TRUE(other.ok() && other->size() == 1u);
  EXPECT_EQ((*other)[0].line(), 1);
  // The cursor goes on as before: lines after the second one's n.
  auto rest = reader().ReadDiary(a, (*lines)[1].n(), 100);
  ASSERT_TRUE(rest.ok() && rest->size() == 2u);
  EXPECT_EQ((*rest)[0].line(), 3);
}

TEST_F(StoreTest, OpensAVersion9FileAndNumbersTheLinesItHolds) {
  const int64_t a = Insert(NewJob("a"));
  const int64_t b = Insert(NewJob("b"));
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(store_->AddDiary(a, 1, 0, i, 10 + i, 1, "a").ok());
    ASSERT_TRUE(store_->AddDiary(b, 1, 0, i, 10 + i, 1, "b").ok());
  }
  ASSERT_NO_FATAL_FAILURE(
      ReopenAsVersion(9,
                      // A version 9 file has no index on the line either.
                      "DROP INDEX diary_by_job_line; "
                      "ALTER TABLE diary DROP COLUMN line; "
                      "ALTER TABLE diary DROP COLUMN ending;"));
  ASSERT_TRUE(store_->AddDiary(b, 1, 0, 3, 20, 1, "new").ok());
  auto numbers = [&](int64_t job) {
    std::vector<int64_t> out;
    auto lines = reader().ReadDiary(job, 0, 100);
    EXPECT_TRUE(lines.ok()) << lines.status();
    if (!lines.ok()) return out;
    for (const v1::DiaryLine& line : *lines) {
      out.push_back(line.line());
      EXPECT_EQ(line.ending(), v1::DiaryLine::ENDING_NEWLINE);
    }
    return out;
  };
  EXPECT_THAT(numbers(a), ElementsAre(1, 2, 3));
  EXPECT_THAT(numbers(b), ElementsAre(1, 2, 3, 4));
}

TEST_F(StoreTest, AddDiaryDeduplicatesWorkerLines) {
  int64_t job = Insert(NewJob("a"));
  EXPECT_TRUE(store_->AddDiary(job, 1, 0, 0, 10, 1, "epoch 1").value());
  EXPECT_FALSE(store_->AddDiary(job, 1, 0, 0, 11, 1, "epoch 1 again").value());
  EXPECT_TRUE(store_->AddDiary(job, 1, 0, 1, 12, 1, "epoch 2").value());
  EXPECT_TRUE(store_->AddDiary(job, 1, 1, 0, 13, 1, "part 1").value());
  EXPECT_TRUE(store_->AddDiary(job, 2, 0, 0, 14, 1, "attempt 2").value());
  EXPECT_TRUE(store_->AddDiary(job + 1, 1, 0, 0, 15, 1, "other job").value());
  // dlbatch's own lines carry no seq and are never deduplicated.
  EXPECT_TRUE(store_->AddDiary(job, 1, 0, -1, 16, 0, "restarted").value());
  EXPECT_TRUE(store_->AddDiary(job, 1, 0, -1, 17, 0, "restarted").value());

  EXPECT_EQ(reader().DiaryCount(job).value(), 6);
  EXPECT_EQ(reader().DiaryCount(job + 1).value(), 1);
  EXPECT_EQ(reader().DiaryCount(job + 2).value(), 0);

  auto lines = reader().ReadDiary(job, 0, 100);
  ASSERT_TRUE(lines.ok()) << lines.status();
  ASSERT_EQ(lines->size(), 6u);
  EXPECT_EQ((*lines)[0].text(), "epoch 1");  // the first copy is kept
  EXPECT_EQ((*lines)[0].time_ms(), 10);
  EXPECT_EQ((*lines)[0].stream(), 1);
  EXPECT_EQ((*lines)[0].attempt(), 1);
  EXPECT_EQ((*lines)[0].seq(), 0);
  EXPECT_EQ((*lines)[1].seq(), 1);
  EXPECT_EQ((*lines)[4].seq(), -1);
  EXPECT_EQ((*lines)[4].stream(), 0);
  EXPECT_EQ((*lines)[5].seq(), -1);
}

TEST_F(StoreTest, ReadDiaryPages) {
  int64_t job = Insert(NewJob("a"));
  int64_t other = Insert(NewJob("b"));
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(
        store_->AddDiary(job, 1, 0, i, i, 1, absl::StrCat("line ", i)).ok());
    ASSERT_TRUE(store_->AddDiary(other, 1, 0, i, i, 1, "noise").ok());
  }
  std::vector<std::string> seen;
  int64_t after = 0;
  int pages = 0;
  for (;;) {
    auto page = reader().ReadDiary(job, after, 4);
    ASSERT_TRUE(page.ok()) << page.status();
    if (page->empty()) break;
    ++pages;
    EXPECT_LE(page->size(), 4u);
    for (const v1::DiaryLine& line : *page) {
      EXPECT_GT(line.n(), after);
      after = line.n();
      seen.push_back(line.text());
    }
  }
  EXPECT_EQ(pages, 3);
  ASSERT_EQ(seen.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(seen[i], absl::StrCat("line ", i));
  // Nothing past the end.
  EXPECT_TRUE(reader().ReadDiary(job, after, 4).value().empty());
}

TEST_F(StoreTest, DiaryLinesAreBytesReadBackExactly) {
  int64_t job = Insert(NewJob("a"));
  const std::string raw("\377\000x\r\033[2J\xc3", 9);
  ASSERT_TRUE(store_->AddDiary(job, 1, 0, 1, 10, 1, raw).value());
  ASSERT_TRUE(store_->AddDiary(job, 1, 0, 2, 11, 1, "").value());
  auto lines = reader().ReadDiary(job, 0, 10);
  ASSERT_TRUE(lines.ok()) << lines.status();
  ASSERT_EQ(lines->size(), 2u);
  EXPECT_EQ((*lines)[0].text(), raw);
  EXPECT_EQ((*lines)[0].text().size(), 9u);
  EXPECT_EQ((*lines)[1].text(), "");
  EXPECT_EQ(store_->DiaryBytes(job).value(), 9);
}

TEST_F(StoreTest, TrimDiaryDeletesTheOldestAndKeepsTheNewest) {
  int64_t job = Insert(NewJob("a"));
  for (int i = 1; i <= 5; ++i) {
    ASSERT_TRUE(
        store_->AddDiary(job, 1, 0, i, i, 1, std::string(10, 'a' + i)).ok());
  }
  const int64_t first_n = reader().ReadDiary(job, 0, 1).value()[0].n();
  // 25 bytes: three lines of 10 go, counted after the first.
  auto trimmed = store_->TrimDiary(job, first_n, 15);
  ASSERT_TRUE(trimmed.ok()) << trimmed.status();
  EXPECT_EQ(trimmed->first, 2);
  EXPECT_EQ(trimmed->second, 20);
  std::vector<int64_t> seqs;
  // Held in a local: a range-for over value() of the returned StatusOr
  // would read a temporary already destroyed.
  auto lines = reader().ReadDiary(job, 0, 10);
  for (const auto& l : lines.value()) seqs.push_back(l.seq());
  EXPECT_THAT(seqs, ElementsAre(1, 4, 5));
  // Never the newest line, however much is asked.
  trimmed = store_->TrimDiary(job, first_n, 1000);
  ASSERT_TRUE(trimmed.ok());
  EXPECT_EQ(trimmed->first, 1);
  seqs.clear();
  lines = reader().ReadDiary(job, 0, 10);
  for (const auto& l : lines.value()) seqs.push_back(l.seq());
  EXPECT_THAT(seqs, ElementsAre(1, 5));
  auto last = store_->DiaryLastSeqs(job, first_n);
  ASSERT_TRUE(last.ok());
  ASSERT_EQ(last->size(), 1u);
  EXPECT_EQ(std::get<2>((*last)[0]), 5);
}

TEST_F(StoreTest, PurgeJobsDeletesEndedJobsAndNamesBlobsNoOneHolds) {
  JobRecord ended = NewJob("old", "", v1::JOB_STATE_FINISHED);
  ended.end_ms = 5'000;
  const int64_t old = Insert(ended);  // attaches aaaa...
  ended.end_ms = 9'000;
  const int64_t newer = Insert(ended);  // attaches aaaa... too
  const int64_t running = Insert(NewJob("running", "", v1::JOB_STATE_RUNNING));
  ASSERT_TRUE(store_->PutOutputs(old, {Output("only-old", 3)}).ok());
  ASSERT_TRUE(store_->PutOutputs(newer, {Output("shared", 3)}).ok());
  ASSERT_TRUE(store_->PutOutputs(running, {Output("shared", 3)}).ok());
  ASSERT_TRUE(store_->AddDiary(old, 1, 0, 1, 1, 1, "line").ok());
  ASSERT_TRUE(store_->AddEvent(old, v1::JOB_STATE_FINISHED, 1, 1, "").ok());

  EXPECT_THAT(store_->EndedBefore(6'000, 10).value(), ElementsAre(old));
  EXPECT_THAT(store_->EndedBefore(10'000, 10).value(), ElementsAre(old, newer));

  auto purged = store_->PurgeJobs({old, running, 999});
  ASSERT_TRUE(purged.ok()) << purged.status();
  EXPECT_EQ(purged->jobs, 1);  // the running job and a missing one stay
  EXPECT_THAT(purged->unreferenced_blobs, ElementsAre(Sha256Hex("only-old")));
  EXPECT_FALSE(reader().GetJob(old).value().has_value());
  EXPECT_TRUE(reader().GetJob(running).value().has_value());
  EXPECT_EQ(reader().DiaryCount(old).value(), 0);
  EXPECT_TRUE(reader().History(old).value().empty());
  EXPECT_TRUE(reader().Outputs(old).value().empty());

  purged = store_->PurgeJobs({newer});
  ASSERT_TRUE(purged.ok());
  // The running job holds "shared" and the attachment too.
  EXPECT_THAT(purged->unreferenced_blobs, IsEmpty());
  ASSERT_TRUE(store_
                  ->UpdateJob([&] {
                    JobRecord r = NewJob("running", "", v1::JOB_STATE_FAILED);
                    r.id = running;
                    return r;
                  }())
                  .ok());
  purged = store_->PurgeJobs({running});
  ASSERT_TRUE(purged.ok());
  EXPECT_THAT(purged->unreferenced_blobs,
              UnorderedElementsAre(std::string(64, 'a'), Sha256Hex("shared")));
}

// ---- Outputs, workers, profiles ----

TEST_F(StoreTest, PutOutputsReplacesTheSetAndOutputsAreSorted) {
  int64_t job = Insert(NewJob("a"));
  ASSERT_TRUE(
      store_
          ->PutOutputs(job, {Output("model/z.pt", 30), Output("a.log", 10),
                             Output("model/b.pt", 20)})
          .ok());
  auto outputs = reader().Outputs(job);
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  ASSERT_EQ(outputs->size(), 3u);
  EXPECT_EQ((*outputs)[0].path(), "a.log");
  EXPECT_EQ((*outputs)[1].path(), "model/b.pt");
  EXPECT_EQ((*outputs)[2].path(), "model/z.pt");
  EXPECT_TRUE(
      MessageDifferencer::Equals((*outputs)[1], Output("model/b.pt", 20)));

  ASSERT_TRUE(store_->PutOutputs(job, {Output("only.txt", 1)}).ok());
  outputs = reader().Outputs(job);
  ASSERT_TRUE(outputs.ok());
  ASSERT_EQ(outputs->size(), 1u);
  EXPECT_EQ((*outputs)[0].path(), "only.txt");

  ASSERT_TRUE(store_->PutOutputs(job, {}).ok());
  EXPECT_TRUE(reader().Outputs(job).value().empty());
}

TEST_F(StoreTest, PutOutputsKeepsOtherJobsOutputs) {
  ASSERT_TRUE(store_->PutOutputs(1, {Output("a", 1)}).ok());
  ASSERT_TRUE(store_->PutOutputs(2, {Output("b", 2)}).ok());
  ASSERT_TRUE(store_->PutOutputs(1, {}).ok());
  EXPECT_TRUE(reader().Outputs(1).value().empty());
  EXPECT_EQ(reader().Outputs(2).value().size(), 1u);
}

TEST_F(StoreTest, UpsertWorkerKeepsTheIdOfAName) {
  WorkerRecord w;
  w.name = "gpu-node-1";
  w.host = "10.0.0.1";
  w.profile = "local";
  v1::Device d;
  d.set_index(0);
  d.set_kind("gpu");
  d.set_name("H100");
  d.set_memory_bytes(80LL << 30);
  w.devices = {d};
  w.last_seen_ms = 100;
  auto first = store_->UpsertWorker(w);
  ASSERT_TRUE(first.ok()) << first.status();

  WorkerRecord other = w;
  other.name = "gpu-node-2";
  auto second = store_->UpsertWorker(other);
  ASSERT_TRUE(second.ok());
  EXPECT_NE(*second, *first);

  w.host = "10.0.0.9";
  w.profile = "big";
  d.set_index(1);
  w.devices.push_back(d);
  w.last_seen_ms = 200;
  auto again = store_->UpsertWorker(w);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *first);

  auto workers = store_->Workers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 2u);
  const WorkerRecord& got = (*workers)[0];
  EXPECT_EQ(got.id, *first);
  EXPECT_EQ(got.name, "gpu-node-1");
  EXPECT_EQ(got.host, "10.0.0.9");
  EXPECT_EQ(got.profile, "big");
  EXPECT_EQ(got.last_seen_ms, 200);
  ASSERT_EQ(got.devices.size(), 2u);
  EXPECT_EQ(got.devices[1].index(), 1);
  EXPECT_EQ(got.devices[1].name(), "H100");
  EXPECT_EQ(got.devices[1].memory_bytes(), 80LL << 30);
}

TEST_F(StoreTest, Profiles) {
  EXPECT_THAT(store_->Profiles().value(), IsEmpty());
  ASSERT_TRUE(store_->UpsertProfile("local", 4).ok());
  ASSERT_TRUE(store_->UpsertProfile("big", 16).ok());
  ASSERT_TRUE(store_->UpsertProfile("local", 8).ok());
  EXPECT_THAT(store_->Profiles().value(),
              ElementsAre(Pair("big", 16), Pair("local", 8)));
}

// ---- Listing ----

TEST_F(StoreTest, ListJobSummaries) {
  JobRecord failed = NewJob("f", "", v1::JOB_STATE_FAILED);
  failed.reason = "exit status 1";
  failed.spec.set_pool(4);
  failed.spec.set_priority(9);
  std::vector<int64_t> ids = {
      Insert(NewJob("q1")),
      Insert(failed),
      Insert(NewJob("r", "", v1::JOB_STATE_RUNNING)),
      Insert(NewJob("q2")),
      Insert(NewJob("c", "", v1::JOB_STATE_CANCELLED)),
  };
  EXPECT_EQ(ListedIds({}, 0, false), ids);
  EXPECT_THAT(ListedIds({v1::JOB_STATE_QUEUED}, 0, false),
              ElementsAre(ids[0], ids[3]));
  EXPECT_THAT(
      ListedIds({v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED}, 0, false),
      ElementsAre(ids[1], ids[4]));
  EXPECT_THAT(ListedIds({}, 2, false), ElementsAre(ids[0], ids[1]));
  EXPECT_THAT(ListedIds({}, 2, true), ElementsAre(ids[4], ids[3]));
  EXPECT_THAT(ListedIds({v1::JOB_STATE_QUEUED}, 1, true), ElementsAre(ids[3]));
  EXPECT_THAT(ListedIds({v1::JOB_STATE_FINISHED}, 0, false), IsEmpty());

  v1::ListJobsReply reply;
  ASSERT_TRUE(
      reader().ListJobSummaries({v1::JOB_STATE_FAILED}, 0, false, &reply).ok());
  ASSERT_EQ(reply.jobs_size(), 1);
  const v1::Job& job = reply.jobs(0);
  EXPECT_EQ(job.user(), "ada");
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.reason(), "exit status 1");
  EXPECT_EQ(job.submit_time_ms(), 1'000);
  EXPECT_EQ(job.spec().name(), "f");
  EXPECT_EQ(job.spec().profile(), "local");
  EXPECT_EQ(job.spec().pool(), 4);
  EXPECT_EQ(job.spec().priority(), 9);
  EXPECT_FALSE(job.spec().has_command());  // summaries carry no program
}

// ---- Transactions and durability ----

TEST_F(StoreTest, SweepsGroupTheirJobs) {
  EXPECT_EQ(store_->NextSweepId().value(), 1);
  const int64_t plain = Insert(NewJob("plain"));
  std::vector<int64_t> swept;
  for (const char* rate : {"0.1", "0.01", "0.001"}) {
    JobRecord job = NewJob(std::string("net[initial_learn_rate=") + rate + "]");
    job.sweep_id = 1;
    (*job.spec.mutable_sweep_point())["initial_learn_rate"] = rate;
    swept.push_back(Insert(job));
  }
  EXPECT_EQ(store_->NextSweepId().value(), 2);
  EXPECT_EQ(store_->SweepIdOf(plain).value(), 0);
  EXPECT_EQ(store_->SweepIdOf(swept[1]).value(), 1);
  EXPECT_EQ(store_->SweepIdOf(999).value(), 0);
  EXPECT_EQ(store_->SweepJobIds(1).value(), swept);
  EXPECT_THAT(store_->SweepJobIds(2).value(), IsEmpty());

  v1::ListJobsReply reply;
  ASSERT_TRUE(reader().ListJobSummaries({}, 0, false, &reply, 1).ok());
  ASSERT_EQ(reply.jobs_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(reply.jobs(i).id(), swept[i]);
    EXPECT_EQ(reply.jobs(i).sweep_id(), 1);
  }
  EXPECT_THAT(reply.jobs(1).spec().sweep_point(),
              ElementsAre(Pair("initial_learn_rate", "0.01")));
  // Combined with a state filter and a limit.
  reply.Clear();
  ASSERT_TRUE(reader()
                  .ListJobSummaries({v1::JOB_STATE_QUEUED}, 2, true, &reply, 1)
                  .ok());
  ASSERT_EQ(reply.jobs_size(), 2);
  EXPECT_EQ(reply.jobs(0).id(), swept[2]);
  // Every job's listing carries the sweep id but not the spec.
  reply.Clear();
  ASSERT_TRUE(reader().ListJobSummaries({}, 0, false, &reply).ok());
  ASSERT_EQ(reply.jobs_size(), 4);
  EXPECT_EQ(reply.jobs(0).sweep_id(), 0);
  EXPECT_EQ(reply.jobs(3).sweep_id(), 1);
  EXPECT_THAT(reply.jobs(3).spec().sweep_point(), IsEmpty());

  auto job = reader().GetJob(swept[0]);
  ASSERT_TRUE(job.ok() && job->has_value());
  EXPECT_EQ((*job)->sweep_id, 1);
  EXPECT_THAT((*job)->spec.sweep_point(),
              ElementsAre(Pair("initial_learn_rate", "0.1")));
}

TEST_F(StoreTest, UncommittedTransactionRollsBack) {
  {
    Transaction txn(store_->db());
    ASSERT_TRUE(txn.status().ok()) << txn.status();
    Insert(NewJob("gone"));
    ASSERT_TRUE(store_->UpsertProfile("gone", 1).ok());
    EXPECT_EQ(store_->CountJobs().value(), 1);  // visible inside
  }
  EXPECT_EQ(store_->CountJobs().value(), 0);
  EXPECT_THAT(store_->Profiles().value(), IsEmpty());

  {
    Transaction txn(store_->db());
    ASSERT_TRUE(txn.status().ok());
    Insert(NewJob("kept"));
    ASSERT_TRUE(txn.Commit().ok());
    EXPECT_EQ(txn.Commit().code(), absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_EQ(store_->CountJobs().value(), 1);
}

TEST_F(StoreTest, ReaderSeesOnlyCommittedChanges) {
  Transaction txn(store_->db());
  ASSERT_TRUE(txn.status().ok());
  int64_t id = Insert(NewJob("pending"));
  EXPECT_FALSE(reader().GetJob(id).value().has_value());
  ASSERT_TRUE(txn.Commit().ok());
  // The same pooled connection sees the commit.
  EXPECT_TRUE(reader().GetJob(id).value().has_value());
}

TEST_F(StoreTest, DataSurvivesANewStore) {
  int64_t id;
  {
    Transaction txn(store_->db());
    ASSERT_TRUE(txn.status().ok());
    JobRecord job = NewJob("durable", "req-d", v1::JOB_STATE_RUNNING);
    job.attempt = 1;
    job.parts = {{1, {0}}, {2, {0}}};
    id = Insert(job);
    ASSERT_TRUE(
        store_->AddEvent(id, v1::JOB_STATE_RUNNING, 1, 5, "started").ok());
    ASSERT_TRUE(store_->AddDiary(id, 1, 0, 0, 6, 1, "hello").ok());
    ASSERT_TRUE(store_->PutOutputs(id, {Output("o", 1)}).ok());
    ASSERT_TRUE(store_->UpsertProfile("local", 2).ok());
    ASSERT_TRUE(txn.Commit().ok());
  }
  store_.reset();
  auto reopened = Store::Open(path_, /*sync_full=*/true);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  Store& store = **reopened;
  auto active = store.ActiveJobs();
  ASSERT_TRUE(active.ok());
  ASSERT_EQ(active->size(), 1u);
  EXPECT_EQ((*active)[0].id, id);
  EXPECT_EQ((*active)[0].spec.name(), "durable");
  EXPECT_EQ((*active)[0].parts, (std::vector<Part>{{1, {0}}, {2, {0}}}));
  EXPECT_EQ(RequestJob(store, "ada", "req-d"), id);
  EXPECT_THAT(store.Profiles().value(), ElementsAre(Pair("local", 2)));
  // The duplicate check also survives.
  EXPECT_FALSE(store.AddDiary(id, 1, 0, 0, 7, 1, "hello").value());

  StoreReader reader(path_);
  EXPECT_EQ(reader.History(id).value().size(), 1u);
  EXPECT_EQ(reader.DiaryCount(id).value(), 1);
  EXPECT_EQ(reader.Outputs(id).value().size(), 1u);
}

// Checkpoints on their own thread keep the WAL bounded while commits go on
// without pause: SQLite restarts the WAL at a commit after a checkpoint has
// copied all of it.
TEST_F(TempDirTest, BackgroundCheckpointsKeepTheWalBoundedUnderSteadyCommits) {
  const std::string path = dir_ + "/wal.db";
  auto db = Database::Open(path, /*read_only=*/false, /*sync_full=*/false);
  ASSERT_TRUE(db.ok()) << db.status();
  ASSERT_TRUE((*db)->CheckpointInBackground().ok());
  ASSERT_TRUE(
      (*db)->Exec("CREATE TABLE t(n INTEGER PRIMARY KEY, b BLOB)").ok());
  const std::string row(4000, 'x');  // a page or so per commit
  const int commits = 12000;
  for (int i = 0; i < commits; ++i) {
    Transaction txn(db->get());
    ASSERT_TRUE(txn.status().ok()) << txn.status();
    auto insert = (*db)->Prepare("INSERT INTO t(b) VALUES(?)");
    ASSERT_TRUE(insert.ok());
    ASSERT_TRUE((*insert)->BindBlob(1, row).Run().ok());
    ASSERT_TRUE(txn.Commit().ok());
  }
  std::error_code ec;
  const auto wal = std::filesystem::file_size(path + "-wal", ec);
  ASSERT_FALSE(ec) << ec.message();
  // Without checkpoints the WAL would hold every commit: over 2 pages each
  // (about 100 MB); with them it stays near the threshold of 1,000 frames.
  EXPECT_LT(wal, uintmax_t{24} << 20);
  // Everything committed is there.
  auto count = (*db)->Prepare("SELECT COUNT(*) FROM t");
  ASSERT_TRUE(count.ok());
  ASSERT_TRUE((*count)->Step().value());
  EXPECT_EQ((*count)->Int(0), commits);
  (*count)->Reset();
}

// ---- BlobStore ----

int CountEntries(const std::string& dir) {
  std::error_code ec;
  int n = 0;
  for (auto it = std::filesystem::directory_iterator(dir, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return n;
}

class BlobStoreTest : public TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    blobs_dir_ = dir_ + "/blobs";
    auto blobs = BlobStore::Open(blobs_dir_, /*min_free_bytes=*/0);
    ASSERT_TRUE(blobs.ok()) << blobs.status();
    blobs_ = std::move(*blobs);
  }

  int TempFiles() const { return CountEntries(blobs_dir_ + "/tmp"); }

  std::string blobs_dir_;
  std::unique_ptr<BlobStore> blobs_;
};

TEST(IsSha256HexTest, OnlyLowercaseHexOfLength64) {
  EXPECT_TRUE(IsSha256Hex(Sha256Hex("abc")));
  EXPECT_FALSE(IsSha256Hex(""));
  EXPECT_FALSE(IsSha256Hex(std::string(63, 'a')));
  EXPECT_FALSE(IsSha256Hex(std::string(65, 'a')));
  EXPECT_FALSE(IsSha256Hex(std::string(64, 'A')));
  EXPECT_FALSE(IsSha256Hex(std::string(64, 'g')));
  EXPECT_FALSE(IsSha256Hex("../" + std::string(61, 'a')));
}

TEST_F(BlobStoreTest, CommitMakesTheBlobVisible) {
  std::string data = "hello, blob store";
  std::string sha = Sha256Hex(data);
  EXPECT_EQ(blobs_->Size(sha).status().code(), absl::StatusCode::kNotFound);

  auto writer = blobs_->NewWriter(sha, static_cast<int64_t>(data.size()));
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Append(data.substr(0, 5)).ok());
  ASSERT_TRUE((*writer)->Append(data.substr(5)).ok());
  EXPECT_EQ((*writer)->written(), static_cast<int64_t>(data.size()));
  // Not visible until committed.
  EXPECT_EQ(blobs_->Size(sha).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE((*writer)->Commit().ok());
  writer->reset();

  EXPECT_EQ(blobs_->Size(sha).value(), static_cast<int64_t>(data.size()));
  EXPECT_EQ(blobs_->PathFor(sha),
            blobs_dir_ + "/" + sha.substr(0, 2) + "/" + sha);
  EXPECT_EQ(ReadFile(blobs_->PathFor(sha)).value(), data);
  EXPECT_EQ(TempFiles(), 0);

  // Uploading the same blob again is harmless.
  auto again = blobs_->NewWriter(sha, static_cast<int64_t>(data.size()));
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE((*again)->Append(data).ok());
  EXPECT_TRUE((*again)->Commit().ok());
  EXPECT_EQ(ReadFile(blobs_->PathFor(sha)).value(), data);
}

TEST_F(BlobStoreTest, EmptyBlob) {
  std::string sha = Sha256Hex("");
  auto writer = blobs_->NewWriter(sha, 0);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Commit().ok());
  EXPECT_EQ(blobs_->Size(sha).value(), 0);
}

TEST_F(BlobStoreTest, WrongDigestIsDataLossAndLeavesNothing) {
  std::string data = "the real bytes";
  std::string claimed = Sha256Hex("other bytes");
  {
    auto writer = blobs_->NewWriter(claimed, static_cast<int64_t>(data.size()));
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->Append(data).ok());
    absl::Status s = (*writer)->Commit();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(s.message()), HasSubstr("checksum mismatch"));
    EXPECT_THAT(std::string(s.message()), HasSubstr(Sha256Hex(data)));
  }
  EXPECT_EQ(blobs_->Size(claimed).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(::access(blobs_->PathFor(claimed).c_str(), F_OK), -1);
  EXPECT_EQ(TempFiles(), 0);
}

TEST_F(BlobStoreTest, ShortUploadIsDataLoss) {
  std::string data = "0123456789";
  std::string sha = Sha256Hex(data);
  {
    auto writer = blobs_->NewWriter(sha, 10);
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE((*writer)->Append(data.substr(0, 6)).ok());
    absl::Status s = (*writer)->Commit();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(s.message()), HasSubstr("received 6 of 10 bytes"));
  }
  EXPECT_EQ(blobs_->Size(sha).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(TempFiles(), 0);
}

TEST_F(BlobStoreTest, AppendBeyondTheAnnouncedSizeFails) {
  std::string data = "0123456789";
  auto writer = blobs_->NewWriter(Sha256Hex(data), 8);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Append(data.substr(0, 8)).ok());
  absl::Status s = (*writer)->Append("9");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("longer than the announced 8 bytes"));
  EXPECT_EQ((*writer)->written(), 8);
}

// An empty name is no refusal: the digest is learnt from the bytes
// (blob_store_test.cc).
TEST_F(BlobStoreTest, RefusesNamesThatAreNotADigest) {
  const std::string valid = Sha256Hex("x");
  std::string upper = valid;
  for (char& c : upper) c = static_cast<char>(std::toupper(c));
  for (const std::string& bad :
       {std::string("../../etc/passwd"), "../" + valid.substr(3), upper,
        valid.substr(1), valid + "/"}) {
    auto writer = blobs_->NewWriter(bad, 1);
    ASSERT_FALSE(writer.ok()) << bad;
    EXPECT_EQ(writer.status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
    EXPECT_THAT(std::string(writer.status().message()),
                HasSubstr("is not a sha256"));
    EXPECT_EQ(blobs_->Size(bad).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(TempFiles(), 0);
  EXPECT_FALSE(blobs_->NewWriter(valid, -1).ok());
}

TEST_F(BlobStoreTest, WriterDestroyedBeforeCommitLeavesNothing) {
  std::string data = "abandoned upload";
  std::string sha = Sha256Hex(data);
  {
    auto writer = blobs_->NewWriter(sha, static_cast<int64_t>(data.size()));
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE((*writer)->Append(data).ok());
    EXPECT_EQ(TempFiles(), 1);
  }
  EXPECT_EQ(TempFiles(), 0);
  EXPECT_EQ(blobs_->Size(sha).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(BlobStoreTest, FullDiskIsResourceExhausted) {
  auto tight =
      BlobStore::Open(blobs_dir_, std::numeric_limits<int64_t>::max() / 2);
  ASSERT_TRUE(tight.ok()) << tight.status();
  auto writer = (*tight)->NewWriter(Sha256Hex("x"), 1);
  ASSERT_FALSE(writer.ok());
  EXPECT_EQ(writer.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(writer.status().message()), HasSubstr("full"));
  EXPECT_THAT(std::string(writer.status().message()), HasSubstr(blobs_dir_));
  EXPECT_EQ(TempFiles(), 0);
}

TEST_F(BlobStoreTest, OpenRemovesStaleTempFilesAndKeepsBlobs) {
  std::string data = "kept";
  std::string sha = Sha256Hex(data);
  auto writer = blobs_->NewWriter(sha, 4);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Append(data).ok());
  ASSERT_TRUE((*writer)->Commit().ok());
  ASSERT_TRUE(
      WriteFileAtomic(blobs_dir_ + "/tmp/" + sha + ".1.0", "half").ok());
  ASSERT_EQ(TempFiles(), 1);

  auto reopened = BlobStore::Open(blobs_dir_, 0);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ(TempFiles(), 0);
  EXPECT_EQ((*reopened)->Size(sha).value(), 4);
}

// Each progress report appended; a full history drops every other point of
// its older half, seqs never reused; a purge removes it.
TEST_F(StoreTest, ProgressHistoryIsThinnedWhenFullAndPurgedWithItsJob) {
  const int64_t id = Insert(NewJob("a", "", v1::JOB_STATE_FINISHED));
  const int64_t max = JobTables::kMaxProgressHistory;
  {
    Transaction txn(store_->db());
    for (int64_t i = 1; i <= max + 1; ++i) {
      v1::TrainProgress p;
      p.set_iteration(i);
      ASSERT_TRUE(store_->AppendProgress(id, p).ok());
    }
    ASSERT_TRUE(txn.Commit().ok());
  }
  auto history = reader().ProgressHistory(id, 0, 2 * max);
  ASSERT_TRUE(history.ok()) << history.status();
  ASSERT_EQ(history->size(), static_cast<size_t>(max - max / 4 + 1));
  EXPECT_EQ((*history)[0].seq, 1);
  EXPECT_EQ((*history)[1].seq, 3);  // the 2nd went
  EXPECT_EQ(history->back().seq, max + 1);
  EXPECT_EQ(history->back().progress.iteration(), max + 1);
  auto after = reader().ProgressHistory(id, max, 10);
  ASSERT_TRUE(after.ok());
  ASSERT_EQ(after->size(), 1u);
  {
    Transaction txn(store_->db());
    ASSERT_TRUE(store_->PurgeJobs({id}).ok());
    ASSERT_TRUE(txn.Commit().ok());
  }
  EXPECT_TRUE(reader().ProgressHistory(id, 0, 10)->empty());
}

}  // namespace
}  // namespace dlbatch::scheduler
