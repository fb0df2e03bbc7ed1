// The REST API (scheduler/web/api.h) over a real Scheduler and SQLite store
// in a temp dir: requests handed to RestApi::Handle as the HTTPS server
// would, the caller as the server authenticated it. Workers are fake
// sessions posting worker messages, as scheduler_test's are.
#include <sqlite3.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/web/api.h"
#include "tests/common/fake_clock.h"
#include "tests/scheduler/fake_session.h"

namespace dlbatch::scheduler::web {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

bool WaitUntil(const std::function<bool()>& done,
               absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

Caller User(const std::string& name, bool admin = false) {
  Caller c;
  c.user = name;
  c.admin = admin;
  c.credential = "user:" + name;
  return c;
}
Caller Worker() {
  Caller c;
  c.user = "w1";
  c.worker = true;
  c.credential = "worker:w1";
  return c;
}

HttpRequest Get(const std::string& path,
                std::vector<std::pair<std::string, std::string>> query = {}) {
  HttpRequest r;
  r.method = "GET";
  r.path = path;
  r.query = std::move(query);
  return r;
}
HttpRequest Post(const std::string& path, const std::string& body = "") {
  HttpRequest r;
  r.method = "POST";
  r.path = path;
  r.body = body;
  return r;
}

Json Body(const HttpResponse& r) { return Json::parse(r.body); }

// The server's end of an event stream: collects what is written.
class FakeStreamWriter final : public StreamWriter {
 public:
  void Write(std::string bytes, std::function<void(bool)> done) override {
    {
      absl::MutexLock lock(&mu_);
      bytes_ += bytes;
      ++writes_;
    }
    done(true);
  }
  void Finish() override {
    absl::MutexLock lock(&mu_);
    finished_ = true;
  }
  std::string bytes() const {
    absl::MutexLock lock(&mu_);
    return bytes_;
  }
  bool finished() const {
    absl::MutexLock lock(&mu_);
    return finished_;
  }
  int writes() const {
    absl::MutexLock lock(&mu_);
    return writes_;
  }

 private:
  mutable absl::Mutex mu_;
  std::string bytes_ ABSL_GUARDED_BY(mu_);
  int writes_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

class WebApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "dlbatch_webapi_XXXXXX")
            .string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    api_.reset();
    if (scheduler_) scheduler_->Stop();
    scheduler_.reset();
    reader_.reset();
    blobs_.reset();
    store_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  void Start(bool shared_visibility = false) {
    const std::string db = dir_ + "/state.db";
    auto store = Store::Open(db, /*sync_full=*/false);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    reader_ = std::make_unique<StoreReader>(db);
    auto blobs = BlobStore::Open(dir_ + "/blobs", 0);
    ASSERT_TRUE(blobs.ok()) << blobs.status();
    blobs_ = std::move(*blobs);
    SchedulerOptions options;
    options.heartbeat_interval_ms = 100;
    options.heartbeat_timeout_ms = 100000;
    if (max_diary_bytes_ > 0) options.max_diary_bytes = max_diary_bytes_;
    scheduler_ = std::make_unique<Scheduler>(store_.get(), reader_.get(),
                                             blobs_.get(), &clock_, options);
    ASSERT_TRUE(scheduler_->Start().ok());
    api_ = std::make_unique<RestApi>(scheduler_.get(), reader_.get(),
                                     blobs_.get(), shared_visibility);
  }

  int64_t Submit(const std::string& user, const std::string& name,
                 int priority = 0) {
    v1::SubmitJobRequest request;
    request.set_user(user);
    v1::JobSpec* spec = request.mutable_spec();
    spec->set_name(name);
    spec->set_profile("local");
    spec->set_pool(1);
    spec->set_priority(priority);
    (*spec->mutable_env())["SECRET"] = "s3cret";
    spec->mutable_command()->add_argv("true");
    auto reply = scheduler_->Submit(request);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? reply->job_id() : -1;
  }

  std::shared_ptr<FakeSession> Connect(const std::string& name, int slots) {
    auto session = std::make_shared<FakeSession>();
    v1::WorkerMessage m;
    v1::Register* reg = m.mutable_register_();
    reg->set_name(name);
    reg->set_host("host");
    reg->set_profile("local");
    for (int i = 0; i < slots; ++i) {
      v1::Device* d = reg->add_devices();
      d->set_index(i);
      d->set_kind("cpu");
      d->set_name("cpu");
    }
    scheduler_->OnWorkerMessage(session, std::move(m));
    EXPECT_TRUE(session
                    ->WaitFor([](const v1::SchedulerMessage& s) {
                      return s.has_registered();
                    })
                    .has_value());
    return session;
  }
  void WaitStarted(const std::shared_ptr<FakeSession>& s, int64_t id) {
    ASSERT_TRUE(s->WaitFor([id](const v1::SchedulerMessage& m) {
                   return m.has_start() && m.start().job_id() == id;
                 }).has_value());
    v1::WorkerMessage started;
    started.mutable_started()->set_job_id(id);
    started.mutable_started()->set_attempt(1);
    scheduler_->OnWorkerMessage(s, started);
    ASSERT_TRUE(WaitUntil([&] {
      auto job = scheduler_->GetJob(id);
      return job.ok() && job->state() == v1::JOB_STATE_RUNNING;
    }));
  }

  // A drained worker of profile local: jobs are accepted and stay queued.
  void DrainedWorker() {
    parked_ = Connect("parked", 1);
    ASSERT_TRUE(scheduler_->control().DrainWorker("parked", true, "test").ok());
  }

  HttpResponse Call(const HttpRequest& r, const Caller& c) {
    return api_->Handle(r, c);
  }

  FakeClock clock_;
  std::string dir_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<StoreReader> reader_;
  std::unique_ptr<BlobStore> blobs_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<RestApi> api_;
  std::shared_ptr<FakeSession> parked_;
  int64_t max_diary_bytes_ = 0;  // 0: SchedulerOptions' own
};

TEST_F(WebApiTest, JobIsReadAsShowReadsItAndWorkerCredentialsGet403) {
  Start();
  DrainedWorker();
  const int64_t id = Submit("alice", "mine");
  const std::string path = absl::StrCat("/api/v1/jobs/", id);
  HttpResponse own = Call(Get(path), User("alice"));
  ASSERT_EQ(own.status, 200) << own.body;
  EXPECT_EQ(Body(own)["id"], id);
  EXPECT_EQ(Body(own)["spec"]["env"]["SECRET"], "s3cret");

  HttpResponse other = Call(Get(path), User("bob"));
  EXPECT_EQ(other.status, 403);
  EXPECT_THAT(other.body, HasSubstr("belongs to alice"));

  HttpResponse admin = Call(Get(path), User("root", /*admin=*/true));
  ASSERT_EQ(admin.status, 200);
  EXPECT_EQ(Body(admin)["spec"]["env"]["SECRET"], "s3cret");

  for (const char* p :
       {"/api/v1/jobs", "/api/v1/workers", "/api/v1/queue", "/api/v1/events"}) {
    HttpResponse w = Call(Get(p), Worker());
    EXPECT_EQ(w.status, 403) << p;
    EXPECT_THAT(w.body, HasSubstr("worker credential")) << p;
  }
  EXPECT_EQ(Call(Get(path), Worker()).status, 403);
  EXPECT_EQ(Call(Post(path + "/cancel"), Worker()).status, 403);

  // Listing: everyone's jobs, another's env: cleared.
  HttpResponse list = Call(Get("/api/v1/jobs"), User("bob"));
  ASSERT_EQ(list.status, 200);
  EXPECT_EQ(Body(list)["jobs"][0]["spec"]["env"], Json::object());
}

TEST_F(WebApiTest, SharedVisibilityReadsRedactedButNeverControls) {
  Start(/*shared_visibility=*/true);
  DrainedWorker();
  const int64_t id = Submit("alice", "mine");
  const std::string path = absl::StrCat("/api/v1/jobs/", id);
  HttpResponse other = Call(Get(path), User("bob"));
  ASSERT_EQ(other.status, 200) << other.body;
  EXPECT_EQ(Body(other)["spec"]["env"], Json::object());
  EXPECT_EQ(Call(Get(path + "/diary"), User("bob")).status, 200);
  EXPECT_EQ(Call(Get(path + "/outputs"), User("bob")).status, 200);
  EXPECT_EQ(Call(Get(path + "/progress"), User("bob")).status, 200);

  // One job's action is refused whole (403); the bulk form says so per job.
  HttpResponse cancel = Call(Post(path + "/cancel"), User("bob"));
  EXPECT_EQ(cancel.status, 403) << cancel.body;
  EXPECT_EQ(Body(cancel)["error"]["code"], "PERMISSION_DENIED");
  EXPECT_THAT(Body(cancel)["error"]["message"].get<std::string>(),
              HasSubstr("belongs to alice"));
  HttpResponse bulk =
      Call(Post("/api/v1/jobs/cancel", absl::StrCat("{\"ids\":[", id, "]}")),
           User("bob"));
  ASSERT_EQ(bulk.status, 200) << bulk.body;
  Json result = Body(bulk)["results"][0];
  EXPECT_EQ(result["job"], id);
  EXPECT_EQ(result["ok"], false);
  EXPECT_THAT(result["message"].get<std::string>(), HasSubstr("belongs to"));
  EXPECT_EQ(Body(Call(Get(path), User("alice")))["state"], "queued");
}

TEST_F(WebApiTest, ActionsAnswerPerJob) {
  Start();
  DrainedWorker();
  const int64_t a = Submit("alice", "a");
  const int64_t b = Submit("bob", "b");
  HttpResponse held = Call(
      Post("/api/v1/jobs/hold", absl::StrCat("{\"ids\":[", a, ",", b, "]}")),
      User("alice"));
  ASSERT_EQ(held.status, 200) << held.body;
  Json results = Body(held)["results"];
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0]["job"], a);
  EXPECT_EQ(results[0]["ok"], true) << results;
  EXPECT_EQ(results[1]["job"], b);
  EXPECT_EQ(results[1]["ok"], false);
  EXPECT_EQ(results[1]["state"], nullptr);
  EXPECT_TRUE(scheduler_->GetJob(a)->held());

  HttpResponse release = Call(
      Post(absl::StrCat("/api/v1/jobs/", a, "/release"), "{\"reason\":\"go\"}"),
      User("alice"));
  EXPECT_EQ(Body(release)["results"][0]["ok"], true) << release.body;
  HttpResponse cancel = Call(Post(absl::StrCat("/api/v1/jobs/", b, "/cancel")),
                             User("root", true));
  EXPECT_EQ(Body(cancel)["results"][0]["ok"], true) << cancel.body;
  EXPECT_EQ(scheduler_->GetJob(b)->state(), v1::JOB_STATE_CANCELLED);

  HttpResponse bad =
      Call(Post("/api/v1/jobs/cancel", "{\"ids\":\"1\"}"), User("alice"));
  EXPECT_EQ(bad.status, 400);
  EXPECT_THAT(bad.body, HasSubstr("\\\"ids\\\" must be an array"));
  EXPECT_EQ(Call(Post("/api/v1/jobs/cancel", "not json"), User("alice")).status,
            400);
}

