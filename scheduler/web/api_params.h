// The REST API's parsing of its parameters and bodies: pure functions with
// errors that say what to change ("limit must be 1..1000; got 5000").
#ifndef DLBATCH_SCHEDULER_WEB_API_PARAMS_H_
#define DLBATCH_SCHEDULER_WEB_API_PARAMS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/json_shapes.h"
#include "scheduler/web/http_message.h"

namespace dlbatch::scheduler::web {

// Untrusted text for an error message: valid UTF-8, at most 80 bytes.
std::string Shown(const std::string& text);

// Query parameter `name` as an integer in [min, max]; `fallback` where it
// is absent. InvalidArgument names the parameter, the range and the value.
absl::StatusOr<int64_t> IntParam(const HttpRequest& request,
                                 const std::string& name, int64_t min,
                                 int64_t max, int64_t fallback);

// A job, sweep or array id from the path: a positive integer.
absl::StatusOr<int64_t> PathId(const std::string& text, const char* what);

// The JSON object of a request's body ({} for an empty body).
absl::StatusOr<Json> BodyObject(const HttpRequest& request);

// A 200 response with `body` as JSON.
HttpResponse JsonResponse(const Json& body, int status = 200);

// Content-Disposition's value for an attachment named `name` (untrusted):
// an ASCII fallback filename (unsafe bytes as '_') and the RFC 5987
// filename* with every byte outside attr-char percent-encoded.
std::string AttachmentDisposition(const std::string& name);

// The comma-separated states of ?state= ("queued,running"); the CLI's
// names (JobStateByName). InvalidArgument names a bad one.
absl::StatusOr<std::vector<v1::JobState>> StatesParam(const std::string& text);

}  // namespace dlbatch::scheduler::web

#endif  // DLBATCH_SCHEDULER_WEB_API_PARAMS_H_
