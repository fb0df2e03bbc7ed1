#include "scheduler/web/web_server.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <deque>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "scheduler/web/static_files.h"
#include "spdlog/spdlog.h"

namespace dlbatch::scheduler::web {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;

namespace {

constexpr size_t kFileChunk = 64 << 10;

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::optional<std::string> PercentDecode(absl::string_view in,
                                         bool plus_is_space) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c == '%') {
      if (i + 2 >= in.size()) return std::nullopt;
      int hi = HexValue(in[i + 1]);
      int lo = HexValue(in[i + 2]);
      if (hi < 0 || lo < 0) return std::nullopt;
      c = static_cast<char>(hi * 16 + lo);
      i += 2;
    } else if (c == '+' && plus_is_space) {
      c = ' ';
    }
    if (c == '\0') return std::nullopt;
    out.push_back(c);
  }
  return out;
}

// A header value as sent: CR, LF and NUL dropped, so that no value a
// handler took from a user can start a header or a response of its own.
std::string HeaderSafe(absl::string_view value) {
  std::string out;
  for (char c : value)
    if (c != '\r' && c != '\n' && c != '\0') out.push_back(c);
  return out;
}

bool HeaderNameSafe(absl::string_view name) {
  if (name.empty()) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' &&
        c != '_')
      return false;
  }
  return true;
}

// The status line and headers of `response` with these framing headers.
std::string HeadText(const HttpResponse& response, bool keep_alive,
                     std::optional<int64_t> content_length) {
  std::string out = absl::StrCat(
      "HTTP/1.1 ", response.status, " ",
      std::string(http::obsolete_reason(http::int_to_status(response.status))),
      "\r\n");
  if (!response.content_type.empty())
    absl::StrAppend(&out, "Content-Type: ", HeaderSafe(response.content_type),
                    "\r\n");
  if (content_length)
    absl::StrAppend(&out, "Content-Length: ", *content_length, "\r\n");
  absl::StrAppend(&out, "Connection: ", keep_alive ? "keep-alive" : "close",
                  "\r\n");
  for (const auto& [name, value] : response.headers) {
    if (!HeaderNameSafe(name)) continue;
    absl::StrAppend(&out, name, ": ", HeaderSafe(value), "\r\n");
  }
  out += "\r\n";
  return out;
}

}  // namespace

bool ParseTarget(absl::string_view target, HttpRequest* request) {
  if (target.empty() || target[0] != '/') return false;
  absl::string_view raw_path = target;
  absl::string_view raw_query;
  if (size_t q = target.find('?'); q != absl::string_view::npos) {
    raw_path = target.substr(0, q);
    raw_query = target.substr(q + 1);
  }
  std::optional<std::string> path = PercentDecode(raw_path, false);
  if (!path) return false;
  request->path = *std::move(path);
  request->query.clear();
  if (raw_query.empty()) return true;
  for (absl::string_view part : absl::StrSplit(raw_query, '&')) {
    if (part.empty()) continue;
    size_t eq = part.find('=');
    std::optional<std::string> key = PercentDecode(part.substr(0, eq), true);
    std::optional<std::string> value =
        eq == absl::string_view::npos
            ? std::string()
            : PercentDecode(part.substr(eq + 1), true);
    if (!key || !value) return false;
    request->query.emplace_back(*std::move(key), *std::move(value));
  }
  return true;
}

class WebServer::Impl {
 public:
  Impl(const WebServerOptions& options, RequestHandler handler,
       OpenCalls* open_calls)
      : options_(options),
        handler_(std::move(handler)),
        open_calls_(open_calls),
        ssl_(ssl::context::tls_server),
        pool_(std::max(1, options.handler_threads)),
        acceptor_(net::make_strand(io_)) {}

  absl::Status Listen();
  void Run();
  void Stop();
  int port() const { return port_; }

  // ---- for the connections ----
  const WebServerOptions& options() const { return options_; }
  ssl::context& ssl_context() { return ssl_; }
  net::thread_pool& pool() { return pool_; }
  const RequestHandler& handler() const { return handler_; }
  OpenCalls* open_calls() const { return open_calls_; }
  void Forget(void* conn);

 private:
  class Connection;
  void Accept();

