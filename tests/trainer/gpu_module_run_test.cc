// The GPU backend is a module, libdlbatch-gpu.so, that the real
// dlbatch-train loads only where a run may use a GPU (trainer/gpu_module.h):
// a CPU run loads none of CUDA's libraries, and where the module is missing
// (dlbatch-train alone in a folder, as the dlbatch package without
// dlbatch-gpu), does not load (as where CUDA's libraries are missing), or
// is no dlbatch module, a GPU run is refused before it trains, saying what
// to install, --version and --list-devices say why, and auto trains on the
// CPU. Runs in every build (a CPU-only one says it has no GPU backend).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/version.h"
#include "tests/integration/harness.h"
#include "tests/trainer/train_run_fixture.h"

namespace dlbatch::trainer {
namespace {

using dlbatch::testing::BinDir;
using dlbatch::testing::Exec;
using dlbatch::testing::Result;
using dlbatch::testing::WriteAll;

const char kTiny[] = R"(
  network:
    input: [28, 28, 1]
    layers:
      - {type: conv, filters: 4, size: 5, stride: 2}
      - {type: relu}
      - {type: fc, units: 10}
      - {type: softmax}
)";

class GpuModuleRun : public testing::TrainRunFixture {
 protected:
  void SetUp() override {
    TrainRunFixture::SetUp();
    if (IsSkipped()) return;
    job_ = WriteJob("tiny", testing::FashionMnistJobText(
                                "tiny", kTiny, "    mini_batch_size: 32\n",
                                /*validation=*/false));
  }

  // `train` (a dlbatch-train) with `args`, and with `env` but no GPU.
  Result Run(const std::string& train, std::vector<std::string> args,
             std::map<std::string, std::string> env = {}) {
    env["CUDA_VISIBLE_DEVICES"] = "";
    env["XDG_CACHE_HOME"] = dir_ + "/cache";
    args.insert(args.begin(), train);
    return Exec(args, env);
  }

  // A GPU run of the job refused, saying `why`, before it trains; and
  // --version and --list-devices saying it too.
  void ExpectRefused(const std::string& train, const std::string& why,
                     std::map<std::string, std::string> env = {}) {
    const std::string out = dir_ + "/gpu-out";
    for (const char* gpu : {"gpu", "multi-gpu"}) {
      Result r =
          Run(train,
              {job_, "--output-dir", out, "--execution-environment", gpu}, env);
      EXPECT_NE(r.code, 0) << gpu << ": " << r.out << r.err;
      EXPECT_NE(r.err.find("asks for a GPU, but"), std::string::npos)
          << gpu << ": " << r.err;
      EXPECT_NE(r.err.find(why), std::string::npos) << gpu << ": " << r.err;
      EXPECT_NE(r.err.find("use cpu or auto"), std::string::npos)
          << gpu << ": " << r.err;
      EXPECT_FALSE(std::filesystem::exists(out + "/checkpoint.dlbc")) << gpu;
    }
    Result v = Run(train, {"--version"}, env);
    EXPECT_EQ(v.code, 0) << v.err;
    EXPECT_NE(v.out.find("\nGPU backend: not "), std::string::npos) << v.out;
    if (dlbatch::GpuBackendBuilt() || env.count("DLBATCH_GPU_MODULE") > 0) {
      EXPECT_NE(v.out.find("GPU backend: not usable (CPU only): "),
                std::string::npos)
          << v.out;
      EXPECT_NE(v.out.find(why), std::string::npos) << v.out;
    } else {
      EXPECT_NE(v.out.find("GPU backend: not built (CPU only)"),
                std::string::npos)
          << v.out;
    }
    Result l = Run(train, {"--list-devices"}, env);
    EXPECT_EQ(l.code, 0) << l.err;
    EXPECT_NE(l.out.find("training runs on the CPU"), std::string::npos)
        << l.out;
    EXPECT_NE(l.out.find(why), std::string::npos) << l.out;
  }

  // An auto run of `train` trains on the CPU.
  void ExpectAutoTrainsOnTheCpu(const std::string& train,
                                std::map<std::string, std::string> env = {}) {
    const std::string out = dir_ + "/auto-out";
    std::filesystem::remove_all(out);
    Result r = Run(train,
                   {job_, "--output-dir", out, "--execution-environment",
                    "auto", "--max-iterations", "2"},
                   env);
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE((r.out + r.err).find("Training on cpu"), std::string::npos)
        << r.out << r.err;
    EXPECT_TRUE(std::filesystem::exists(out + "/checkpoint.dlbc"));
  }

