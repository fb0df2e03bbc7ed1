#include "scheduler/web/api_params.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/utf8.h"
#include "proto/job_state.h"

namespace dlbatch::scheduler::web {

std::string Shown(const std::string& text) {
  constexpr size_t kMax = 80;
  return ValidUtf8(text.size() > kMax ? text.substr(0, kMax) + "..." : text);
}

absl::StatusOr<int64_t> IntParam(const HttpRequest& request,
                                 const std::string& name, int64_t min,
                                 int64_t max, int64_t fallback) {
  if (!request.HasQuery(name)) return fallback;
  const std::string text = request.Query(name);
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < min || value > max) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " must be ", min, "..", max, "; got '", Shown(text), "'"));
  }
  return value;
}

absl::StatusOr<int64_t> PathId(const std::string& text, const char* what) {
  int64_t id = 0;
  if (!absl::SimpleAtoi(text, &id) || id <= 0) {
    return absl::NotFoundError(absl::StrCat("no ", what, " '", Shown(text),
                                            "'; ", what,
                                            " ids are positive integers"));
  }
  return id;
}

absl::StatusOr<Json> BodyObject(const HttpRequest& request) {
  if (absl::StripAsciiWhitespace(request.body).empty()) return Json::object();
  Json body = Json::parse(request.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) {
    return absl::InvalidArgumentError(
        "the request's body must be a JSON object, such as "
        "{\"ids\": [1, 2]}");
  }
  return body;
}

HttpResponse JsonResponse(const Json& body, int status) {
  HttpResponse response;
  response.status = status;
  response.body = JsonText(body, /*compact=*/true);
  return response;
}

std::string AttachmentDisposition(const std::string& name) {
  // The last component only: a path's folders are not the file's name.
  const size_t slash = name.rfind('/');
  const std::string base =
      slash == std::string::npos ? name : name.substr(slash + 1);
  std::string ascii;
  std::string encoded;
  for (unsigned char c : base) {
    const bool attr_char =
        absl::ascii_isalnum(c) ||
        std::string_view("!#$&+-.^_`|~").find(c) != std::string_view::npos;
    ascii.push_back(attr_char ? static_cast<char>(c) : '_');
    if (attr_char) {
      encoded.push_back(static_cast<char>(c));
    } else {
      absl::StrAppend(
          &encoded, "%",
          absl::AsciiStrToUpper(absl::StrCat(absl::Hex(c, absl::kZeroPad2))));
    }
  }
  if (ascii.empty()) ascii = "output";
  return absl::StrCat("attachment; filename=\"", ascii, "\"; filename*=UTF-8''",
                      encoded);
}

absl::StatusOr<std::vector<v1::JobState>> StatesParam(const std::string& text) {
  std::vector<v1::JobState> states;
  if (text.empty()) return states;
  for (absl::string_view name : absl::StrSplit(text, ',')) {
    v1::JobState state;
    if (!ParseJobState(std::string(name), &state)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state '", Shown(std::string(name)),
          "' is not one; use queued, running, finished, failed or cancelled "
          "(comma-separated)"));
    }
    states.push_back(state);
  }
  return states;
}

}  // namespace dlbatch::scheduler::web
