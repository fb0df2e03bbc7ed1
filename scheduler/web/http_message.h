// The web face's contract between its HTTPS server (web_server.h: TLS,
// sessions, CSRF, security headers, static assets) and what answers the
// requests (the REST API under /api/v1/, api.h). The server parses and
// authenticates; a handler sees a parsed request and the caller it comes
// from and returns a response: bytes, a file (ranges served by the server),
// or a stream of Server-Sent Events.
#ifndef DLBATCH_SCHEDULER_WEB_HTTP_MESSAGE_H_
#define DLBATCH_SCHEDULER_WEB_HTTP_MESSAGE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "scheduler/rpc/identity.h"

namespace dlbatch::scheduler::web {

struct HttpRequest {
  std::string method;  // "GET", "POST", ... as sent
  // The path, percent-decoded, without the query: "/api/v1/jobs/12".
  std::string path;
  // The query's parameters, percent-decoded ('+' as a space), in order.
  std::vector<std::pair<std::string, std::string>> query;
  // Header names in lower case.
  std::map<std::string, std::string> headers;
  std::string body;
  std::string peer;  // the client's address, "127.0.0.1"

  // The first value of query parameter `name`, or `fallback`.
  std::string Query(const std::string& name,
                    const std::string& fallback = "") const {
    for (const auto& [key, value] : query)
      if (key == name) return value;
    return fallback;
  }
  bool HasQuery(const std::string& name) const {
    for (const auto& [key, value] : query)
      if (key == name) return true;
    return false;
  }
  std::string Header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? "" : it->second;
  }
};

// The server's end of one open event stream. Thread-safe.
class StreamWriter {
 public:
  virtual ~StreamWriter() = default;
  // Starts writing `bytes` (whole SSE messages, see SseMessage); must not
  // block. `done(ok)` is called once they are written, on a server thread
  // (ok false: the client left, and no later Write is taken). At most one
  // write is in flight: the next Write comes after its `done`.
  virtual void Write(std::string bytes, std::function<void(bool ok)> done) = 0;
  // Ends the response. No Write after it.
  virtual void Finish() = 0;
};

// A handler's end of an event stream (Content-Type text/event-stream).
class StreamSource {
 public:
  virtual ~StreamSource() = default;
  // The headers are written; the source writes through `writer` from now
  // on, from any thread, never blocking the caller.
  virtual void Start(std::shared_ptr<StreamWriter> writer) = 0;
  // The client left or the server stops: write no more. May be called
  // from a server thread at any time after Start, once.
  virtual void Cancel() = 0;
};

// "event: EVENT\ndata: DATA\n\n" with DATA's newlines split over data:
// lines (an SSE message); `id` non-empty adds "id: ID".
std::string SseMessage(const std::string& event, const std::string& data,
                       const std::string& id = "");

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  // More headers (the server adds the security headers to every response).
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // Non-empty: the body is this file's bytes instead of `body`. The server
  // answers a Range header (206, one range; 416 past the end) and sends
  // Accept-Ranges.
  std::string file_path;
  // Non-null: an event stream (status 200, text/event-stream, no body).
  std::shared_ptr<StreamSource> stream;
};

// A JSON error body: {"error": {"code": "NOT_FOUND", "message": ...}} with
// the HTTP status of the absl code (400, 401, 403, 404, 409, 429, 500,
// 503, ...).
HttpResponse ErrorResponse(const absl::Status& status);
int HttpStatusFor(absl::StatusCode code);

// Answers what the server passes on: every /api/v1/ request but the
// server's own (login, logout, session). Called on a pool thread, never on
// the server's I/O threads, so it may block briefly (the store, the
// scheduler's lock); it must not wait for jobs.
class ApiHandler {
 public:
  virtual ~ApiHandler() = default;
  // `caller` is who the session or bearer token belongs to; the server
  // has checked the CSRF token of state-changing requests already.
  virtual HttpResponse Handle(const HttpRequest& request,
                              const Caller& caller) = 0;
};

}  // namespace dlbatch::scheduler::web

#endif  // DLBATCH_SCHEDULER_WEB_HTTP_MESSAGE_H_
