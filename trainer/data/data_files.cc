// Reading the data files a job names: IDX (MNIST, Fashion-MNIST; gzipped
// or raw) and CIFAR-10's binary batches.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "trainer/data/data.h"
#include "trainer/data/image_folders.h"

namespace dlbatch::trainer {
namespace {

// IDX magic numbers: two zero bytes, the element type (0x08: unsigned
// byte), the number of dimensions.
constexpr uint32_t kIdxImagesMagic = 0x00000803;  // 2051
constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // 2049
constexpr int kIdxImagesHeader = 16;
constexpr int kIdxLabelsHeader = 8;

// CIFAR-10 binary records: a label byte, then 32x32 red, green and blue
// planes, each row-major.
constexpr int kCifarSide = 32;
constexpr int kCifarPlane = kCifarSide * kCifarSide;
constexpr int kCifarRecord = 1 + 3 * kCifarPlane;  // 3073
constexpr int kCifarClasses = 10;

// The largest single gzread (it takes an unsigned int and returns an int).
constexpr int64_t kMaxReadChunk = int64_t{1} << 30;
// zlib's input buffer: big reads and big inflate calls, so that 60,000
// Fashion-MNIST images decompress in a small fraction of a second.
constexpr unsigned kGzipBufferBytes = 1u << 20;

std::string Resolve(const std::string& given, const std::string& base_dir) {
  if (given.empty() || given.front() == '/' || base_dir.empty()) return given;
  if (base_dir.back() == '/') return base_dir + given;
  return absl::StrCat(base_dir, "/", given);
}

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

// One data file opened for sequential reading. zlib's gzread inflates a
// gzipped file and passes a raw one through unchanged, so both read alike.
class DataFileReader {
 public:
  // `role` names the file in messages ("images file"); `given` is the path
  // as the job wrote it.
  static absl::StatusOr<DataFileReader> Open(std::string role,
                                             const std::string& given,
                                             const std::string& base_dir) {
    DataFileReader r(std::move(role), given, Resolve(given, base_dir));
    if (given.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the data source names no ", r.role_, "; add its path to the job"));
    }
    const int fd = ::open(r.path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == ENOENT || err == ENOTDIR) {
        std::string where =
            r.path_ == given ? std::string()
                             : absl::StrCat(" (relative paths are taken from '",
                                            base_dir, "')");
        return absl::NotFoundError(absl::StrCat(
            r.Describe(), ": no such file", where,
            "; check the path in the job's data section and that the file "
            "is attached to the job or present on the worker"));
      }
      return r.OsError(err, "cannot open it");
    }
    struct stat st;
    if (::fstat(fd, &st) == 0) {
      if (S_ISDIR(st.st_mode)) {
        ::close(fd);
        return r.Error(absl::InvalidArgumentError,
                       "is a directory; name the file itself");
      }
      r.disk_size_ = st.st_size;
    }
    r.file_.reset(gzdopen(fd, "rb"));
    if (r.file_ == nullptr) {
      ::close(fd);
      return r.Error(absl::ResourceExhaustedError,
                     "cannot set up decompression (out of memory)");
    }
    gzbuffer(r.file_.get(), kGzipBufferBytes);
    return r;
  }

  // Reads up to `n` bytes into `dst`; fewer only where the data ends, or
  // where gzip data ends early (then truncated() is true).
  absl::StatusOr<int64_t> Read(void* dst, int64_t n) {
    int64_t got = 0;
    auto* out = static_cast<uint8_t*>(dst);
    while (got < n) {
      const int64_t chunk = std::min(n - got, kMaxReadChunk);
      const int r =
          gzread(file_.get(), out + got, static_cast<unsigned>(chunk));
      if (r < 0) return ZlibError();
      if (r == 0) {
        int errnum = Z_OK;
        gzerror(file_.get(), &errnum);
        if (errnum == Z_BUF_ERROR) {
          truncated_ = true;
        } else if (errnum != Z_OK) {
          return ZlibError();
        }
        break;
      }
      got += r;
    }
    return got;
  }

  // Whether gzip data ended before its end marker and checksum.
  bool truncated() const { return truncated_; }
  absl::Status TruncatedError() const {
    return Error(absl::DataLossError,
                 "truncated: the gzip data ends early; download or copy the "
                 "file again");
  }

