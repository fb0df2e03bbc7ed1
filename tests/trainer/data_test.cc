// Data loading: IDX and CIFAR-10 files (real Fashion-MNIST, and files
// written here, broken on purpose), epoch order, normalisation,
// augmentation and the batch loader.
#include "trainer/data/data.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "tests/trainer/images_from_bytes.h"
#include "trainer/backend.h"
#include "trainer/rng.h"

namespace dlbatch::trainer {
namespace {

using ::testing::HasSubstr;

constexpr char kFashionDir[] = "/usr/share/datasets/fashion-mnist";

std::string MakeTempDir() {
  std::string pattern = ::testing::TempDir() + "data_test.XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) return "";
  return pattern;
}

void WriteBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void WriteGzip(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

void PutBigEndian32(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift : {24, 16, 8, 0}) out.push_back((v >> shift) & 0xff);
}

std::vector<uint8_t> IdxImages(uint32_t count, uint32_t rows, uint32_t cols,
                               const std::vector<uint8_t>& pixels) {
  std::vector<uint8_t> out;
  PutBigEndian32(out, 2051);
  PutBigEndian32(out, count);
  PutBigEndian32(out, rows);
  PutBigEndian32(out, cols);
  out.insert(out.end(), pixels.begin(), pixels.end());
  return out;
}

std::vector<uint8_t> IdxLabels(const std::vector<uint8_t>& labels) {
  std::vector<uint8_t> out;
  PutBigEndian32(out, 2049);
  PutBigEndian32(out, static_cast<uint32_t>(labels.size()));
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

v1::DataSource Idx(const std::string& images, const std::string& labels) {
  v1::DataSource s;
  s.set_format("idx");
  s.set_images(images);
  s.set_labels(labels);
  return s;
}

uint32_t BigEndianAt(const std::vector<uint8_t>& b, size_t at) {
  return (uint32_t{b[at]} << 24) | (uint32_t{b[at + 1]} << 16) |
         (uint32_t{b[at + 2]} << 8) | b[at + 3];
}

// --- Real Fashion-MNIST ---------------------------------------------------

// The real files, gunzipped by the system's gzip into a temp folder when a
// test first needs them, and parsed here independently of the loader.
class FashionMnistTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { raw_dir_ = new std::string(MakeTempDir()); }
  static void TearDownTestSuite() {
    (void)RemoveTree(*raw_dir_);
    delete raw_dir_;
  }
  // The raw form of `name` (e.g. "t10k-labels-idx1-ubyte"), in raw_dir_.
  static std::string Raw(const std::string& name) {
    const std::string path = *raw_dir_ + "/" + name;
    if (!std::ifstream(path).good()) {
      const std::string cmd =
          absl::StrCat("gzip -dc ", kFashionDir, "/", name, ".gz > ", path);
      EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
    return path;
  }
  static std::string* raw_dir_;
};
std::string* FashionMnistTest::raw_dir_ = nullptr;

TEST_F(FashionMnistTest, TrainSetMatchesTheFilesReadIndependently) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<Dataset> data = LoadDataset(
      Idx("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
      kFashionDir);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  ASSERT_TRUE(data.ok()) << data.status();
  std::printf("loaded 60,000 gzipped training images in %.3f s\n", seconds);

  EXPECT_EQ(data->count, 60000);
  EXPECT_EQ(data->shape, (Shape{28, 28, 1}));
  EXPECT_EQ(data->num_classes, 10);
  EXPECT_THAT(data->source, HasSubstr("train-images-idx3-ubyte.gz"));
  ASSERT_EQ(data->pixels.size(), 60000u * 784);
  ASSERT_EQ(data->labels.size(), 60000u);

  const std::vector<uint8_t> images = ReadBytes(Raw("train-images-idx3-ubyte"));
  const std::vector<uint8_t> labels = ReadBytes(Raw("train-labels-idx1-ubyte"));
  ASSERT_EQ(images.size(), 16u + 60000u * 784);
  EXPECT_EQ(BigEndianAt(images, 4), 60000u);
  EXPECT_TRUE(std::equal(data->pixels.begin(), data->pixels.end(),
                         images.begin() + 16));
  ASSERT_EQ(labels.size(), 8u + 60000u);
  std::map<int, int> histogram;
  for (int64_t i = 0; i < 60000; ++i) {
    ASSERT_EQ(data->labels[i], labels[8 + i]) << "sample " << i;
    ++histogram[data->labels[i]];
  }
  ASSERT_EQ(histogram.size(), 10u);
  for (const auto& [label, n] : histogram) {
    EXPECT_EQ(n, 6000) << "class " << label;
  }
  EXPECT_EQ(data->labels[0], 9);  // the first image is an ankle boot
}

TEST_F(FashionMnistTest, RawAndGzipGiveTheSameTestSet) {
  absl::StatusOr<Dataset> gz =
      LoadDataset(Idx(absl::StrCat(kFashionDir, "/t10k-images-idx3-ubyte.gz"),
                      absl::StrCat(kFashionDir, "/t10k-labels-idx1-ubyte.gz")),
                  "/nonexistent-base-dir-unused-for-absolute-paths");
  ASSERT_TRUE(gz.ok()) << gz.status();
  absl::StatusOr<Dataset> raw = LoadDataset(
      Idx(Raw("t10k-images-idx3-ubyte"), Raw("t10k-labels-idx1-ubyte")), "");
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_EQ(gz->count, 10000);
  EXPECT_EQ(raw->count, 10000);
  EXPECT_EQ(gz->shape, raw->shape);
  EXPECT_EQ(gz->num_classes, 10);
  EXPECT_EQ(raw->num_classes, 10);
  EXPECT_TRUE(gz->pixels == raw->pixels);
  EXPECT_TRUE(gz->labels == raw->labels);
  std::vector<int> histogram(10);
  for (int32_t label : raw->labels) ++histogram[label];
  EXPECT_EQ(histogram, std::vector<int>(10, 1000));
}

TEST_F(FashionMnistTest, NormalizationOfTheTestSet) {
  absl::StatusOr<Dataset> data = LoadDataset(
      Idx(Raw("t10k-images-idx3-ubyte"), Raw("t10k-labels-idx1-ubyte")), "");
  ASSERT_TRUE(data.ok()) << data.status();
  double sum = 0;
  double sum_sq = 0;
  for (uint8_t p : data->pixels) {
    sum += p / 255.0;
    sum_sq += (p / 255.0) * (p / 255.0);
  }
  const double n = static_cast<double>(data->pixels.size());
  const double mean = sum / n;
  const double sd = std::sqrt(sum_sq / n - mean * mean);
  const Normalization norm = ComputeNormalization(*data);
  ASSERT_EQ(norm.mean.size(), 1u);
  ASSERT_EQ(norm.std.size(), 1u);
  EXPECT_NEAR(norm.mean[0], mean, 1e-6);
  EXPECT_NEAR(norm.std[0], sd, 1e-6);
  EXPECT_NEAR(norm.mean[0], 0.286, 0.01);  // Fashion-MNIST's known stats
  EXPECT_NEAR(norm.std[0], 0.353, 0.01);
}

// --- Bad files --------------------------------------------------------

class BadFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    ASSERT_FALSE(dir_.empty());
    for (int i = 0; i < 5 * 4 * 3; ++i) pixels_.push_back(i * 4 + 1);
    labels_ = {0, 1, 2, 1, 3};
    WriteBytes(Path("images"), IdxImages(5, 4, 3, pixels_));
    WriteBytes(Path("labels"), IdxLabels(labels_));
  }
  void TearDown() override { (void)RemoveTree(dir_); }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // Loads and expects an error whose message names `file` and holds each
  // of `parts`; returns its code.
  absl::StatusCode ExpectError(const v1::DataSource& source,
                               const std::string& file,
                               std::vector<std::string> parts) {
    absl::StatusOr<Dataset> data = LoadDataset(source, dir_);
    EXPECT_FALSE(data.ok());
    if (data.ok()) return absl::StatusCode::kOk;
    const std::string message(data.status().message());
    EXPECT_THAT(message, HasSubstr(file));
    for (const std::string& part : parts) EXPECT_THAT(message, HasSubstr(part));
    return data.status().code();
  }

