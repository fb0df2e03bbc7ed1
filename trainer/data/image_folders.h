// Data sets of image files in class folders (format: folders), MATLAB's
// imageDatastore(folder, IncludeSubfolders=true, LabelSource="foldernames"):
// listing the folder, decoding it on several threads, and the decoded
// cache that later runs read instead. LoadDataset (data.h) puts them
// together; the parts are here for tests and the benchmark.
#ifndef DLBATCH_TRAINER_DATA_IMAGE_FOLDERS_H_
#define DLBATCH_TRAINER_DATA_IMAGE_FOLDERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainer/data/data.h"
#include "trainer/shape.h"

namespace dlbatch::trainer {

// One image file of a folder.
struct FolderFile {
  std::string path;  // from the folder: "<class>/<within the class>"
  int label = 0;
  int64_t size = 0;
  int64_t mtime_ns = 0;
};

struct FolderListing {
  std::string root;       // the folder, as resolved (for messages)
  std::string canonical;  // its absolute path, links resolved (for keys)
  std::vector<std::string> class_names;  // label i is class_names[i]
  std::vector<FolderFile> files;         // in sample order
  int64_t ignored = 0;  // files of other kinds than .png, .jpg, .jpeg
};

// Lists `root`: each subfolder is a class (names sorted bytewise), and
// every .png, .jpg or .jpeg file below it, at any depth, is one of its
// samples. Names beginning with '.' are left out. Sample order: by the
// path within the class folder, then by class, so that a data set written
// out as <class>/<index>.png keeps its own order. Where `classes` is not
// empty (a validation or test set takes the training set's classes) the
// labels are positions in it, and a folder of another class is an error.
// An image directly in `root`, a class without images, or no classes at
// all is an error saying what to change. The classes are listed on up to
// `threads` threads.
absl::StatusOr<FolderListing> ListImageFolder(
    const std::string& root, const std::vector<std::string>& classes = {},
    int threads = 1);

// An image that did not decode: its path from the folder, and why.
struct BadImage {
  std::string path;
  std::string problem;
};

// A decoded folder: the images that decoded, in sample order, and those
// that did not.
struct DecodedFolder {
  Dataset data;  // shape, count, labels, pixels, class_names, num_classes
  std::vector<BadImage> bad;
};

// Decodes every file of `listing` to `shape` (DecodeImageTo) on `threads`
// threads (at least one). The result does not depend on the threads.
DecodedFolder DecodeFolder(const FolderListing& listing, const Shape& shape,
                           int threads);

// The decoded cache's key for `listing` decoded to `shape`: sha256 over the
// folder, the classes, every file's path, label, size and modification
// time, and the shape. Any change to the folder's files changes it.
std::string FolderCacheKey(const FolderListing& listing, const Shape& shape);

// The cache file's name for it inside a cache folder:
// "images-<folder and shape>-<key>.dlbimg"; files of the same folder and
// shape but another key are stale.
std::string FolderCacheName(const FolderListing& listing, const Shape& shape,
                            const std::string& key);

// Writes `decoded` to `path` with its key, atomically (a temporary file,
// fsync, rename): a run killed mid-write leaves no cache file, never a
// partial one. Then removes the stale cache files of the same folder and
// shape, and those of any folder that no run has read for 14 days.
absl::Status WriteFolderCache(const std::string& path, const std::string& key,
                              const DecodedFolder& decoded);

// Reads a cache file written for `key`, and marks it used (its mtime).
// NotFound where there is none;
// DataLoss where it is damaged or of another key (the caller decodes
// again).
absl::StatusOr<DecodedFolder> ReadFolderCache(const std::string& path,
                                              const std::string& key);

// LoadDataset's format folders: `root` is source.path() resolved from
// `base_dir`. Reads the cache where it holds the folder as it is now;
// otherwise decodes it and writes the cache (LoadOptions::cache_dir). A
// bad image is an error naming it, or with source.skip_bad_images() left
// out and counted (Dataset::images_skipped, and in the diary).
absl::StatusOr<Dataset> LoadImageFolder(const v1::DataSource& source,
                                        const std::string& root,
                                        const std::string& base_dir,
                                        const LoadOptions& options);

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_DATA_IMAGE_FOLDERS_H_
