// Unit tests for common/: durations, endpoints and tokens, durable files and
// sha256, and the status helpers.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/background_sha256.h"
#include "common/duration.h"
#include "common/edit_distance.h"
#include "common/endpoint.h"
#include "common/files.h"
#include "common/hashing_file_writer.h"
#include "common/helper_thread.h"
#include "common/status.h"
#include "common/stop_signals.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dlbatch {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

// The permission bits of `path`, or -1 when it cannot be stat'ed.
int ModeOf(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int>(st.st_mode & 07777);
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

mode_t CurrentUmask() {
  mode_t mask = ::umask(0);
  ::umask(mask);
  return mask;
}

// A fresh folder per test, removed afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "common_test.XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
  }
  void TearDown() override { EXPECT_TRUE(RemoveTree(dir_).ok()); }

  std::string dir_;
};

// ---- duration.h ----

TEST(ParseDurationSecondsTest, AcceptsTheDocumentedForms) {
  EXPECT_EQ(ParseDurationSeconds("90").value(), 90);
  EXPECT_EQ(ParseDurationSeconds("90s").value(), 90);
  EXPECT_EQ(ParseDurationSeconds("30m").value(), 30 * 60);
  EXPECT_EQ(ParseDurationSeconds("1h30m").value(), 90 * 60);
  EXPECT_EQ(ParseDurationSeconds("2d").value(), 2 * 86400);
  EXPECT_EQ(ParseDurationSeconds("1.5h").value(), 90 * 60);
  EXPECT_EQ(ParseDurationSeconds("1d2h3m4s").value(),
            86400 + 2 * 3600 + 3 * 60 + 4);
}

TEST(ParseDurationSecondsTest, RejectsMalformedTextWithAHint) {
  for (const char* text : {"", "abc", "1h30", "-5m", "0s", "5x", "h", "1.2.3h",
                           " 5m", "99999999999999999999d"}) {
    absl::StatusOr<int64_t> got = ParseDurationSeconds(text);
    ASSERT_FALSE(got.ok()) << "'" << text << "' parsed as " << *got;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(got.status().message()),
                HasSubstr("write e.g. 90s, 30m, 1h30m or 2d"))
        << text;
    EXPECT_THAT(std::string(got.status().message()),
                HasSubstr(absl::StrCat("'", text, "'")));
  }
}