TEST_F(WebApiTest, PagesAreFilteredSortedAndCounted) {
  Start();
  DrainedWorker();
  for (int i = 0; i < 7; ++i)
    Submit(i % 2 ? "bob" : "alice", absl::StrCat("Net-", i), i);
  HttpResponse page = Call(
      Get("/api/v1/jobs", {{"limit", "3"}, {"offset", "1"}, {"order", "asc"}}),
      User("alice"));
  ASSERT_EQ(page.status, 200) << page.body;
  Json body = Body(page);
  EXPECT_EQ(body["total"], 7);
  EXPECT_EQ(body["offset"], 1);
  EXPECT_EQ(body["limit"], 3);
  ASSERT_EQ(body["jobs"].size(), 3u);
  EXPECT_EQ(body["jobs"][0]["id"], 2);

  Json mine = Body(Call(Get("/api/v1/jobs", {{"mine", "1"}}), User("bob")));
  EXPECT_EQ(mine["total"], 3);
  Json named = Body(Call(Get("/api/v1/jobs", {{"q", "net-4"}}), User("bob")));
  ASSERT_EQ(named["total"], 1);
  EXPECT_EQ(named["jobs"][0]["spec"]["name"], "Net-4");
  Json by_priority =
      Body(Call(Get("/api/v1/jobs", {{"sort", "priority"}, {"user", "alice"}}),
                User("bob")));
  EXPECT_EQ(by_priority["jobs"][0]["spec"]["priority"], 6);
  Json none =
      Body(Call(Get("/api/v1/jobs", {{"state", "running"}}), User("bob")));
  EXPECT_EQ(none["total"], 0);

  HttpResponse big = Call(Get("/api/v1/jobs", {{"limit", "5000"}}), User("a"));
  EXPECT_EQ(big.status, 400);
  EXPECT_THAT(big.body, HasSubstr("limit must be 1..1000; got '5000'"));
  EXPECT_EQ(Call(Get("/api/v1/jobs", {{"sort", "size"}}), User("a")).status,
            400);
  EXPECT_EQ(Call(Get("/api/v1/jobs", {{"state", "done"}}), User("a")).status,
            400);
  EXPECT_EQ(Call(Get("/api/v1/jobs", {{"order", "up"}}), User("a")).status,
            400);
}

