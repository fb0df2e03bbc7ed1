// Image folders (format: folders): decoding PNG and JPEG, channels and
// bilinear resizing, the folder's listing and order, bad images, the
// decoded cache (hits, invalidation, fallbacks, a writer killed mid-write),
// and the stratified validation split.
#include "trainer/data/image_folders.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "tests/common/image_files.h"
#include "trainer/data/data.h"
#include "trainer/data/image_decode.h"

namespace dlbatch::trainer {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Str(const std::vector<uint8_t>& v) {
  return std::string(v.begin(), v.end());
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

// A grey h x w image whose pixel (y, x) is `seed` + 7y + 3x (mod 256).
std::vector<uint8_t> Pattern(int h, int w, int c, int seed) {
  std::vector<uint8_t> p(static_cast<size_t>(h) * w * c);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int k = 0; k < c; ++k) {
        p[(y * w + x) * c + k] =
            static_cast<uint8_t>(seed + 7 * y + 3 * x + 50 * k);
      }
    }
  }
  return p;
}

// --- Decoding ---

TEST(DecodeImage, GreyPngIsExact) {
  const std::vector<uint8_t> px = Pattern(5, 7, 1, 11);
  absl::StatusOr<Image> img =
      DecodeImage(testing::EncodePng(5, 7, 1, px.data()), 1);
  ASSERT_TRUE(img.ok()) << img.status();
  EXPECT_EQ(img->h, 5);
  EXPECT_EQ(img->w, 7);
  EXPECT_EQ(img->c, 1);
  EXPECT_EQ(img->pixels, px);
}

TEST(DecodeImage, ColourBecomesLumaAndGreyBecomesColour) {
  const std::vector<uint8_t> rgb = {255, 0, 0,   0,  255, 0,
                                    0,   0, 255, 10, 20,  30};
  absl::StatusOr<Image> grey =
      DecodeImage(testing::EncodePng(2, 2, 3, rgb.data()), 1);
  ASSERT_TRUE(grey.ok()) << grey.status();
  // 0.299 R + 0.587 G + 0.114 B, rounded.
  EXPECT_THAT(grey->pixels, ElementsAre(76, 150, 29, 18));

  const std::vector<uint8_t> g = {0, 100, 200, 255};
  absl::StatusOr<Image> colour =
      DecodeImage(testing::EncodePng(2, 2, 1, g.data()), 3);
  ASSERT_TRUE(colour.ok()) << colour.status();
  EXPECT_EQ(colour->c, 3);
  EXPECT_THAT(colour->pixels, ElementsAre(0, 0, 0, 100, 100, 100, 200, 200, 200,
                                          255, 255, 255));
}

TEST(DecodeImage, AlphaIsCompositedOntoBlack) {
  const std::vector<uint8_t> rgba = {200, 200, 200, 255, 200, 200, 200, 0};
  absl::StatusOr<Image> img =
      DecodeImage(testing::EncodePng(1, 2, 4, rgba.data()), 3);
  ASSERT_TRUE(img.ok()) << img.status();
  EXPECT_THAT(img->pixels, ElementsAre(200, 200, 200, 0, 0, 0));
}

TEST(DecodeImage, JpegDecodesCloseToWhatWasEncoded) {
  std::vector<uint8_t> px(16 * 16 * 3);
  for (int i = 0; i < 16 * 16; ++i) {
    px[3 * i] = 40;
    px[3 * i + 1] = 120;
    px[3 * i + 2] = 220;
  }
  const std::string jpeg = testing::EncodeJpeg(16, 16, 3, px.data(), 100);
  absl::StatusOr<Image> img = DecodeImage(jpeg, 3);
  ASSERT_TRUE(img.ok()) << img.status();
  ASSERT_EQ(img->pixels.size(), px.size());
  for (size_t i = 0; i < px.size(); ++i) {
    EXPECT_NEAR(img->pixels[i], px[i], 3) << i;
  }
  // To grey: the JPEG's luma.
  absl::StatusOr<Image> grey = DecodeImage(jpeg, 1);
  ASSERT_TRUE(grey.ok()) << grey.status();
  EXPECT_NEAR(grey->pixels[0], (299 * 40 + 587 * 120 + 114 * 220) / 1000, 3);
}