  const WebServerOptions options_;
  const RequestHandler handler_;
  OpenCalls* const open_calls_;
  // Declared before io_: connections, destroyed with io_'s handlers,
  // reach it until then.
  absl::Mutex mu_;
  std::map<void*, std::weak_ptr<Connection>> conns_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int> open_{0};
  net::io_context io_;
  ssl::context ssl_;
  net::thread_pool pool_;
  tcp::acceptor acceptor_;
  std::vector<std::thread> threads_;
  int port_ = 0;
};

// One client connection. Every member is touched on the connection's
// strand only (the stream's executor), except through what it posts.
class WebServer::Impl::Connection
    : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Impl* server, tcp::socket socket)
      : server_(server),
        stream_(std::move(socket), server->ssl_context()),
        heartbeat_(stream_.get_executor()) {
    ++server_->open_;
  }
  ~Connection() {
    CancelSource();
    if (fd_ >= 0) ::close(fd_);
    --server_->open_;
  }

  void Start() {
    beast::error_code ec;
    auto remote = beast::get_lowest_layer(stream_).socket().remote_endpoint(ec);
    peer_ = ec ? "unknown" : remote.address().to_string();
    beast::get_lowest_layer(stream_).expires_after(
        std::chrono::milliseconds(server_->options().handshake_timeout_ms));
    stream_.async_handshake(ssl::stream_base::server,
                            [self = shared_from_this()](beast::error_code e) {
                              if (e) return self->Close(false);
                              self->ReadRequest();
                            });
  }

  // From any thread: ends the connection on its strand.
  void PostClose() {
    net::post(stream_.get_executor(),
              [self = shared_from_this()] { self->Close(false); });
  }

  // ---- the event stream's writer, on the strand ----
  void StreamWrite(std::string bytes, std::function<void(bool)> done) {
    if (closed_ || finishing_) {
      if (done) done(false);
      return;
    }
    Enqueue(std::move(bytes), std::move(done));
  }
  void StreamFinish() {
    finishing_ = true;
    if (!writing_ && queue_.empty()) Close(true);
  }

 private:
  struct Pending {
    std::string bytes;
    std::function<void(bool)> done;
  };

  void ReadRequest() {
    parser_.emplace();
    parser_->header_limit(
        static_cast<std::uint32_t>(server_->options().max_header_bytes));
    parser_->body_limit(server_->options().max_body_bytes);
    beast::get_lowest_layer(stream_).expires_after(
        std::chrono::milliseconds(server_->options().idle_timeout_ms));
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code e, size_t) {
                       self->OnRead(e);
                     });
  }

  void OnRead(beast::error_code ec) {
    if (closed_) return;
    if (ec == http::error::end_of_stream) return Close(true);
    if (ec == http::error::body_limit) {
      return ReplyError(
          413, absl::StrCat("the request's body is over ",
                            server_->options().max_body_bytes, " bytes"));
    }
    if (ec == http::error::header_limit) {
      return ReplyError(431, "the request's headers are too large");
    }
    if (ec &&
        &ec.category() ==
            &http::make_error_code(http::error::bad_target).category() &&
        ec != http::error::partial_message) {
      return ReplyError(400, "malformed HTTP request");
    }
    if (ec) return Close(false);  // the client left, or was too slow
    HttpRequest request;
    auto& message = parser_->get();
    request.method = std::string(message.method_string());
    request.peer = peer_;
    keep_alive_ = message.keep_alive();
    beast::string_view target = message.target();
    if (!ParseTarget(absl::string_view(target.data(), target.size()),
                     &request)) {
      return ReplyError(400, "malformed request target");
    }
    for (const auto& field : message) {
      std::string name = absl::AsciiStrToLower(absl::string_view(
          field.name_string().data(), field.name_string().size()));
      absl::string_view value(field.value().data(), field.value().size());
      auto [it, fresh] = request.headers.emplace(name, std::string(value));
      if (!fresh)
        absl::StrAppend(&it->second, name == "cookie" ? "; " : ", ", value);
    }
    request.body = std::move(message.body());
    head_only_ = request.method == "HEAD";
    range_ = request.Header("range");
    beast::get_lowest_layer(stream_).expires_never();
    // The handler may read the store: on the pool, never here.
    net::post(server_->pool(), [self = shared_from_this(),
                                request = std::move(request)]() mutable {
      RoutedResponse routed;
      try {
        routed = self->server_->handler()(request);
      } catch (const std::exception& e) {
        spdlog::error("web face: {} {} failed: {}", request.method,
                      request.path, e.what());
        routed.response = ErrorResponse(
            absl::InternalError("the request failed inside the scheduler"));
      }
      AddSecurityHeaders(request.path, &routed.response);
      net::post(self->stream_.get_executor(),
                [self, routed = std::move(routed)]() mutable {
                  self->Respond(std::move(routed));
                });
    });
  }

  void ReplyError(int status, const std::string& message) {
    keep_alive_ = false;
    head_only_ = false;
    HttpResponse r = ErrorResponse(absl::InvalidArgumentError(message));
    r.status = status;
    AddSecurityHeaders("/api/", &r);
    Respond(RoutedResponse{std::move(r), ""});
  }

  void Respond(RoutedResponse routed) {
    if (closed_) return;
    HttpResponse& r = routed.response;
    if (r.stream) return StartStream(std::move(routed));
    if (!r.file_path.empty()) return SendFile(r);
    const bool no_body = r.status == 204 || r.status == 304;
    std::string out = HeadText(
        r, keep_alive_,
        no_body ? std::nullopt : std::optional<int64_t>(r.body.size()));
    if (!head_only_ && !no_body) out += r.body;
    Enqueue(std::move(out), [this](bool ok) { AfterResponse(ok); });
  }

  void SendFile(HttpResponse& r) {
    fd_ = ::open(r.file_path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd_ < 0 || ::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      HttpResponse e = ErrorResponse(absl::NotFoundError("no such file"));
      e.headers = r.headers;
      return Respond(RoutedResponse{std::move(e), ""});
    }
    const int64_t size = st.st_size;
    r.headers.emplace_back("Accept-Ranges", "bytes");
    ByteRange range = ParseRange(range_, size);
    if (r.status == 200 && range.kind == ByteRange::kUnsatisfiable) {
      ::close(fd_);
      fd_ = -1;
      HttpResponse e = ErrorResponse(absl::OutOfRangeError(absl::StrCat(
          "the range asked for starts past the end (", size, " bytes)")));
      e.status = 416;
      e.headers = r.headers;
      e.headers.emplace_back("Content-Range", absl::StrCat("bytes */", size));
      return Respond(RoutedResponse{std::move(e), ""});
    }
    file_at_ = 0;
    file_end_ = size;
    if (r.status == 200 && range.kind == ByteRange::kPartial) {
      r.status = 206;
      file_at_ = range.first;
      file_end_ = range.last + 1;
      r.headers.emplace_back(
          "Content-Range",
          absl::StrCat("bytes ", range.first, "-", range.last, "/", size));
    }
    std::string head = HeadText(r, keep_alive_, file_end_ - file_at_);
    if (head_only_) file_end_ = file_at_;
    Enqueue(std::move(head), [this](bool ok) { NextFileChunk(ok); });
  }

  void NextFileChunk(bool ok) {
    if (!ok) return Close(false);
    if (file_at_ >= file_end_) {
      ::close(fd_);
      fd_ = -1;
      return AfterResponse(true);
    }
    std::string chunk(static_cast<size_t>(
                          std::min<int64_t>(kFileChunk, file_end_ - file_at_)),
                      '\0');
    ssize_t n = ::pread(fd_, chunk.data(), chunk.size(), file_at_);
    if (n <= 0) return Close(false);  // shrank under us: the length is wrong
    chunk.resize(static_cast<size_t>(n));
    file_at_ += n;
    Enqueue(std::move(chunk), [this](bool ok2) { NextFileChunk(ok2); });
  }

  void AfterResponse(bool ok) {
    if (!ok) return Close(false);
    if (!keep_alive_) return Close(true);
    ReadRequest();
  }

  void StartStream(RoutedResponse routed) {
    HttpResponse& r = routed.response;
    source_ = r.stream;
    r.status = 200;
    r.content_type = "text/event-stream";
    bool has_cache = false;
    for (const auto& h : r.headers)
      has_cache = has_cache || absl::EqualsIgnoreCase(h.first, "Cache-Control");
    if (!has_cache) r.headers.emplace_back("Cache-Control", "no-store");
    // The body ends when the connection does (no length, no chunks).
    keep_alive_ = false;
    if (!routed.credential.empty() && server_->open_calls() != nullptr) {
      std::weak_ptr<Connection> weak = weak_from_this();
      revocation_ = server_->open_calls()->Add(routed.credential, [weak] {
        if (auto c = weak.lock()) c->PostClose();
      });
    }
    Enqueue(HeadText(r, false, std::nullopt), [this](bool ok) {
      if (!ok) return Close(false);
      source_->Start(
          std::make_shared<Writer>(weak_from_this(), stream_.get_executor()));
      Heartbeat();
      WatchForLeaving();
    });
  }

  void Heartbeat() {
    heartbeat_.expires_after(
        std::chrono::milliseconds(server_->options().heartbeat_ms));
    heartbeat_.async_wait([self = shared_from_this()](beast::error_code e) {
      if (e || self->closed_) return;
      if (self->queue_.empty() && !self->writing_)
        self->Enqueue(": ping\n\n", nullptr);
      self->Heartbeat();
    });
  }

  // A client sends nothing on an event stream; a read ends when it goes.
  void WatchForLeaving() {
    stream_.async_read_some(
        net::buffer(discard_),
        [self = shared_from_this()](beast::error_code e, size_t) {
          if (e || self->closed_) return self->Close(false);
          self->WatchForLeaving();
        });
  }

  void Enqueue(std::string bytes, std::function<void(bool)> done) {
    queue_.push_back(Pending{std::move(bytes), std::move(done)});
    if (!writing_) WriteNext();
  }

  void WriteNext() {
    if (queue_.empty()) {
      if (finishing_) Close(true);
      return;
    }
    writing_ = true;
    beast::get_lowest_layer(stream_).expires_after(
        std::chrono::milliseconds(server_->options().write_timeout_ms));
    net::async_write(stream_, net::buffer(queue_.front().bytes),
                     [self = shared_from_this()](beast::error_code e, size_t) {
                       Pending done = std::move(self->queue_.front());
                       self->queue_.pop_front();
                       self->writing_ = false;
                       // A pending event-stream read must not inherit the
                       // write's limit.
                       beast::get_lowest_layer(self->stream_).expires_never();
                       if (e) {
                         if (done.done) done.done(false);
                         return self->Close(false);
                       }
                       // `done` may queue the next bytes (and start writing
                       // them).
                       if (done.done) done.done(true);
                       if (!self->closed_ && !self->writing_) self->WriteNext();
                     });
  }

  void CancelSource() {
    if (source_ && !cancelled_) {
      cancelled_ = true;
      source_->Cancel();
    }
  }

  // `graceful`: a TLS close_notify first (bounded in time).
  void Close(bool graceful) {
    if (closed_) return;
    closed_ = true;
    CancelSource();
    if (revocation_ != 0) {
      server_->open_calls()->Remove(revocation_);
      revocation_ = 0;
    }
    heartbeat_.cancel();
    // What was queued behind the write in flight is never written.
    for (size_t i = writing_ ? 1 : 0; i < queue_.size(); ++i)
      if (queue_[i].done) queue_[i].done(false);
    if (queue_.size() > (writing_ ? 1u : 0u)) queue_.resize(writing_ ? 1 : 0);
    server_->Forget(this);
    auto& socket = beast::get_lowest_layer(stream_);
    // An event stream's read is still pending: no TLS shutdown beside it.
    if (!graceful || writing_ || source_) {
      beast::error_code ignored;
      socket.socket().shutdown(tcp::socket::shutdown_both, ignored);
      socket.close();
      return;
    }
    socket.expires_after(std::chrono::seconds(2));
    stream_.async_shutdown([self = shared_from_this()](beast::error_code) {
      beast::get_lowest_layer(self->stream_).close();
    });
  }

  class Writer final : public StreamWriter {
   public:
    Writer(std::weak_ptr<Connection> conn, net::any_io_executor strand)
        : conn_(std::move(conn)), strand_(std::move(strand)) {}
    void Write(std::string bytes, std::function<void(bool)> done) override {
      std::shared_ptr<Connection> conn = conn_.lock();
      if (!conn) {
        if (done) done(false);
        return;
      }
      net::post(strand_, [conn, bytes = std::move(bytes),
                          done = std::move(done)]() mutable {
        conn->StreamWrite(std::move(bytes), std::move(done));
      });
    }
    void Finish() override {
      if (std::shared_ptr<Connection> conn = conn_.lock())
        net::post(strand_, [conn] { conn->StreamFinish(); });
    }

   private:
    std::weak_ptr<Connection> conn_;
    net::any_io_executor strand_;
  };

  Impl* const server_;
  beast::ssl_stream<beast::tcp_stream> stream_;
  net::steady_timer heartbeat_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string peer_;
  bool keep_alive_ = false;
  bool head_only_ = false;
  std::string range_;
  std::deque<Pending> queue_;
  bool writing_ = false;
  bool closed_ = false;
  bool finishing_ = false;
  int fd_ = -1;
  int64_t file_at_ = 0;
  int64_t file_end_ = 0;
  std::shared_ptr<StreamSource> source_;
  bool cancelled_ = false;
  int64_t revocation_ = 0;
  char discard_[512];
};