  std::string dir_;
  std::vector<uint8_t> pixels_;
  std::vector<uint8_t> labels_;
};

TEST_F(BadFileTest, GoodFilesLoad) {
  absl::StatusOr<Dataset> data = LoadDataset(Idx("images", "labels"), dir_);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->count, 5);
  EXPECT_EQ(data->shape, (Shape{4, 3, 1}));
  EXPECT_EQ(data->num_classes, 4);  // largest label + 1
  EXPECT_EQ(data->pixels, pixels_);
  EXPECT_EQ(data->labels, std::vector<int32_t>({0, 1, 2, 1, 3}));
}

TEST_F(BadFileTest, MissingFileNamesTheGivenAndResolvedPaths) {
  absl::StatusCode s =
      ExpectError(Idx("data/nope.gz", "labels"), Path("data/nope.gz"),
                  {"given as 'data/nope.gz'", "no such file", dir_});
  EXPECT_EQ(s, absl::StatusCode::kNotFound);
  ExpectError(Idx("images", "/abs/missing-labels"), "/abs/missing-labels",
              {"labels file", "no such file"});
}

TEST_F(BadFileTest, BadMagicNumbersSayWhatWasExpected) {
  ExpectError(Idx("labels", "labels"), Path("labels"),
              {"bad magic number 2049", "expected 2051", "swapped"});
  ExpectError(Idx("images", "images"), Path("images"),
              {"bad magic number 2051", "expected 2049"});
  WriteBytes(Path("text"), {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l',
                            'd', '!', '!', '!', '!', '!'});
  ExpectError(Idx("text", "labels"), Path("text"),
              {"bad magic number", "expected 2051"});
}

