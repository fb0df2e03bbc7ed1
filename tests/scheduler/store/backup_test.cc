// The backup's staged copy and its tar archive, on a real store and blob
// store, read back by GNU tar.
#include "scheduler/store/backup.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/store/store.h"

namespace dlbatch::scheduler {
namespace {

using ::testing::HasSubstr;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class BackupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dlbatch-backup-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    state_ = root_ + "/state";
    ASSERT_TRUE(MakeDirs(state_, 0700).ok());
    auto store = Store::Open(state_ + "/dlbatch.db", false);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    auto blobs = BlobStore::Open(state_ + "/blobs", 0);
    ASSERT_TRUE(blobs.ok()) << blobs.status();
    blobs_ = std::move(*blobs);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  std::string PutBlob(const std::string& bytes) {
    auto w = blobs_->NewWriter("", static_cast<int64_t>(bytes.size()));
    EXPECT_TRUE(w.ok()) << w.status();
    EXPECT_TRUE((*w)->Append(bytes).ok());
    EXPECT_TRUE((*w)->Commit().ok());
    return (*w)->sha256();
  }

  // A job holding the blobs `shas` as outputs.
  void AddJob(const std::vector<std::string>& shas) {
    Transaction txn(store_->db());
    ASSERT_TRUE(txn.status().ok());
    JobRecord job;
    job.user = "alice";
    job.spec.set_name("j");
    job.spec.set_profile("local");
    auto id = store_->InsertJob(job);
    ASSERT_TRUE(id.ok()) << id.status();
    std::vector<v1::OutputFile> files;
    for (const std::string& sha : shas) {
      v1::OutputFile f;
      f.set_path("out-" + sha.substr(0, 8));
      f.set_sha256(sha);
      f.set_size(1);
      files.push_back(f);
    }
    ASSERT_TRUE(store_->PutOutputs(*id, files).ok());
    ASSERT_TRUE(txn.Commit().ok());
  }

  std::unique_ptr<StagedBackup> Stage(int64_t reserve = 0) {
    auto staged = StagedBackup::Stage(state_, state_ + "/dlbatch.db", *blobs_,
                                      blobs_->temp_dir() + "/b", reserve);
    EXPECT_TRUE(staged.ok()) << staged.status();
    return staged.ok() ? std::move(*staged) : nullptr;
  }

  // Sends `backup` into root_/backup.tar in pieces of `piece` bytes.
  std::string Archive(const StagedBackup& backup, size_t piece) {
    std::string archive;
    EXPECT_TRUE(backup
                    .Send(
                        [&](absl::string_view p) {
                          EXPECT_LE(p.size(), piece);
                          archive.append(p.data(), p.size());
                          return true;
                        },
                        piece)
                    .ok());
    EXPECT_EQ(static_cast<int64_t>(archive.size()), backup.archive_bytes());
    const std::string path = root_ + "/backup.tar";
    EXPECT_TRUE(WriteFileAtomic(path, archive, 0600).ok());
    return path;
  }