absl::Status WebServer::Impl::Listen() {
  beast::error_code ec;
  ssl_.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                       ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                       ssl::context::no_tlsv1_1 | ssl::context::single_dh_use,
                   ec);
  ssl_.use_certificate_chain_file(options_.cert_file, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("the web face cannot read the certificate ",
                     options_.cert_file, ": ", ec.message()));
  }
  ssl_.use_private_key_file(options_.key_file, ssl::context::pem, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("the web face cannot read the key ", options_.key_file,
                     ": ", ec.message()));
  }
  auto address = net::ip::make_address(options_.host, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--web-listen ", options_.host,
                     ": not an IP address; write e.g. 127.0.0.1:8443"));
  }
  tcp::endpoint endpoint(address, static_cast<unsigned short>(options_.port));
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(
        "the web face cannot listen on ", options_.host, ":", options_.port,
        ": ", ec.message(),
        " (in use, or not an address of this machine); choose another with "
        "--web-listen"));
  }
  port_ = acceptor_.local_endpoint().port();
  return absl::OkStatus();
}

void WebServer::Impl::Run() {
  Accept();
  for (int i = 0; i < std::max(1, options_.io_threads); ++i) {
    threads_.emplace_back([this] {
      for (;;) {
        try {
          io_.run();
          return;
        } catch (const std::exception& e) {
          // A handler's exception must not end the process's web face.
          spdlog::error("web face: {}", e.what());
        }
      }
    });
  }
}

