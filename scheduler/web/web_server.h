// The web face's HTTPS server: Boost.Beast's HTTP/1.1 over Boost.Asio's
// OpenSSL streams, asynchronous throughout, so hundreds of open event
// streams cost a socket and a little memory each, not a thread. A fixed
// few I/O threads run every socket (each connection on a strand of its
// own); requests are answered on a separate small pool (the handler may
// read the store), never on an I/O thread.
//
// Per connection: HTTP/1.1 keep-alive, a request's headers at most
// max_header_bytes (431) and its body at most max_body_bytes (413), time
// limits on the handshake, on a request and between requests, and on
// each write; past max_connections a new connection is closed at once. A
// malformed request gets 400 and its connection is closed. A response is
// bytes, a file (streamed in chunks; one Range served: 206, or 416 past
// the end) or an event stream (SSE: headers, then the source writes; a
// comment every heartbeat; the source is cancelled when the client goes,
// the server stops, or the credential it was opened under is revoked).
#ifndef DLBATCH_SCHEDULER_WEB_WEB_SERVER_H_
#define DLBATCH_SCHEDULER_WEB_WEB_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "scheduler/rpc/credentials.h"
#include "scheduler/web/http_message.h"
#include "scheduler/web/web_routes.h"

namespace dlbatch::scheduler::web {

struct WebServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;           // 0: any free port
  std::string cert_file;  // PEM: certificate and chain
  std::string key_file;
  int io_threads = 2;
  int handler_threads = 4;
  int max_connections = 1024;
  int64_t handshake_timeout_ms = 10000;
  // A request must arrive whole within this, and a kept-alive connection
  // with no request for this long is closed.
  int64_t idle_timeout_ms = 60000;
  int64_t write_timeout_ms = 30000;
  int64_t heartbeat_ms = 15000;  // ": ping" on an event stream
  size_t max_header_bytes = 16 << 10;
  size_t max_body_bytes = 1 << 20;
};

// Answers one parsed request (on a pool thread; thread-safe).
using RequestHandler = std::function<RoutedResponse(const HttpRequest&)>;

class WebServer {
 public:
  // Listens and serves until Stop. `open_calls` (may be null) learns each
  // event stream under its response's credential.
  static absl::StatusOr<std::unique_ptr<WebServer>> Start(
      const WebServerOptions& options, RequestHandler handler,
      OpenCalls* open_calls);
  ~WebServer();  // Stop()

  int port() const;
  // Stops accepting, ends every connection (cancelling event streams),
  // waits for the handlers running and the I/O threads. Idempotent.
  void Stop();

  class Impl;

 private:
  explicit WebServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Splits a request target ("/a%20b?x=1&y") into the decoded path and
// query (HttpRequest's). False where it is not an origin-form target or
// an escape is malformed or decodes to NUL.
bool ParseTarget(absl::string_view target, HttpRequest* request);

}  // namespace dlbatch::scheduler::web

#endif  // DLBATCH_SCHEDULER_WEB_WEB_SERVER_H_
