#include "client/direct_call.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/endpoint.h"

namespace dlbatch::client {
namespace {

// RFC 7541 Appendix A: the static table's names (index 1 to 61) and the
// values of the entries that have one.
constexpr std::array<std::pair<const char*, const char*>, 61> kStaticTable = {{
    {":authority", ""},
    {":method", "GET"},
    {":method", "POST"},
    {":path", "/"},
    {":path", "/index.html"},
    {":scheme", "http"},
    {":scheme", "https"},
    {":status", "200"},
    {":status", "204"},
    {":status", "206"},
    {":status", "304"},
    {":status", "400"},
    {":status", "404"},
    {":status", "500"},
    {"accept-charset", ""},
    {"accept-encoding", "gzip, deflate"},
    {"accept-language", ""},
    {"accept-ranges", ""},
    {"accept", ""},
    {"access-control-allow-origin", ""},
    {"age", ""},
    {"allow", ""},
    {"authorization", ""},
    {"cache-control", ""},
    {"content-disposition", ""},
    {"content-encoding", ""},
    {"content-language", ""},
    {"content-length", ""},
    {"content-location", ""},
    {"content-range", ""},
    {"content-type", ""},
    {"cookie", ""},
    {"date", ""},
    {"etag", ""},
    {"expect", ""},
    {"expires", ""},
    {"from", ""},
    {"host", ""},
    {"if-match", ""},
    {"if-modified-since", ""},
    {"if-none-match", ""},
    {"if-range", ""},
    {"if-unmodified-since", ""},
    {"last-modified", ""},
    {"link", ""},
    {"location", ""},
    {"max-forwards", ""},
    {"proxy-authenticate", ""},
    {"proxy-authorization", ""},
    {"range", ""},
    {"referer", ""},
    {"refresh", ""},
    {"retry-after", ""},
    {"server", ""},
    {"set-cookie", ""},
    {"strict-transport-security", ""},
    {"transfer-encoding", ""},
    {"user-agent", ""},
    {"vary", ""},
    {"via", ""},
    {"www-authenticate", ""},
}};

// HTTP/2 (RFC 9113) frame types and flags used here.
constexpr uint8_t kData = 0x0, kHeaders = 0x1, kRstStream = 0x3,
                  kSettings = 0x4, kPing = 0x6, kGoaway = 0x7,
                  kWindowUpdate = 0x8, kContinuation = 0x9;
constexpr uint8_t kEndStream = 0x1, kAck = 0x1, kEndHeaders = 0x4,
                  kPadded = 0x8, kPriority = 0x20;
constexpr size_t kFrameHeader = 9;
constexpr size_t kMaxFrame = 16384;  // SETTINGS_MAX_FRAME_SIZE's default
// What the server may send before it has our window update: a request
// larger than the initial windows is left to gRPC.
constexpr size_t kInitialWindow = 65535;
// The window this client opens for the reply (stream and connection).
constexpr uint32_t kReplyWindow = 16 << 20;

// An HPACK integer with an `n`-bit prefix whose other bits are `first`.
void PutInt(std::string* out, uint8_t first, int n, uint64_t value) {
  const uint64_t max = (uint64_t{1} << n) - 1;
  if (value < max) {
    out->push_back(static_cast<char>(first | value));
    return;
  }
  out->push_back(static_cast<char>(first | max));
  value -= max;
  while (value >= 128) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

// A string literal, not Huffman-coded.
void PutString(std::string* out, std::string_view s) {
  PutInt(out, 0x00, 7, s.size());
  out->append(s);
}

bool GetInt(std::string_view* in, int n, uint64_t* value) {
  if (in->empty()) return false;
  const uint64_t max = (uint64_t{1} << n) - 1;
  *value = static_cast<uint8_t>((*in)[0]) & max;
  in->remove_prefix(1);
  if (*value < max) return true;
  for (int shift = 0; shift < 56; shift += 7) {
    if (in->empty()) return false;
    const uint8_t b = static_cast<uint8_t>((*in)[0]);
    in->remove_prefix(1);
    *value += static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

bool GetString(std::string_view* in, std::string* s) {
  if (in->empty()) return false;
  const bool huffman = (static_cast<uint8_t>((*in)[0]) & 0x80) != 0;
  uint64_t length = 0;
  if (!GetInt(in, 7, &length) || length > in->size()) return false;
  if (huffman) return false;  // not read here: gRPC takes the call
  s->assign(in->substr(0, length));
  in->remove_prefix(length);
  return true;
}

void PutFrameHeader(std::string* out, size_t length, uint8_t type,
                    uint8_t flags, uint32_t stream) {
  out->push_back(static_cast<char>((length >> 16) & 0xff));
  out->push_back(static_cast<char>((length >> 8) & 0xff));
  out->push_back(static_cast<char>(length & 0xff));
  out->push_back(static_cast<char>(type));
  out->push_back(static_cast<char>(flags));
  for (int shift = 24; shift >= 0; shift -= 8) {
    out->push_back(static_cast<char>((stream >> shift) & 0xff));
  }
}

void PutU32(std::string* out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) {
    out->push_back(static_cast<char>((v >> shift) & 0xff));
  }
}

uint32_t GetU32(const char* p) {
  return (uint32_t{static_cast<uint8_t>(p[0])} << 24) |
         (uint32_t{static_cast<uint8_t>(p[1])} << 16) |
         (uint32_t{static_cast<uint8_t>(p[2])} << 8) |
         uint32_t{static_cast<uint8_t>(p[3])};
}

bool WriteAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// ---- HPACK ----

bool HpackDecoder::Lookup(uint64_t index, Field* field) const {
  if (index == 0) return false;
  if (index <= kStaticTable.size()) {
    *field = {kStaticTable[index - 1].first, kStaticTable[index - 1].second};
    return true;
  }
  const uint64_t at = index - kStaticTable.size() - 1;
  if (at >= dynamic_.size()) return false;
  *field = dynamic_[at];
  return true;
}

void HpackDecoder::Insert(Field field) {
  const size_t size = field.first.size() + field.second.size() + 32;
  if (size > max_size_) {  // RFC 7541 4.4: empties the table
    dynamic_.clear();
    size_ = 0;
    return;
  }
  dynamic_.insert(dynamic_.begin(), std::move(field));
  size_ += size;
  Evict();
}

void HpackDecoder::Evict() {
  while (size_ > max_size_ && !dynamic_.empty()) {
    size_ -= dynamic_.back().first.size() + dynamic_.back().second.size() + 32;
    dynamic_.pop_back();
  }
}

bool HpackDecoder::Decode(std::string_view block, std::vector<Field>* fields) {
  while (!block.empty()) {
    const uint8_t b = static_cast<uint8_t>(block[0]);
    uint64_t index = 0;
    if ((b & 0x80) != 0) {  // indexed
      Field field;
      if (!GetInt(&block, 7, &index) || !Lookup(index, &field)) return false;
      fields->push_back(std::move(field));
      continue;
    }
    if ((b & 0xe0) == 0x20) {  // dynamic table size update
      if (!GetInt(&block, 5, &index) || index > 4096) return false;
      max_size_ = index;
      Evict();
      continue;
    }
    // A literal: with incremental indexing (01), else without (0000) or
    // never indexed (0001).
    const bool indexing = (b & 0xc0) == 0x40;
    if (!GetInt(&block, indexing ? 6 : 4, &index)) return false;
    Field field;
    if (index == 0) {
      if (!GetString(&block, &field.first)) return false;
    } else {
      if (!Lookup(index, &field)) return false;
    }
    if (!GetString(&block, &field.second)) return false;
    if (indexing) Insert(field);
    fields->push_back(std::move(field));
  }
  return true;
}

std::string EncodeRequestHeaders(std::string_view path, int64_t timeout_ms,
                                 const std::string& token) {
  std::string out;
  out.push_back(static_cast<char>(0x83));  // :method POST
  out.push_back(static_cast<char>(0x86));  // :scheme http
  PutInt(&out, 0x00, 4, 4);                // :path, not indexed
  PutString(&out, path);
  PutInt(&out, 0x00, 4, 1);  // :authority
  PutString(&out, "localhost");
  PutInt(&out, 0x00, 4, 31);  // content-type
  PutString(&out, "application/grpc");
  PutInt(&out, 0x00, 4, 0);
  PutString(&out, "te");
  PutString(&out, "trailers");
  if (timeout_ms > 0) {
    PutInt(&out, 0x00, 4, 0);
    PutString(&out, "grpc-timeout");
    // At most 8 digits (gRPC's rule); past that, in seconds.
    PutString(&out, timeout_ms < 100000000
                        ? absl::StrCat(timeout_ms, "m")
                        : absl::StrCat(timeout_ms / 1000 + 1, "S"));
  }
  if (!token.empty()) {
    PutInt(&out, 0x00, 4, 23);  // authorization
    PutString(&out, absl::StrCat("Bearer ", token));
  }
  PutInt(&out, 0x00, 4, 58);  // user-agent
  PutString(&out, "dlbatch-cli (direct)");
  return out;
}

// ---- the call ----

SharedSocket ConnectUnix(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) return nullptr;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return nullptr;
  SharedSocket sock(new int(fd), [](const int* owned) {
    ::close(*owned);
    delete owned;
  });
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) !=
      0) {
    return nullptr;
  }
  return sock;
}

std::optional<grpc::Status> DirectUnaryCall(
    const std::string& socket_path, std::string_view path,
    const std::string& token, const google::protobuf::MessageLite& request,
    google::protobuf::MessageLite* reply, int64_t timeout_ms) {
  reply->Clear();
  SharedSocket sock = ConnectUnix(socket_path);
  if (sock == nullptr) return std::nullopt;
  return DirectUnaryCall(std::move(sock), path, token, request, reply,
                         timeout_ms);
}

std::optional<grpc::Status> DirectUnaryCall(
    SharedSocket connected, std::string_view path, const std::string& token,
    const google::protobuf::MessageLite& request,
    google::protobuf::MessageLite* reply, int64_t timeout_ms) {
  reply->Clear();
  if (connected == nullptr) return std::nullopt;
  const int fd = *connected;
  const int64_t deadline = timeout_ms > 0 ? NowMs() + timeout_ms : 0;
  std::string message;
  if (!request.SerializeToString(&message)) return std::nullopt;
  const std::string headers = EncodeRequestHeaders(path, timeout_ms, token);
  if (message.size() + 5 > kInitialWindow || headers.size() > kMaxFrame) {
    return std::nullopt;
  }

  // Everything the request is, in one write: the preface, our settings (no
  // push; a large window for the reply) and the window to match, the
  // headers, and the message in DATA frames, the last ending the stream.
  std::string out = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  PutFrameHeader(&out, 12, kSettings, 0, 0);
  out.append("\x00\x02", 2);  // SETTINGS_ENABLE_PUSH
  PutU32(&out, 0);
  out.append("\x00\x04", 2);  // SETTINGS_INITIAL_WINDOW_SIZE
  PutU32(&out, kReplyWindow);
  PutFrameHeader(&out, 4, kWindowUpdate, 0, 0);
  PutU32(&out, kReplyWindow - kInitialWindow);
  PutFrameHeader(&out, headers.size(), kHeaders, kEndHeaders, 1);
  out.append(headers);
  std::string body;
  body.push_back(0);  // not compressed
  PutU32(&body, static_cast<uint32_t>(message.size()));
  body.append(message);
  for (size_t at = 0; at < body.size(); at += kMaxFrame) {
    const size_t n = std::min(kMaxFrame, body.size() - at);
    PutFrameHeader(&out, n, kData, at + n == body.size() ? kEndStream : 0, 1);
    out.append(body, at, n);
  }
  if (!WriteAll(fd, out)) return std::nullopt;

  HpackDecoder hpack;
  std::string in;           // read, not yet parsed
  std::string block;        // a header block being gathered
  bool gathering = false;   // HEADERS came without END_HEADERS
  bool block_ends = false;  // that block's HEADERS had END_STREAM
  bool had_headers = false;
  std::string data;  // stream 1's DATA payloads
  std::vector<HpackDecoder::Field> trailers;
  bool ended = false;
  char buf[16384];
  while (!ended) {
    // Parse every whole frame read so far.
    size_t at = 0;
    while (!ended && in.size() - at >= kFrameHeader) {
      const char* h = in.data() + at;
      const size_t length = (size_t{static_cast<uint8_t>(h[0])} << 16) |
                            (size_t{static_cast<uint8_t>(h[1])} << 8) |
                            size_t{static_cast<uint8_t>(h[2])};
      if (in.size() - at - kFrameHeader < length) break;
      const uint8_t type = static_cast<uint8_t>(h[3]);
      const uint8_t flags = static_cast<uint8_t>(h[4]);
      const uint32_t stream = GetU32(h + 5) & 0x7fffffff;
      std::string_view payload(h + kFrameHeader, length);
      at += kFrameHeader + length;
      // CONTINUATION follows its HEADERS at once, and nothing else does.
      if (gathering != (type == kContinuation)) return std::nullopt;
      switch (type) {
        case kSettings:
          if ((flags & kAck) == 0) {
            std::string ack;
            PutFrameHeader(&ack, 0, kSettings, kAck, 0);
            if (!WriteAll(fd, ack)) return std::nullopt;
          }
          break;
        case kPing:
          if ((flags & kAck) == 0 && length == 8) {
            std::string pong;
            PutFrameHeader(&pong, 8, kPing, kAck, 0);
            pong.append(payload);
            if (!WriteAll(fd, pong)) return std::nullopt;
          }
          break;
        case kWindowUpdate:
          break;
        case kHeaders:
        case kContinuation: {
          if (stream != 1) return std::nullopt;
          if (type == kHeaders) {
            size_t pad = 0;
            if ((flags & kPadded) != 0) {
              if (payload.empty()) return std::nullopt;
              pad = static_cast<uint8_t>(payload[0]);
              payload.remove_prefix(1);
            }
            if ((flags & kPriority) != 0) {
              if (payload.size() < 5) return std::nullopt;
              payload.remove_prefix(5);
            }
            if (pad > payload.size()) return std::nullopt;
            payload.remove_suffix(pad);
            block_ends = (flags & kEndStream) != 0;
          }
          block.append(payload);
          gathering = (flags & kEndHeaders) == 0;
          if (gathering) break;
          std::vector<HpackDecoder::Field> fields;
          if (!hpack.Decode(block, &fields)) return std::nullopt;
          block.clear();
          if (!had_headers) {
            had_headers = true;
            bool status_200 = false;
            for (const auto& [name, value] : fields) {
              if (name == ":status") status_200 = value == "200";
            }
            if (!status_200) return std::nullopt;
          }
          if (block_ends) {  // the trailers (or trailers-only)
            trailers = std::move(fields);
            ended = true;
          }
          break;
        }
        case kData: {
          if (stream != 1 || !had_headers) return std::nullopt;
          size_t pad = 0;
          if ((flags & kPadded) != 0) {
            if (payload.empty()) return std::nullopt;
            pad = static_cast<uint8_t>(payload[0]);
            payload.remove_prefix(1);
          }
          if (pad > payload.size()) return std::nullopt;
          payload.remove_suffix(pad);
          data.append(payload);
          if (data.size() > kReplyWindow) return std::nullopt;
          // A stream that ends on DATA has no trailers: not gRPC.
          if ((flags & kEndStream) != 0) return std::nullopt;
          break;
        }
        case kRstStream:
        case kGoaway:
          return std::nullopt;
        default:
          break;  // unknown frame types are ignored (RFC 9113 4.1)
      }
    }
    in.erase(0, at);
    if (ended) break;
    int wait = -1;
    if (deadline > 0) {
      const int64_t left = deadline - NowMs();
      if (left <= 0) {
        return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                            "Deadline Exceeded");
      }
      wait = static_cast<int>(left);
    }
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, wait);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return std::nullopt;
    if (ready == 0) continue;  // the deadline is checked above
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;  // the scheduler went away mid-call
    in.append(buf, static_cast<size_t>(n));
  }

  std::optional<int> code;
  std::string text;
  for (const auto& [name, value] : trailers) {
    int v = 0;
    if (name == "grpc-status" && absl::SimpleAtoi(value, &v) && v >= 0 &&
        v <= 16) {
      code = v;
    } else if (name == "grpc-message") {
      // Percent-encoded by gRPC's spec: bytes outside 0x20..0x7e, and '%'.
      text = PercentDecoded(value);
    }
  }
  if (!code) return std::nullopt;
  if (*code != 0) {
    return grpc::Status(static_cast<grpc::StatusCode>(*code), text);
  }
  // One message: its 5-byte prefix (not compressed), then the bytes.
  if (data.size() < 5 || data[0] != 0 ||
      GetU32(data.data() + 1) != data.size() - 5 ||
      !reply->ParseFromArray(data.data() + 5,
                             static_cast<int>(data.size() - 5))) {
    reply->Clear();
    return std::nullopt;
  }
  return grpc::Status::OK;
}

}  // namespace dlbatch::client