void WebServer::Impl::Accept() {
  acceptor_.async_accept(
      net::make_strand(io_), [this](beast::error_code ec, tcp::socket socket) {
        if (ec == net::error::operation_aborted || !acceptor_.is_open()) return;
        if (!ec) {
          if (open_.load() >= options_.max_connections) {
            beast::error_code ignored;
            socket.close(ignored);
          } else {
            // A response of more than one TLS record must not wait in
            // Nagle's algorithm for the client's delayed ACK (~40 ms).
            beast::error_code ignored;
            socket.set_option(tcp::no_delay(true), ignored);
            auto conn = std::make_shared<Connection>(this, std::move(socket));
            bool stopped;
            {
              absl::MutexLock lock(&mu_);
              stopped = stopped_;
              if (!stopped) conns_[conn.get()] = conn;
            }
            if (!stopped) conn->Start();
          }
        }
        Accept();
      });
}

void WebServer::Impl::Forget(void* conn) {
  absl::MutexLock lock(&mu_);
  conns_.erase(conn);
}

void WebServer::Impl::Stop() {
  std::vector<std::shared_ptr<Connection>> open;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    for (auto& [key, weak] : conns_)
      if (auto c = weak.lock()) open.push_back(std::move(c));
  }
  net::post(acceptor_.get_executor(), [this] {
    beast::error_code ignored;
    acceptor_.close(ignored);
  });
  for (auto& c : open) c->PostClose();
  open.clear();
  // The handlers running finish; what they post back meets closed
  // connections.
  pool_.join();
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (open_.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  io_.stop();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

WebServer::WebServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
WebServer::~WebServer() { Stop(); }
int WebServer::port() const { return impl_->port(); }
void WebServer::Stop() { impl_->Stop(); }

absl::StatusOr<std::unique_ptr<WebServer>> WebServer::Start(
    const WebServerOptions& options, RequestHandler handler,
    OpenCalls* open_calls) {
  auto impl = std::make_unique<Impl>(options, std::move(handler), open_calls);
  if (absl::Status s = impl->Listen(); !s.ok()) return s;
  impl->Run();
  return std::unique_ptr<WebServer>(new WebServer(std::move(impl)));
}

}  // namespace dlbatch::scheduler::web
