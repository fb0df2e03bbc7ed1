// Whole runs of the real dlbatch-train on folders of images (format:
// folders): Fashion-MNIST written out as 70,000 PNG files in class folders
// trains exactly as its IDX files do (the same batches, losses and
// weights), and says so from the decoded cache on a second run; a few
// thousand as JPEG train with a validation split; a truncated JPEG is
// refused with its name, or skipped and counted.
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/statfs.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/files.h"
#include "tests/common/image_files.h"
#include "tests/integration/harness.h"
#include "tests/trainer/train_run_fixture.h"
#include "trainer/data/data.h"
#include "trainer/output/checkpoint.h"
#include "trainer/output/history.h"
#include "trainer/output/onnx_subset.pb.h"

namespace dlbatch::trainer {
namespace {

using dlbatch::testing::FashionMnistDir;
using dlbatch::testing::ReadAll;
using dlbatch::testing::Result;
using dlbatch::testing::WriteAll;

// Fashion-MNIST's classes, numbered so that their sorted names keep the
// IDX files' labels.
const std::vector<std::string> kClasses = {
    "0-tshirt-top", "1-trouser", "2-pullover", "3-dress", "4-coat",
    "5-sandal",     "6-shirt",   "7-sneaker",  "8-bag",   "9-ankle-boot"};

const char kNetwork[] = R"(
  network:
    input: [28, 28, 1]
    layers:
      - {type: conv, filters: 8, size: 5, stride: 2}
      - {type: batchnorm}
      - {type: relu}
      - {type: maxpool, size: 2}
      - {type: fc, units: 10}
      - {type: softmax}
)";

const char kOptions[] = R"(
  options:
    solver: sgdm
    initial_learn_rate: 0.05
    momentum: 0.9
    mini_batch_size: 64
    shuffle: every-epoch
    validation_frequency: 40
    verbose_frequency: 40
    checkpoint_frequency: 0
    execution_environment: cpu
    seed: 7
)";

Dataset LoadIdx(const std::string& set) {
  v1::DataSource s;
  s.set_format("idx");
  s.set_images(
      absl::StrCat(FashionMnistDir(), "/", set, "-images-idx3-ubyte.gz"));
  s.set_labels(
      absl::StrCat(FashionMnistDir(), "/", set, "-labels-idx1-ubyte.gz"));
  absl::StatusOr<Dataset> d = LoadDataset(s, ".");
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *std::move(d) : Dataset{};
}

// Writes the first `n` images of `data` as <root>/<class>/<index>.<ext>
// (PNG, or JPEG of quality 90), on two threads.
void WriteFolder(const Dataset& data, int64_t n, const std::string& root,
                 bool jpeg) {
  for (const std::string& c : kClasses) {
    std::filesystem::create_directories(root + "/" + c);
  }
  auto write = [&](int part) {
    for (int64_t i = part; i < n; i += 2) {
      const uint8_t* px = &data.pixels[i * 784];
      const std::string path =
          absl::StrFormat("%s/%s/%05d.%s", root, kClasses[data.labels[i]], i,
                          jpeg ? "jpg" : "png");
      if (jpeg) {
        WriteAll(path, dlbatch::testing::EncodeJpeg(28, 28, 1, px, 90));
      } else {
        ASSERT_TRUE(dlbatch::testing::WritePng(path, 28, 28, 1, px)) << path;
      }
    }
  };
  std::thread other(write, 1);
  write(0);
  other.join();
}

class FoldersTrainRun : public testing::TrainRunFixture {
 protected:
  std::string Job(const std::string& name, const std::string& data) {
    return WriteJob(name, absl::StrCat("name: ", name, "\ntrain:", kNetwork,
                                       "  data:\n", data, kOptions));
  }

  Result Train(const std::string& job, const std::string& out,
               std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(), {"--threads", "2"});
    return RunTrain(job, out, extra);
  }
};

