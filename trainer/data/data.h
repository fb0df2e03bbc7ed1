// Labelled image data for the trainer: reading the files a job names, the
// sample order of each epoch, and a loader that prepares the next batches
// on its own thread while the current one trains.
#ifndef DLBATCH_TRAINER_DATA_DATA_H_
#define DLBATCH_TRAINER_DATA_DATA_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "dlbatch/v1/job.pb.h"
#include "trainer/placement.h"
#include "trainer/shape.h"

namespace dlbatch::trainer {

// A data set held in memory: 8-bit pixels, NHWC, and class labels.
struct Dataset {
  std::string source;  // the file(s) it came from, for messages
  Shape shape;
  int64_t count = 0;
  int num_classes = 0;          // largest label + 1
  std::vector<uint8_t> pixels;  // count * shape.size()
  std::vector<int32_t> labels;  // count
  // Format folders: label i's name (otherwise empty), and how the images
  // were read: decoded now (0 where the decoded cache had them), and bad
  // ones left out (skip_bad_images).
  std::vector<std::string> class_names;
  int64_t images_decoded = 0;
  int64_t images_skipped = 0;
};

// What reading a folders source needs besides the source.
struct LoadOptions {
  Shape input;      // the network's input: what every image becomes
  int threads = 1;  // decoding threads
  // Where decoded folders are cached ($XDG_CACHE_HOME/dlbatch); where it
  // is empty or cannot be written, base_dir/.dlbatch-cache; where neither
  // can, the images are decoded on every run.
  std::string cache_dir;
  // The training set's classes, which a validation or test folder's labels
  // refer to; empty for the training set itself.
  std::vector<std::string> class_names;
  // Where the diary's lines go (what was decoded, cached, skipped); may be
  // empty.
  std::function<void(const std::string&)> say;
};

// Reads `source` (format idx: gzipped or raw IDX image and label files, as
// MNIST and Fashion-MNIST ship them; format cifar10: the binary batch
// files; format folders: image files in class folders, image_folders.h).
// Relative paths are taken from `base_dir`. A missing, corrupt or
// truncated file, or images and labels of different counts, is an error
// naming the file and what is wrong with it.
absl::StatusOr<Dataset> LoadDataset(const v1::DataSource& source,
                                    const std::string& base_dir,
                                    const LoadOptions& options = {});

// MATLAB's splitEachLabel: of each class's samples, round(fraction * n)
// (but at most n - 1) chosen from `seed` go to the second set, the rest to
// the first; each keeps the data set's order. A pure function of its
// arguments. REQUIRES: 0 <= fraction < 1.
std::pair<Dataset, Dataset> SplitEachLabel(const Dataset& data, double fraction,
                                           uint64_t seed);

// Pixels are scaled to [0, 1]; with per-channel normalisation they are then
// (x - mean[c]) / std[c]. Empty vectors: scaling only.
struct Normalization {
  std::vector<float> mean;
  std::vector<float> std;
};
// Per-channel mean and standard deviation of the scaled pixels.
Normalization ComputeNormalization(const Dataset& data);
// What a pixel value v of channel c becomes: v * scale[c] + bias[c] (one
// multiply, then one add, each rounded), scale[c] at [c] and bias[c] at
// [channels + c]; a fill position (translation, crop padding) is bias[c].
// What Backend::PrepareImages takes.
std::vector<float> ScaleAndBias(const Normalization& norm, int channels);

// The order in which an epoch visits the samples: `shuffle` is "never"
// (0..count-1), "once" (one permutation, epoch 0's, for every epoch) or
// "every-epoch". A pure function of its arguments, so that every rank
// computes the same order and a resumed run continues it exactly.
std::vector<int64_t> EpochOrder(const std::string& shuffle, uint64_t seed,
                                int64_t epoch, int64_t count);

// Whether `aug` changes any sample: where it does not, a batch asked to be
// augmented is prepared as it is (and, as bytes, carries no placements).
bool AnyAugmentation(const v1::Augmentation& aug);

// A batch to prepare: which samples, and whether to augment them.
struct BatchRequest {
  int64_t epoch = 0;
  int64_t iteration = 0;  // the consumer's counter, carried through
  std::vector<int64_t> indices;
  bool augment = false;
};

// A prepared batch, host memory: images scaled/normalised (and augmented
// where asked), NHWC floats; or, from a loader whose Options::bytes is set,
// the samples' bytes as the data set holds them and where augmentation puts
// them, for Backend::PrepareImages to finish on the device.
struct Batch {
  int64_t epoch = 0;
  int64_t iteration = 0;
  int n = 0;
  std::vector<float> images;    // n * shape.size(); empty with bytes
  std::vector<int32_t> labels;  // n
  // Options::bytes only: n * shape.size() bytes, and n placements where
  // the batch is augmented (none where it is not: the samples stay as
  // they are).
  std::vector<uint8_t> pixels;
  std::vector<SamplePlacement> placements;
};

// Prepares the requests it is given, in order, on its own thread, up to
// `depth` batches ahead of Next().
//
// Augmentation (MATLAB's imageDataAugmenter): random X/Y reflection,
// random X/Y translation by up to +-N pixels (zero fill), random crop after
// zero padding by N pixels. A sample's draws are a pure function of (seed,
// epoch, sample index): the same on every rank, whichever rank loads it,
// and again after a resume.
//
// Thread safety: Push and Next may be called from different threads.
class BatchLoader {
 public:
  struct Options {
    v1::Augmentation augmentation;
    Normalization normalization;
    uint64_t seed = 0;
    int depth = 3;
    // Hand over bytes and placements instead of floats (Batch): a GPU
    // converts and augments on the device, and copies a quarter of the
    // bytes to it.
    bool bytes = false;
  };
  // `data` must outlive the loader.
  static std::unique_ptr<BatchLoader> Start(const Dataset* data,
                                            Options options);
  virtual ~BatchLoader() = default;  // stops the thread

  // Queues a request; never blocks.
  virtual void Push(BatchRequest request) = 0;
  // The next prepared batch, in Push order; blocks until it is ready.
  // nullopt once Close() was called and every request is served.
  virtual std::optional<Batch> Next() = 0;
  virtual void Close() = 0;
};

// Prepares one batch on the calling thread (what the loader's thread runs).
Batch PrepareBatch(const Dataset& data, const BatchLoader::Options& options,
                   const BatchRequest& request);

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_DATA_DATA_H_