TEST(FormatDurationMsTest, PicksTheTwoLargestUnits) {
  EXPECT_EQ(FormatDurationMs(0), "0ms");
  EXPECT_EQ(FormatDurationMs(850), "850ms");
  EXPECT_EQ(FormatDurationMs(42'000), "42s");
  EXPECT_EQ(FormatDurationMs(42'999), "42s");
  EXPECT_EQ(FormatDurationMs(185'000), "3m05s");
  EXPECT_EQ(FormatDurationMs(3'720'000), "1h02m");
  EXPECT_EQ(FormatDurationMs((2 * 86400 + 3 * 3600) * 1000LL), "2d03h");
  EXPECT_EQ(FormatDurationMs(-5), "0ms");
}

// ---- endpoint.h ----

TEST(ParseEndpointTest, UnixSockets) {
  absl::StatusOr<Endpoint> abs = ParseEndpoint("unix:/a/b");
  ASSERT_TRUE(abs.ok()) << abs.status();
  EXPECT_TRUE(abs->is_unix);
  EXPECT_EQ(abs->path, "/a/b");
  EXPECT_EQ(abs->original, "unix:/a/b");
  EXPECT_EQ(abs->GrpcTarget(), "unix:///a/b");
  EXPECT_TRUE(abs->IsLoopback());

  absl::StatusOr<Endpoint> rel = ParseEndpoint("unix:rel/sock");
  ASSERT_TRUE(rel.ok()) << rel.status();
  EXPECT_EQ(rel->path, "rel/sock");
  EXPECT_EQ(rel->GrpcTarget(), "unix:rel/sock");

  absl::StatusOr<Endpoint> uri = ParseEndpoint("unix:///abs/sock");
  ASSERT_TRUE(uri.ok()) << uri.status();
  EXPECT_EQ(uri->path, "/abs/sock");
  EXPECT_EQ(uri->GrpcTarget(), "unix:///abs/sock");

  absl::StatusOr<Endpoint> none = ParseEndpoint("unix:");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(none.status().message()),
              HasSubstr("unix:/path/to/socket"));
}

TEST(ParseEndpointTest, TcpAddresses) {
  absl::StatusOr<Endpoint> ep = ParseEndpoint("node7:5000");
  ASSERT_TRUE(ep.ok()) << ep.status();
  EXPECT_FALSE(ep->is_unix);
  EXPECT_EQ(ep->host, "node7");
  EXPECT_EQ(ep->port, 5000);
  EXPECT_EQ(ep->GrpcTarget(), "node7:5000");
  EXPECT_FALSE(ep->IsLoopback());

  absl::StatusOr<Endpoint> v6 = ParseEndpoint("[::1]:80");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 80);
  EXPECT_EQ(v6->GrpcTarget(), "[::1]:80");
  EXPECT_TRUE(v6->IsLoopback());

  absl::StatusOr<Endpoint> bare = ParseEndpoint(":7070");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(bare->host, "127.0.0.1");
  EXPECT_EQ(bare->port, 7070);
  EXPECT_EQ(bare->GrpcTarget(), "127.0.0.1:7070");
  EXPECT_TRUE(bare->IsLoopback());
}

TEST(ParseEndpointTest, BadPortsSayWhatAPortIs) {
  for (const char* address :
       {"host:", "host:abc", "host:70000", "host:-1", "[::1]", "host:80x"}) {
    absl::StatusOr<Endpoint> ep = ParseEndpoint(address);
    ASSERT_FALSE(ep.ok()) << address;
    EXPECT_EQ(ep.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(ep.status().message()),
                HasSubstr("no valid port (0-65535)"))
        << address;
    EXPECT_THAT(std::string(ep.status().message()), HasSubstr(address));
  }
}

TEST(ParseEndpointTest, MissingColonNamesBothForms) {
  absl::StatusOr<Endpoint> ep = ParseEndpoint("localhost");
  ASSERT_FALSE(ep.ok());
  EXPECT_EQ(ep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ep.status().message()),
              HasSubstr("neither unix:PATH nor HOST:PORT"));
}

TEST(EndpointTest, IsLoopback) {
  auto loopback = [](const char* address) {
    absl::StatusOr<Endpoint> ep = ParseEndpoint(address);
    EXPECT_TRUE(ep.ok()) << address << ": " << ep.status();
    return ep.ok() && ep->IsLoopback();
  };
  EXPECT_TRUE(loopback("127.0.0.1:1"));
  EXPECT_TRUE(loopback("127.1.2.3:1"));
  EXPECT_TRUE(loopback("localhost:1"));
  EXPECT_TRUE(loopback("[::1]:1"));
  EXPECT_FALSE(loopback("0.0.0.0:1"));
  EXPECT_FALSE(loopback("10.0.0.1:1"));
  EXPECT_FALSE(loopback("[::]:1"));
  // A DNS name that merely starts like a loopback address can resolve to
  // any machine.
  EXPECT_FALSE(loopback("127.example.com:1"));
}

TEST(TokenTest, GenerateTokenIs64HexCharsAndFresh) {
  std::set<std::string> seen;
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<std::string> token = GenerateToken();
    ASSERT_TRUE(token.ok()) << token.status();
    EXPECT_THAT(*token, MatchesRegex("[0-9a-f]{64}"));
    seen.insert(*token);
  }
  EXPECT_EQ(seen.size(), 4u);
}

class TokenFileTest : public TempDirTest {};

TEST_F(TokenFileTest, LoadOrCreateTokenCreatesAPrivateFileOnce) {
  absl::StatusOr<std::string> first = LoadOrCreateToken(dir_);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_THAT(*first, MatchesRegex("[0-9a-f]{64}"));
  EXPECT_EQ(ModeOf(dir_ + "/token"), 0600);
  EXPECT_FALSE(Exists(dir_ + "/token.tmp"));

  absl::StatusOr<std::string> second = LoadOrCreateToken(dir_);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, *first);
  EXPECT_EQ(ReadTokenFile(dir_ + "/token").value(), *first);
}

TEST_F(TokenFileTest, LoadOrCreateTokenFailsInAMissingFolder) {
  EXPECT_FALSE(LoadOrCreateToken(dir_ + "/missing").ok());
}

TEST_F(TokenFileTest, ReadTokenFileTrimsWhitespace) {
  std::string path = dir_ + "/t";
  ASSERT_TRUE(WriteFileAtomic(path, "  \tsecret-token \n\n").ok());
  absl::StatusOr<std::string> token = ReadTokenFile(path);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "secret-token");
}

