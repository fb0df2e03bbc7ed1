// The CLI's direct unary calls (client/direct_call.h) against the real
// scheduler: they answer as gRPC's own calls do, and every peer they cannot
// read — none listening, one that hangs up, one that answers junk — is left
// to gRPC, while one that never answers ends at the deadline.
#include "client/direct_call.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "dlbatch/v1/scheduler.grpc.pb.h"
#include "tests/integration/harness.h"

namespace dlbatch::testing {
namespace {

using client::DirectUnaryCall;

std::string SocketPath(const Cluster& c) {
  std::string address = c.address();
  EXPECT_EQ(address.rfind("unix:", 0), 0u) << address;
  return address.substr(5);
}

v1::SubmitJobRequest TrueJob(const std::string& request_id) {
  v1::SubmitJobRequest request;
  request.set_request_id(request_id);
  request.mutable_spec()->set_pool(1);
  request.mutable_spec()->mutable_command()->add_argv("true");
  return request;
}

TEST(DirectCall, AnswersAsGrpcDoes) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 1);
  ASSERT_TRUE(c.WaitWorkers(1));
  const std::string socket = SocketPath(c);
  const std::string submit = "/dlbatch.v1.Scheduler/SubmitJob";

  v1::SubmitJobReply first, again;
  auto status =
      DirectUnaryCall(socket, submit, "", TrueJob("direct-1"), &first, 10000);
  ASSERT_TRUE(status.has_value());
  ASSERT_TRUE(status->ok()) << status->error_message();
  EXPECT_GT(first.job_id(), 0);
  EXPECT_FALSE(first.duplicate());
  // The request id makes a repeat (as after a lost reply) the same job.
  status =
      DirectUnaryCall(socket, submit, "", TrueJob("direct-1"), &again, 10000);
  ASSERT_TRUE(status.has_value() && status->ok());
  EXPECT_EQ(again.job_id(), first.job_id());
  EXPECT_TRUE(again.duplicate());
  ASSERT_TRUE(c.WaitState(first.job_id(), "JOB_STATE_FINISHED")) << c.Logs();

  // What the scheduler made is what gRPC's own call reads back.
  auto stub = v1::Scheduler::NewStub(
      grpc::CreateChannel(c.address(), grpc::InsecureChannelCredentials()));
  v1::GetJobRequest get;
  get.set_job_id(first.job_id());
  v1::Job direct_job, grpc_job;
  status = DirectUnaryCall(socket, "/dlbatch.v1.Scheduler/GetJob", "", get,
                           &direct_job, 10000);
  ASSERT_TRUE(status.has_value() && status->ok());
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->GetJob(&ctx, get, &grpc_job).ok());
  EXPECT_EQ(direct_job.SerializeAsString(), grpc_job.SerializeAsString());
  EXPECT_EQ(direct_job.state(), v1::JOB_STATE_FINISHED);

  // Errors carry the scheduler's code and message, bytes outside ASCII
  // included (gRPC percent-encodes them on the wire).
  get.set_job_id(987654);
  v1::Job none;
  status = DirectUnaryCall(socket, "/dlbatch.v1.Scheduler/GetJob", "", get,
                           &none, 10000);
  grpc::ClientContext ctx2;
  grpc::Status from_grpc = stub->GetJob(&ctx2, get, &none);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status->error_code(), from_grpc.error_code());
  EXPECT_EQ(status->error_message(), from_grpc.error_message());
  v1::SubmitJobRequest odd = TrueJob("direct-2");
  odd.mutable_spec()->set_profile("prófile-%-ünknown");
  v1::SubmitJobReply refused;
  status = DirectUnaryCall(socket, submit, "", odd, &refused, 10000);
  grpc::ClientContext ctx3;
  odd.set_request_id("direct-3");
  from_grpc = stub->SubmitJob(&ctx3, odd, &refused);
  ASSERT_TRUE(status.has_value());
  EXPECT_FALSE(status->ok());
  EXPECT_EQ(status->error_code(), from_grpc.error_code());
  EXPECT_EQ(status->error_message(), from_grpc.error_message());
  EXPECT_NE(status->error_message().find("prófile-%-ünknown"),
            std::string::npos)
      << status->error_message();
}

