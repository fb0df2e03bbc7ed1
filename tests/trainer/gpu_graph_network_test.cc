// Networks as graphs on the GPU against the CPU, the reference: the new
// kernels (add, strided copies, gelu, label smoothing, Nesterov), a graph
// network's forward, loss and backward (gradients summed over the layers
// that take one output), the same step recorded as a CUDA graph and
// replayed, and whole dlbatch-train runs of a graph net with and without
// recorded steps, which must end with the same weights bit for bit.
//
// Every test skips, saying why, where this process sees no CUDA device.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "gtest/gtest.h"
#include "tests/common/fashion_mnist.h"
#include "tests/integration/harness.h"
#include "trainer/backend.h"
#include "trainer/cuda/backend_cuda.h"
#include "trainer/network.h"
#include "trainer/output/checkpoint.h"
#include "trainer/rng.h"

namespace dlbatch::trainer {
namespace {

using dlbatch::testing::BinDir;
using dlbatch::testing::Exec;
using dlbatch::testing::FashionMnistDir;
using dlbatch::testing::Result;
using dlbatch::testing::WriteAll;

int CudaDevices() { return CudaDeviceCount(); }

std::vector<float> Random(int64_t count, uint64_t seed) {
  Rng rng(Key(seed, 99));
  std::vector<float> v(count);
  for (float& x : v) x = static_cast<float>(4 * rng.Uniform() - 2);
  return v;
}

double Relative(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  double num = 0, den = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    num += (double{gpu[i]} - cpu[i]) * (double{gpu[i]} - cpu[i]);
    den += double{cpu[i]} * cpu[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

class GpuGraphTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDevices() == 0) {
      GTEST_SKIP() << "no CUDA device: these tests compare the GPU backend "
                      "with the CPU";
    }
    cpu_ = *MakeCpuBackend(1);
    auto gpu = MakeCudaBackend(0);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = *std::move(gpu);
  }
  // `host` on `b`, in a buffer kept by the test.
  float* On(Backend* b, const std::vector<float>& host) {
    buffers_.push_back(*b->Allocate(std::max<size_t>(host.size(), 1) * 4));
    b->CopyToDevice(buffers_.back().f32(), host.data(), host.size() * 4);
    return buffers_.back().f32();
  }
  std::vector<float> Get(Backend* b, const float* x, int64_t count) {
    std::vector<float> host(count);
    b->CopyToHost(host.data(), x, count * 4);
    return host;
  }

  std::unique_ptr<Backend> cpu_, gpu_;
  std::vector<Buffer> buffers_;
};

TEST_F(GpuGraphTest, AddCopyStridedGeluAndNesterovAgreeWithTheCpu) {
  const int64_t count = 3000;
  const std::vector<float> a = Random(count, 1), b = Random(count, 2);
  auto run = [&](Backend* be) {
    float* x = On(be, a);
    float* y = On(be, b);
    float* out = On(be, std::vector<float>(count, 7.0f));
    be->Add(count, x, y, out);
    be->Add(count, out, x, out);  // in place
    std::vector<float> result = Get(be, out, count);
    // 100 rows of 30: columns 5..12 into a 10-wide array at 2.
    float* narrow = On(be, std::vector<float>(1000, -1.0f));
    be->CopyStrided(100, 8, x + 5, 30, narrow + 2, 10);
    for (float v : Get(be, narrow, 1000)) result.push_back(v);
    ActivationDesc gelu;
    gelu.kind = ActivationKind::kGelu;
    be->ActivationForward(gelu, count, x, out);
    for (float v : Get(be, out, count)) result.push_back(v);
    be->ActivationBackward(gelu, count, x, y, out);
    for (float v : Get(be, out, count)) result.push_back(v);
    float* p = On(be, a);
    float* v = On(be, b);
    be->SgdmNesterovUpdate(count, count / 2, 0.1f, 0.9f, 0.01f, p, y, v);
    for (float e : Get(be, p, count)) result.push_back(e);
    for (float e : Get(be, v, count)) result.push_back(e);
    return result;
  };
  const std::vector<float> c = run(cpu_.get()), g = run(gpu_.get());
  ASSERT_EQ(c.size(), g.size());
  EXPECT_LT(Relative(g, c), 1e-6);
}

// Appends layers to a network spec for 12x10x3 inputs.
class SpecWriter {
 public:
  SpecWriter() {
    for (int d : {12, 10, 3}) spec_.add_input(d);
  }
  void operator()(const std::string& type, const std::string& name,
                  std::vector<std::string> inputs, int filters = 0) {
    v1::LayerSpec* l = spec_.add_layers();
    l->set_type(type);
    l->set_name(name);
    for (auto& i : inputs) l->add_inputs(i);
    if (type == "conv") {
      l->set_filters(filters);
      l->set_size(3);
      l->set_padding_same(true);
    }
    if (type == "fc") l->set_units(filters);
  }
  const v1::NetworkSpec& spec() const { return spec_; }