TEST_F(BadFileTest, TruncatedFilesSayHowMuchIsMissing) {
  std::vector<uint8_t> images = IdxImages(5, 4, 3, pixels_);
  images.resize(images.size() - 7);
  WriteBytes(Path("short-images"), images);
  absl::StatusCode s =
      ExpectError(Idx("short-images", "labels"), Path("short-images"),
                  {"truncated", "expected 60 bytes", "got 53"});
  EXPECT_EQ(s, absl::StatusCode::kDataLoss);

  std::vector<uint8_t> labels = IdxLabels(labels_);
  labels.pop_back();
  WriteBytes(Path("short-labels"), labels);
  ExpectError(Idx("images", "short-labels"), Path("short-labels"),
              {"truncated", "expected 5 bytes", "got 4"});

  WriteBytes(Path("short-header"), {0, 0, 8, 3, 0, 0, 0, 5, 0});
  ExpectError(Idx("short-header", "labels"), Path("short-header"),
              {"truncated", "header"});

  // A damaged count: refused before allocating what it announces.
  WriteBytes(Path("huge-count"), IdxImages(0xffffffffu, 60000, 60000, pixels_));
  ExpectError(Idx("huge-count", "labels"), Path("huge-count"), {"damaged"});
  WriteBytes(Path("big-count"), IdxImages(1u << 30, 28, 28, pixels_));
  ExpectError(Idx("big-count", "labels"), Path("big-count"),
              {"truncated: expected 841813590016 bytes", "got 60"});
  WriteGzip(Path("big-count.gz"), IdxImages(1u << 30, 28, 28, pixels_));
  ExpectError(Idx("big-count.gz", "labels"), Path("big-count.gz"),
              {"truncated or a damaged header"});

  images = IdxImages(5, 4, 3, pixels_);
  images.push_back(0);
  WriteBytes(Path("long-images"), images);
  ExpectError(Idx("long-images", "labels"), Path("long-images"),
              {"more data than"});
}

TEST_F(BadFileTest, TruncatedAndCorruptGzip) {
  // Pixels that do not compress to nothing, so that cutting the file in
  // half cuts the deflate stream.
  std::vector<uint8_t> pixels(5 * 28 * 28);
  Rng rng(Key(42));
  for (uint8_t& p : pixels) p = static_cast<uint8_t>(rng.Below(256));
  const std::vector<uint8_t> images = IdxImages(5, 28, 28, pixels);
  WriteGzip(Path("images.gz"), images);
  ASSERT_TRUE(LoadDataset(Idx("images.gz", "labels"), dir_).ok());

  std::vector<uint8_t> gz = ReadBytes(Path("images.gz"));
  ASSERT_GT(gz.size(), 100u);
  std::vector<uint8_t> half(gz.begin(), gz.begin() + gz.size() / 2);
  WriteBytes(Path("half.gz"), half);
  absl::StatusCode s =
      ExpectError(Idx("half.gz", "labels"), Path("half.gz"),
                  {"truncated: expected 3920 bytes", "gzip data ends early"});
  EXPECT_EQ(s, absl::StatusCode::kDataLoss);

  // Cut in the trailer: all the data is there, its checksum is not.
  std::vector<uint8_t> no_trailer(gz.begin(), gz.end() - 4);
  WriteBytes(Path("no-trailer.gz"), no_trailer);
  s = ExpectError(Idx("no-trailer.gz", "labels"), Path("no-trailer.gz"),
                  {"truncated", "gzip data ends early"});
  EXPECT_EQ(s, absl::StatusCode::kDataLoss);

  std::vector<uint8_t> no_header(gz.begin(), gz.begin() + 12);
  WriteBytes(Path("no-header.gz"), no_header);
  ExpectError(Idx("no-header.gz", "labels"), Path("no-header.gz"),
              {"truncated"});

  std::vector<uint8_t> bad_crc = gz;
  bad_crc[bad_crc.size() - 8] ^= 0x55;  // the trailer's CRC-32
  WriteBytes(Path("bad-crc.gz"), bad_crc);
  s = ExpectError(Idx("bad-crc.gz", "labels"), Path("bad-crc.gz"),
                  {"gzip data is corrupt (incorrect data check)"});
  EXPECT_EQ(s, absl::StatusCode::kDataLoss);

  std::vector<uint8_t> bad_block = gz;
  bad_block[10] = 0xff;  // the first deflate block: type 3, which is invalid
  WriteBytes(Path("bad-block.gz"), bad_block);
  ExpectError(Idx("bad-block.gz", "labels"), Path("bad-block.gz"),
              {"gzip data is corrupt"});
}

TEST_F(BadFileTest, ImageAndLabelCountsDiffer) {
  WriteBytes(Path("labels4"), IdxLabels({0, 1, 2, 3}));
  ExpectError(Idx("images", "labels4"), Path("images"),
              {Path("labels4"), "5 images", "4 labels"});
}