// Where the 70,000 PNG files of PngFolderTrainsExactlyAsTheIdxFiles go: a
// fresh folder in /dev/shm where that is a tmpfs with room (writing and
// removing that many small files on a disk that discards each removed
// file's blocks takes minutes on a shared 2-core machine), else in `dir`.
// Such folders over a day old, left by a test that was killed, are
// removed first: a tmpfs holds them in memory.
std::string PngRoot(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    std::error_code age_ec;
    const auto changed = e.last_write_time(age_ec);
    if (!age_ec &&
        e.path().filename().string().rfind("dlbatch-png-folders-", 0) == 0 &&
        std::filesystem::file_time_type::clock::now() - changed >
            std::chrono::hours(24)) {
      RemoveTree(e.path().string()).IgnoreError();
    }
  }
  struct statfs fs;
  if (statfs("/dev/shm", &fs) == 0 && fs.f_type == TMPFS_MAGIC &&
      static_cast<uint64_t>(fs.f_bavail) * fs.f_bsize > (1ull << 30)) {
    std::string tmpl = "/dev/shm/dlbatch-png-folders-XXXXXX";
    if (mkdtemp(tmpl.data()) != nullptr) return tmpl;
  }
  return dir + "/png";
}

class PngFolder : public FoldersTrainRun {
 protected:
  void TearDown() override {
    if (!root_.empty() && root_.rfind("/dev/shm/", 0) == 0 &&
        std::getenv("DLBATCH_KEEP_TEST_DIRS") == nullptr) {
      RemoveTree(root_).IgnoreError();
    }
    FoldersTrainRun::TearDown();
  }
  std::string root_;
};

// All of Fashion-MNIST, 60,000 training and 10,000 test images, written as
// PNG files in class folders (as MATLAB's multi-GPU example writes out
// CIFAR-10), trains exactly as its IDX files do.
TEST_F(PngFolder, PngFolderTrainsExactlyAsTheIdxFiles) {
  constexpr int64_t kTrainImages = 60000, kTestImages = 10000;
  const Dataset train = LoadIdx("train");
  const Dataset test = LoadIdx("t10k");
  ASSERT_EQ(train.labels.size(), size_t{kTrainImages});
  ASSERT_EQ(test.labels.size(), size_t{kTestImages});
  root_ = PngRoot(dir_);
  WriteFolder(train, kTrainImages, root_ + "/train", false);
  WriteFolder(test, kTestImages, root_ + "/test", false);
  ASSERT_FALSE(HasFatalFailure());
  const std::string common = "    normalize: true\n";
  const std::string data_dir = dlbatch::testing::FashionMnistDir();
  const std::string idx_job = Job(
      "idx", absl::StrCat("    train: ", testing::IdxSource(data_dir, "train"),
                          "\n    validation: ",
                          testing::IdxSource(data_dir, "t10k"), "\n", common));
  const std::string folder_job = Job(
      "folders",
      absl::StrCat("    train: {format: folders, path: ", root_, "/train}\n",
                   "    validation: {format: folders, path: ", root_,
                   "/test}\n", common));
  const std::vector<std::string> args = {"--max-iterations", "120"};
  Result idx = Train(idx_job, dir_ + "/idx", args);
  ASSERT_EQ(idx.code, 0) << idx.err;
  Result first = Train(folder_job, dir_ + "/first", args);
  ASSERT_EQ(first.code, 0) << first.err;
  EXPECT_NE(first.out.find("Decoding 60000 images of " + root_ + "/train"),
            std::string::npos)
      << first.out;
  EXPECT_NE(first.out.find("Decoding 10000 images of " + root_ + "/test"),
            std::string::npos);

  // The same batches: every iteration's loss and accuracy, and each
  // validation's, bit for bit; and the same weights.
  const TrainingHistory want = History(dir_ + "/idx");
  const TrainingHistory got = History(dir_ + "/first");
  ASSERT_EQ(want.iterations.size(), 120u);
  ASSERT_EQ(got.iterations.size(), want.iterations.size());
  for (size_t i = 0; i < want.iterations.size(); ++i) {
    EXPECT_EQ(got.iterations[i].loss, want.iterations[i].loss) << i;
    EXPECT_EQ(got.iterations[i].accuracy, want.iterations[i].accuracy) << i;
  }
  ASSERT_EQ(got.validations.size(), want.validations.size());
  ASSERT_GE(want.validations.size(), 3u);
  for (size_t i = 0; i < want.validations.size(); ++i) {
    EXPECT_EQ(got.validations[i].loss, want.validations[i].loss) << i;
  }
  const std::vector<float> weights = FinalParams(dir_ + "/idx");
  ASSERT_FALSE(weights.empty());
  EXPECT_EQ(FinalParams(dir_ + "/first"), weights);
  EXPECT_EQ(Metrics(dir_ + "/first")["validation_accuracy"],
            Metrics(dir_ + "/idx")["validation_accuracy"]);

  // The class names: in metrics.json and the ONNX model's metadata.
  EXPECT_EQ(Metrics(dir_ + "/first")["class_names"], nlohmann::json(kClasses));
  EXPECT_FALSE(Metrics(dir_ + "/idx").contains("class_names"));
  onnx::ModelProto model;
  ASSERT_TRUE(model.ParseFromString(ReadAll(dir_ + "/first/model.onnx")));
  ASSERT_EQ(model.metadata_props_size(), 1);
  EXPECT_EQ(model.metadata_props(0).key(), "class_names");
  EXPECT_EQ(nlohmann::json::parse(model.metadata_props(0).value()),
            nlohmann::json(kClasses));

  // A second run reads the decoded cache, and trains alike again.
  Result second = Train(folder_job, dir_ + "/second", args);
  ASSERT_EQ(second.code, 0) << second.err;
  EXPECT_NE(second.out.find("Read 60000 images of " + root_ +
                            "/train from the decoded cache " + dir_ +
                            "/cache/dlbatch/images-"),
            std::string::npos)
      << second.out;
  EXPECT_EQ(second.out.find("Decoding"), std::string::npos) << second.out;
  EXPECT_EQ(FinalParams(dir_ + "/second"), weights);
}