TEST(DecodeImage, TruncatedAndCorruptFilesAreErrors) {
  const std::vector<uint8_t> px = Pattern(32, 32, 3, 1);
  const std::string jpeg = testing::EncodeJpeg(32, 32, 3, px.data());
  absl::StatusOr<Image> cut = DecodeImage(jpeg.substr(0, jpeg.size() / 2), 3);
  ASSERT_FALSE(cut.ok());
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(cut.status().message(),
              HasSubstr("not a readable JPEG (Premature end of JPEG file)"));

  const std::string png = testing::EncodePng(32, 32, 3, px.data());
  absl::StatusOr<Image> png_cut =
      DecodeImage(png.substr(0, png.size() - 40), 3);
  ASSERT_FALSE(png_cut.ok());
  EXPECT_EQ(png_cut.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(png_cut.status().message(), HasSubstr("not a readable PNG"));

  std::string flipped = png;
  flipped[png.size() / 2] ^= 0x55;  // inside the compressed pixels: CRC
  EXPECT_FALSE(DecodeImage(flipped, 3).ok());

  absl::StatusOr<Image> text = DecodeImage("hello, world", 1);
  ASSERT_FALSE(text.ok());
  EXPECT_THAT(text.status().message(), HasSubstr("neither a PNG nor a JPEG"));
  EXPECT_THAT(DecodeImage("", 1).status().message(), HasSubstr("empty"));
}

// --- Resizing ---

TEST(ResizeBilinear, HalfPixelCentres) {
  Image in{2, 2, 1, {0, 100, 200, 250}};
  std::vector<uint8_t> out(4 * 4);
  ResizeBilinear(in, 4, 4, out.data());
  // Output column x samples source x' = (x + 0.5) / 2 - 0.5, clamped:
  // 0, 0.25, 0.75, 1.
  EXPECT_THAT(out, ElementsAre(0, 25, 75, 100,        //
                               50, 72, 116, 138,      // rows at y' = 0.25
                               150, 166, 197, 213,    // y' = 0.75
                               200, 213, 238, 250));  // y' = 1
  // Halving averages each 2 x 2 block.
  Image big{2, 4, 1, {0, 10, 20, 30, 40, 50, 60, 70}};
  std::vector<uint8_t> half(1 * 2);
  ResizeBilinear(big, 1, 2, half.data());
  EXPECT_THAT(half, ElementsAre(25, 45));
  // The same size: a copy.
  std::vector<uint8_t> same(4);
  ResizeBilinear(in, 2, 2, same.data());
  EXPECT_EQ(same, in.pixels);
}

// --- Folders ---

class ImageFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dlbatch-image-folder-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    root_ = dir_ + "/images";
  }
  void TearDown() override { RemoveTree(dir_).IgnoreError(); }

  // Writes `name` (under root_) as a 4 x 4 grey PNG of `seed`'s pattern.
  void Png(const std::string& name, int seed) {
    const std::vector<uint8_t> px = Pattern(4, 4, 1, seed);
    WriteBytes(root_ + "/" + name, testing::EncodePng(4, 4, 1, px.data()));
  }

  v1::DataSource Source(bool skip = false) {
    v1::DataSource s;
    s.set_format("folders");
    s.set_path(root_);
    s.set_skip_bad_images(skip);
    return s;
  }

  LoadOptions Options() {
    LoadOptions o;
    o.input = {4, 4, 1};
    o.threads = 2;
    o.cache_dir = dir_ + "/cache";
    o.say = [this](const std::string& line) { said_ += line + "\n"; };
    return o;
  }

  absl::StatusOr<Dataset> Load(bool skip = false) {
    said_.clear();
    return LoadDataset(Source(skip), dir_, Options());
  }

  std::vector<std::string> CacheFiles(const std::string& dir) {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      names.push_back(e.path().filename().string());
    }
    return names;
  }

  std::string dir_, root_, said_;
};