TEST_F(BadFileTest, DirectoryAndUnknownFormat) {
  ExpectError(Idx(".", "labels"), dir_, {"directory"});
  v1::DataSource source = Idx("images", "labels");
  source.set_format("png");
  absl::StatusOr<Dataset> data = LoadDataset(source, dir_);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(data.status().message(), HasSubstr("'png'"));
}

// --- CIFAR-10 ---------------------------------------------------------

// Record r of a generated file: label r % 10; channel c of pixel p holds a
// value that encodes (file, r, c, p).
uint8_t CifarValue(int file, int r, int c, int p) {
  return static_cast<uint8_t>(file * 97 + r * 31 + c * 85 + p * 7);
}

std::vector<uint8_t> CifarFile(int file, int records) {
  std::vector<uint8_t> out;
  for (int r = 0; r < records; ++r) {
    out.push_back(static_cast<uint8_t>((r + file) % 10));
    for (int c = 0; c < 3; ++c) {
      for (int p = 0; p < 1024; ++p) out.push_back(CifarValue(file, r, c, p));
    }
  }
  return out;
}

v1::DataSource Cifar(const std::vector<std::string>& files) {
  v1::DataSource s;
  s.set_format("cifar10");
  for (const std::string& f : files) s.add_files(f);
  return s;
}

TEST_F(BadFileTest, CifarFilesReadBackAsNhwc) {
  WriteBytes(Path("data_batch_1.bin"), CifarFile(0, 3));
  WriteGzip(Path("data_batch_2.bin.gz"), CifarFile(1, 12));
  absl::StatusOr<Dataset> data =
      LoadDataset(Cifar({"data_batch_1.bin", "data_batch_2.bin.gz"}), dir_);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->count, 15);
  EXPECT_EQ(data->shape, (Shape{32, 32, 3}));
  EXPECT_EQ(data->num_classes, 10);
  EXPECT_THAT(data->source, HasSubstr("data_batch_2.bin.gz"));
  ASSERT_EQ(data->pixels.size(), 15u * 3072);
  for (int n = 0; n < 15; ++n) {
    const int file = n < 3 ? 0 : 1;
    const int r = n < 3 ? n : n - 3;
    EXPECT_EQ(data->labels[n], (r + file) % 10);
    for (int y = 0; y < 32; ++y) {
      for (int x = 0; x < 32; ++x) {
        for (int c = 0; c < 3; ++c) {
          ASSERT_EQ(data->pixels[((n * 32 + y) * 32 + x) * 3 + c],
                    CifarValue(file, r, c, y * 32 + x))
              << "sample " << n << " y " << y << " x " << x << " c " << c;
        }
      }
    }
  }
}

TEST_F(BadFileTest, BadCifarFiles) {
  std::vector<uint8_t> bytes = CifarFile(0, 2);
  bytes.pop_back();
  WriteBytes(Path("short.bin"), bytes);
  ExpectError(Cifar({"short.bin"}), Path("short.bin"),
              {"6145 bytes", "not a multiple of 3073"});

  bytes = CifarFile(0, 3);
  bytes[2 * 3073] = 10;
  WriteBytes(Path("label.bin"), bytes);
  WriteBytes(Path("good.bin"), CifarFile(0, 1));
  ExpectError(Cifar({"good.bin", "label.bin"}), Path("label.bin"),
              {"record 2 has label 10", "0..9"});

  ExpectError(Cifar({"good.bin", "missing.bin"}), Path("missing.bin"),
              {"no such file"});
  WriteGzip(Path("cut.bin.gz"), CifarFile(0, 2));
  std::vector<uint8_t> gz = ReadBytes(Path("cut.bin.gz"));
  gz.resize(gz.size() - 6);
  WriteBytes(Path("cut.bin.gz"), gz);
  ExpectError(Cifar({"good.bin", "cut.bin.gz"}), Path("cut.bin.gz"),
              {"truncated", "gzip data ends early"});

  WriteBytes(Path("empty.bin"), {});
  ExpectError(Cifar({"empty.bin"}), Path("empty.bin"), {"empty"});
}

// --- Epoch order and normalisation -----------------------------------

bool IsPermutation(std::vector<int64_t> order, int64_t count) {
  if (static_cast<int64_t>(order.size()) != count) return false;
  std::sort(order.begin(), order.end());
  for (int64_t i = 0; i < count; ++i) {
    if (order[i] != i) return false;
  }
  return true;
}