TEST_F(WebApiTest, UnknownPathsAre404AndWrongMethods405) {
  Start();
  EXPECT_EQ(Call(Get("/api/v1/nothing"), User("a")).status, 404);
  EXPECT_EQ(Call(Get("/api/v1/jobs/12345"), User("a", true)).status, 404);
  EXPECT_EQ(Call(Get("/api/v1/jobs/x"), User("a")).status, 404);
  EXPECT_EQ(Call(Get("/api/v1/jobs/1/what"), User("a")).status, 404);
  EXPECT_EQ(Call(Get("/api/v1/jobs/12345/progress"), User("a", true)).status,
            404);
  HttpResponse wrong = Call(Post("/api/v1/workers"), User("a"));
  EXPECT_EQ(wrong.status, 405);
  ASSERT_EQ(wrong.headers.size(), 1u);
  EXPECT_EQ(wrong.headers[0],
            std::make_pair(std::string("Allow"), std::string("GET")));
  EXPECT_EQ(Call(Get("/api/v1/jobs/1/cancel"), User("a")).status, 405);
}

TEST_F(WebApiTest, ProgressHistoryDiaryRangesAndOutputDownload) {
  Start();
  auto session = Connect("w1", 1);
  const int64_t id = Submit("alice", "train");
  WaitStarted(session, id);
  for (int i = 1; i <= 3; ++i) {
    v1::WorkerMessage m;
    v1::JobProgress* p = m.mutable_progress();
    p->set_job_id(id);
    p->set_attempt(1);
    p->mutable_progress()->set_iteration(i * 10);
    p->mutable_progress()->set_loss(1.0 / i);
    (*p->mutable_progress()->mutable_metrics())["reward"] = i;
    scheduler_->OnWorkerMessage(session, m);
  }
  v1::WorkerMessage diary;
  diary.mutable_diary()->set_job_id(id);
  diary.mutable_diary()->set_attempt(1);
  for (int i = 1; i <= 20; ++i) {
    v1::DiaryLine* line = diary.mutable_diary()->add_lines();
    line->set_seq(i);
    line->set_stream(1);
    line->set_rank(i % 2);
    line->set_text(absl::StrCat("line ", i));
  }
  scheduler_->OnWorkerMessage(session, diary);
  const std::string base = absl::StrCat("/api/v1/jobs/", id);
  ASSERT_TRUE(WaitUntil([&] {
    return Body(Call(Get(base + "/progress"), User("alice")))["points"]
                   .size() == 3 &&
           Body(Call(Get(base + "/diary"), User("alice")))["total"] >= 20;
  }));
  Json progress = Body(Call(Get(base + "/progress"), User("alice")));
  EXPECT_EQ(progress["points"][2]["iteration"], 30);
  EXPECT_EQ(progress["points"][0]["metrics"]["reward"], 1.0);
  EXPECT_EQ(progress["points"][0]["validation_loss"], nullptr);
  const int64_t second = progress["points"][1]["seq"];
  Json after =
      Body(Call(Get(base + "/progress", {{"after", std::to_string(second)}}),
                User("alice")));
  ASSERT_EQ(after["points"].size(), 1u);
  EXPECT_EQ(after["next"], progress["next"]);

  Json range = Body(Call(Get(base + "/diary", {{"after", "5"}, {"limit", "3"}}),
                         User("alice")));
  ASSERT_EQ(range["lines"].size(), 3u);
  EXPECT_EQ(range["lines"][0]["n"], 6);
  EXPECT_EQ(range["ended"], false);
  const int64_t total = range["total"];
  Json tail = Body(Call(Get(base + "/diary", {{"tail", "2"}}), User("alice")));
  ASSERT_EQ(tail["lines"].size(), 2u);
  EXPECT_EQ(tail["lines"][1]["n"], total);
  Json rank = Body(Call(Get(base + "/diary", {{"rank", "1"}, {"limit", "100"}}),
                        User("alice")));
  for (const Json& line : rank["lines"]) EXPECT_EQ(line["rank"], 1);
  EXPECT_EQ(rank["lines"].size(), 10u);
  HttpResponse too_many =
      Call(Get(base + "/diary", {{"limit", "5001"}}), User("alice"));
  EXPECT_THAT(too_many.body, HasSubstr("limit must be 1..5000"));

  // An output, uploaded and reported with the end.
  const std::string data = "weights";
  const std::string sha = Sha256Hex(data);
  auto writer = blobs_->NewWriter(sha, static_cast<int64_t>(data.size()));
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Append(data).ok());
  ASSERT_TRUE((*writer)->Commit().ok());
  v1::WorkerMessage ended;
  v1::JobEnded* e = ended.mutable_ended();
  e->set_job_id(id);
  e->set_attempt(1);
  e->set_state(v1::JOB_STATE_FINISHED);
  v1::OutputFile* f = e->add_outputs();
  f->set_path("out/model \"v1\" é.bin");
  f->set_size(static_cast<int64_t>(data.size()));
  f->set_sha256(sha);
  f->set_mode(0644);
  scheduler_->OnWorkerMessage(session, ended);
  ASSERT_TRUE(WaitUntil([&] {
    return scheduler_->GetJob(id)->state() == v1::JOB_STATE_FINISHED;
  }));
  Json files = Body(Call(Get(base + "/outputs"), User("alice")))["files"];
  ASSERT_EQ(files.size(), 1u);
  HttpResponse file =
      Call(Get(base + "/outputs/out/model \"v1\" é.bin"), User("alice"));
  ASSERT_EQ(file.status, 200) << file.body;
  EXPECT_EQ(file.file_path, blobs_->PathFor(sha));
  EXPECT_EQ(file.content_type, "application/octet-stream");
  auto header = [&](const std::string& name) {
    for (const auto& [k, v] : file.headers)
      if (k == name) return v;
    return std::string();
  };
  EXPECT_EQ(header("ETag"), absl::StrCat("\"", sha, "\""));
  EXPECT_EQ(header("X-Checksum-Sha256"), sha);
  EXPECT_EQ(header("Content-Disposition"),
            "attachment; filename=\"model__v1____.bin\"; "
            "filename*=UTF-8''model%20%22v1%22%20%C3%A9.bin");
  EXPECT_EQ(Call(Get(base + "/outputs/nope"), User("alice")).status, 404);
  EXPECT_EQ(
      Call(Get(base + "/outputs/out/model \"v1\" é.bin"), User("bob")).status,
      403);
  EXPECT_EQ(Body(Call(Get(base + "/diary"), User("alice")))["ended"], true);
}