TEST_F(ImageFolder, ListsClassesSortedAndSamplesByNameThenClass) {
  Png("dog/2.png", 1);
  Png("cat/1.png", 2);
  Png("cat/2.png", 3);
  Png("dog/1.png", 4);
  Png("dog/more/0.PNG", 5);   // a subfolder of a class belongs to it
  Png("cat/.hidden.png", 6);  // hidden: left out
  WriteBytes(root_ + "/cat/notes.txt", "not an image");
  WriteBytes(root_ + "/README", "about the set");
  absl::StatusOr<FolderListing> l = ListImageFolder(root_);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_THAT(l->class_names, ElementsAre("cat", "dog"));
  std::vector<std::string> paths;
  std::vector<int> labels;
  for (const FolderFile& f : l->files) {
    paths.push_back(f.path);
    labels.push_back(f.label);
  }
  EXPECT_THAT(paths, ElementsAre("cat/1.png", "dog/1.png", "cat/2.png",
                                 "dog/2.png", "dog/more/0.PNG"));
  EXPECT_THAT(labels, ElementsAre(0, 1, 0, 1, 1));
  EXPECT_EQ(l->ignored, 2);
  // A folder named with a trailing '/' lists alike.
  absl::StatusOr<FolderListing> slash = ListImageFolder(root_ + "/");
  ASSERT_TRUE(slash.ok()) << slash.status();
  EXPECT_EQ(slash->root, root_);
  EXPECT_EQ(slash->files[4].path, "dog/more/0.PNG");

  // A validation set takes the training set's labels.
  absl::StatusOr<FolderListing> v =
      ListImageFolder(root_, {"ant", "cat", "dog"});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->files[0].label, 1);
  EXPECT_EQ(v->files[1].label, 2);
  absl::StatusOr<FolderListing> other = ListImageFolder(root_, {"cat"});
  ASSERT_FALSE(other.ok());
  EXPECT_THAT(other.status().message(),
              HasSubstr("the class folder 'dog' is not a class of the "
                        "training set"));
}

// Links: a linked image file is listed with its target's size, a linked
// class folder is followed, a link to a folder inside a class is not, and
// a dangling link to an "image" is listed for decoding to name. Several
// listing threads list what one does.
TEST_F(ImageFolder, ListsLinksAndListsAlikeOnAnyNumberOfThreads) {
  for (int i = 0; i < 30; ++i) Png(absl::StrCat("c", i % 6, "/", i, ".png"), i);
  Png("c1/deep/er/x.jpg", 40);
  const std::string outside = dir_ + "/outside";
  fs::create_directories(outside + "/birds");
  WriteBytes(outside + "/birds/b.png",
             testing::EncodePng(4, 4, 1, Pattern(4, 4, 1, 50).data()));
  WriteBytes(outside + "/big.png", std::string(1234, 'x'));
  fs::create_symlink(outside + "/big.png", root_ + "/c2/linked.png");
  fs::create_symlink(outside + "/birds", root_ + "/bird");
  fs::create_symlink(outside + "/birds", root_ + "/c3/birds-inside");
  fs::create_symlink(outside + "/gone.png", root_ + "/c4/dangling.png");
  WriteBytes(root_ + "/c5/notes.txt", "not an image");

  absl::StatusOr<FolderListing> one = ListImageFolder(root_, {}, 1);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_THAT(one->class_names,
              ElementsAre("bird", "c0", "c1", "c2", "c3", "c4", "c5"));
  EXPECT_EQ(one->files.size(), 30u + 4u);
  EXPECT_EQ(one->ignored, 1);
  std::map<std::string, FolderFile> by_path;
  for (const FolderFile& f : one->files) by_path[f.path] = f;
  EXPECT_EQ(by_path.count("bird/b.png"), 1u);
  EXPECT_EQ(by_path.count("c1/deep/er/x.jpg"), 1u);
  EXPECT_EQ(by_path["c2/linked.png"].size, 1234);
  EXPECT_EQ(by_path["c4/dangling.png"].size, -1);
  for (const auto& [path, f] : by_path) {
    EXPECT_FALSE(absl::StartsWith(path, "c3/birds-inside")) << path;
  }

  for (int threads : {2, 4, 16}) {
    absl::StatusOr<FolderListing> many = ListImageFolder(root_, {}, threads);
    ASSERT_TRUE(many.ok()) << many.status();
    ASSERT_EQ(many->files.size(), one->files.size());
    for (size_t i = 0; i < one->files.size(); ++i) {
      EXPECT_EQ(many->files[i].path, one->files[i].path);
      EXPECT_EQ(many->files[i].label, one->files[i].label);
      EXPECT_EQ(many->files[i].size, one->files[i].size);
      EXPECT_EQ(many->files[i].mtime_ns, one->files[i].mtime_ns);
    }
    EXPECT_EQ(many->ignored, one->ignored);
  }
  // The dangling link is named when the folder is decoded.
  absl::StatusOr<Dataset> loaded = Load();
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(loaded.status().message(), HasSubstr("c4/dangling.png"));
}