  std::string job_;
};

// A run on the CPU (auto without a GPU, and cpu) loads neither the module
// nor any of CUDA's libraries: the dynamic linker lists what it loads
// (LD_DEBUG=files). Before the module, dlbatch-train linked CUDA's runtime,
// cuDNN and NCCL, and started nowhere without them.
TEST_F(GpuModuleRun, ACpuRunLoadsNoCudaLibrary) {
  for (const char* environment : {"auto", "cpu"}) {
    SCOPED_TRACE(environment);
    const std::string out = dir_ + "/" + environment;
    Result r = Run(BinDir() + "/dlbatch-train",
                   {job_, "--output-dir", out, "--execution-environment",
                    environment, "--max-iterations", "2"},
                   {{"LD_DEBUG", "files"}});
    ASSERT_EQ(r.code, 0) << r.err;
    ASSERT_NE(r.err.find("file=libgomp"), std::string::npos)
        << "no LD_DEBUG listing:\n"
        << r.err.substr(0, 2000);
    for (const char* lib :
         {"libdlbatch-gpu", "libcudart", "libcudnn", "libnccl", "libcublas"}) {
      const size_t at = r.err.find(lib);
      EXPECT_EQ(at, std::string::npos)
          << lib << " loaded:\n"
          << r.err.substr(at == std::string::npos || at < 300 ? 0 : at - 300,
                          600);
    }
  }
}

// dlbatch-train alone in a folder: no module beside it nor where the
// package installs it (../lib/<triplet>/dlbatch).
TEST_F(GpuModuleRun, WithoutTheModuleAGpuRunSaysWhatToInstall) {
  const std::string alone = dir_ + "/bin/dlbatch-train";
  std::filesystem::create_directories(dir_ + "/bin");
  std::error_code ec;
  std::filesystem::create_hard_link(BinDir() + "/dlbatch-train", alone, ec);
  if (ec) {
    std::filesystem::copy_file(BinDir() + "/dlbatch-train", alone, ec);
    ASSERT_FALSE(ec) << ec.message();
  }
  if (dlbatch::GpuBackendBuilt()) {
    ExpectRefused(alone, "install the dlbatch-gpu package");
  } else {
    ExpectRefused(alone, "built without the GPU backend");
  }
  ExpectAutoTrainsOnTheCpu(alone);
}

// DLBATCH_GPU_MODULE naming a file that is not there, one that does not
// load (as a module whose CUDA libraries are missing fails to), and a
// shared object that is no dlbatch module (the C library).
TEST_F(GpuModuleRun, AModuleThatIsNotThereOrDoesNotLoadIsNamed) {
  WriteAll(dir_ + "/empty.so", "");
  Dl_info libc{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&std::fopen), &libc), 0);
  const std::string train = BinDir() + "/dlbatch-train";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {dir_ + "/none/libdlbatch-gpu.so", "which does not exist"},
      {dir_ + "/empty.so", "cannot be loaded"},
      {libc.dli_fname, "is no dlbatch GPU module"},
  };
  for (const auto& [module, why] : cases) {
    SCOPED_TRACE(module);
    ExpectRefused(train, why, {{"DLBATCH_GPU_MODULE", module}});
    if (HasFatalFailure()) return;
  }
  // One that does not load says what it needs.
  Result r =
      Run(train,
          {job_, "--output-dir", dir_ + "/o", "--execution-environment", "gpu"},
          {{"DLBATCH_GPU_MODULE", dir_ + "/empty.so"}});
  EXPECT_NE(r.err.find("install NVIDIA's"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ld.so.conf.d"), std::string::npos) << r.err;
  ExpectAutoTrainsOnTheCpu(train, {{"DLBATCH_GPU_MODULE", dir_ + "/empty.so"}});
}

// Where the build made the module, dlbatch-train finds it beside itself and
// says which libraries it runs on.
TEST_F(GpuModuleRun, VersionSaysWhereTheModuleWasLoadedFrom) {
  Result v = Run(BinDir() + "/dlbatch-train", {"--version"});
  ASSERT_EQ(v.code, 0) << v.err;
  EXPECT_EQ(
      v.out.rfind(absl::StrCat("dlbatch-train ", std::string(Version()), "\n"),
                  0),
      0u)
      << v.out;
  if (!dlbatch::GpuBackendBuilt()) {
    EXPECT_NE(v.out.find("GPU backend: not built (CPU only)"),
              std::string::npos)
        << v.out;
    return;
  }
  EXPECT_NE(
      v.out.find(absl::StrCat("GPU backend: loaded from ",
                              std::filesystem::canonical(BinDir()).string(),
                              "/libdlbatch-gpu.so\nCUDA runtime: ")),
      std::string::npos)
      << v.out;
  EXPECT_NE(v.out.find("\ncuDNN: "), std::string::npos) << v.out;
  EXPECT_NE(v.out.find("\nNCCL: "), std::string::npos) << v.out;
}

}  // namespace
}  // namespace dlbatch::trainer