TEST(EpochOrderTest, ShuffleModes) {
  const int64_t count = 60000;
  std::vector<int64_t> identity(count);
  for (int64_t i = 0; i < count; ++i) identity[i] = i;
  EXPECT_EQ(EpochOrder("never", 1, 0, count), identity);
  EXPECT_EQ(EpochOrder("never", 1, 5, count), identity);

  const auto start = std::chrono::steady_clock::now();
  const std::vector<int64_t> e0 = EpochOrder("every-epoch", 1, 0, count);
  const double ms = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - start)
                        .count();
  std::printf("EpochOrder of 60,000 samples: %.3f ms\n", ms);
  const std::vector<int64_t> e1 = EpochOrder("every-epoch", 1, 1, count);
  EXPECT_TRUE(IsPermutation(e0, count));
  EXPECT_TRUE(IsPermutation(e1, count));
  EXPECT_NE(e0, identity);
  EXPECT_NE(e0, e1);
  EXPECT_EQ(e0, EpochOrder("every-epoch", 1, 0, count));  // reproducible
  EXPECT_NE(e0, EpochOrder("every-epoch", 2, 0, count));  // seed matters

  const std::vector<int64_t> once = EpochOrder("once", 1, 0, count);
  EXPECT_TRUE(IsPermutation(once, count));
  EXPECT_NE(once, identity);
  EXPECT_EQ(EpochOrder("once", 1, 7, count), once);
  EXPECT_EQ(once, e0);  // "once" is epoch 0's permutation

  // A shuffle moves most samples: in a uniform permutation about one
  // stays in place.
  int fixed = 0;
  for (int64_t i = 0; i < count; ++i) fixed += e1[i] == i;
  EXPECT_LT(fixed, 20);
  EXPECT_TRUE(EpochOrder("every-epoch", 1, 0, 0).empty());
  EXPECT_EQ(EpochOrder("every-epoch", 1, 0, 1), std::vector<int64_t>{0});
}

// A synthetic data set: pixels 1..255 drawn at random (never 0, so that
// fill is told apart from image), labels n % classes.
Dataset Synthetic(int count, Shape shape, int classes = 10) {
  Dataset data;
  data.source = "synthetic";
  data.shape = shape;
  data.count = count;
  data.num_classes = classes;
  data.pixels.resize(count * shape.size());
  Rng rng(Key(7));
  for (uint8_t& p : data.pixels) p = static_cast<uint8_t>(1 + rng.Below(255));
  for (int i = 0; i < count; ++i) data.labels.push_back(i % classes);
  return data;
}

TEST(NormalizationTest, PerChannelMeanAndStd) {
  const Dataset data = Synthetic(50, Shape{5, 4, 3});
  const Normalization norm = ComputeNormalization(data);
  ASSERT_EQ(norm.mean.size(), 3u);
  ASSERT_EQ(norm.std.size(), 3u);
  for (int c = 0; c < 3; ++c) {
    double sum = 0;
    double n = 0;
    for (size_t i = c; i < data.pixels.size(); i += 3) {
      sum += data.pixels[i] / 255.0;
      ++n;
    }
    const double mean = sum / n;
    double var = 0;
    for (size_t i = c; i < data.pixels.size(); i += 3) {
      var += (data.pixels[i] / 255.0 - mean) * (data.pixels[i] / 255.0 - mean);
    }
    EXPECT_NEAR(norm.mean[c], mean, 1e-6) << "channel " << c;
    EXPECT_NEAR(norm.std[c], std::sqrt(var / n), 1e-6) << "channel " << c;
  }
  // A constant channel must not make normalisation divide by zero.
  Dataset flat = Synthetic(3, Shape{2, 2, 1});
  std::fill(flat.pixels.begin(), flat.pixels.end(), 51);
  const Normalization flat_norm = ComputeNormalization(flat);
  EXPECT_NEAR(flat_norm.mean[0], 0.2, 1e-6);
  EXPECT_EQ(flat_norm.std[0], 1.0f);
}

// --- Preparing batches ----------------------------------------------

BatchRequest Request(std::vector<int64_t> indices, int64_t epoch = 0,
                     bool augment = false, int64_t iteration = 0) {
  BatchRequest r;
  r.epoch = epoch;
  r.iteration = iteration;
  r.indices = std::move(indices);
  r.augment = augment;
  return r;
}

// One sample's image out of a batch.
std::vector<float> SampleOf(const Batch& batch, int i, const Shape& shape) {
  return std::vector<float>(batch.images.begin() + i * shape.size(),
                            batch.images.begin() + (i + 1) * shape.size());
}

TEST(PrepareBatchTest, ScalesAndNormalises) {
  const Dataset data = Synthetic(20, Shape{4, 5, 3});
  BatchLoader::Options options;
  const Batch plain =
      PrepareBatch(data, options, Request({3, 0, 17}, 2, false, 9));
  EXPECT_EQ(plain.epoch, 2);
  EXPECT_EQ(plain.iteration, 9);
  ASSERT_EQ(plain.n, 3);
  EXPECT_EQ(plain.labels, std::vector<int32_t>({3, 0, 7}));
  ASSERT_EQ(plain.images.size(), 3u * 60);
  const int64_t indices[] = {3, 0, 17};
  for (int i = 0; i < 3; ++i) {
    for (int k = 0; k < 60; ++k) {
      const float x = data.pixels[indices[i] * 60 + k] / 255.0f;
      ASSERT_NEAR(plain.images[i * 60 + k], x, 1e-6);
    }
  }
  EXPECT_GE(*std::min_element(plain.images.begin(), plain.images.end()), 0.0f);
  EXPECT_LE(*std::max_element(plain.images.begin(), plain.images.end()), 1.0f);

  options.normalization =
      Normalization{{0.5f, 0.25f, 0.75f}, {0.2f, 0.4f, 0.1f}};
  const Batch norm = PrepareBatch(data, options, Request({3, 0, 17}));
  for (int i = 0; i < 3; ++i) {
    for (int k = 0; k < 60; ++k) {
      const int c = k % 3;
      const float x = data.pixels[indices[i] * 60 + k] / 255.0f;
      ASSERT_NEAR(
          norm.images[i * 60 + k],
          (x - options.normalization.mean[c]) / options.normalization.std[c],
          1e-5);
    }
  }
  // Augmentation configured but not asked for: the plain images.
  options.normalization = {};
  options.augmentation.set_random_x_reflection(true);
  options.augmentation.set_random_x_translation(2);
  EXPECT_EQ(PrepareBatch(data, options, Request({3, 0, 17})).images,
            plain.images);
  EXPECT_EQ(PrepareBatch(data, options, Request({})).n, 0);
}

