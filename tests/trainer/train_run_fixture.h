// What the tests of whole dlbatch-train runs share (train_run_test,
// graph_train_run_test, loss_scaling_train_run_test, bf16_train_run_test,
// folders_train_test and the GPU ones): Fashion-MNIST's IDX files as a job
// file's data, a temp folder per test, dlbatch-train run with the test's
// own tuning cache, and what a run leaves behind read back.
#ifndef DLBATCH_TESTS_TRAINER_TRAIN_RUN_FIXTURE_H_
#define DLBATCH_TESTS_TRAINER_TRAIN_RUN_FIXTURE_H_

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/files.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"
#include "trainer/output/checkpoint.h"
#include "trainer/output/history.h"

namespace dlbatch::trainer::testing {

// Fashion-MNIST's `set` ("train" or "t10k") in folder `dir` as a job file's
// data source: `{format: idx, images: ..., labels: ...}`.
inline std::string IdxSource(const std::string& dir, const std::string& set) {
  return absl::StrCat("{format: idx, images: ", dir, "/", set,
                      "-images-idx3-ubyte.gz, labels: ", dir, "/", set,
                      "-labels-idx1-ubyte.gz}");
}

// A job file's `data:` block (two spaces in, to sit under `train:`) of the
// IDX files in FashionMnistDir(): the training set, and where `validation`
// the test set to validate on. Ends with a newline.
inline std::string FashionMnistData(bool validation = true) {
  const std::string dir = dlbatch::testing::FashionMnistDir();
  std::string data =
      absl::StrCat("  data:\n    train: ", IdxSource(dir, "train"), "\n");
  if (validation) {
    absl::StrAppend(&data, "    validation: ", IdxSource(dir, "t10k"), "\n");
  }
  return data;
}

// The text of job `name` that trains `network` (a `network:` block, two
// spaces in) on FashionMnistData(`validation`) followed by `data_extra`
// (more lines of the data block, four spaces in), with `options` (lines
// four spaces in) under `options:`.
inline std::string FashionMnistJobText(const std::string& name,
                                       const std::string& network,
                                       const std::string& options,
                                       bool validation = true,
                                       const std::string& data_extra = "") {
  return absl::StrCat("name: ", name, "\ntrain:\n", network,
                      FashionMnistData(validation), data_extra, "  options:\n",
                      options);
}

// ‖a − b‖ / ‖a‖ of two parameter vectors of the same size.
inline double RelativeDifference(const std::vector<float>& a,
                                 const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    norm += double{a[i]} * a[i];
  }
  return std::sqrt(diff / norm);
}

// A test of dlbatch-train runs: skipped, saying why, where Fashion-MNIST is
// not in FashionMnistDir(); else dir_ is a fresh temp folder, removed after
// the test unless DLBATCH_KEEP_TEST_DIRS is set. A fixture that checks
// more (a GPU) does so before calling SetUp(), and one that writes into
// dir_ after it returns when IsSkipped() or HasFatalFailure().
class TrainRunFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string data = dlbatch::testing::FashionMnistDir();
    if (access((data + "/train-images-idx3-ubyte.gz").c_str(), R_OK) != 0) {
      GTEST_SKIP() << "Fashion-MNIST is not in " << data
                   << " (Debian's dataset-fashion-mnist, or "
                      "DLBATCH_TEST_DATA_DIR)";
    }
    const ::testing::TestInfo* test =
        ::testing::UnitTest::GetInstance()->current_test_info();
    std::string tmpl = absl::StrCat(
        "/tmp/dlbatch-",
        absl::StrReplaceAll(test->test_suite_name(), {{"/", "-"}}), "-XXXXXX");
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr) << tmpl;
    dir_ = tmpl;
  }
  void TearDown() override {
    if (!dir_.empty() && std::getenv("DLBATCH_KEEP_TEST_DIRS") == nullptr) {
      RemoveTree(dir_).IgnoreError();
    }
  }

  // Writes `text` as dir_/`name`.yaml; its path.
  std::string WriteJob(const std::string& name, const std::string& text) {
    const std::string path = absl::StrCat(dir_, "/", name, ".yaml");
    dlbatch::testing::WriteAll(path, text);
    return path;
  }

  // Runs this build's dlbatch-train on `job` into `out`, followed by
  // `extra`, in `env`, killed after `timeout_ms`. The decoded images and
  // kernel choices are cached in dir_/cache, shared by the test's runs (so
  // that they compute alike).
  dlbatch::testing::Result RunTrain(const std::string& job,
                                    const std::string& out,
                                    const std::vector<std::string>& extra = {},
                                    std::map<std::string, std::string> env = {},
                                    int timeout_ms = 600000) {
    std::vector<std::string> argv = {
        dlbatch::testing::BinDir() + "/dlbatch-train", job, "--output-dir",
        out};
    argv.insert(argv.end(), extra.begin(), extra.end());
    env["XDG_CACHE_HOME"] = dir_ + "/cache";
    return dlbatch::testing::Exec(argv, env, timeout_ms);
  }

  // The checkpoint a run left in `out` (a failed expectation and an empty
  // one where it cannot be read).
  Checkpoint LastCheckpoint(const std::string& out) {
    absl::StatusOr<Checkpoint> c = ReadCheckpoint(out + "/checkpoint.dlbc");
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : Checkpoint();
  }
  std::vector<float> FinalParams(const std::string& out) {
    return LastCheckpoint(out).params;
  }
  // The training history a run left in `out` (a failed expectation and an
  // empty one where it cannot be parsed).
  TrainingHistory History(const std::string& out) {
    absl::StatusOr<TrainingHistory> h = ParseHistoryCsv(
        dlbatch::testing::ReadAll(out + "/training_history.csv"));
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? *std::move(h) : TrainingHistory();
  }
  nlohmann::json Metrics(const std::string& out) {
    return nlohmann::json::parse(
        dlbatch::testing::ReadAll(out + "/metrics.json"));
  }

  std::string dir_;
};

}  // namespace dlbatch::trainer::testing

#endif  // DLBATCH_TESTS_TRAINER_TRAIN_RUN_FIXTURE_H_