  // Reads the whole remaining file.
  absl::StatusOr<std::vector<uint8_t>> ReadAll() {
    std::vector<uint8_t> data;
    // A raw file is read in one call; a gzipped one grows geometrically.
    int64_t chunk = std::max<int64_t>(disk_size_ + 1, 1 << 20);
    for (;;) {
      const size_t old = data.size();
      data.resize(old + chunk);
      absl::StatusOr<int64_t> got = Read(data.data() + old, chunk);
      if (!got.ok()) return got.status();
      if (truncated()) return TruncatedError();
      data.resize(old + *got);
      if (*got < chunk) return data;
      chunk =
          std::min<int64_t>(static_cast<int64_t>(data.size()), kMaxReadChunk);
    }
  }

  // The most data bytes the file can still hold after `consumed` bytes:
  // exact for a raw file; for a gzipped one, what deflate's best ratio
  // (1032:1) allows. Checked before allocating what a header announces.
  int64_t MaxRemaining(int64_t consumed) {
    if (gzdirect(file_.get()) == 1) {
      return std::max<int64_t>(0, disk_size_ - consumed);
    }
    return disk_size_ * 1032 + (int64_t{1} << 16);
  }
  bool gzipped() { return gzdirect(file_.get()) == 0; }

  const std::string& path() const { return path_; }

  // "images file '/jobs/7/data/x.gz' (given as 'data/x.gz')".
  std::string Describe() const {
    std::string s = absl::StrCat(role_, " '", path_, "'");
    if (given_ != path_) absl::StrAppend(&s, " (given as '", given_, "')");
    return s;
  }

  absl::Status Error(absl::Status (*make)(absl::string_view),
                     absl::string_view what) const {
    return make(absl::StrCat(Describe(), ": ", what));
  }
  absl::Status Invalid(absl::string_view what) const {
    return Error(absl::InvalidArgumentError, what);
  }

 private:
  DataFileReader(std::string role, std::string given, std::string path)
      : role_(std::move(role)),
        given_(std::move(given)),
        path_(std::move(path)) {}

  absl::Status OsError(int err, absl::string_view what) const {
    const bool denied = err == EACCES || err == EPERM;
    return Error(denied ? absl::PermissionDeniedError : absl::InternalError,
                 absl::StrCat(what, " (", std::strerror(err), ")",
                              denied ? "; make it readable by the job" : ""));
  }

  absl::Status ZlibError() {
    int errnum = Z_OK;
    std::string msg = gzerror(file_.get(), &errnum);
    // zlib prefixes the file's name, "<fd:N>" for an opened descriptor.
    if (absl::StartsWith(msg, "<fd:") && msg.find(": ") != std::string::npos) {
      msg = msg.substr(msg.find(": ") + 2);
    }
    switch (errnum) {
      case Z_ERRNO:
        return OsError(errno, "cannot read it");
      case Z_MEM_ERROR:
        return Error(absl::ResourceExhaustedError,
                     "out of memory while decompressing it");
      default:
        return Error(absl::DataLossError,
                     absl::StrCat("the gzip data is corrupt (", msg,
                                  "); download or copy the file again"));
    }
  }