// Whether `out` is `in` (both H x W x C) reflected and then shifted by
// (dy, dx), zero filled.
bool IsTransformOf(const std::vector<float>& out, const std::vector<float>& in,
                   const Shape& s, bool flip_x, bool flip_y, int dy, int dx,
                   float fill = 0.0f) {
  for (int y = 0; y < s.h; ++y) {
    for (int x = 0; x < s.w; ++x) {
      for (int c = 0; c < s.c; ++c) {
        int sy = y - dy;
        int sx = x - dx;
        float want = fill;
        if (sy >= 0 && sy < s.h && sx >= 0 && sx < s.w) {
          if (flip_y) sy = s.h - 1 - sy;
          if (flip_x) sx = s.w - 1 - sx;
          want = in[(sy * s.w + sx) * s.c + c];
        }
        if (out[(y * s.w + x) * s.c + c] != want) return false;
      }
    }
  }
  return true;
}

// Finds the reflection and shift (within +-max_shift) that turn `in` into
// `out`; false when none does.
bool FindTransform(const std::vector<float>& out, const std::vector<float>& in,
                   const Shape& s, int max_shift, bool* flip_x, bool* flip_y,
                   int* dy, int* dx, float fill = 0.0f) {
  for (int fy = 0; fy < 2; ++fy) {
    for (int fx = 0; fx < 2; ++fx) {
      for (int y = -max_shift; y <= max_shift; ++y) {
        for (int x = -max_shift; x <= max_shift; ++x) {
          if (IsTransformOf(out, in, s, fx, fy, y, x, fill)) {
            *flip_x = fx;
            *flip_y = fy;
            *dy = y;
            *dx = x;
            return true;
          }
        }
      }
    }
  }
  return false;
}

std::vector<int64_t> Range(int64_t n) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

TEST(AugmentationTest, ReflectionsFlipExactly) {
  const Shape shape{6, 5, 3};
  const Dataset data = Synthetic(64, shape);
  BatchLoader::Options options;
  options.seed = 11;
  const Batch plain = PrepareBatch(data, options, Request(Range(64)));
  options.augmentation.set_random_x_reflection(true);
  options.augmentation.set_random_y_reflection(true);
  const Batch aug = PrepareBatch(data, options, Request(Range(64), 1, true));
  std::set<std::pair<bool, bool>> seen;
  for (int i = 0; i < 64; ++i) {
    bool fx = false, fy = false;
    int dy = 0, dx = 0;
    ASSERT_TRUE(FindTransform(SampleOf(aug, i, shape),
                              SampleOf(plain, i, shape), shape, 0, &fx, &fy,
                              &dy, &dx))
        << "sample " << i << " is not a reflection of its image";
    seen.insert({fx, fy});
  }
  EXPECT_EQ(seen.size(), 4u) << "all four reflection combinations occur";
  EXPECT_EQ(aug.labels, plain.labels);
}

TEST(AugmentationTest, TranslationsShiftWithZeroFill) {
  const Shape shape{7, 8, 1};
  const Dataset data = Synthetic(300, shape);
  BatchLoader::Options options;
  options.seed = 5;
  const Batch plain = PrepareBatch(data, options, Request(Range(300)));
  options.augmentation.set_random_x_translation(3);
  options.augmentation.set_random_y_translation(1);
  const Batch aug = PrepareBatch(data, options, Request(Range(300), 0, true));
  std::set<int> xs, ys;
  for (int i = 0; i < 300; ++i) {
    bool fx = true, fy = true;
    int dy = 0, dx = 0;
    ASSERT_TRUE(FindTransform(SampleOf(aug, i, shape),
                              SampleOf(plain, i, shape), shape, 3, &fx, &fy,
                              &dy, &dx))
        << "sample " << i;
    EXPECT_FALSE(fx || fy) << "no reflection was asked for";
    EXPECT_LE(std::abs(dy), 1);
    xs.insert(dx);
    ys.insert(dy);
  }
  EXPECT_EQ(xs, std::set<int>({-3, -2, -1, 0, 1, 2, 3}));
  EXPECT_EQ(ys, std::set<int>({-1, 0, 1}));
}