// A capped diary keeps its head and its tail: its line numbers jump at the
// cut. Pages by offset cover the stored lines exactly once each, in order,
// where pages by line number (after=) would repeat or skip lines there.
TEST_F(WebApiTest, DiaryPagesByOffsetCrossACapsCut) {
  max_diary_bytes_ = 200;
  Start();
  auto session = Connect("w1", 1);
  const int64_t id = Submit("alice", "chatty");
  WaitStarted(session, id);
  v1::WorkerMessage diary;
  diary.mutable_diary()->set_job_id(id);
  diary.mutable_diary()->set_attempt(1);
  for (int i = 1; i <= 60; ++i) {
    v1::DiaryLine* line = diary.mutable_diary()->add_lines();
    line->set_seq(i);
    line->set_stream(1);
    line->set_rank(i % 2);
    line->set_text(absl::StrFormat("line %02d", i));
  }
  scheduler_->OnWorkerMessage(session, diary);
  const std::string base = absl::StrCat("/api/v1/jobs/", id, "/diary");
  Json all;
  ASSERT_TRUE(WaitUntil([&] {
    all = Body(Call(Get(base, {{"limit", "5000"}}), User("alice")));
    return !all["lines"].empty() && all["lines"].back()["text"] == "line 60";
  }));
  const int64_t total = all["total"];
  ASSERT_EQ(static_cast<int64_t>(all["lines"].size()), total);
  // Cut: fewer lines than numbers (the marker among them).
  const int64_t last_n = all["lines"].back()["n"];
  ASSERT_LT(total, last_n) << all.dump();
  ASSERT_GT(total, 10);
  for (int page : {1, 3, 7}) {
    std::vector<int64_t> seen;
    for (int64_t offset = 0; offset < total + page; offset += page) {
      Json r = Body(Call(Get(base, {{"offset", std::to_string(offset)},
                                    {"limit", std::to_string(page)}}),
                         User("alice")));
      EXPECT_EQ(r["total"], total);
      for (const Json& line : r["lines"]) seen.push_back(line["n"]);
    }
    std::vector<int64_t> want;
    for (const Json& line : all["lines"]) want.push_back(line["n"]);
    EXPECT_EQ(seen, want) << "pages of " << page;
  }
  // The position right after the marker is the first kept line after it.
  int64_t marker = 0;
  for (size_t i = 0; i < all["lines"].size(); ++i) {
    if (all["lines"][i]["stream"] == 0) marker = static_cast<int64_t>(i);
  }
  ASSERT_GT(marker, 0);
  Json after_marker = Body(
      Call(Get(base, {{"offset", std::to_string(marker + 1)}, {"limit", "1"}}),
           User("alice")));
  ASSERT_EQ(after_marker["lines"].size(), 1u);
  EXPECT_EQ(after_marker["lines"][0]["n"], all["lines"][marker + 1]["n"]);
  EXPECT_GT(after_marker["lines"][0]["n"].get<int64_t>(), marker + 2);
  // Past the end: nothing, and the count.
  Json past = Body(
      Call(Get(base, {{"offset", std::to_string(total + 5)}}), User("alice")));
  EXPECT_TRUE(past["lines"].empty());
  EXPECT_EQ(past["total"], total);

  // One rank: its own lines counted, and paged by their own positions.
  std::vector<int64_t> rank_lines;
  for (const Json& line : all["lines"]) {
    if (line["rank"] == 1) rank_lines.push_back(line["n"]);
  }
  std::vector<int64_t> seen;
  for (int64_t offset = 0; offset < static_cast<int64_t>(rank_lines.size()) + 4;
       offset += 4) {
    Json r = Body(Call(Get(base, {{"rank", "1"},
                                  {"offset", std::to_string(offset)},
                                  {"limit", "4"}}),
                       User("alice")));
    EXPECT_EQ(r["total"], static_cast<int64_t>(rank_lines.size()));
    for (const Json& line : r["lines"]) seen.push_back(line["n"]);
  }
  EXPECT_EQ(seen, rank_lines);

  HttpResponse both =
      Call(Get(base, {{"offset", "1"}, {"after", "1"}}), User("alice"));
  EXPECT_EQ(both.status, 400);
  EXPECT_THAT(both.body, HasSubstr("use one of them"));
  HttpResponse with_tail =
      Call(Get(base, {{"offset", "1"}, {"tail", "5"}}), User("alice"));
  EXPECT_EQ(with_tail.status, 400);
  HttpResponse negative = Call(Get(base, {{"offset", "-1"}}), User("alice"));
  EXPECT_EQ(negative.status, 400);
}