TEST_F(ImageFolder, RefusesWhatIsNotAFolderOfClasses) {
  absl::StatusOr<FolderListing> missing = ListImageFolder(root_);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("no such folder"));

  fs::create_directories(root_);
  EXPECT_THAT(ListImageFolder(root_).status().message(),
              HasSubstr("holds no class folders"));

  fs::create_directories(root_ + "/empty");
  Png("full/a.png", 1);
  EXPECT_THAT(ListImageFolder(root_).status().message(),
              HasSubstr("the class folder 'empty' holds no .png, .jpg or "
                        ".jpeg images"));
  fs::remove(root_ + "/empty");
  Png("stray.png", 2);
  EXPECT_THAT(ListImageFolder(root_).status().message(),
              HasSubstr("the image 'stray.png' lies directly in it"));
}

TEST_F(ImageFolder, DecodesOnceThenReadsTheCacheUntilAFileChanges) {
  for (int i = 0; i < 40; ++i)
    Png(absl::StrCat(i % 3, "/", 100 + i, ".png"), i);
  absl::StatusOr<Dataset> first = Load();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->count, 40);
  EXPECT_EQ(first->images_decoded, 40);
  EXPECT_THAT(first->class_names, ElementsAre("0", "1", "2"));
  EXPECT_EQ(first->num_classes, 3);
  EXPECT_THAT(said_, HasSubstr("Decoding 40 images of " + root_));
  EXPECT_THAT(said_, HasSubstr("Cached them in " + dir_ + "/cache/images-"));
  // Sample i is file 100 + i: the names' order.
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(first->labels[i], i % 3);
    const std::vector<uint8_t> px = Pattern(4, 4, 1, i);
    EXPECT_TRUE(std::equal(px.begin(), px.end(), &first->pixels[i * 16])) << i;
  }

  absl::StatusOr<Dataset> second = Load();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->images_decoded, 0);
  EXPECT_THAT(said_, HasSubstr("Read 40 images of " + root_ +
                               " from the decoded cache"));
  EXPECT_EQ(Str(second->pixels), Str(first->pixels));
  EXPECT_EQ(second->labels, first->labels);
  EXPECT_EQ(second->class_names, first->class_names);

  // Touching one file (a new modification time) makes the cache stale.
  const std::string touched = root_ + "/1/101.png";
  fs::last_write_time(touched,
                      fs::last_write_time(touched) + std::chrono::seconds(5));
  absl::StatusOr<Dataset> third = Load();
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->images_decoded, 40);
  // ...and the stale cache file is replaced, not kept beside the new one.
  EXPECT_EQ(CacheFiles(dir_ + "/cache").size(), 1u);

  // So does another input size (a cache of its own).
  LoadOptions bigger = Options();
  bigger.input = {8, 8, 3};
  absl::StatusOr<Dataset> resized = LoadDataset(Source(), dir_, bigger);
  ASSERT_TRUE(resized.ok()) << resized.status();
  EXPECT_EQ(resized->images_decoded, 40);
  EXPECT_EQ(resized->shape, (Shape{8, 8, 3}));
  EXPECT_EQ(resized->pixels.size(), 40u * 8 * 8 * 3);
  EXPECT_EQ(CacheFiles(dir_ + "/cache").size(), 2u);
}

