// Image folders (format: folders) against the IDX files they were written
// from: Fashion-MNIST's 60,000 training images written out as PNG files in
// one folder per class (as MATLAB's examples write CIFAR-10), then
//   - writing them (libpng), for scale;
//   - the first load: listing and decoding every PNG (images/s), which
//     writes the decoded cache;
//   - a cached load, against reading the IDX file;
//   - with --train, dlbatch-train for one epoch of a small network (conv 8,
//     batchnorm, pool, fc: the data's share of the time is large) from the
//     folder on a first run (decoding), then from the IDX files and the
//     cached folder alternately: wall time and training images/s. Goal:
//     the cached run within 5% of the IDX run.
// Prints markdown tables; asserts nothing but that the folder's images are
// the IDX file's, in its order.
//
//   image_folder_bench [--images N] [--threads T] [--repeats R] [--train]
//                      [--dir DIR] [--data-dir DIR] [--dlbatch-train PATH]
//
// --images N: the first N training images (default all 60,000). --threads:
// decoding threads (default: the cores). --repeats: loads of each kind
// (median). --dir: where to write (default a new folder under /tmp,
// removed afterwards).
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_args.h"
#include "common/files.h"
#include "tests/common/image_files.h"
#include "trainer/data/data.h"

namespace dlbatch {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Flags {
  int64_t images = 60000;
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  int repeats = 3;
  bool train = false;
  std::string dir;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::string dlbatch_train;
};

// Runs argv with XDG_CACHE_HOME=cache, output to `log`; its exit status.
int RunTrainer(const std::vector<std::string>& argv, const std::string& cache,
               const std::string& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::setenv("XDG_CACHE_HOME", cache.c_str(), 1);
    std::vector<char*> args;
    for (const std::string& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A small network, so that an epoch's time is as much the data's as the
// network's: the strictest comparison of where the images come from.
constexpr char kJob[] = R"(name: folder-bench
train:
  network:
    input: [28, 28, 1]
    layers:
      - {type: conv, filters: 8, size: 5, stride: 2}
      - {type: batchnorm}
      - {type: relu}
      - {type: maxpool, size: 2}
      - {type: fc, units: 10}
      - {type: softmax}
  data:
    train: %s
    normalize: true
  options:
    solver: sgdm
    initial_learn_rate: 0.05
    momentum: 0.9
    mini_batch_size: 64
    max_epochs: 1
    shuffle: every-epoch
    execution_environment: cpu
    checkpoint_frequency: 0
    seed: 1
)";

struct TrainFigures {
  double wall_s = 0;
  double images_per_s = 0;
};

// One run of dlbatch-train on `source` (a data source in flow style).
std::optional<TrainFigures> TrainOnce(const Flags& f, const std::string& source,
                                      const std::string& cache) {
  const std::string job = f.dir + "/job.yaml";
  std::ofstream(job) << absl::StrFormat(kJob, source);
  const std::string out = f.dir + "/out";
  RemoveTree(out).IgnoreError();
  const auto start = Clock::now();
  const int rc = RunTrainer({f.dlbatch_train, job, "--output-dir", out,
                             "--threads", std::to_string(f.threads)},
                            cache, f.dir + "/train.log");
  TrainFigures t;
  t.wall_s = Seconds(start);
  if (rc != 0) {
    std::fprintf(stderr, "dlbatch-train failed (%d); see %s/train.log\n", rc,
                 f.dir.c_str());
    return std::nullopt;
  }
  std::ifstream metrics(out + "/metrics.json");
  t.images_per_s = nlohmann::json::parse(metrics)["images_per_s"].get<double>();
  return t;
}

constexpr char kUsage[] =
    "usage: image_folder_bench [--images N] [--threads T] [--repeats R] "
    "[--train]\n"
    "                          [--dir DIR] [--data-dir DIR] "
    "[--dlbatch-train PATH]\n"
    "Writes Fashion-MNIST's training images as PNG files in class folders, "
    "times\n"
    "their first load (decode, write the cache), a cached load and the IDX "
    "load,\n"
    "and with --train one epoch of dlbatch-train from the IDX files and the "
    "cached\n"
    "folder alternately (goal: the cached run within 5%). Prints markdown "
    "tables.\n"
    "  --images N        the first N training images (default 60000)\n"
    "  --threads T       decoding and training threads (default: the cores)\n"
    "  --repeats R       runs of each kind, medians (default 3)\n"
    "  --train           also time dlbatch-train epochs\n"
    "  --dir DIR         where to write (default a new folder under /tmp, "
    "removed after)\n"
    "  --data-dir DIR    Fashion-MNIST's IDX files (default "
    "/usr/share/datasets/fashion-mnist)\n"
    "  --dlbatch-train PATH   default: beside this program\n";

int Main(int argc, char** argv) {
  if (int rc; bench::HelpOrBadPairs(argc, argv, kUsage, false, &rc)) {
    return rc;
  }
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--images") {
      f.images = std::atoll(next().c_str());
    } else if (a == "--threads") {
      f.threads = std::atoi(next().c_str());
    } else if (a == "--repeats") {
      f.repeats = std::max(1, std::atoi(next().c_str()));
    } else if (a == "--train") {
      f.train = true;
    } else if (a == "--dir") {
      f.dir = next();
    } else if (a == "--data-dir") {
      f.data_dir = next();
    } else if (a == "--dlbatch-train") {
      f.dlbatch_train = next();
    } else {
      std::fprintf(stderr, "unknown flag %s\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  if (f.dlbatch_train.empty()) {
    f.dlbatch_train =
        (std::filesystem::path(argv[0]).parent_path() / "dlbatch-train")
            .string();
  }
  const bool own_dir = f.dir.empty();
  if (own_dir) {
    char tmpl[] = "/tmp/dlbatch-folder-bench-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return 1;
    f.dir = tmpl;
  }
  const std::string images_path = f.data_dir + "/train-images-idx3-ubyte.gz";
  const std::string labels_path = f.data_dir + "/train-labels-idx1-ubyte.gz";
  v1::DataSource idx;
  idx.set_format("idx");
  idx.set_images(images_path);
  idx.set_labels(labels_path);

  std::vector<double> idx_times;
  absl::StatusOr<trainer::Dataset> reference;
  for (int r = 0; r < f.repeats; ++r) {
    const auto start = Clock::now();
    reference = trainer::LoadDataset(idx, ".");
    idx_times.push_back(Seconds(start));
    if (!reference.ok()) {
      std::fprintf(stderr, "%s\n", reference.status().ToString().c_str());
      return 1;
    }
  }
  const int64_t n = std::min<int64_t>(f.images, reference->count);
  const std::string root = f.dir + "/fashion-mnist-png";
  for (int c = 0; c < 10; ++c) {
    std::filesystem::create_directories(absl::StrCat(root, "/", c));
  }
  auto start = Clock::now();
  for (int64_t i = 0; i < n; ++i) {
    const std::string path =
        absl::StrFormat("%s/%d/%05d.png", root, reference->labels[i], i);
    if (!testing::WritePng(path, 28, 28, 1, &reference->pixels[i * 784])) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
  }
  const double write_s = Seconds(start);

  v1::DataSource folders;
  folders.set_format("folders");
  folders.set_path(root);
  trainer::LoadOptions lo;
  lo.input = {28, 28, 1};
  lo.threads = f.threads;
  lo.cache_dir = f.dir + "/cache";
  std::vector<double> decode_times, cached_times;
  for (int r = 0; r < f.repeats; ++r) {
    RemoveTree(lo.cache_dir).IgnoreError();
    start = Clock::now();
    absl::StatusOr<trainer::Dataset> decoded =
        trainer::LoadDataset(folders, ".", lo);
    decode_times.push_back(Seconds(start));
    if (!decoded.ok()) {
      std::fprintf(stderr, "%s\n", decoded.status().ToString().c_str());
      return 1;
    }
    start = Clock::now();
    absl::StatusOr<trainer::Dataset> cached =
        trainer::LoadDataset(folders, ".", lo);
    cached_times.push_back(Seconds(start));
    if (!cached.ok() || cached->images_decoded != 0) {
      std::fprintf(stderr, "the second load did not read the cache\n");
      return 1;
    }
    const bool same = std::equal(cached->pixels.begin(), cached->pixels.end(),
                                 reference->pixels.begin()) &&
                      std::equal(cached->labels.begin(), cached->labels.end(),
                                 reference->labels.begin());
    if (!same || cached->count != n) {
      std::fprintf(stderr, "the folder's images differ from the IDX file's\n");
      return 1;
    }
  }
  const double decode_s = Median(decode_times);
  std::printf(
      "## Image folders: %lld Fashion-MNIST PNGs, %d decoding threads\n\n",
      static_cast<long long>(n), f.threads);
  std::printf("| step | seconds | images/s |\n|---|---:|---:|\n");
  std::printf("| write the PNGs (libpng, 1 thread) | %.2f | %.0f |\n", write_s,
              n / write_s);
  std::printf("| first load: list + decode + write the cache | %.2f | %.0f |\n",
              decode_s, n / decode_s);
  std::printf("| cached load | %.3f | %.0f |\n", Median(cached_times),
              n / Median(cached_times));
  std::printf("| IDX load (60,000, gunzip) | %.3f | %.0f |\n\n",
              Median(idx_times), reference->count / Median(idx_times));

  if (f.train) {
    const std::string idx_source = absl::StrCat(
        "{format: idx, images: ", images_path, ", labels: ", labels_path, "}");
    const std::string folder_source =
        absl::StrCat("{format: folders, path: ", root, "}");
    const std::string cache = f.dir + "/train-cache";
    RemoveTree(cache).IgnoreError();
    // The first folder run decodes (and caches); then IDX and cached runs
    // alternate, so that the machine's drift falls on both.
    std::optional<TrainFigures> first = TrainOnce(f, folder_source, cache);
    if (!first) return 1;
    std::vector<double> idx_wall, idx_rate, cached_wall, cached_rate;
    for (int r = 0; r < f.repeats; ++r) {
      std::optional<TrainFigures> a = TrainOnce(f, idx_source, cache);
      std::optional<TrainFigures> b = TrainOnce(f, folder_source, cache);
      if (!a || !b) return 1;
      idx_wall.push_back(a->wall_s);
      idx_rate.push_back(a->images_per_s);
      cached_wall.push_back(b->wall_s);
      cached_rate.push_back(b->images_per_s);
    }
    std::printf(
        "| dlbatch-train, 1 epoch (%lld images), batch 64, CPU, %d threads | "
        "wall s | training images/s |\n|---|---:|---:|\n",
        static_cast<long long>(n), f.threads);
    std::printf("| IDX files (median of %d) | %.2f | %.0f |\n", f.repeats,
                Median(idx_wall), Median(idx_rate));
    std::printf("| folder, first run (decodes, caches) | %.2f | %.0f |\n",
                first->wall_s, first->images_per_s);
    std::printf("| folder, cached (median of %d) | %.2f | %.0f |\n", f.repeats,
                Median(cached_wall), Median(cached_rate));
    std::printf("| cached / IDX | %.3f | %.3f |\n\n",
                Median(cached_wall) / Median(idx_wall),
                Median(cached_rate) / Median(idx_rate));
  }
  std::fflush(stdout);
  if (own_dir) RemoveTree(f.dir).IgnoreError();
  return 0;
}

}  // namespace
}  // namespace dlbatch

int main(int argc, char** argv) { return dlbatch::Main(argc, argv); }