  std::string role_;
  std::string given_;
  std::string path_;
  int64_t disk_size_ = 0;  // compressed or raw, as stored
  bool truncated_ = false;
  std::unique_ptr<gzFile_s, GzCloser> file_;
};

// Reads an IDX header of `header_bytes` and checks its magic number.
absl::Status ReadIdxHeader(DataFileReader& file, uint32_t magic,
                           absl::string_view kind, uint8_t* header,
                           int header_bytes) {
  absl::StatusOr<int64_t> got = file.Read(header, header_bytes);
  if (!got.ok()) return got.status();
  if (file.truncated() && *got < header_bytes) return file.TruncatedError();
  if (*got < 4) {
    return file.Invalid(absl::StrCat("is too short to be an IDX file (", *got,
                                     " bytes); expected an IDX ", kind,
                                     " file as MNIST ships them"));
  }
  const uint32_t found = BigEndian32(header);
  if (found != magic) {
    std::string hint;
    if (found == kIdxImagesMagic || found == kIdxLabelsMagic) {
      hint = absl::StrCat("; this is an IDX ",
                          found == kIdxImagesMagic ? "images" : "labels",
                          " file: are images: and labels: swapped?");
    } else if (header[0] == 0x1f && header[1] == 0x8b) {
      hint = "; it is gzipped twice: gunzip it once";
    } else {
      hint = "; is it an IDX file at all?";
    }
    return file.Invalid(absl::StrCat("bad magic number ", found, " (expected ",
                                     magic, " for IDX ", kind,
                                     " of unsigned bytes)", hint));
  }
  if (*got < header_bytes) {
    return file.Error(absl::DataLossError,
                      absl::StrCat("truncated: the IDX header needs ",
                                   header_bytes, " bytes, the file has ", *got,
                                   "; download or copy it again"));
  }
  return absl::OkStatus();
}

// Reads exactly `n` bytes of data after a header of `header_bytes` into
// `dst` (resized to n), and checks that nothing follows them (which also
// makes zlib verify the gzip checksum).
absl::Status ReadIdxBody(DataFileReader& file, int header_bytes, int64_t n,
                         absl::string_view what, std::vector<uint8_t>& dst) {
  // A damaged header must not make us allocate what the file cannot hold.
  const int64_t possible = file.MaxRemaining(header_bytes);
  if (n > possible) {
    if (!file.gzipped()) {
      return file.Error(
          absl::DataLossError,
          absl::StrCat("truncated: expected ", n, " bytes of data for the ",
                       what, " the header announces, got ", possible,
                       "; download or copy the file again"));
    }
    return file.Error(
        absl::DataLossError,
        absl::StrCat("truncated or a damaged header: it announces ", what, " (",
                     n,
                     " bytes), more than its compressed size can hold; "
                     "download or copy the file again"));
  }
  dst.resize(n);
  absl::StatusOr<int64_t> got = file.Read(dst.data(), n);
  if (!got.ok()) return got.status();
  if (*got < n) {
    return file.Error(
        absl::DataLossError,
        absl::StrCat("truncated: expected ", n, " bytes of data for the ", what,
                     " the header announces, got ", *got,
                     file.truncated() ? " (the gzip data ends early)" : "",
                     "; download or copy the file again"));
  }
  uint8_t extra[256];
  absl::StatusOr<int64_t> more = file.Read(extra, sizeof(extra));
  if (!more.ok()) return more.status();
  if (file.truncated()) return file.TruncatedError();
  if (*more > 0) {
    return file.Invalid(absl::StrCat(
        "has more data than the ", what, " its header announces (", n,
        " bytes); the header's count is wrong or the file was damaged"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Dataset> LoadIdx(const v1::DataSource& source,
                                const std::string& base_dir) {
  absl::StatusOr<DataFileReader> images =
      DataFileReader::Open("images file", source.images(), base_dir);
  if (!images.ok()) return images.status();
  absl::StatusOr<DataFileReader> labels =
      DataFileReader::Open("labels file", source.labels(), base_dir);
  if (!labels.ok()) return labels.status();

  Dataset data;
  data.source = absl::StrCat(images->path(), ", ", labels->path());

  uint8_t header[kIdxImagesHeader];
  absl::Status s = ReadIdxHeader(*images, kIdxImagesMagic, "images", header,
                                 kIdxImagesHeader);
  if (!s.ok()) return s;
  const int64_t count = BigEndian32(header + 4);
  const uint32_t rows = BigEndian32(header + 8);
  const uint32_t cols = BigEndian32(header + 12);
  if (count == 0 || rows == 0 || cols == 0 || rows > 65536 || cols > 65536) {
    return images->Invalid(absl::StrCat(
        "the header announces ", count, " images of ", rows, "x", cols,
        " pixels; expected at least one image of 1x1 to 65536x65536"));
  }
  data.shape = Shape{static_cast<int>(rows), static_cast<int>(cols), 1};
  data.count = count;
  if (count > (int64_t{1} << 50) / data.shape.size()) {
    return images->Invalid(
        absl::StrCat("the header announces ", count, " images of ", rows, "x",
                     cols, " pixels, over a petabyte; the header is damaged"));
  }
  const int64_t pixel_bytes = count * data.shape.size();
  s = ReadIdxBody(*images, kIdxImagesHeader, pixel_bytes,
                  absl::StrCat(count, " images of ", rows, "x", cols),
                  data.pixels);
  if (!s.ok()) return s;

  s = ReadIdxHeader(*labels, kIdxLabelsMagic, "labels", header,
                    kIdxLabelsHeader);
  if (!s.ok()) return s;
  const int64_t label_count = BigEndian32(header + 4);
  if (label_count != count) {
    return absl::InvalidArgumentError(absl::StrCat(
        images->Describe(), " holds ", count, " images but ",
        labels->Describe(), " holds ", label_count,
        " labels; give the labels file of the same set (train with train, "
        "t10k with t10k)"));
  }
  std::vector<uint8_t> raw_labels;
  s = ReadIdxBody(*labels, kIdxLabelsHeader, count,
                  absl::StrCat(count, " labels"), raw_labels);
  if (!s.ok()) return s;
  data.labels.assign(raw_labels.begin(), raw_labels.end());
  data.num_classes =
      *std::max_element(raw_labels.begin(), raw_labels.end()) + 1;
  return data;
}

absl::StatusOr<Dataset> LoadCifar10(const v1::DataSource& source,
                                    const std::string& base_dir) {
  if (source.files_size() == 0) {
    return absl::InvalidArgumentError(
        "a cifar10 data source names no files; list its batch files under "
        "files:");
  }
  Dataset data;
  data.shape = Shape{kCifarSide, kCifarSide, 3};
  std::vector<std::string> paths;
  int max_label = 0;
  for (const std::string& given : source.files()) {
    absl::StatusOr<DataFileReader> file =
        DataFileReader::Open("CIFAR-10 batch file", given, base_dir);
    if (!file.ok()) return file.status();
    paths.push_back(file->path());
    absl::StatusOr<std::vector<uint8_t>> bytes = file->ReadAll();
    if (!bytes.ok()) return bytes.status();
    const int64_t size = static_cast<int64_t>(bytes->size());
    if (size == 0) {
      return file->Invalid("is empty; expected CIFAR-10 records of 3073 bytes");
    }
    if (size % kCifarRecord != 0) {
      return file->Invalid(absl::StrCat(
          "its size, ", size, " bytes, is not a multiple of ", kCifarRecord,
          " (one label byte and 32x32x3 pixels per record): it is truncated "
          "or not a CIFAR-10 binary batch (the Python pickles and CIFAR-100 "
          "files are not read)"));
    }
    const int64_t records = size / kCifarRecord;
    const int64_t first = data.count;
    data.count += records;
    data.labels.resize(data.count);
    data.pixels.resize(data.count * data.shape.size());
    for (int64_t r = 0; r < records; ++r) {
      const uint8_t* rec = bytes->data() + r * kCifarRecord;
      if (rec[0] >= kCifarClasses) {
        return file->Invalid(absl::StrCat(
            "record ", r, " has label ", rec[0], "; CIFAR-10 labels are 0..",
            kCifarClasses - 1, " (is this a CIFAR-100 file?)"));
      }
      data.labels[first + r] = rec[0];
      max_label = std::max<int>(max_label, rec[0]);
      const uint8_t* red = rec + 1;
      const uint8_t* green = red + kCifarPlane;
      const uint8_t* blue = green + kCifarPlane;
      uint8_t* out = data.pixels.data() + (first + r) * data.shape.size();
      for (int p = 0; p < kCifarPlane; ++p) {
        out[3 * p] = red[p];
        out[3 * p + 1] = green[p];
        out[3 * p + 2] = blue[p];
      }
    }
  }
  data.source = absl::StrJoin(paths, ", ");
  data.num_classes = max_label + 1;
  return data;
}

}  // namespace

absl::StatusOr<Dataset> LoadDataset(const v1::DataSource& source,
                                    const std::string& base_dir,
                                    const LoadOptions& options) {
  if (source.format() == "idx") return LoadIdx(source, base_dir);
  if (source.format() == "cifar10") return LoadCifar10(source, base_dir);
  if (source.format() == "folders") {
    return LoadImageFolder(source, Resolve(source.path(), base_dir), base_dir,
                           options);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", source.format(),
                   "' is not a data format; use idx, cifar10 or folders"));
}

}  // namespace dlbatch::trainer