// Caches of other folders (a worker's finished jobs) go once no run has
// read them for 14 days; a read counts as a use.
TEST_F(ImageFolder, CachesUnusedForTwoWeeksAreRemoved) {
  for (int i = 0; i < 4; ++i) Png(absl::StrCat(i % 2, "/", i, ".png"), i);
  const std::string cache = dir_ + "/cache";
  fs::create_directories(cache);
  const auto now = fs::file_time_type::clock::now();
  const std::string old_one = cache + "/images-0000000000000000-0.dlbimg";
  const std::string recent = cache + "/images-1111111111111111-1.dlbimg";
  const std::string other = cache + "/tuning-0123.txt";
  for (const std::string& p : {old_one, recent, other}) {
    WriteBytes(p, "x");
    fs::last_write_time(p, now - std::chrono::hours(24 * 15));
  }
  fs::last_write_time(recent, now - std::chrono::hours(24));
  ASSERT_TRUE(Load().ok());
  EXPECT_FALSE(fs::exists(old_one));
  EXPECT_TRUE(fs::exists(recent));
  EXPECT_TRUE(fs::exists(other));  // not ours

  // Reading our own cache marks it used.
  std::string ours;
  for (const std::string& name : CacheFiles(cache)) {
    if (name != fs::path(recent).filename() &&
        name != fs::path(other).filename()) {
      ours = cache + "/" + name;
    }
  }
  ASSERT_FALSE(ours.empty());
  fs::last_write_time(ours, now - std::chrono::hours(24 * 20));
  absl::StatusOr<Dataset> cached = Load();
  ASSERT_TRUE(cached.ok());
  EXPECT_EQ(cached->images_decoded, 0);
  EXPECT_GT(fs::last_write_time(ours), now - std::chrono::hours(1));
}

TEST_F(ImageFolder, ADamagedCacheIsDecodedAgain) {
  for (int i = 0; i < 6; ++i) Png(absl::StrCat(i % 2, "/", i, ".png"), i);
  ASSERT_TRUE(Load().ok());
  const std::vector<std::string> files = CacheFiles(dir_ + "/cache");
  ASSERT_EQ(files.size(), 1u);
  const std::string cache = dir_ + "/cache/" + files[0];
  fs::resize_file(cache, fs::file_size(cache) - 10);
  absl::StatusOr<Dataset> again = Load();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->images_decoded, 6);
  EXPECT_THAT(said_, HasSubstr("Not using the decoded cache"));
  EXPECT_THAT(said_, HasSubstr("is damaged"));
  absl::StatusOr<Dataset> cached = Load();
  ASSERT_TRUE(cached.ok());
  EXPECT_EQ(cached->images_decoded, 0);
}

TEST_F(ImageFolder, AnUnwritableCacheFolderFallsBackToTheJobsFolder) {
  for (int i = 0; i < 4; ++i) Png(absl::StrCat(i % 2, "/", i, ".png"), i);
  WriteBytes(dir_ + "/a-file", "x");
  LoadOptions o = Options();
  o.cache_dir = dir_ + "/a-file/cache";  // under a file: cannot be made
  ASSERT_TRUE(LoadDataset(Source(), dir_, o).ok());
  EXPECT_EQ(CacheFiles(dir_ + "/.dlbatch-cache").size(), 1u);
  absl::StatusOr<Dataset> again = LoadDataset(Source(), dir_, o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->images_decoded, 0);

  // Where neither can be written: decoded, and said.
  std::string said;
  o.say = [&](const std::string& line) { said += line + "\n"; };
  absl::StatusOr<Dataset> uncached = LoadDataset(Source(), dir_ + "/a-file", o);
  ASSERT_TRUE(uncached.ok()) << uncached.status();
  EXPECT_EQ(uncached->count, 4);
  EXPECT_THAT(said, HasSubstr("Could not cache the decoded images"));
}