// Positions are the order the scheduler tries the queue in: bob, who has
// used nothing, before alice, who has run a job for an hour, though her
// jobs are older; a held job has none.
TEST_F(WebApiTest, QueuePositionsFollowFairShare) {
  Start();
  auto session = Connect("w1", 1);
  const int64_t running = Submit("alice", "long");
  WaitStarted(session, running);
  clock_.Advance(3600 * 1000);
  const int64_t a1 = Submit("alice", "a1");
  const int64_t a2 = Submit("alice", "a2");
  const int64_t held = Submit("alice", "held");
  const int64_t b1 = Submit("bob", "b1");
  Json hold = Body(
      Call(Post(absl::StrCat("/api/v1/jobs/", held, "/hold")), User("alice")));
  ASSERT_EQ(hold["results"][0]["ok"], true) << hold.dump();
  Json queue = Body(Call(Get("/api/v1/queue"), User("alice")));
  ASSERT_EQ(queue["jobs"].size(), 4u) << queue.dump();
  std::vector<int64_t> ids;
  for (const Json& j : queue["jobs"]) ids.push_back(j["id"]);
  EXPECT_EQ(ids, (std::vector<int64_t>{b1, a1, a2, held}));
  EXPECT_EQ(queue["jobs"][0]["position"], 1);
  EXPECT_EQ(queue["jobs"][1]["position"], 2);
  EXPECT_EQ(queue["jobs"][2]["position"], 3);
  EXPECT_EQ(queue["jobs"][3]["position"], nullptr);
  EXPECT_EQ(queue["jobs"][0]["queue_position"], 1);
  // A job as GET /jobs/ID (and `show --json`) has it.
  Json b = Body(Call(Get(absl::StrCat("/api/v1/jobs/", b1)), User("bob")));
  EXPECT_EQ(b["queue_position"], 1);
  Json a = Body(Call(Get(absl::StrCat("/api/v1/jobs/", a2)), User("alice")));
  EXPECT_EQ(a["queue_position"], 3);
  EXPECT_THAT(a["wait_reason"].get<std::string>(), HasSubstr("2 jobs ahead"));
  Json h = Body(Call(Get(absl::StrCat("/api/v1/jobs/", held)), User("alice")));
  EXPECT_EQ(h["queue_position"], nullptr);
  Json r =
      Body(Call(Get(absl::StrCat("/api/v1/jobs/", running)), User("alice")));
  EXPECT_EQ(r["queue_position"], nullptr);
}