 private:
  v1::NetworkSpec spec_;
};

// A residual block, a concat, gelu and batchnorm: what the CPU's graph
// tests check by finite differences.
v1::NetworkSpec GraphNet() {
  SpecWriter add;
  add("conv", "stem", {}, 8);
  add("batchnorm", "bn0", {});
  add("gelu", "g", {});
  add("conv", "a", {}, 8);
  add("batchnorm", "bn1", {});
  add("relu", "r", {});
  add("add", "sum", {"g", "r"});
  add("conv", "side", {"g"}, 4);
  add("concat", "cat", {"sum", "side", "input"});
  add("globalavgpool", "pool", {});
  add("fc", "fc", {}, 5);
  add("softmax", "", {});
  return add.spec();
}

// What GraphNet leaves out: a batch norm of the network's input (a dx
// nobody wants, into scratch), a sum of three inputs, a concat input that
// another layer takes too, and a sum whose gradient, accumulated over its
// two consumers, is handed on without a copy to the one input that only it
// takes.
v1::NetworkSpec JoinsNet() {
  SpecWriter add;
  add("batchnorm", "bn_in", {});
  add("conv", "c1", {}, 8);
  add("relu", "r1", {});
  add("conv", "c2", {"r1"}, 8);
  add("conv", "c3", {"r1"}, 8);
  add("add", "s", {"r1", "c2", "c3"});
  add("concat", "cat", {"s", "c2"});
  add("conv", "t", {"s"}, 8);
  add("conv", "m", {"cat"}, 8);
  add("add", "u", {"m", "t"});
  add("globalavgpool", "pool", {});
  add("fc", "fc", {}, 5);
  add("softmax", "", {});
  return add.spec();
}

struct StepResult {
  std::vector<float> probs, grads, stats;
  std::vector<ParamInfo> params;  // the ranges of grads
};

constexpr int kMaxBatch = 6;

// A batch of `n` images and labels drawn from `seed`.
std::vector<float> Images(int n, uint64_t seed) {
  return Random(n * 12 * 10 * 3, seed);
}
std::vector<int32_t> Labels(int n, uint64_t seed) {
  std::vector<int32_t> labels(n);
  for (int i = 0; i < n; ++i) labels[i] = static_cast<int32_t>((i + seed) % 5);
  return labels;
}

// Builds GraphNet on `be` for batches of up to kMaxBatch, initialised alike,
// and runs one training step on `n` samples drawn from `seed`; the
// probabilities, gradients and loss statistics. Where `record`, the step is
// first recorded as a CUDA graph on other samples (seed + 100), which are
// then replaced by seed's in the same buffers, and replayed over outputs set
// to NaN: what it gives is what the replay computed from the new inputs.
StepResult Step(Backend* be, int n, uint64_t seed, bool record,
                const v1::NetworkSpec& spec = GraphNet()) {
  auto net = Network::Build(spec, be, kMaxBatch);
  EXPECT_TRUE(net.ok()) << net.status();
  if (!net.ok()) return {};
  (*net)->Initialize(2);
  (*net)->SetLabelSmoothing(0.1f);
  Buffer x = *be->Allocate(Images(kMaxBatch, 0).size() * 4);
  Buffer y = *be->Allocate(kMaxBatch * 4);
  Buffer stats = *be->Allocate(8);
  auto load = [&](uint64_t s) {
    const std::vector<float> images = Images(n, s);
    const std::vector<int32_t> labels = Labels(n, s);
    be->CopyToDevice(x.f32(), images.data(), images.size() * 4);
    be->CopyToDevice(y.as<void>(), labels.data(), n * 4);
  };
  auto step = [&] {
    be->Fill(stats.f32(), 2, 0);
    (*net)->Forward(n, x.f32(), /*training=*/true);
    (*net)->Loss(n, y.as<int32_t>(), stats.f32());
    (*net)->Backward(n, y.as<int32_t>(), 1.0f / n);
  };
  load(record ? seed + 100 : seed);
  step();
  if (record) {
    // Once more from the same start, recorded; then replayed on seed's
    // samples.
    (*net)->Initialize(2);
    EXPECT_TRUE(be->StartRecording().ok());
    step();
    auto recording = be->FinishRecording();
    EXPECT_TRUE(recording.ok()) << recording.status();
    load(seed);
    be->Fill((*net)->grads(), (*net)->num_params(), 0);
    // The network hands its probabilities out read-only; the test blanks
    // them so that only the replay can have written them.
    be->Fill(const_cast<float*>((*net)->probabilities()), n * 5, std::nanf(""));
    be->Fill(stats.f32(), 2, std::nanf(""));
    if (recording.ok()) (*recording)->Replay();
  }
  StepResult r;
  r.probs.resize(n * 5);
  be->CopyToHost(r.probs.data(), (*net)->probabilities(), n * 5 * 4);
  r.grads.resize((*net)->num_params());
  be->CopyToHost(r.grads.data(), (*net)->grads(), r.grads.size() * 4);
  r.stats.resize(2);
  be->CopyToHost(r.stats.data(), stats.f32(), 8);
  r.params = (*net)->params_info();
  return r;
}

double Norm(const std::vector<float>& v) {
  double sum = 0;
  for (float x : v) sum += double{x} * x;
  return std::sqrt(sum);
}

// Every parameter's gradient on its own: a norm over all of them would hide
// an error in a small one. Gradients that are zero but for rounding (a conv
// bias before a batch norm: ~1e-7 against a whole gradient of ~1) are held
// to the whole gradient's scale instead.
void ExpectGradientsAgree(const StepResult& got, const StepResult& want,
                          double tolerance) {
  ASSERT_EQ(got.grads.size(), want.grads.size());
  ASSERT_FALSE(want.grads.empty());
  const double scale = Norm(want.grads);
  for (const ParamInfo& p : want.params) {
    const auto part = [&](const std::vector<float>& g) {
      return std::vector<float>(g.begin() + p.offset,
                                g.begin() + p.offset + p.count);
    };
    const std::vector<float> w = part(want.grads), g = part(got.grads);
    if (Norm(w) < 1e-4 * scale) {
      std::vector<float> diff(w.size());
      for (size_t i = 0; i < w.size(); ++i) diff[i] = g[i] - w[i];
      EXPECT_LT(Norm(diff), tolerance * scale) << p.name;
    } else {
      EXPECT_LT(Relative(g, w), tolerance) << p.name;
    }
  }
  EXPECT_LT(Relative(got.grads, want.grads), tolerance) << "all gradients";
}

// One step of `spec` on the GPU against the CPU, at the batch the network
// was built for and a smaller one.
void ExpectStepsAgree(Backend* cpu, Backend* gpu, const v1::NetworkSpec& spec,
                      uint64_t seed) {
  for (int n : {kMaxBatch, 4}) {
    SCOPED_TRACE(absl::StrCat("batch of ", n));
    const StepResult c = Step(cpu, n, seed, false, spec);
    const StepResult g = Step(gpu, n, seed, false, spec);
    ASSERT_FALSE(c.grads.empty());
    EXPECT_LT(Relative(g.probs, c.probs), 1e-5);
    ExpectGradientsAgree(g, c, 1e-4);
    EXPECT_NEAR(g.stats[0], c.stats[0], 1e-5 * c.stats[0]);
    EXPECT_EQ(g.stats[1], c.stats[1]);
  }
}

TEST_F(GpuGraphTest, GraphNetworkStepAgreesWithTheCpu) {
  ExpectStepsAgree(cpu_.get(), gpu_.get(), GraphNet(), 3);
}

TEST_F(GpuGraphTest, JoinsNetworkStepAgreesWithTheCpu) {
  ExpectStepsAgree(cpu_.get(), gpu_.get(), JoinsNet(), 7);
}

TEST_F(GpuGraphTest, RecordedGraphNetworkStepReplaysAsLaunched) {
  const StepResult launched = Step(gpu_.get(), kMaxBatch, 3, false);
  const StepResult replayed = Step(gpu_.get(), kMaxBatch, 3, true);
  ASSERT_FALSE(launched.grads.empty());
  ExpectGradientsAgree(replayed, launched, 1e-6);
  EXPECT_LT(Relative(replayed.probs, launched.probs), 1e-6);
  // Not NaN: the replay wrote them, from the samples loaded after recording.
  EXPECT_NEAR(replayed.stats[0], launched.stats[0],
              1e-6 * std::abs(launched.stats[0]));
  EXPECT_EQ(replayed.stats[1], launched.stats[1]);
}

// Whole runs of a graph net on the GPU, steps recorded or launched.
TEST(GpuGraphRun, RecordedStepsOfAGraphNetTrainToTheWeightsOfLaunchedOnes) {
  if (CudaDevices() == 0) {
    GTEST_SKIP() << "no CUDA device: this test trains a graph net on the GPU";
  }
  const std::string data = FashionMnistDir();
  if (access(absl::StrCat(data, "/train-images-idx3-ubyte.gz").c_str(), R_OK) !=
      0) {
    GTEST_SKIP() << "Fashion-MNIST is not in " << data
                 << " (Debian's dataset-fashion-mnist, or set "
                    "DLBATCH_TEST_DATA_DIR)";
  }
  char tmpl[] = "/tmp/gpu-graph-net-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string job = dir + "/graph.yaml";
  WriteAll(job, absl::StrCat(R"(name: graph
train:
  network:
    input: [28, 28, 1]
    layers:
      - {name: stem, type: conv, filters: 16, size: 3, padding: same}
      - {type: batchnorm}
      - {name: g, type: gelu}
      - {type: conv, filters: 16, size: 3, padding: same}
      - {type: batchnorm}
      - {name: r, type: relu}
      - {name: sum, type: add, inputs: [g, r]}
      - {name: side, type: conv, filters: 4, size: 1, inputs: [g]}
      - {type: concat, inputs: [sum, side]}
      - {type: maxpool, size: 2}
      - {type: fc, units: 10}
      - {type: softmax}
  data:
    train: {format: idx, images: )",
                             data, "/train-images-idx3-ubyte.gz, labels: ",
                             data, R"(/train-labels-idx1-ubyte.gz}
  options:
    nesterov: true
    label_smoothing: 0.1
    mini_batch_size: 64
    seed: 5
)"));
  auto train = [&](const std::string& out, bool graphs) {
    Result r =
        Exec({BinDir() + "/dlbatch-train", job, "--output-dir", out,
              "--execution-environment", "gpu", "--max-iterations", "30"},
             {{"XDG_CACHE_HOME", dir + "/cache"},
              {"DLBATCH_CUDNN_DETERMINISTIC", "1"},
              {"DLBATCH_CUDA_GRAPHS", graphs ? "1" : "0"}},
             300000);
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    return r.out;
  };
  train(dir + "/launched", false);
  const std::string replayed = train(dir + "/replayed", true);
  EXPECT_NE(replayed.find("recorded once as a CUDA graph"), std::string::npos)
      << replayed;
  // A slot whose recording failed would fall back to launching, and train
  // the same weights: that must not pass unseen.
  EXPECT_EQ(replayed.find("failed"), std::string::npos) << replayed;
  absl::StatusOr<Checkpoint> a =
      ReadCheckpoint(dir + "/launched/checkpoint.dlbc");
  absl::StatusOr<Checkpoint> b =
      ReadCheckpoint(dir + "/replayed/checkpoint.dlbc");
  RemoveTree(dir).IgnoreError();
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(a->params == b->params) << "weights differ";
  EXPECT_TRUE(a->solver_state == b->solver_state) << "momentum differs";
}

}  // namespace
}  // namespace dlbatch::trainer