TEST_F(TokenFileTest, ReadTokenFileRejectsAnEmptyFile) {
  std::string path = dir_ + "/t";
  for (const char* contents : {"", " \n\t\n"}) {
    ASSERT_TRUE(WriteFileAtomic(path, contents).ok());
    absl::StatusOr<std::string> token = ReadTokenFile(path);
    ASSERT_FALSE(token.ok()) << "read '" << *token << "'";
    EXPECT_EQ(token.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(token.status().message()), HasSubstr("is empty"));
    EXPECT_THAT(std::string(token.status().message()), HasSubstr(path));
  }
}

TEST_F(TokenFileTest, ReadTokenFileOfAMissingFileIsNotFound) {
  absl::StatusOr<std::string> token = ReadTokenFile(dir_ + "/none");
  ASSERT_FALSE(token.ok());
  EXPECT_EQ(token.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(token.status().message()),
              HasSubstr("reading the token file"));
}

// ---- files.h ----

class FilesTest : public TempDirTest {};

TEST_F(FilesTest, WriteFileAtomicReplacesContentAndLeavesNoTemp) {
  std::string path = dir_ + "/f";
  ASSERT_TRUE(WriteFileAtomic(path, "first version, longer").ok());
  EXPECT_EQ(ReadFile(path).value(), "first version, longer");
  ASSERT_TRUE(WriteFileAtomic(path, "second").ok());
  EXPECT_EQ(ReadFile(path).value(), "second");
  EXPECT_FALSE(Exists(path + ".tmp"));

  std::string binary("a\0b\xff", 4);
  ASSERT_TRUE(WriteFileAtomic(path, binary).ok());
  EXPECT_EQ(ReadFile(path).value(), binary);
}

TEST_F(FilesTest, WriteFileAtomicHonoursMode) {
  mode_t mask = CurrentUmask();
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/private", "x", 0600).ok());
  EXPECT_EQ(ModeOf(dir_ + "/private"), static_cast<int>(0600 & ~mask));
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/group", "x", 0640).ok());
  EXPECT_EQ(ModeOf(dir_ + "/group"), static_cast<int>(0640 & ~mask));
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/default", "x").ok());
  EXPECT_EQ(ModeOf(dir_ + "/default"), static_cast<int>(0644 & ~mask));
}

TEST_F(FilesTest, WriteFileAtomicIgnoresAStaleTempFile) {
  // A crash can leave PATH.tmp behind with looser permissions; a secret
  // written later must still get the mode asked for.
  std::string path = dir_ + "/secret";
  ASSERT_TRUE(WriteFileAtomic(path + ".tmp", "stale", 0644).ok());
  ASSERT_TRUE(WriteFileAtomic(path, "s3cret", 0600).ok());
  EXPECT_EQ(ModeOf(path), 0600);
  EXPECT_EQ(ReadFile(path).value(), "s3cret");
  EXPECT_FALSE(Exists(path + ".tmp"));
}

TEST_F(FilesTest, WriteFileAtomicDoesNotWriteThroughATempSymlink) {
  std::string victim = dir_ + "/victim";
  ASSERT_TRUE(WriteFileAtomic(victim, "keep me").ok());
  std::string path = dir_ + "/f";
  ASSERT_EQ(::symlink(victim.c_str(), (path + ".tmp").c_str()), 0);
  ASSERT_TRUE(WriteFileAtomic(path, "new").ok());
  EXPECT_EQ(ReadFile(victim).value(), "keep me");
  EXPECT_EQ(ReadFile(path).value(), "new");
}

TEST_F(FilesTest, WriteFileAtomicInAMissingFolderFails) {
  absl::Status s = WriteFileAtomic(dir_ + "/no/such/f", "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
}

TEST_F(FilesTest, ReadFileOfAMissingFileIsNotFoundNamingThePath) {
  std::string path = dir_ + "/missing.txt";
  absl::StatusOr<std::string> got = ReadFile(path);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(got.status().message()), HasSubstr(path));
}

