// /api/v1/jobs/ID/diary: ranges of a diary by position among the stored
// lines (a browser's virtual scroll over a 1,000,000-line diary loads only
// what it shows; positions have no gaps where a capped diary was cut) or
// after a line number,
// its tail, one rank's lines, and an event stream that follows new lines.
// The stream is a call of the scheduler's DiaryFollowHub, as `dlbatch
// diary -f` is: no thread per stream, one write at a time.
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "proto/job_state.h"
#include "scheduler/web/api.h"
#include "scheduler/web/api_params.h"

namespace dlbatch::scheduler::web {
namespace {

Json LinesJson(const v1::DiaryChunk& chunk) {
  Json lines = Json::array();
  for (const v1::DiaryLine& line : chunk.lines())
    lines.push_back(DiaryLineJson(line));
  return lines;
}

// One /diary/events stream: the hub's DiaryWriter on one side, the server's
// StreamWriter on the other. Owns itself from Start until the hub is done
// with it (FinishDiary), so the server may drop it at any time.
class DiaryEventSource final
    : public StreamSource,
      public DiaryWriter,
      public std::enable_shared_from_this<DiaryEventSource> {
 public:
  DiaryEventSource(DiaryFollowHub* hub, v1::ReadDiaryRequest request)
      : hub_(hub), request_(std::move(request)) {}

  void Start(std::shared_ptr<StreamWriter> writer) override {
    DiaryFollowHub::Handle call;
    {
      absl::MutexLock lock(&mu_);
      writer_ = std::move(writer);
      self_ = shared_from_this();
      call_ = hub_->ReadDiary(request_, this);
      call = call_;
    }
    hub_->Start(call);
  }
  void Cancel() override {
    DiaryFollowHub::Handle call;
    {
      absl::MutexLock lock(&mu_);
      call = call_;
    }
    if (call) hub_->Cancel(call);
  }

  // DiaryWriter: the hub never has two writes outstanding.
  void WriteChunk(v1::DiaryChunk chunk) override {
    std::string bytes;
    if (chunk.lines_size() > 0) {
      bytes = SseMessage("lines",
                         JsonText(Json{{"lines", LinesJson(chunk)}}, true));
    }
    if (chunk.end()) {
      absl::StrAppend(
          &bytes,
          SseMessage("end", JsonText(Json{{"state", JsonState(chunk.state())}},
                                     true)));
    }
    std::shared_ptr<StreamWriter> writer;
    DiaryFollowHub::Handle call;
    {
      absl::MutexLock lock(&mu_);
      writer = writer_;
      call = call_;
    }
    if (bytes.empty()) {  // a chunk with nothing to say: written at once
      hub_->Written(call, true);
      return;
    }
    auto self = shared_from_this();
    writer->Write(std::move(bytes),
                  [self, call](bool ok) { self->hub_->Written(call, ok); });
  }
  void FinishDiary(absl::Status status) override {
    std::shared_ptr<StreamWriter> writer;
    std::shared_ptr<DiaryEventSource> self;
    DiaryFollowHub::Handle call;
    {
      absl::MutexLock lock(&mu_);
      writer = std::move(writer_);
      self = std::move(self_);
      call = std::move(call_);
    }
    if (!status.ok() && !absl::IsCancelled(status) && writer != nullptr) {
      // The stream is open already: the error is its last message.
      Json error{{"code", absl::StatusCodeToString(status.code())},
                 {"message", std::string(status.message())}};
      writer->Write(SseMessage("error", JsonText(Json{{"error", error}}, true)),
                    [writer](bool) { writer->Finish(); });
    } else if (writer != nullptr) {
      writer->Finish();
    }
    if (call) hub_->Detach(call);
  }

 private:
  DiaryFollowHub* const hub_;
  const v1::ReadDiaryRequest request_;
  absl::Mutex mu_;
  std::shared_ptr<StreamWriter> writer_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<DiaryEventSource> self_ ABSL_GUARDED_BY(mu_);
  DiaryFollowHub::Handle call_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::vector<int32_t>> RankParam(const HttpRequest& request) {
  if (!request.HasQuery("rank")) return std::vector<int32_t>{};
  ASSIGN_OR_RETURN(int64_t rank, IntParam(request, "rank", 0, INT32_MAX, 0));
  return std::vector<int32_t>{static_cast<int32_t>(rank)};
}

}  // namespace

absl::StatusOr<Json> RestApi::Diary(const HttpRequest& request,
                                    const Caller& caller, int64_t id) {
  ASSIGN_OR_RETURN(int64_t after, IntParam(request, "after", 0, INT64_MAX, 0));
  ASSIGN_OR_RETURN(int64_t limit, IntParam(request, "limit", 1, kMaxDiaryPage,
                                           kDefaultDiaryPage));
  ASSIGN_OR_RETURN(int64_t offset,
                   IntParam(request, "offset", 0, INT64_MAX, 0));
  ASSIGN_OR_RETURN(int64_t tail,
                   IntParam(request, "tail", 1, kMaxDiaryPage, 0));
  if (tail > 0 && (request.HasQuery("after") || request.HasQuery("limit") ||
                   request.HasQuery("offset"))) {
    return absl::InvalidArgumentError(
        "tail reads the last lines; use either tail=L, after=N&limit=L or "
        "offset=K&limit=L");
  }
  if (request.HasQuery("offset") && request.HasQuery("after")) {
    return absl::InvalidArgumentError(
        "after=N starts after line number N, offset=K at the K-th stored "
        "line (from 0); use one of them");
  }
  ASSIGN_OR_RETURN(std::vector<int32_t> ranks, RankParam(request));
  RETURN_IF_ERROR(MayAccess(caller, id, /*control=*/false));
  // The state before the lines: where the job had ended, no line follows
  // the newest read.
  ASSIGN_OR_RETURN(v1::Job job, scheduler_->GetJob(id));
  const bool ended = IsTerminal(job.state());
  int64_t cursor = 0;
  if (tail > 0) {
    ASSIGN_OR_RETURN(cursor, reader_->DiaryTailStart(id, tail, ranks));
    limit = tail;
  } else if (request.HasQuery("offset")) {
    ASSIGN_OR_RETURN(cursor, reader_->DiaryCursorForOffset(id, offset, ranks));
  } else {
    ASSIGN_OR_RETURN(cursor, reader_->DiaryCursorForLine(id, after));
  }
  ASSIGN_OR_RETURN(
      std::vector<v1::DiaryLine> lines,
      reader_->ReadDiary(id, cursor, static_cast<int>(limit), ranks));
  // The lines a reader can page through by offset: the selected ranks'.
  ASSIGN_OR_RETURN(int64_t total, reader_->DiaryCount(id, ranks));
  Json out = Json::array();
  for (const v1::DiaryLine& line : lines) out.push_back(DiaryLineJson(line));
  return Json{{"lines", std::move(out)}, {"total", total}, {"ended", ended}};
}

absl::StatusOr<HttpResponse> RestApi::DiaryEvents(const HttpRequest& request,
                                                  const Caller& caller,
                                                  int64_t id) {
  ASSIGN_OR_RETURN(int64_t after, IntParam(request, "after", 0, INT64_MAX, 0));
  ASSIGN_OR_RETURN(std::vector<int32_t> ranks, RankParam(request));
  RETURN_IF_ERROR(MayAccess(caller, id, /*control=*/false));
  RETURN_IF_ERROR(scheduler_->JobOwner(id).status());  // NotFound as a 404
  v1::ReadDiaryRequest follow;
  follow.set_job_id(id);
  ASSIGN_OR_RETURN(int64_t cursor, reader_->DiaryCursorForLine(id, after));
  follow.set_after(cursor);
  follow.set_follow(true);
  follow.mutable_ranks()->Add(ranks.begin(), ranks.end());
  HttpResponse response;
  response.content_type = "text/event-stream";
  response.stream = std::make_shared<DiaryEventSource>(&scheduler_->followers(),
                                                       std::move(follow));
  return response;
}

}  // namespace dlbatch::scheduler::web
