// CheckDataAttached: a train job's relative data paths against the files
// it attaches, and LocateInJobFile pointing its errors at their lines.
#include "proto/data_paths.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "proto/jobspec_yaml.h"

namespace dlbatch {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

const std::vector<std::string> kFashion = {
    "data/train-images-idx3-ubyte.gz", "data/train-labels-idx1-ubyte.gz",
    "data/t10k-images-idx3-ubyte.gz", "data/t10k-labels-idx1-ubyte.gz"};
const std::vector<std::string> kAttachData = {"data/"};

v1::TrainSpec Idx(const std::string& images, const std::string& labels) {
  v1::TrainSpec train;
  v1::DataSource* s = train.mutable_data()->mutable_train();
  s->set_format("idx");
  s->set_images(images);
  s->set_labels(labels);
  return train;
}

std::string Refused(const v1::TrainSpec& train,
                    const std::vector<std::string>& attached,
                    const std::vector<std::string>& written) {
  absl::Status s = CheckDataAttached(train, attached, written);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  return std::string(s.message());
}

TEST(DataPaths, NamesEveryPathOfEverySource) {
  v1::TrainSpec train = Idx("a.gz", "b.gz");
  v1::DataSource* v = train.mutable_data()->mutable_validation();
  v->set_format("cifar10");
  v->add_files("c1.bin");
  v->add_files("c2.bin");
  v1::DataSource* t = train.mutable_data()->mutable_test();
  t->set_format("folders");
  t->set_path("images/");
  std::vector<std::string> fields;
  for (const DataPath& p : DataPaths(train)) {
    fields.push_back(p.field + "=" + p.path + (p.folder ? "/" : ""));
  }
  EXPECT_EQ(fields,
            (std::vector<std::string>{"train.data.train.images=a.gz",
                                      "train.data.train.labels=b.gz",
                                      "train.data.validation.files[0]=c1.bin",
                                      "train.data.validation.files[1]=c2.bin",
                                      "train.data.test.path=images//"}));
}

TEST(DataPaths, AttachedFilesAndAbsolutePathsPass) {
  EXPECT_TRUE(
      CheckDataAttached(Idx(kFashion[0], "./data//" + kFashion[1].substr(5)),
                        kFashion, kAttachData)
          .ok());
  // Absolute paths are read on the workers: not this check's.
  EXPECT_TRUE(CheckDataAttached(Idx("/srv/a.gz", "/srv/b.gz"), {}, {}).ok());
  v1::TrainSpec folders;
  folders.mutable_data()->mutable_train()->set_format("folders");
  folders.mutable_data()->mutable_train()->set_path("images/");
  EXPECT_TRUE(CheckDataAttached(
                  folders, {"images/cat/1.png", "images/dog/2.png"}, {"images"})
                  .ok());
  folders.mutable_data()->mutable_train()->set_path(".");
  EXPECT_TRUE(
      CheckDataAttached(folders, {"cat/1.png", "dog/2.png"}, {"cat", "dog"})
          .ok());
}

TEST(DataPaths, APathNotAttachedSaysWhatToAttach) {
  // Nothing attached: the job's folder would be empty.
  EXPECT_THAT(
      Refused(Idx("data/train.gz", "data/labels.gz"), {}, {}),
      AllOf(StartsWith("train.data.train.images: 'data/train.gz' is not among "
                       "the job's attached files, and the job attaches "
                       "nothing"),
            HasSubstr("add `attach: [data/]`"),
            HasSubstr("or give an absolute path")));
  // The folder is attached, but holds no such file.
  EXPECT_THAT(Refused(Idx("data/train.gz", kFashion[1]), kFashion, kAttachData),
              AllOf(StartsWith("train.data.train.images: 'data/train.gz' is "
                               "not among the job's attached files (attach: "
                               "[data/], 4 files)"),
                    HasSubstr("data/ is attached, but without 'train.gz'")));
  // A typo gets the nearest file beside it.
  EXPECT_THAT(
      Refused(Idx(kFashion[0], "data/train-lables-idx1-ubyte.gz"), kFashion,
              kAttachData),
      AllOf(StartsWith("train.data.train.labels: "),
            HasSubstr("did you mean 'data/train-labels-idx1-ubyte.gz'?")));
  // Another folder than the one attached.
  EXPECT_THAT(Refused(Idx("mnist/a.gz", "mnist/b.gz"), kFashion, kAttachData),
              HasSubstr("; add mnist/ to attach: (relative to the job file's "
                        "folder), or correct the path"));
  EXPECT_THAT(Refused(Idx("../data/a.gz", "b.gz"), kFashion, kAttachData),
              HasSubstr("climbs out of the job's working folder"));
  EXPECT_THAT(Refused(Idx("data", kFashion[1]), kFashion, kAttachData),
              HasSubstr("'data' is an attached folder; name the file in it"));

  v1::TrainSpec cifar;
  v1::DataSource* c = cifar.mutable_data()->mutable_train();
  c->set_format("cifar10");
  c->add_files("data/data_batch_1.bin");
  c->add_files("data/data_batch_9.bin");
  EXPECT_THAT(Refused(cifar, {"data/data_batch_1.bin", "data/data_batch_2.bin"},
                      kAttachData),
              StartsWith("train.data.train.files[1]: 'data/data_batch_9.bin'"));

  v1::TrainSpec folders;
  folders.mutable_data()->mutable_train()->set_format("folders");
  folders.mutable_data()->mutable_train()->set_path("images/cat/1.png");
  EXPECT_THAT(
      Refused(folders, {"images/cat/1.png"}, {"images/"}),
      HasSubstr("is an attached file; a folders source names a folder"));
  folders.mutable_data()->mutable_train()->set_path("pictures");
  EXPECT_THAT(Refused(folders, {"images/cat/1.png"}, {"images/"}),
              AllOf(HasSubstr("is not among the job's attached folders"),
                    HasSubstr("add pictures/ to attach:")));
}

// The client checks after parsing; its error points at the path's line as
// the parser's own would.
TEST(DataPaths, ErrorsPointAtTheLineInTheJobFile) {
  absl::StatusOr<ParsedJobFile> parsed = ParseJobYaml(
      "name: x\n"
      "attach: [data/]\n"
      "train:\n"
      "  network: {input: [28, 28, 1], layers: [{type: fc, units: 10}, "
      "softmax]}\n"
      "  data:\n"
      "    train:\n"
      "      format: idx\n"
      "      images: data/train-images-idx3-ubyte.gz\n"
      "      labels: data/train.gz\n",
      "jobs/x.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  absl::Status s = LocateInJobFile(
      *parsed,
      CheckDataAttached(parsed->spec.train(), kFashion, parsed->attach));
  EXPECT_THAT(std::string(s.message()),
              StartsWith("jobs/x.yaml:9:15: train.data.train.labels: "
                         "'data/train.gz' is not among the job's attached "
                         "files (attach: [data/], 4 files)"));
  EXPECT_TRUE(LocateInJobFile(*parsed, absl::OkStatus()).ok());
  // A field never written: the file alone.
  EXPECT_EQ(
      LocateInJobFile(*parsed, absl::InvalidArgumentError("pool: x")).message(),
      "jobs/x.yaml: pool: x");
}

}  // namespace
}  // namespace dlbatch