TEST(AugmentationTest, CropAfterPaddingFillsWithNormalisedZero) {
  const Shape shape{6, 6, 3};
  const Dataset data = Synthetic(200, shape);
  BatchLoader::Options options;
  options.normalization =
      Normalization{{0.5f, 0.5f, 0.5f}, {0.25f, 0.25f, 0.25f}};
  const Batch plain = PrepareBatch(data, options, Request(Range(200)));
  options.augmentation.set_random_crop_padding(2);
  const Batch aug = PrepareBatch(data, options, Request(Range(200), 4, true));
  std::set<std::pair<int, int>> shifts;
  for (int i = 0; i < 200; ++i) {
    bool fx = true, fy = true;
    int dy = 0, dx = 0;
    // A black pixel, normalised: (0 - 0.5) / 0.25.
    ASSERT_TRUE(FindTransform(SampleOf(aug, i, shape),
                              SampleOf(plain, i, shape), shape, 2, &fx, &fy,
                              &dy, &dx, -2.0f))
        << "sample " << i;
    shifts.insert({dy, dx});
  }
  EXPECT_EQ(shifts.size(), 25u) << "every crop offset of 5x5 occurs";
}

TEST(AugmentationTest, TranslationBeyondTheImageFillsItAll) {
  const Shape shape{3, 3, 1};
  const Dataset data = Synthetic(40, shape);
  BatchLoader::Options options;
  options.augmentation.set_random_x_translation(10);
  const Batch aug = PrepareBatch(data, options, Request(Range(40), 0, true));
  int blank = 0;
  for (int i = 0; i < 40; ++i) {
    const std::vector<float> s = SampleOf(aug, i, shape);
    blank += std::all_of(s.begin(), s.end(), [](float v) { return v == 0; });
  }
  EXPECT_GT(blank, 10);  // |dx| >= 3 in 16 of 21 cases
  EXPECT_LT(blank, 40);
}

TEST(AugmentationTest, DrawsDependOnSeedEpochAndSampleOnly) {
  const Shape shape{8, 8, 1};
  const Dataset data = Synthetic(32, shape);
  BatchLoader::Options options;
  options.seed = 3;
  options.augmentation.set_random_x_reflection(true);
  options.augmentation.set_random_y_reflection(true);
  options.augmentation.set_random_x_translation(2);
  options.augmentation.set_random_y_translation(2);
  options.augmentation.set_random_crop_padding(1);
  const Batch alone = PrepareBatch(data, options, Request({7}, 3, true));
  const Batch mixed =
      PrepareBatch(data, options, Request({20, 7, 1, 30}, 3, true, 55));
  const Batch reordered =
      PrepareBatch(data, options, Request({1, 2, 3, 4, 5, 6, 7}, 3, true));
  EXPECT_EQ(SampleOf(alone, 0, shape), SampleOf(mixed, 1, shape));
  EXPECT_EQ(SampleOf(alone, 0, shape), SampleOf(reordered, 6, shape));
  EXPECT_EQ(PrepareBatch(data, options, Request({7}, 3, true)).images,
            alone.images);

  // Another epoch or seed draws anew (for some of the samples).
  const Batch epoch3 = PrepareBatch(data, options, Request(Range(32), 3, true));
  const Batch epoch4 = PrepareBatch(data, options, Request(Range(32), 4, true));
  EXPECT_NE(epoch3.images, epoch4.images);
  options.seed = 4;
  EXPECT_NE(PrepareBatch(data, options, Request(Range(32), 3, true)).images,
            epoch3.images);
}

TEST(PrepareBatchTest, PrintsItsCost) {
  const Shape shape{28, 28, 1};
  const Dataset data = Synthetic(1000, shape);
  BatchLoader::Options options;
  options.normalization = ComputeNormalization(data);
  const std::vector<int64_t> order = EpochOrder("every-epoch", 1, 0, 1000);
  auto time_batches = [&](bool augment) {
    const int rounds = 2000;
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < rounds; ++r) {
      std::vector<int64_t> indices(order.begin() + (r % 15) * 64,
                                   order.begin() + (r % 15 + 1) * 64);
      Batch b =
          PrepareBatch(data, options, Request(std::move(indices), r, augment));
      if (b.n != 64) return -1.0;
    }
    return std::chrono::duration<double, std::micro>(
               std::chrono::steady_clock::now() - start)
               .count() /
           rounds;
  };
  const double plain_us = time_batches(false);
  options.augmentation.set_random_x_reflection(true);
  options.augmentation.set_random_x_translation(3);
  options.augmentation.set_random_y_translation(3);
  const double aug_us = time_batches(true);
  // As bytes and placements (a GPU's batches): what is left on the host.
  options.bytes = true;
  const double bytes_aug_us = time_batches(true);
  options.augmentation = {};
  const double bytes_plain_us = time_batches(false);
  std::printf(
      "PrepareBatch, 64 x 28x28: floats %.1f us plain, %.1f us augmented; "
      "bytes %.1f us plain, %.1f us augmented\n",
      plain_us, aug_us, bytes_plain_us, bytes_aug_us);
  // Printed, not asserted: speed is measured by benchmarks, never by timed
  // tests. The batches themselves were checked above.
  EXPECT_GT(plain_us, 0);
}