class JpegFolder : public FoldersTrainRun {
 protected:
  void SetUp() override {
    FoldersTrainRun::SetUp();
    if (IsSkipped()) return;
    WriteFolder(LoadIdx("train"), 3000, dir_ + "/jpeg", true);
  }
  std::string Data(const std::string& source_extra) {
    return absl::StrCat("    train: {format: folders, path: jpeg", source_extra,
                        "}\n    validation_split: 0.1\n");
  }
};

TEST_F(JpegFolder, TrainsWithAValidationSplit) {
  const std::string job = Job("jpeg", Data(""));
  Result r = Train(job, dir_ + "/out", {"--max-epochs", "3"});
  ASSERT_EQ(r.code, 0) << r.err;
  // A tenth of each class validates (rounded per class).
  const Dataset idx = LoadIdx("train");
  std::vector<int64_t> per_class(10, 0);
  for (int i = 0; i < 3000; ++i) ++per_class[idx.labels[i]];
  int64_t held_out = 0;
  for (int64_t n : per_class) held_out += std::llround(0.1 * n);
  EXPECT_NE(r.out.find(absl::StrCat("Validating on ", held_out,
                                    " of the 3000 training images")),
            std::string::npos)
      << r.out;
  // Epochs of the remaining images' whole batches.
  const nlohmann::json m = Metrics(dir_ + "/out");
  EXPECT_EQ(m["iterations"], 3 * ((3000 - held_out) / 64));
  EXPECT_GT(m["validation_accuracy"].get<double>(), 60.0) << m.dump(2);
  EXPECT_EQ(m["class_names"], nlohmann::json(kClasses));
}

TEST_F(JpegFolder, ATruncatedJpegIsRefusedWithItsNameOrSkipped) {
  const std::string broken = dir_ + "/jpeg/3-dress/zz-broken.jpg";
  const std::string whole = ReadAll(dir_ + "/jpeg/3-dress/00003.jpg");
  WriteAll(broken, whole.substr(0, whole.size() * 2 / 3));
  Result refused = Train(Job("jpeg", Data("")), dir_ + "/refused");
  EXPECT_EQ(refused.code, 1);
  EXPECT_NE(refused.err.find("image '" + broken +
                             "': not a readable JPEG (Premature end of JPEG "
                             "file)"),
            std::string::npos)
      << refused.err;

  Result skipped = Train(Job("skip", Data(", skip_bad_images: true")),
                         dir_ + "/skipped", {"--max-iterations", "5"});
  ASSERT_EQ(skipped.code, 0) << skipped.err;
  EXPECT_NE(skipped.out.find("Skipped 1 bad image of " + dir_ +
                             "/jpeg (skip_bad_images): 3-dress/zz-broken.jpg"),
            std::string::npos)
      << skipped.out;
}

}  // namespace
}  // namespace dlbatch::trainer
