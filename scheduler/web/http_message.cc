#include "scheduler/web/http_message.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/utf8.h"

namespace dlbatch::scheduler::web {

std::string SseMessage(const std::string& event, const std::string& data,
                       const std::string& id) {
  std::string out;
  if (!id.empty()) absl::StrAppend(&out, "id: ", id, "\n");
  absl::StrAppend(&out, "event: ", event, "\n");
  for (absl::string_view line : absl::StrSplit(data, '\n'))
    absl::StrAppend(&out, "data: ", line, "\n");
  out += "\n";
  return out;
}

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kFailedPrecondition:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

HttpResponse ErrorResponse(const absl::Status& status) {
  HttpResponse response;
  response.status = HttpStatusFor(status.code());
  nlohmann::ordered_json body = {
      {"error",
       {{"code", absl::StatusCodeToString(status.code())},
        {"message", ValidUtf8(std::string_view(status.message().data(),
                                               status.message().size()))}}}};
  response.body = body.dump();
  return response;
}

}  // namespace dlbatch::scheduler::web