// A Unix socket in `dir` whose every connection `serve` handles.
class Peer {
 public:
  Peer(const std::string& path, std::function<void(int)> serve) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(fd_, 8), 0);
    thread_ = std::thread([this, serve] {
      for (;;) {
        int conn = ::accept(fd_, nullptr, nullptr);
        if (conn < 0 || stop_) {
          if (conn >= 0) ::close(conn);
          return;
        }
        serve(conn);
        ::close(conn);
      }
    });
  }
  ~Peer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
    ::unlink(path_.c_str());
  }

 private:
  std::string path_;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

void ReadSome(int fd) {
  char buf[4096];
  (void)!::read(fd, buf, sizeof buf);
}

TEST(DirectCall, LeavesToGrpcWhatItCannotRead) {
  Cluster c;  // for its temp folder
  const std::string method = "/dlbatch.v1.Scheduler/ListJobs";
  v1::ListJobsRequest request;
  v1::ListJobsReply reply;
  reply.add_jobs()->set_id(5);  // cleared whatever the outcome

  // Nothing listening.
  EXPECT_FALSE(
      DirectUnaryCall(c.dir() + "/none.sock", method, "", request, &reply, 2000)
          .has_value());
  EXPECT_EQ(reply.jobs_size(), 0);
  {  // A peer that reads the request and hangs up (a scheduler killed
     // mid-call).
    Peer peer(c.dir() + "/hangup.sock", ReadSome);
    EXPECT_FALSE(DirectUnaryCall(c.dir() + "/hangup.sock", method, "", request,
                                 &reply, 2000)
                     .has_value());
  }
  {  // A peer that answers with something that is not HTTP/2's frames.
    Peer peer(c.dir() + "/junk.sock", [](int fd) {
      ReadSome(fd);
      const std::string junk = "HTTP/1.1 400 Bad Request\r\n\r\n";
      (void)!::write(fd, junk.data(), junk.size());
    });
    EXPECT_FALSE(DirectUnaryCall(c.dir() + "/junk.sock", method, "", request,
                                 &reply, 2000)
                     .has_value());
  }
  {  // A peer that resets the stream.
    Peer peer(c.dir() + "/reset.sock", [](int fd) {
      ReadSome(fd);
      const char rst[] = {0, 0, 4, 3, 0, 0, 0, 0, 1, 0, 0, 0, 2};
      (void)!::write(fd, rst, sizeof rst);
      ReadSome(fd);
    });
    EXPECT_FALSE(DirectUnaryCall(c.dir() + "/reset.sock", method, "", request,
                                 &reply, 2000)
                     .has_value());
  }
  {  // A peer that never answers: the call's deadline ends it.
    std::atomic<bool> done{false};
    Peer peer(c.dir() + "/silent.sock", [&done](int fd) {
      ReadSome(fd);
      while (!done) usleep(10000);
    });
    const auto start = std::chrono::steady_clock::now();
    auto status = DirectUnaryCall(c.dir() + "/silent.sock", method, "", request,
                                  &reply, 300);
    const auto took = std::chrono::steady_clock::now() - start;
    done = true;
    ASSERT_TRUE(status.has_value());
    EXPECT_EQ(status->error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    EXPECT_GE(took, std::chrono::milliseconds(290));
    EXPECT_LT(took, std::chrono::milliseconds(5000));
  }
}

// An HTTP/2 frame: length, type, flags, stream 1 (or 0 for the
// connection's frames).
std::string Frame(uint8_t type, uint8_t flags, uint32_t stream,
                  const std::string& payload) {
  std::string f;
  f.push_back(static_cast<char>(payload.size() >> 16));
  f.push_back(static_cast<char>(payload.size() >> 8));
  f.push_back(static_cast<char>(payload.size()));
  f.push_back(static_cast<char>(type));
  f.push_back(static_cast<char>(flags));
  for (int shift = 24; shift >= 0; shift -= 8)
    f.push_back(static_cast<char>(stream >> shift));
  return f + payload;
}

// What a server may do within HTTP/2 that gRPC's happens not to: a PING
// first, the headers split into HEADERS and CONTINUATION, padded DATA. The
// call reads it all and answers the PING; the same headers with DATA in
// between are refused.
TEST(DirectCall, ReadsContinuationsPaddingAndPings) {
  Cluster c;  // for its temp folder
  v1::ListJobsReply want;
  want.add_jobs()->set_id(7);
  const std::string message = want.SerializeAsString();
  std::string data = std::string(1, '\3') + std::string(1, '\0');
  for (int shift = 24; shift >= 0; shift -= 8)
    data.push_back(static_cast<char>(message.size() >> shift));
  data += message + std::string(3, '\0');  // pad length 3
  const std::string ping = "pingpong";
  const std::string status_200(1, static_cast<char>(0x88));
  const std::string content_type = std::string("\x40\x0c", 2) +
                                   "content-type\x10"
                                   "application/grpc";
  const std::string trailers =
      std::string("\x40\x0b", 2) + "grpc-status" + std::string("\x01", 1) + "0";
  auto reply_with = [&](bool data_inside_headers) {
    std::string out = Frame(4, 0, 0, "") + Frame(6, 0, 0, ping) +
                      Frame(1, 0, 1, status_200);  // no END_HEADERS
    if (data_inside_headers) out += Frame(0, 0x8, 1, data);
    out += Frame(9, 0x4, 1, content_type) + Frame(0, 0x8, 1, data) +
           Frame(1, 0x5, 1, trailers);
    return out;
  };
  const std::string method = "/dlbatch.v1.Scheduler/ListJobs";
  v1::ListJobsRequest request;
  v1::ListJobsReply reply;
  std::string seen;  // what the call sent after the request
  {
    Peer peer(c.dir() + "/split.sock", [&](int fd) {
      ReadSome(fd);
      const std::string out = reply_with(false);
      (void)!::write(fd, out.data(), out.size());
      char buf[4096];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof buf)) > 0) seen.append(buf, n);
    });
    auto status = DirectUnaryCall(c.dir() + "/split.sock", method, "", request,
                                  &reply, 5000);
    ASSERT_TRUE(status.has_value());
    EXPECT_TRUE(status->ok()) << status->error_message();
    EXPECT_EQ(reply.SerializeAsString(), message);
  }
  EXPECT_NE(seen.find(Frame(6, 0x1, 0, ping)), std::string::npos)
      << "no PING ACK";
  EXPECT_NE(seen.find(Frame(4, 0x1, 0, "")), std::string::npos)
      << "no SETTINGS ACK";
  {
    Peer peer(c.dir() + "/bad-order.sock", [&](int fd) {
      ReadSome(fd);
      const std::string out = reply_with(true);
      (void)!::write(fd, out.data(), out.size());
    });
    EXPECT_FALSE(DirectUnaryCall(c.dir() + "/bad-order.sock", method, "",
                                 request, &reply, 5000)
                     .has_value());
  }
}