  std::string root_, state_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<BlobStore> blobs_;
};

TEST_F(BackupTest, TarRestoresTheStoreTheHeldFilesAndTheKeys) {
  const std::string a = PutBlob("first output\n");
  // Larger than one piece, and not a multiple of 512.
  std::string big(3 * 4096 + 77, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 31);
  const std::string b = PutBlob(big);
  const std::string orphan = PutBlob("held by no job");
  AddJob({a});
  AddJob({a, b});
  AddJob({});
  ASSERT_TRUE(WriteFileAtomic(state_ + "/token", "secret\n", 0600).ok());

  auto backup = Stage();
  ASSERT_NE(backup, nullptr);
  EXPECT_EQ(backup->jobs(), 3);
  EXPECT_EQ(backup->blobs(), 2);
  EXPECT_EQ(backup->missing_blobs(), 0);
  const std::string tar = Archive(*backup, 8192);
  backup.reset();
  EXPECT_FALSE(std::filesystem::exists(blobs_->temp_dir() + "/b"));

  const std::string out = root_ + "/restored";
  ASSERT_TRUE(MakeDirs(out, 0700).ok());
  const std::string cmd = "tar -xf " + tar + " -C " + out + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  EXPECT_EQ(Slurp(out + "/blobs/" + a.substr(0, 2) + "/" + a),
            "first output\n");
  EXPECT_EQ(Slurp(out + "/blobs/" + b.substr(0, 2) + "/" + b), big);
  EXPECT_FALSE(std::filesystem::exists(out + "/blobs/" + orphan.substr(0, 2) +
                                       "/" + orphan));
  EXPECT_EQ(Slurp(out + "/token"), "secret\n");
  struct stat st;
  ASSERT_EQ(stat((out + "/dlbatch.db").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(stat((out + "/blobs").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  auto restored = Store::Open(out + "/dlbatch.db", false);
  ASSERT_TRUE(restored.ok()) << restored.status();
  auto jobs = (*restored)->CountJobs();
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(*jobs, 3);
}

// The copy is the state at one commit: writes after it are not in it, and
// a blob deleted after staging is still in the archive (it was linked).
TEST_F(BackupTest, TheCopyIsOneMomentAndKeepsItsFilesThroughADelete) {
  const std::string a = PutBlob("kept through a purge\n");
  AddJob({a});
  auto backup = Stage();
  ASSERT_NE(backup, nullptr);
  AddJob({});
  ASSERT_TRUE(blobs_->Remove(a).ok());
  const std::string tar = Archive(*backup, 4 << 20);
  const std::string out = root_ + "/restored";
  ASSERT_TRUE(MakeDirs(out, 0700).ok());
  ASSERT_EQ(std::system(("tar -xf " + tar + " -C " + out).c_str()), 0);
  EXPECT_EQ(Slurp(out + "/blobs/" + a.substr(0, 2) + "/" + a),
            "kept through a purge\n");
  auto restored = Store::Open(out + "/dlbatch.db", false);
  ASSERT_TRUE(restored.ok());
  EXPECT_EQ(*(*restored)->CountJobs(), 1);
}

TEST_F(BackupTest, AHeldFileMissingFromTheStoreIsCountedAndLeftOut) {
  const std::string a = PutBlob("here\n");
  const std::string gone = PutBlob("gone\n");
  AddJob({a, gone});
  ASSERT_TRUE(blobs_->Remove(gone).ok());
  auto backup = Stage();
  ASSERT_NE(backup, nullptr);
  EXPECT_EQ(backup->blobs(), 1);
  EXPECT_EQ(backup->missing_blobs(), 1);
}

TEST_F(BackupTest, NoRoomForTheCopyIsRefusedNamingTheSizes) {
  AddJob({});
  auto staged =
      StagedBackup::Stage(state_, state_ + "/dlbatch.db", *blobs_,
                          blobs_->temp_dir() + "/b", int64_t{1} << 60);
  ASSERT_FALSE(staged.ok());
  EXPECT_EQ(staged.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(staged.status().message(),
              HasSubstr("no room for the backup's copy of the database"));
  EXPECT_FALSE(std::filesystem::exists(blobs_->temp_dir() + "/b"));
}

TEST(TarHeader, LongNamesAndHugeSizesFitTheirFields) {
  BackupEntry e;
  e.name = std::string(120, 'd') + "/" + std::string(90, 'f');
  e.size = int64_t{20} << 30;  // past ustar's 8 GiB octal field
  auto h = TarHeader(e, 0, 0, "root", "root");
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->size(), 512u);
  EXPECT_EQ(h->substr(0, 90), std::string(90, 'f'));
  EXPECT_EQ(h->substr(345, 120), std::string(120, 'd'));
  EXPECT_EQ(static_cast<unsigned char>((*h)[124]), 0x80);
  uint64_t size = 0;
  for (int i = 1; i < 12; ++i)
    size = size << 8 | static_cast<unsigned char>((*h)[124 + i]);
  EXPECT_EQ(size, uint64_t{20} << 30);
  // The checksum: the header's byte sum with its own field as spaces.
  std::string copy = *h;
  std::fill(copy.begin() + 148, copy.begin() + 156, ' ');
  unsigned sum = 0;
  for (unsigned char c : copy) sum += c;
  EXPECT_EQ(std::stoul(h->substr(148, 6), nullptr, 8), sum);

  e.name = std::string(300, 'x');
  EXPECT_FALSE(TarHeader(e, 0, 0, "root", "root").ok());
}

}  // namespace
}  // namespace dlbatch::scheduler
