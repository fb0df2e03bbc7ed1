// One unary call to the scheduler on its Unix socket, made without gRPC's
// runtime: the CLI writes the HTTP/2 frames of a gRPC request itself and
// reads the answer.
//
// Why: a command such as `dlbatch submit` makes one call and exits. gRPC's
// client starts its runtime for it (six threads, its core configuration,
// a channel that resolves, connects and settles), then joins it all at
// exit, and on this project's machines that was about half of a fresh
// submit's wall time. A unary call on a local socket needs none of it: one
// write of the preface, the settings, the request's headers and its
// message, then reading frames until the trailers.
//
// Only what a gRPC server sends to a unary call is read: SETTINGS (acked),
// PING (answered), WINDOW_UPDATE, HEADERS with CONTINUATION, DATA, in
// HPACK's static and dynamic tables and plain literals. Anything else
// (Huffman-coded strings, a reset stream, GOAWAY, a compressed message, a
// connection that cannot be made or ends early) makes the call say that it
// cannot tell, and the caller then makes the same call through gRPC. So
// only calls that are safe to repeat may come here: reads, and submits that
// carry a request id.
#ifndef DLBATCH_CLIENT_DIRECT_CALL_H_
#define DLBATCH_CLIENT_DIRECT_CALL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "google/protobuf/message_lite.h"
#include "grpcpp/support/status.h"

namespace dlbatch::client {

// HPACK (RFC 7541) decoding, as much of it as a gRPC server's headers use.
class HpackDecoder {
 public:
  using Field = std::pair<std::string, std::string>;
  // Decodes one header block, updating the dynamic table. False where the
  // block uses what this does not read (a Huffman-coded string) or is
  // malformed; the decoder is then unusable.
  bool Decode(std::string_view block, std::vector<Field>* fields);
  size_t table_size() const { return size_; }  // RFC 7541's, in octets

 private:
  bool Lookup(uint64_t index, Field* field) const;
  void Insert(Field field);
  void Evict();

  std::vector<Field> dynamic_;  // newest first
  size_t size_ = 0;
  size_t max_size_ = 4096;
};

// The request's headers as this client writes them (HPACK, no indexing, no
// Huffman): POST `path` with the gRPC content type, `te: trailers`, a
// grpc-timeout when timeout_ms > 0, and the token when not empty.
std::string EncodeRequestHeaders(std::string_view path, int64_t timeout_ms,
                                 const std::string& token);

// A connected socket, closed when the last copy goes.
using SharedSocket = std::shared_ptr<const int>;
// Connects to the Unix socket at `path`; null where nothing accepts there.
SharedSocket ConnectUnix(const std::string& path);

// Makes the unary call `path` ("/dlbatch.v1.Scheduler/SubmitJob") on the
// Unix socket `socket_path`, or on `connected` (a fresh connection to it:
// the local cluster's check that its socket accepts hands its own on). Returns
// the call's status where the server answered it (OK with *reply parsed from
// the message; or the server's error, message and all; DEADLINE_EXCEEDED after
// timeout_ms without an answer), or nullopt where this cannot tell what
// happened (see above): *reply is then cleared and the caller makes the call
// through gRPC.
std::optional<grpc::Status> DirectUnaryCall(
    const std::string& socket_path, std::string_view path,
    const std::string& token, const google::protobuf::MessageLite& request,
    google::protobuf::MessageLite* reply, int64_t timeout_ms);
std::optional<grpc::Status> DirectUnaryCall(
    SharedSocket connected, std::string_view path, const std::string& token,
    const google::protobuf::MessageLite& request,
    google::protobuf::MessageLite* reply, int64_t timeout_ms);

}  // namespace dlbatch::client

#endif  // DLBATCH_CLIENT_DIRECT_CALL_H_