TEST_F(ImageFolder, ABadImageIsAnErrorNamingItOrSkippedAndCounted) {
  for (int i = 0; i < 6; ++i) Png(absl::StrCat(i % 2, "/", i, ".png"), i);
  const std::vector<uint8_t> px = Pattern(4, 4, 3, 9);
  const std::string jpeg = testing::EncodeJpeg(4, 4, 3, px.data());
  WriteBytes(root_ + "/1/broken.jpg", jpeg.substr(0, jpeg.size() / 2));
  absl::StatusOr<Dataset> refused = Load();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("image '" + root_ +
                        "/1/broken.jpg': not a readable "
                        "JPEG (Premature end of JPEG file)"));
  EXPECT_THAT(refused.status().message(),
              HasSubstr("add skip_bad_images: true"));

  absl::StatusOr<Dataset> skipped = Load(/*skip=*/true);
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_EQ(skipped->count, 6);
  EXPECT_EQ(skipped->images_skipped, 1);
  EXPECT_EQ(skipped->images_decoded, 0);  // the refused run cached them
  EXPECT_THAT(said_, HasSubstr("Skipped 1 bad image of " + root_ +
                               " (skip_bad_images): 1/broken.jpg: not a "
                               "readable JPEG"));
  // The cache remembers the bad image: without skip_bad_images, refused.
  absl::StatusOr<Dataset> again = Load();
  ASSERT_FALSE(again.ok());
  EXPECT_THAT(again.status().message(), HasSubstr("1/broken.jpg"));
}

// A writer killed with SIGKILL in the middle of writing the cache leaves
// no cache file (only its temporary one), and the next load decodes and
// caches as if there had been none. The child is stopped mid-write by a
// file size limit whose signal it answers by killing itself with SIGKILL.
TEST_F(ImageFolder, AWriterKilledMidWriteLeavesNoCache) {
  for (int i = 0; i < 200; ++i) Png(absl::StrCat(i % 2, "/", i, ".png"), i);
  LoadOptions o = Options();
  o.input = {64, 64, 3};  // 2.4 MB of pixels: the limit cuts them short
  fs::create_directories(o.cache_dir);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    signal(SIGXFSZ, [](int) { raise(SIGKILL); });
    rlimit limit{1 << 20, 1 << 20};
    setrlimit(RLIMIT_FSIZE, &limit);
    LoadOptions quiet = o;
    quiet.say = nullptr;
    (void)LoadDataset(Source(), dir_, quiet);
    _exit(0);  // not reached: the write passes 1 MB
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << status;
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  const std::vector<std::string> left = CacheFiles(o.cache_dir);
  ASSERT_EQ(left.size(), 1u);
  EXPECT_THAT(left[0], HasSubstr(".dlbimg.tmp-"));

  said_.clear();
  absl::StatusOr<Dataset> after = LoadDataset(Source(), dir_, o);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->images_decoded, 200);
  EXPECT_THAT(said_, HasSubstr("Cached them in"));
  absl::StatusOr<Dataset> cached = LoadDataset(Source(), dir_, o);
  ASSERT_TRUE(cached.ok());
  EXPECT_EQ(cached->images_decoded, 0);
  EXPECT_EQ(Str(cached->pixels), Str(after->pixels));
}

// A write that fails (a full disk, here a file size limit with its signal
// ignored) leaves no temporary file, and the run goes on uncached.
TEST_F(ImageFolder, AFailedCacheWriteCleansUpAndGoesOn) {
  for (int i = 0; i < 200; ++i) Png(absl::StrCat(i % 2, "/", i, ".png"), i);
  LoadOptions o = Options();
  o.input = {64, 64, 3};
  fs::create_directories(o.cache_dir);
  fs::create_directories(dir_ + "/.dlbatch-cache");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    signal(SIGXFSZ, SIG_IGN);
    rlimit limit{1 << 20, 1 << 20};
    setrlimit(RLIMIT_FSIZE, &limit);
    std::string said;
    LoadOptions counted = o;
    counted.say = [&](const std::string& line) { said += line; };
    absl::StatusOr<Dataset> d = LoadDataset(Source(), dir_, counted);
    const bool ok = d.ok() && d->count == 200 &&
                    said.find("Could not cache") != std::string::npos;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(CacheFiles(o.cache_dir).empty());
  EXPECT_TRUE(CacheFiles(dir_ + "/.dlbatch-cache").empty());
}