TEST_F(WebApiTest, EventsStreamDeliversAJobsStateChange) {
  Start();
  DrainedWorker();
  const int64_t id = Submit("alice", "watched");
  HttpResponse r = Call(Get("/api/v1/events"), User("alice"));
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_NE(r.stream, nullptr);
  EXPECT_EQ(r.content_type, "text/event-stream");
  auto writer = std::make_shared<FakeStreamWriter>();
  r.stream->Start(writer);
  ASSERT_TRUE(WaitUntil([&] {
    return absl::StrContains(writer->bytes(), "event: ready\n");
  })) << writer->bytes();
  EXPECT_THAT(writer->bytes(), HasSubstr("event: job\n"));
  ASSERT_EQ(Body(Call(Post(absl::StrCat("/api/v1/jobs/", id, "/cancel")),
                      User("alice")))["results"][0]["ok"],
            true);
  EXPECT_TRUE(WaitUntil([&] {
    return absl::StrContains(writer->bytes(), "\"state\":\"cancelled\"");
  })) << writer->bytes();
  r.stream->Cancel();
  EXPECT_TRUE(WaitUntil([&] { return writer->finished(); }));

  // One job's stream, for its diary too.
  HttpResponse one =
      Call(Get("/api/v1/events", {{"job", std::to_string(id)}}), User("alice"));
  ASSERT_NE(one.stream, nullptr);
  auto w2 = std::make_shared<FakeStreamWriter>();
  one.stream->Start(w2);
  EXPECT_TRUE(WaitUntil(
      [&] { return absl::StrContains(w2->bytes(), "event: ready\n"); }));
  EXPECT_THAT(w2->bytes(), HasSubstr("\"state\":\"cancelled\""));
  one.stream->Cancel();
  EXPECT_TRUE(WaitUntil([&] { return w2->finished(); }));
  EXPECT_EQ(
      Call(Get("/api/v1/events", {{"job", std::to_string(id)}}), User("bob"))
          .status,
      403);

  HttpResponse diary = Call(
      Get(absl::StrCat("/api/v1/jobs/", id, "/diary/events")), User("alice"));
  ASSERT_NE(diary.stream, nullptr);
  auto w3 = std::make_shared<FakeStreamWriter>();
  diary.stream->Start(w3);
  EXPECT_TRUE(WaitUntil([&] { return w3->finished(); })) << w3->bytes();
  EXPECT_THAT(w3->bytes(), HasSubstr("event: end\n"));
}