// The CLI's submit goes direct; refused, it says what gRPC's way says.
TEST(DirectCall, CliSubmitsDirectAndFailsAsThroughGrpc) {
  Cluster c;
  c.StartScheduler();
  c.StartWorker("w1", 1);
  ASSERT_TRUE(c.WaitWorkers(1));
  Result direct = c.Cli({"submit", "-q", "--", "true"});
  ASSERT_EQ(direct.code, 0) << direct.err;
  const int64_t id = std::stoll(direct.out);
  EXPECT_TRUE(c.WaitState(id, "JOB_STATE_FINISHED"));
  Result shown = c.Cli({"show", std::to_string(id)});
  EXPECT_EQ(shown.code, 0) << shown.err;
  EXPECT_NE(shown.out.find("finished"), std::string::npos) << shown.out;
  Result refused = c.Cli({"submit", "--pool", "9", "--", "true"});
  Result refused_grpc = c.Cli({"submit", "--pool", "9", "--", "true"},
                              {{"DLBATCH_DIRECT_CALLS", "0"}});
  EXPECT_EQ(refused.code, 1);
  EXPECT_EQ(refused.code, refused_grpc.code);
  EXPECT_EQ(refused.err, refused_grpc.err);
  EXPECT_NE(refused.err.find("pool 9"), std::string::npos) << refused.err;
}

}  // namespace
}  // namespace dlbatch::testing