TEST_F(ImageFolder, ImagesOfOtherSizesAndKindsBecomeTheInput) {
  const std::vector<uint8_t> rgb = Pattern(8, 6, 3, 5);
  WriteBytes(root_ + "/a/x.png", testing::EncodePng(8, 6, 3, rgb.data()));
  WriteBytes(root_ + "/b/y.jpg", testing::EncodeJpeg(8, 6, 3, rgb.data()));
  absl::StatusOr<Dataset> d = Load();
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->count, 2);
  EXPECT_EQ(d->shape, (Shape{4, 4, 1}));
  absl::StatusOr<Image> grey =
      DecodeImage(testing::EncodePng(8, 6, 3, rgb.data()), 1);
  ASSERT_TRUE(grey.ok());
  std::vector<uint8_t> expected(16);
  ResizeBilinear(*grey, 4, 4, expected.data());
  EXPECT_TRUE(std::equal(expected.begin(), expected.end(), d->pixels.begin()));
}

TEST_F(ImageFolder, DecodingIsTheSameOnAnyNumberOfThreads) {
  for (int i = 0; i < 300; ++i) Png(absl::StrCat(i % 5, "/", i, ".png"), i);
  absl::StatusOr<FolderListing> l = ListImageFolder(root_);
  ASSERT_TRUE(l.ok());
  const DecodedFolder one = DecodeFolder(*l, {4, 4, 1}, 1);
  const DecodedFolder four = DecodeFolder(*l, {4, 4, 1}, 4);
  EXPECT_EQ(Str(one.data.pixels), Str(four.data.pixels));
  EXPECT_EQ(one.data.labels, four.data.labels);
}

// --- The validation split ---

TEST(SplitEachLabel, StratifiedDeterministicAndOrderKeeping) {
  Dataset data;
  data.shape = {1, 1, 1};
  data.num_classes = 3;
  data.class_names = {"a", "b", "c"};
  // 100 of class 0, 50 of class 1, 10 of class 2; pixel = index % 256.
  for (int i = 0; i < 160; ++i) {
    data.labels.push_back(i < 100 ? 0 : i < 150 ? 1 : 2);
    data.pixels.push_back(static_cast<uint8_t>(i));
  }
  data.count = 160;
  auto [train, validation] = SplitEachLabel(data, 0.1, 7);
  std::map<int, int> per_class;
  for (int32_t l : validation.labels) ++per_class[l];
  EXPECT_EQ(per_class[0], 10);
  EXPECT_EQ(per_class[1], 5);
  EXPECT_EQ(per_class[2], 1);
  EXPECT_EQ(train.count + validation.count, 160);
  EXPECT_EQ(validation.class_names, data.class_names);
  // Disjoint, and each in the data set's order.
  std::vector<int> seen(160, 0);
  for (const Dataset* part : {&train, &validation}) {
    for (int64_t i = 0; i < part->count; ++i) {
      ++seen[part->pixels[i]];
      if (i > 0) {
        EXPECT_LT(part->pixels[i - 1], part->pixels[i]);
      }
    }
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 160);
  // From the seed: the same again, another with another seed.
  auto [train2, validation2] = SplitEachLabel(data, 0.1, 7);
  EXPECT_EQ(validation2.pixels, validation.pixels);
  auto [train3, validation3] = SplitEachLabel(data, 0.1, 8);
  EXPECT_NE(validation3.pixels, validation.pixels);
  // A class of one keeps its sample for training.
  Dataset tiny = data;
  tiny.labels = {0, 1};
  tiny.pixels = {0, 1};
  tiny.count = 2;
  EXPECT_EQ(SplitEachLabel(tiny, 0.9, 1).second.count, 0);
}

}  // namespace
}  // namespace dlbatch::trainer
