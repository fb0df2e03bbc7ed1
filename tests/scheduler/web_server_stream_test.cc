// The HTTPS server's event streams, on a real socket with curl: the
// headers, the source's messages, the heartbeat comment, and Cancel once
// the client goes; and a stop with a stream still open.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "scheduler/rpc/tls_certs.h"
#include "scheduler/web/web_server.h"

namespace dlbatch::scheduler::web {
namespace {

class OneMessage final : public StreamSource {
 public:
  void Start(std::shared_ptr<StreamWriter> writer) override {
    writer_ = writer;
    writer->Write(SseMessage("hello", "{\"n\":1}"), [](bool) {});
  }
  void Cancel() override { ++cancels; }
  std::atomic<int> cancels{0};

 private:
  std::shared_ptr<StreamWriter> writer_;
};

std::string Shell(const std::string& command) {
  std::string out;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

TEST(WebServerStreamTest, WritesBeatsAndCancelsWhenTheClientGoes) {
  char tmpl[] = "/tmp/web_stream_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  auto tls = LoadOrCreateTls(dir, {"127.0.0.1", "localhost"});
  ASSERT_TRUE(tls.ok()) << tls.status();
  auto source = std::make_shared<OneMessage>();
  WebServerOptions options;
  options.cert_file = tls->cert_file;
  options.key_file = tls->key_file;
  options.heartbeat_ms = 300;
  auto server = WebServer::Start(
      options,
      [source](const HttpRequest&) {
        RoutedResponse r;
        r.response.stream = source;
        return r;
      },
      nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  std::string out = Shell(
      "curl -sN -i --max-time 2 --cacert " + tls->ca_file +
      " https://127.0.0.1:" + std::to_string((*server)->port()) + "/events");
  EXPECT_NE(out.find("Content-Type: text/event-stream"), std::string::npos)
      << out;
  EXPECT_NE(out.find("Cache-Control: no-store"), std::string::npos) << out;
  EXPECT_NE(out.find("event: hello\ndata: {\"n\":1}\n\n"), std::string::npos)
      << out;
  EXPECT_NE(out.find(": ping\n\n"), std::string::npos) << out;
  for (int i = 0; i < 100 && source->cancels.load() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(source->cancels.load(), 1);

  // A stream left open when the server stops is cancelled too.
  source->cancels = 0;
  std::thread client([&] {
    Shell("curl -sN --max-time 5 --cacert " + tls->ca_file +
          " https://127.0.0.1:" + std::to_string((*server)->port()) +
          "/events > /dev/null");
  });
  for (int i = 0; i < 200 && source->cancels.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (i == 50) (*server)->Stop();
  }
  client.join();
  EXPECT_EQ(source->cancels.load(), 1);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dlbatch::scheduler::web
