// The direct call's HPACK: RFC 7541's examples, what gRPC's server sends,
// and the request headers this client writes, read back.
#include "client/direct_call.h"

#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dlbatch::client {
namespace {

using Fields = std::vector<HpackDecoder::Field>;
using ::testing::ElementsAre;
using ::testing::Pair;

std::string Bytes(std::initializer_list<int> bytes) {
  std::string s;
  for (int b : bytes) s.push_back(static_cast<char>(b));
  return s;
}

// RFC 7541 C.3: three requests on one connection, without Huffman coding.
const std::string kC31 =
    Bytes({0x82, 0x86, 0x84, 0x41, 0x0f}) + "www.example.com";
const std::string kC32 =
    Bytes({0x82, 0x86, 0x84, 0xbe, 0x58, 0x08}) + "no-cache";
const std::string kC33 = Bytes({0x82, 0x87, 0x85, 0xbf, 0x40, 0x0a}) +
                         "custom-key" + Bytes({0x0c}) + "custom-value";

TEST(HpackDecoderTest, ReadsRfc7541RequestsWithTheDynamicTable) {
  HpackDecoder hpack;
  Fields first, second, third;
  ASSERT_TRUE(hpack.Decode(kC31, &first));
  EXPECT_THAT(first, ElementsAre(Pair(":method", "GET"),
                                 Pair(":scheme", "http"), Pair(":path", "/"),
                                 Pair(":authority", "www.example.com")));
  EXPECT_EQ(hpack.table_size(), 57u);
  ASSERT_TRUE(hpack.Decode(kC32, &second));
  EXPECT_THAT(second, ElementsAre(Pair(":method", "GET"),
                                  Pair(":scheme", "http"), Pair(":path", "/"),
                                  Pair(":authority", "www.example.com"),
                                  Pair("cache-control", "no-cache")));
  EXPECT_EQ(hpack.table_size(), 110u);
  ASSERT_TRUE(hpack.Decode(kC33, &third));
  EXPECT_THAT(third,
              ElementsAre(Pair(":method", "GET"), Pair(":scheme", "https"),
                          Pair(":path", "/index.html"),
                          Pair(":authority", "www.example.com"),
                          Pair("custom-key", "custom-value")));
  EXPECT_EQ(hpack.table_size(), 164u);
}

TEST(HpackDecoderTest, ASmallerTableEvictsTheOldestEntry) {
  HpackDecoder hpack;
  Fields fields;
  // A size update to 60 octets (5-bit prefix: 31, then 29).
  ASSERT_TRUE(hpack.Decode(Bytes({0x3f, 0x1d}) + kC31, &fields));
  EXPECT_EQ(hpack.table_size(), 57u);
  ASSERT_TRUE(hpack.Decode(kC32, &fields));
  EXPECT_EQ(hpack.table_size(), 53u);  // :authority made room
  // C.3.3 names index 63, the evicted :authority.
  EXPECT_FALSE(hpack.Decode(kC33, &fields));
}

TEST(HpackDecoderTest, HuffmanCodedStringsAreLeftToGrpc) {
  // RFC 7541 C.4.1: C.3.1 with the authority Huffman-coded.
  HpackDecoder hpack;
  Fields fields;
  EXPECT_FALSE(
      hpack.Decode(Bytes({0x82, 0x86, 0x84, 0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5,
                          0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff}),
                   &fields));
}

TEST(HpackDecoderTest, TruncatedAndBadBlocksAreRefused) {
  for (const std::string& bad : {Bytes({0x40}), Bytes({0x40, 0x05}) + "ab",
                                 Bytes({0xff}), Bytes({0x80}), Bytes({0xc0})}) {
    HpackDecoder hpack;
    Fields fields;
    EXPECT_FALSE(hpack.Decode(bad, &fields)) << testing::PrintToString(bad);
  }
}

TEST(HpackDecoderTest, ReadsGrpcServersTrailersOnlyReply) {
  // What dlbatch-scheduler (gRPC 1.51) sent for a refused submit.
  const std::string block =
      Bytes({0x88, 0x40, 0x0c}) + "content-type" + Bytes({0x10}) +
      "application/grpc" + Bytes({0x40, 0x0b}) + "grpc-status" + Bytes({0x01}) +
      "3" + Bytes({0x00, 0x0c}) + "grpc-message" + Bytes({0x0a}) + "pool%201ok";
  HpackDecoder hpack;
  Fields fields;
  ASSERT_TRUE(hpack.Decode(block, &fields));
  EXPECT_THAT(fields, ElementsAre(Pair(":status", "200"),
                                  Pair("content-type", "application/grpc"),
                                  Pair("grpc-status", "3"),
                                  Pair("grpc-message", "pool%201ok")));
  // The second reply on a connection names them from the table.
  Fields again;
  ASSERT_TRUE(hpack.Decode(Bytes({0x88, 0xbf, 0xbe}), &again));
  EXPECT_THAT(again, ElementsAre(Pair(":status", "200"),
                                 Pair("content-type", "application/grpc"),
                                 Pair("grpc-status", "3")));
}

TEST(HpackDecoderTest, ReadsBackTheRequestHeadersThisClientWrites) {
  const std::string token(200, 't');  // a length past one octet's prefix
  HpackDecoder hpack;
  Fields fields;
  ASSERT_TRUE(hpack.Decode(
      EncodeRequestHeaders("/dlbatch.v1.Scheduler/SubmitJob", 60000, token),
      &fields));
  EXPECT_THAT(
      fields,
      ElementsAre(Pair(":method", "POST"), Pair(":scheme", "http"),
                  Pair(":path", "/dlbatch.v1.Scheduler/SubmitJob"),
                  Pair(":authority", "localhost"),
                  Pair("content-type", "application/grpc"),
                  Pair("te", "trailers"), Pair("grpc-timeout", "60000m"),
                  Pair("authorization", "Bearer " + token),
                  Pair("user-agent", "dlbatch-cli (direct)")));
  EXPECT_EQ(hpack.table_size(), 0u);  // nothing indexed
  Fields plain;
  ASSERT_TRUE(hpack.Decode(EncodeRequestHeaders("/x/Y", 0, ""), &plain));
  EXPECT_EQ(plain.size(), 7u);  // no timeout, no token
}

}  // namespace
}  // namespace dlbatch::client