// Streams of several callers at once: each sees a job as RedactJob leaves
// it for them (the entries' texts are shared between streams), and a burst
// of changes goes out in a few writes, not one per change.
TEST_F(WebApiTest, EventStreamsShareTextsButNeverAnotherUsersEnv) {
  Start(/*shared_visibility=*/true);
  DrainedWorker();
  std::vector<int64_t> ids;
  for (int i = 0; i < 100; ++i)
    ids.push_back(Submit("alice", absl::StrCat("burst", i)));
  struct Open {
    std::shared_ptr<StreamSource> source;
    std::shared_ptr<FakeStreamWriter> writer;
  };
  auto open = [&](const Caller& who, bool one_job) {
    HttpResponse r =
        Call(one_job ? Get("/api/v1/events", {{"job", std::to_string(ids[0])}})
                     : Get("/api/v1/events"),
             who);
    EXPECT_EQ(r.status, 200) << r.body;
    Open o{r.stream, std::make_shared<FakeStreamWriter>()};
    o.source->Start(o.writer);
    EXPECT_TRUE(WaitUntil([&] {
      return absl::StrContains(o.writer->bytes(), "event: ready\n");
    })) << o.writer->bytes();
    return o;
  };
  Open bob = open(User("bob"), false);
  Open bob_one = open(User("bob"), true);
  Open alice_one = open(User("alice"), true);
  Open root = open(User("root", /*admin=*/true), false);
  const int bob_writes = bob.writer->writes();

  std::string body = "{\"ids\":[";
  for (size_t i = 0; i < ids.size(); ++i)
    absl::StrAppend(&body, i ? "," : "", ids[i]);
  body += "]}";
  ASSERT_EQ(Call(Post("/api/v1/jobs/cancel", body), User("alice")).status, 200);
  auto cancelled = [](const FakeStreamWriter& w) {
    size_t n = 0;
    const std::string bytes = w.bytes();
    for (size_t at = 0;
         (at = bytes.find("\"state\":\"cancelled\"", at)) != std::string::npos;
         ++at) {
      ++n;
    }
    return n;
  };
  EXPECT_TRUE(WaitUntil([&] {
    return cancelled(*bob.writer) == ids.size() &&
           cancelled(*root.writer) == ids.size() &&
           cancelled(*bob_one.writer) == 1 && cancelled(*alice_one.writer) == 1;
  })) << bob.writer->bytes();
  // 100 changes (each job's state), and the workers' none: a few writes.
  EXPECT_LE(bob.writer->writes() - bob_writes, 10);

  // The job as its stream's owner sees it first (GET /api/v1/jobs/ID's
  // view), as bob is let see it: without env.
  EXPECT_THAT(alice_one.writer->bytes(), HasSubstr("s3cret"));
  for (const Open* o : {&bob, &bob_one})
    EXPECT_THAT(o->writer->bytes(), Not(HasSubstr("s3cret")));
  // A job stream carries that job only.
  EXPECT_THAT(bob_one.writer->bytes(),
              Not(HasSubstr(absl::StrCat("\"id\":", ids[1], ","))));
  EXPECT_THAT(bob_one.writer->bytes(), Not(HasSubstr("event: worker")));
  for (const Open* o : {&bob, &bob_one, &alice_one, &root}) {
    o->source->Cancel();
    EXPECT_TRUE(WaitUntil([&] { return o->writer->finished(); }));
  }
}