// A GPU's batches travel as bytes and placements and become images on the
// device (Backend::PrepareImages); the CPU backend's PrepareImages makes
// the loader's own images of them, bit for bit (gpu_backend_test checks
// the GPU's the same way).
TEST(PrepareImagesTest, TheCpuBackendMakesTheLoadersImagesFromBytes) {
  absl::StatusOr<std::unique_ptr<Backend>> cpu = MakeCpuBackend(1);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(testing::CompareImagesFromBytes(cpu->get()), "");
}

// --- The loader thread --------------------------------------------------

TEST(BatchLoaderTest, ServesRequestsInPushOrderThenEnds) {
  const Shape shape{10, 10, 3};
  const Dataset data = Synthetic(100, shape);
  BatchLoader::Options options;
  options.seed = 9;
  options.depth = 2;
  options.normalization = ComputeNormalization(data);
  options.augmentation.set_random_x_reflection(true);
  options.augmentation.set_random_crop_padding(2);
  std::vector<BatchRequest> requests;
  for (int it = 0; it < 12; ++it) {
    const int epoch = it / 4;
    const std::vector<int64_t> order = EpochOrder("every-epoch", 9, epoch, 100);
    const int size = it % 4 == 3 ? 7 : 31;  // a short last batch
    requests.push_back(
        Request(std::vector<int64_t>(order.begin() + (it % 4) * 31,
                                     order.begin() + (it % 4) * 31 + size),
                epoch, it % 2 == 0, it));
  }
  std::unique_ptr<BatchLoader> loader = BatchLoader::Start(&data, options);
  // Pushed from another thread while this one consumes.
  std::thread producer([&] {
    for (const BatchRequest& r : requests) loader->Push(r);
    loader->Close();
  });
  for (const BatchRequest& r : requests) {
    std::optional<Batch> batch = loader->Next();
    ASSERT_TRUE(batch.has_value()) << "iteration " << r.iteration;
    const Batch want = PrepareBatch(data, options, r);
    EXPECT_EQ(batch->iteration, r.iteration);
    EXPECT_EQ(batch->epoch, r.epoch);
    EXPECT_EQ(batch->n, want.n);
    EXPECT_EQ(batch->labels, want.labels);
    EXPECT_EQ(batch->images, want.images) << "iteration " << r.iteration;
  }
  producer.join();
  EXPECT_FALSE(loader->Next().has_value());
  EXPECT_FALSE(loader->Next().has_value());
}

TEST(BatchLoaderTest, CloseServesWhatWasPushedFirst) {
  const Dataset data = Synthetic(10, Shape{2, 2, 1});
  std::unique_ptr<BatchLoader> loader =
      BatchLoader::Start(&data, BatchLoader::Options{});
  for (int it = 0; it < 5; ++it) loader->Push(Request({it}, 0, false, it));
  loader->Close();
  loader->Push(Request({9}, 0, false, 99));  // after Close: not served
  for (int it = 0; it < 5; ++it) {
    std::optional<Batch> batch = loader->Next();
    ASSERT_TRUE(batch.has_value());
    EXPECT_EQ(batch->iteration, it);
    EXPECT_EQ(batch->labels, std::vector<int32_t>({it}));
  }
  EXPECT_FALSE(loader->Next().has_value());
}

TEST(BatchLoaderTest, NextWaitsForAPushFromAnotherThread) {
  const Dataset data = Synthetic(10, Shape{2, 2, 1});
  std::unique_ptr<BatchLoader> loader =
      BatchLoader::Start(&data, BatchLoader::Options{});
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    loader->Push(Request({4}, 0, false, 1));
  });
  std::optional<Batch> batch = loader->Next();
  late.join();
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->labels, std::vector<int32_t>({4}));
  loader->Close();
  EXPECT_FALSE(loader->Next().has_value());
}

TEST(BatchLoaderTest, DestroyingWithPendingRequestsDoesNotHang) {
  const Shape shape{32, 32, 3};
  const Dataset data = Synthetic(256, shape);
  BatchLoader::Options options;
  options.depth = 2;
  options.augmentation.set_random_crop_padding(4);
  const auto start = std::chrono::steady_clock::now();
  {
    std::unique_ptr<BatchLoader> loader = BatchLoader::Start(&data, options);
    // ~2,000 batches of 256 CIFAR-sized images: seconds of work if served.
    for (int it = 0; it < 2000; ++it) {
      loader->Push(Request(Range(256), 0, true, it));
    }
    ASSERT_TRUE(loader->Next().has_value());
  }
  { std::unique_ptr<BatchLoader> idle = BatchLoader::Start(&data, options); }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  EXPECT_LT(seconds, 1.0);
}

}  // namespace
}  // namespace dlbatch::trainer