TEST_F(FilesTest, ReadFileReadsMoreThanOneBuffer) {
  std::string big(300'000, 'z');
  big[123'456] = 'a';
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/big", big).ok());
  EXPECT_EQ(ReadFile(dir_ + "/big").value(), big);
}

TEST_F(FilesTest, MakeDirsCreatesNestedFolders) {
  std::string deep = dir_ + "/a/b/c";
  ASSERT_TRUE(MakeDirs(deep, 0700).ok());
  struct stat st;
  ASSERT_EQ(::stat(deep.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(ModeOf(dir_ + "/a"), 0700);
  EXPECT_EQ(ModeOf(deep), 0700);
  // Existing folders are fine.
  EXPECT_TRUE(MakeDirs(deep).ok());
  EXPECT_TRUE(MakeDirs(dir_ + "/a/b/c/").ok());
}

TEST_F(FilesTest, MakeDirsRelativePath) {
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof cwd), nullptr);
  ASSERT_EQ(::chdir(dir_.c_str()), 0);
  absl::Status s = MakeDirs("x/y");
  bool made = Exists(dir_ + "/x/y");
  ASSERT_EQ(::chdir(cwd), 0);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(made);
}

TEST_F(FilesTest, MakeDirsFailsWhenAFileIsInTheWay) {
  std::string file = dir_ + "/file";
  ASSERT_TRUE(WriteFileAtomic(file, "x").ok());
  absl::Status same = MakeDirs(file);
  EXPECT_EQ(same.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(same.message()), HasSubstr("is not a folder"));
  EXPECT_THAT(std::string(same.message()), HasSubstr(file));

  absl::Status below = MakeDirs(file + "/sub");
  EXPECT_FALSE(below.ok());
  EXPECT_THAT(std::string(below.message()), HasSubstr(file + "/sub"));
}

TEST_F(FilesTest, RemoveTree) {
  EXPECT_TRUE(RemoveTree(dir_ + "/never-existed").ok());
  ASSERT_TRUE(MakeDirs(dir_ + "/t/u").ok());
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/t/u/f", "x").ok());
  ASSERT_TRUE(RemoveTree(dir_ + "/t").ok());
  EXPECT_FALSE(Exists(dir_ + "/t"));
}

TEST(Sha256Test, KnownDigests) {
  EXPECT_EQ(Sha256Hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Sha256Test, IncrementalEqualsOneShot) {
  Sha256 h;
  h.Update("a");
  h.Update("");
  h.Update("bc");
  EXPECT_EQ(h.HexDigest(), Sha256Hex("abc"));
}

// ---- hashing_file_writer.h ----

class HashingFileWriterTest : public TempDirTest {};

// A writer that goes on from a file's first `start` bytes (an interrupted
// download's part) writes after them and hashes the whole file, through
// the page cache and past it, from a block boundary and from any byte.
TEST_F(HashingFileWriterTest, GoesOnFromTheBytesAFileHoldsAlready) {
  std::string whole(20 << 20, '\0');
  for (size_t i = 0; i < whole.size(); ++i) {
    whole[i] = static_cast<char>((i * 2654435761u) >> 13);
  }
  for (int64_t start : {int64_t{0}, int64_t{1} << 20, int64_t{3} << 20 | 7,
                        static_cast<int64_t>(whole.size())}) {
    for (int64_t size :
         {int64_t{5} << 20, static_cast<int64_t>(whole.size())}) {
      if (start > size) continue;
      const std::string name = absl::StrCat("f", start, "-", size);
      const std::string path = dir_ + "/" + name;
      ASSERT_TRUE(WriteFileAtomic(path, whole.substr(0, start)).ok());
      int fd = OpenForSequentialWrite(AT_FDCWD, path, O_WRONLY | O_CLOEXEC,
                                      0600, size);
      ASSERT_GE(fd, 0) << path;
      {
        HashingFileWriter writer(
            fd, [](int err) { return absl::InternalError(strerror(err)); },
            start);
        // The kept bytes in two pieces, the new ones in uneven chunks.
        const int64_t half = start / 2;
        writer.HashKept(absl::string_view(whole).substr(0, half));
        writer.HashKept(absl::string_view(whole).substr(half, start - half));
        for (int64_t at = start; at < size;) {
          const int64_t n = std::min<int64_t>(size - at, 3 << 20 | 123);
          ASSERT_TRUE(
              writer.Append(absl::string_view(whole).substr(at, n)).ok());
          at += n;
        }
        ASSERT_TRUE(writer.Finish().ok());
        EXPECT_EQ(writer.appended(), size - start);
        EXPECT_EQ(writer.HexDigest(),
                  Sha256Hex(absl::string_view(whole).substr(0, size)))
            << name;
      }
      ::close(fd);
      EXPECT_TRUE(ReadFile(path).value() == whole.substr(0, size)) << name;
    }
  }
}

TEST(HelperThreadTest, RunsTasksOneAfterAnotherInOrderOffTheCallersThread) {
  HelperThread helper;
  std::vector<int> order;  // written by the helper only, one task at a time
  std::vector<bool> off_caller;
  const std::thread::id caller = std::this_thread::get_id();
  for (int i = 0; i < 100; ++i) {
    helper.Run([&, i] {
      order.push_back(i);
      off_caller.push_back(std::this_thread::get_id() != caller);
    });
  }
  helper.Wait();
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
  EXPECT_THAT(off_caller, ::testing::Each(true));
}

TEST(HelperThreadTest, WaitWithoutATaskAndTheDestructorFinishTheLastTask) {
  bool ran = false;
  {
    HelperThread helper;
    helper.Wait();  // nothing was run: returns at once
    helper.Run([&ran] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ran = true;
    });
  }
  EXPECT_TRUE(ran);
}

TEST(BackgroundSha256Test, ChunksHashedBehindTheCallerEqualOneShot) {
  std::string data(3 * 1000 * 1000 + 17, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31);
  BackgroundSha256 hash;
  absl::string_view rest(data);
  while (!rest.empty()) {
    const size_t n = std::min<size_t>(rest.size(), 1 << 20);
    hash.Update(rest.substr(0, n));
    rest.remove_prefix(n);
  }
  EXPECT_EQ(hash.HexDigest(), Sha256Hex(data));
}

TEST_F(FilesTest, Sha256FileMatchesAndReportsSize) {
  std::string data(200'001, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31);
  std::string path = dir_ + "/blob";
  ASSERT_TRUE(WriteFileAtomic(path, data).ok());
  int64_t size = -1;
  absl::StatusOr<std::string> digest = Sha256File(path, &size);
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(*digest, Sha256Hex(data));
  EXPECT_EQ(size, 200'001);
  EXPECT_EQ(Sha256File(path).value(), *digest);  // size is optional

  absl::StatusOr<std::string> missing = Sha256File(dir_ + "/none");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

TEST(HumanBytesTest, UsesDecimalUnits) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(512), "512 B");
  EXPECT_EQ(HumanBytes(999), "999 B");
  EXPECT_EQ(HumanBytes(1000), "1.0 KB");
  EXPECT_EQ(HumanBytes(1500), "1.5 KB");
  EXPECT_EQ(HumanBytes(12'345'678), "12.3 MB");
  EXPECT_EQ(HumanBytes(5'000'000'000'000), "5.0 TB");
  EXPECT_EQ(HumanBytes(5'000'000'000'000'000), "5000.0 TB");
  // Rounding up to the next unit shows that unit, not "1000.0 KB".
  EXPECT_EQ(HumanBytes(999'999), "1.0 MB");
  EXPECT_EQ(HumanBytes(999'940), "999.9 KB");
}

TEST(ErrnoStatusTest, MapsCommonErrors) {
  EXPECT_EQ(ErrnoStatus(ENOENT, "open", "/p").code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrnoStatus(EACCES, "open", "/p").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoStatus(ENOSPC, "write", "/p").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoStatus(EDQUOT, "write", "/p").code(),
            absl::StatusCode::kResourceExhausted);
  absl::Status s = ErrnoStatus(EIO, "read", "/some/file");
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(s.message()), HasSubstr("read /some/file: "));
  EXPECT_THAT(std::string(s.message()), HasSubstr(std::strerror(EIO)));
}

// ---- status.h ----

TEST(StatusTest, GrpcConversionKeepsCodeAndMessage) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());

  grpc::Status g = ToGrpcStatus(absl::ResourceExhaustedError("disk is full"));
  EXPECT_EQ(g.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(g.error_message(), "disk is full");

  absl::Status a =
      FromGrpcStatus(grpc::Status(grpc::StatusCode::NOT_FOUND, "no job 7"));
  EXPECT_EQ(a.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(a.message(), "no job 7");

  for (int code = 1; code <= 16; ++code) {
    absl::Status in(static_cast<absl::StatusCode>(code), "m");
    absl::Status out = FromGrpcStatus(ToGrpcStatus(in));
    EXPECT_EQ(out, in) << "code " << code;
  }
}

TEST(StatusTest, AnnotatePrefixesAndKeepsTheCode) {
  absl::Status s = Annotate(absl::UnavailableError("connection refused"),
                            "uploading outputs");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "uploading outputs: connection refused");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "anything").ok());
}

absl::StatusOr<int> Half(int n) {
  if (n % 2 != 0) return absl::InvalidArgumentError(absl::StrCat(n, " is odd"));
  return n / 2;
}

absl::Status CheckPositive(int n) {
  if (n <= 0) return absl::OutOfRangeError("not positive");
  return absl::OkStatus();
}

// Halves twice and counts how far it got.
absl::StatusOr<int> Quarter(int n, int* steps) {
  RETURN_IF_ERROR(CheckPositive(n));
  ++*steps;
  ASSIGN_OR_RETURN(int half, Half(n));
  ++*steps;
  ASSIGN_OR_RETURN(int quarter, Half(half));
  ++*steps;
  return quarter;
}

TEST(StatusTest, MacrosPropagateTheFirstError) {
  int steps = 0;
  EXPECT_EQ(Quarter(12, &steps).value(), 3);
  EXPECT_EQ(steps, 3);

  steps = 0;
  absl::StatusOr<int> r = Quarter(-4, &steps);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(steps, 0);

  steps = 0;
  r = Quarter(7, &steps);
  EXPECT_EQ(r.status(), absl::InvalidArgumentError("7 is odd"));
  EXPECT_EQ(steps, 1);

  steps = 0;
  r = Quarter(6, &steps);
  EXPECT_EQ(r.status(), absl::InvalidArgumentError("3 is odd"));
  EXPECT_EQ(steps, 2);
}

// The hint every "unknown ..." message of a file or command line ends with.
TEST(DidYouMean, NamesTheClosestWordWithinTwoEdits) {
  EXPECT_EQ(DidYouMean("priorty", {"off", "priority", "fair_share"}),
            " (did you mean 'priority'?)");
  EXPECT_EQ(DidYouMean("slrum", {"slurm", "workers"}),
            " (did you mean 'slurm'?)");
  EXPECT_EQ(DidYouMean("fair", {"off", "priority", "fair_share"}), "");
  EXPECT_EQ(DidYouMean("x", {}), "");
  // The fewest edits win, not the first listed.
  EXPECT_EQ(DidYouMean("grade", {"grades_x", "grace"}),
            " (did you mean 'grace'?)");
}

TEST(StopSignals, NamesReadWithOrWithoutSigInAnyCase) {
  EXPECT_EQ(StopSignalNumber("TERM"), SIGTERM);
  EXPECT_EQ(StopSignalNumber("sigusr1"), SIGUSR1);
  EXPECT_EQ(StopSignalNumber("Int"), SIGINT);
  EXPECT_EQ(StopSignalNumber("KILL"), std::nullopt);  // cannot be caught
  EXPECT_EQ(StopSignalNumber("STOP"), std::nullopt);
  EXPECT_EQ(StopSignalNumber(""), std::nullopt);
  EXPECT_EQ(StopSignalNumber("SIG"), std::nullopt);
  EXPECT_EQ(StopSignalName(SIGUSR2), "USR2");
  EXPECT_EQ(StopSignalName(SIGKILL), absl::StrCat("signal ", SIGKILL));
  EXPECT_EQ(StopSignalNames().substr(0, 9), "TERM, INT");
}

}  // namespace
}  // namespace dlbatch