// 100,000 jobs inserted straight into the store: a page of 100 sorted by
// each column, with its total. Prints the times (the benchmark is
// elsewhere); asserts only the answers.
TEST_F(WebApiTest, PageOf100Among100000Jobs) {
  Start();
  scheduler_->Stop();
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir_ + "/state.db").c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "BEGIN", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_stmt* st = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(
                  db,
                  "INSERT INTO jobs(user, spec, name, profile, pool, priority, "
                  "state, attempt, submit_ms, start_ms, end_ms, parts, "
                  "exit_code, reason) VALUES(?, x'', ?, 'local', 1, ?, ?, 1, "
                  "?, 0, 0, '', 0, '')",
                  -1, &st, nullptr),
              SQLITE_OK);
    for (int i = 0; i < 100000; ++i) {
      const std::string user = absl::StrCat("user", i % 50);
      const std::string name = absl::StrCat("job-", i);
      sqlite3_bind_text(st, 1, user.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_text(st, 2, name.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_int(st, 3, i % 10);
      sqlite3_bind_int(
          st, 4, i % 3 == 0 ? v1::JOB_STATE_FAILED : v1::JOB_STATE_FINISHED);
      sqlite3_bind_int64(st, 5, 1000000 + i);
      ASSERT_EQ(sqlite3_step(st), SQLITE_DONE);
      sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    ASSERT_EQ(sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  scheduler_.reset();
  api_.reset();
  reader_.reset();
  store_.reset();
  blobs_.reset();
  Start();
  const std::vector<std::vector<std::pair<std::string, std::string>>> queries =
      {{},
       {{"sort", "submit_time"}},
       {{"sort", "name"}, {"order", "asc"}},
       {{"sort", "user"}, {"offset", "50000"}},
       {{"sort", "priority"}, {"state", "failed"}},
       {{"user", "user7"}},
       {{"q", "job-9999"}}};
  for (const auto& query : queries) {
    std::string shown;
    for (const auto& [k, v] : query) absl::StrAppend(&shown, k, "=", v, "&");
    const auto begin = std::chrono::steady_clock::now();
    HttpResponse page = Call(Get("/api/v1/jobs", query), User("alice"));
    const double ms = std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - begin)
                          .count();
    ASSERT_EQ(page.status, 200) << page.body;
    Json body = Body(page);
    std::printf("page of 100 among 100,000 jobs, %s: %.2f ms (total %lld)\n",
                shown.c_str(), ms,
                static_cast<long long>(body["total"].get<int64_t>()));
    EXPECT_LE(body["jobs"].size(), 100u);
  }
  Json first = Body(Call(Get("/api/v1/jobs"), User("alice")));
  EXPECT_EQ(first["total"], 100000);
  EXPECT_EQ(first["jobs"][0]["id"], 100000);
  Json user7 = Body(Call(Get("/api/v1/jobs", {{"user", "user7"}}), User("a")));
  EXPECT_EQ(user7["total"], 2000);
  Json q = Body(Call(Get("/api/v1/jobs", {{"q", "job-9999"}}), User("a")));
  EXPECT_EQ(q["total"], 11);  // job-9999 and job-99990..99999
}

}  // namespace
}  // namespace dlbatch::scheduler::web
