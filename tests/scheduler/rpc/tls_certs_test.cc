// The scheduler's own CA and server certificate: the names asked for are in
// it, the CA signed it, keys are private, and a restart reuses them (the
// server certificate alone is made again when a name is added or it was not
// signed by the CA).
#include "scheduler/rpc/tls_certs.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "common/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dlbatch::scheduler {
namespace {

using ::testing::Contains;
using ::testing::IsSupersetOf;
using ::testing::Not;

class TlsCertsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tls-certs-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Read(const std::string& name) {
    return ReadFile(dir_ + "/" + name).value_or("");
  }
  mode_t Mode(const std::string& name) {
    struct stat st;
    EXPECT_EQ(::stat((dir_ + "/" + name).c_str(), &st), 0) << name;
    return st.st_mode & 0777;
  }
  std::string dir_;
};

TEST_F(TlsCertsTest, FirstStartMakesACaAndAServerCertificateNamingEveryName) {
  const std::vector<std::string> names = {"10.1.2.3", "sched.example.org",
                                          "localhost", "127.0.0.1", "::1"};
  auto files = LoadOrCreateTls(dir_, names);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_TRUE(files->made_ca);
  EXPECT_TRUE(files->made_server);
  EXPECT_EQ(files->ca_file, dir_ + "/ca.pem");
  EXPECT_EQ(files->cert_file, dir_ + "/server.pem");
  EXPECT_EQ(files->key_file, dir_ + "/server.key");
  auto have = CertNames(Read("server.pem"));
  ASSERT_TRUE(have.ok()) << have.status();
  EXPECT_THAT(*have, IsSupersetOf(names));
  EXPECT_TRUE(CheckSignedBy(Read("server.pem"), Read("ca.pem")).ok());
  EXPECT_FALSE(CheckSignedBy(Read("ca.pem"), Read("server.pem")).ok())
      << "the server's key signs nothing";
  EXPECT_EQ(Mode("ca.key"), 0600u);
  EXPECT_EQ(Mode("server.key"), 0600u);
  auto left = SecondsLeft(Read("server.pem"));
  ASSERT_TRUE(left.ok());
  EXPECT_GT(*left, 365 * 24 * 3600);
  // No temp files are left behind.
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    EXPECT_NE(e.path().extension(), ".tmp") << e.path();
  }
}

TEST_F(TlsCertsTest, ARestartReusesBothAndANewNameRemakesOnlyTheServerOne) {
  const std::vector<std::string> names = {"127.0.0.1", "localhost"};
  ASSERT_TRUE(LoadOrCreateTls(dir_, names).ok());
  const std::string ca = Read("ca.pem");
  const std::string ca_key = Read("ca.key");
  const std::string server = Read("server.pem");
  const std::string server_key = Read("server.key");

  auto again = LoadOrCreateTls(dir_, names);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->made_ca);
  EXPECT_FALSE(again->made_server);
  EXPECT_EQ(Read("ca.pem"), ca);
  EXPECT_EQ(Read("ca.key"), ca_key);
  EXPECT_EQ(Read("server.pem"), server);
  EXPECT_EQ(Read("server.key"), server_key);

  // A name added (--tls-name): the same CA signs a new server certificate.
  auto wider = LoadOrCreateTls(dir_, {"127.0.0.1", "localhost", "10.9.8.7"});
  ASSERT_TRUE(wider.ok()) << wider.status();
  EXPECT_FALSE(wider->made_ca);
  EXPECT_TRUE(wider->made_server);
  EXPECT_EQ(Read("ca.pem"), ca);
  EXPECT_NE(Read("server.pem"), server);
  EXPECT_THAT(CertNames(Read("server.pem")).value(), Contains("10.9.8.7"));
  EXPECT_TRUE(CheckSignedBy(Read("server.pem"), ca).ok());
  EXPECT_EQ(Mode("server.key"), 0600u);
}

TEST_F(TlsCertsTest, AServerCertificateOfAnotherCaIsMadeAgain) {
  ASSERT_TRUE(LoadOrCreateTls(dir_, {"localhost"}).ok());
  char other_tmpl[] = "/tmp/tls-other-XXXXXX";
  const std::string other = ::mkdtemp(other_tmpl);
  ASSERT_TRUE(LoadOrCreateTls(other, {"localhost"}).ok());
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/server.pem",
                              ReadFile(other + "/server.pem").value(), 0644)
                  .ok());
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/server.key",
                              ReadFile(other + "/server.key").value(), 0600)
                  .ok());
  std::filesystem::remove_all(other);
  ASSERT_FALSE(CheckSignedBy(Read("server.pem"), Read("ca.pem")).ok());
  auto files = LoadOrCreateTls(dir_, {"localhost"});
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_TRUE(files->made_server);
  EXPECT_TRUE(CheckSignedBy(Read("server.pem"), Read("ca.pem")).ok());
}

TEST_F(TlsCertsTest, ACaWithoutItsKeyIsRefusedNotReplaced) {
  ASSERT_TRUE(LoadOrCreateTls(dir_, {"localhost"}).ok());
  const std::string ca = Read("ca.pem");
  ASSERT_EQ(::unlink((dir_ + "/ca.key").c_str()), 0);
  auto files = LoadOrCreateTls(dir_, {"localhost"});
  ASSERT_FALSE(files.ok());
  EXPECT_THAT(std::string(files.status().message()),
              ::testing::HasSubstr("ca.key"));
  EXPECT_EQ(Read("ca.pem"), ca) << "clients' CA is kept";
}

TEST_F(TlsCertsTest, OperatorFilesMustBeAPair) {
  ASSERT_TRUE(LoadOrCreateTls(dir_, {"localhost"}).ok());
  auto ok = LoadOperatorTls(dir_ + "/server.pem", dir_ + "/server.key");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->ca_file.empty());
  auto mismatched = LoadOperatorTls(dir_ + "/server.pem", dir_ + "/ca.key");
  ASSERT_FALSE(mismatched.ok());
  EXPECT_THAT(std::string(mismatched.status().message()),
              ::testing::HasSubstr("is not the key of --tls-cert"));
  auto not_pem = LoadOperatorTls(dir_ + "/server.key", dir_ + "/server.key");
  EXPECT_FALSE(not_pem.ok());
}

TEST(TlsNamesTest, NamesCoverLoopbackTheHostAndTheListenAddress) {
  auto names = ServerNames("10.0.0.5", {"Sched.Example.org", "::FFFF:1.2.3.4"});
  EXPECT_THAT(names,
              IsSupersetOf({"10.0.0.5", "sched.example.org", "::ffff:1.2.3.4",
                            "localhost", "127.0.0.1", "::1"}));
  // A wildcard is no name: the machine's addresses stand for it.
  auto any = ServerNames("0.0.0.0", {});
  EXPECT_THAT(any, Not(Contains("0.0.0.0")));
  EXPECT_THAT(any, Contains("127.0.0.1"));
  EXPECT_THAT(ServerNames("::", {}), Not(Contains("::")));
  EXPECT_EQ(std::count(names.begin(), names.end(), "127.0.0.1"), 1);
}

TEST(TlsNamesTest, ATlsNameIsADnsNameOrAnAddress) {
  EXPECT_TRUE(CheckTlsName("gpu-01.cluster.example").ok());
  EXPECT_TRUE(CheckTlsName("192.168.1.10").ok());
  EXPECT_TRUE(CheckTlsName("fe80::1").ok());
  for (const char* bad : {"", "a,b", "two words", "-lead", "x/y"}) {
    auto s = CheckTlsName(bad);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("--tls-name"));
  }
}

}  // namespace
}  // namespace dlbatch::scheduler
