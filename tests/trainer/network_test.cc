// Network::Build (shapes, errors, parameter layout), Initialize, and the
// forward, loss and backward passes of whole networks on the CPU backend.
#include "trainer/network.h"

#include <cmath>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/trainer/test_util.h"
#include "trainer/backend.h"

namespace dlbatch::trainer {
namespace {

using testing::CheckGradient;
using testing::DeviceArray;
using ::testing::HasSubstr;
using testing::RandomVector;

v1::LayerSpec L(const std::string& type) {
  v1::LayerSpec l;
  l.set_type(type);
  return l;
}
v1::LayerSpec Conv(int filters, int size, int stride = 0, bool same = false) {
  v1::LayerSpec l = L("conv");
  l.set_filters(filters);
  l.set_size(size);
  l.set_stride(stride);
  l.set_padding_same(same);
  return l;
}
v1::LayerSpec Pool(const std::string& type, int size, int stride = 0) {
  v1::LayerSpec l = L(type);
  l.set_size(size);
  l.set_stride(stride);
  return l;
}
v1::LayerSpec Fc(int units) {
  v1::LayerSpec l = L("fc");
  l.set_units(units);
  return l;
}
v1::NetworkSpec Net(std::vector<int> input, std::vector<v1::LayerSpec> layers) {
  v1::NetworkSpec spec;
  for (int d : input) spec.add_input(d);
  for (auto& l : layers) *spec.add_layers() = l;
  return spec;
}
v1::NetworkSpec LeNet() {
  return Net({28, 28, 1},
             {Conv(20, 5), Pool("maxpool", 2), Conv(50, 5), Pool("maxpool", 2),
              Fc(500), L("relu"), Fc(10), L("softmax")});
}

class NetworkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // One thread: the kernels' threading is layers_test's concern, and a
    // busy CI machine stalls a team of threads far more than one.
    auto backend = MakeCpuBackend(1);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = *std::move(backend);
  }
  std::unique_ptr<Network> Build(const v1::NetworkSpec& spec, int max_batch) {
    auto net = Network::Build(spec, backend_.get(), max_batch);
    EXPECT_TRUE(net.ok()) << net.status();
    return net.ok() ? *std::move(net) : nullptr;
  }
  absl::Status BuildError(const v1::NetworkSpec& spec) {
    return Network::Build(spec, backend_.get(), 4).status();
  }
  std::vector<float> Params(Network& net) {
    std::vector<float> p(net.num_params());
    backend_->CopyToHost(p.data(), net.params(), p.size() * 4);
    return p;
  }
  std::unique_ptr<Backend> backend_;
};

TEST_F(NetworkTest, LeNetShapesAndParameterLayout) {
  auto net = Build(LeNet(), 8);
  ASSERT_NE(net, nullptr);
  EXPECT_EQ(net->input_shape(), (Shape{28, 28, 1}));
  EXPECT_EQ(net->num_classes(), 10);
  EXPECT_EQ(net->max_batch(), 8);
  const auto& layers = net->layers();
  ASSERT_EQ(layers.size(), 8u);
  EXPECT_EQ(layers[0].name, "conv_1");
  EXPECT_EQ(layers[0].out, (Shape{24, 24, 20}));
  EXPECT_EQ(layers[1].out, (Shape{12, 12, 20}));
  EXPECT_EQ(layers[1].stride_h, 2);  // pooling's stride defaults to size
  EXPECT_EQ(layers[3].in, (Shape{8, 8, 50}));
  EXPECT_EQ(layers[3].out, (Shape{4, 4, 50}));
  EXPECT_EQ(layers[4].out, (Shape{1, 1, 500}));
  EXPECT_EQ(layers[6].out, (Shape{1, 1, 10}));

  // Weights first, in layer order, then the biases.
  const auto& p = net->params_info();
  ASSERT_EQ(p.size(), 8u);
  const std::vector<std::string> names = {
      "conv_1.weight", "conv_3.weight", "fc_5.weight", "fc_7.weight",
      "conv_1.bias",   "conv_3.bias",   "fc_5.bias",   "fc_7.bias"};
  int64_t offset = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_EQ(p[i].name, names[i]);
    EXPECT_EQ(p[i].offset, offset);
    offset += p[i].count;
  }
  EXPECT_EQ(p[0].dims, (std::vector<int64_t>{20, 5, 5, 1}));
  EXPECT_EQ(p[1].dims, (std::vector<int64_t>{50, 5, 5, 20}));
  EXPECT_EQ(p[2].dims, (std::vector<int64_t>{500, 800}));
  EXPECT_EQ(p[7].dims, (std::vector<int64_t>{10}));
  EXPECT_EQ(net->num_params(), offset);
  EXPECT_EQ(net->num_params(), 431080);
  EXPECT_EQ(net->num_decayed(), 500 + 25000 + 400000 + 5000);
  EXPECT_EQ(layers[2].params, (std::vector<int>{1, 5}));
  EXPECT_EQ(net->state_size(), 0);
}

TEST_F(NetworkTest, BatchNormParamsAndStateAndSamePadding) {
  v1::LayerSpec bn = L("batchnorm");
  bn.set_name("bn");
  auto net = Build(Net({9, 8, 3}, {Conv(4, 3, 2, true), bn, L("relu"),
                                   L("globalavgpool"), Fc(3), L("softmax")}),
                   2);
  ASSERT_NE(net, nullptr);
  const LayerInfo& conv = net->layers()[0];
  // same, stride 2: out = ceil(in / 2); the extra padding at the end.
  EXPECT_EQ(conv.out, (Shape{5, 4, 4}));
  EXPECT_EQ(conv.pad, (Padding{1, 0, 1, 1}));  // h: total 2; w: total 1
  EXPECT_EQ(net->layers()[3].out, (Shape{1, 1, 4}));
  std::vector<std::string> names;
  for (const auto& p : net->params_info()) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"conv_1.weight", "fc_5.weight",
                                             "conv_1.bias", "bn.scale",
                                             "bn.offset", "fc_5.bias"}));
  EXPECT_EQ(net->num_decayed(), 4 * 3 * 3 * 3 + 3 * 4);
  ASSERT_EQ(net->state_info().size(), 2u);
  EXPECT_EQ(net->state_info()[0].name, "bn.running_mean");
  EXPECT_EQ(net->state_info()[1].name, "bn.running_var");
  EXPECT_EQ(net->state_size(), 8);
}

TEST_F(NetworkTest, RefusesBadNetworksWithMessagesThatNameTheLayer) {
  absl::Status s =
      BuildError(Net({6, 6, 1}, {Conv(4, 3), Conv(4, 7), Fc(2), L("softmax")}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("layers[1] (conv 'conv_2')"));
  EXPECT_THAT(s.message(), HasSubstr("[7, 7]"));
  EXPECT_THAT(s.message(), HasSubstr("[4, 4, 4]"));

  s = BuildError(Net({8, 8, 1}, {Conv(10, 3), L("softmax")}));
  EXPECT_THAT(s.message(), HasSubstr("layers[1] (softmax 'softmax_2')"));
  EXPECT_THAT(s.message(), HasSubstr("[6, 6, 10]"));
  EXPECT_THAT(s.message(), HasSubstr("[1, 1, classes]"));

  s = BuildError(Net({8, 8, 1}, {Conv(4, 3), Fc(10)}));
  EXPECT_THAT(s.message(), HasSubstr("last layer must be softmax"));
  s = BuildError(Net({8, 8, 1}, {Fc(10), L("softmax"), Fc(3), L("softmax")}));
  EXPECT_THAT(s.message(), HasSubstr("layers[1] (softmax 'softmax_2')"));
  s = BuildError(Net({8, 8, 1}, {L("conv3d"), Fc(3), L("softmax")}));
  EXPECT_THAT(s.message(), HasSubstr("unknown layer type 'conv3d'"));
  s = BuildError(Net({8, 8}, {Fc(3), L("softmax")}));
  EXPECT_THAT(s.message(), HasSubstr("input must be [height, width"));
  s = BuildError(Net({8, 8, 1}, {Fc(0), L("softmax")}));
  EXPECT_THAT(s.message(), HasSubstr("units must be > 0"));
  v1::LayerSpec drop = L("dropout");
  drop.set_probability(1.5f);
  s = BuildError(Net({8, 8, 1}, {drop, Fc(3), L("softmax")}));
  EXPECT_THAT(s.message(), HasSubstr("layers[0] (dropout 'dropout_1')"));
  s = BuildError(Net({3, 3, 2}, {Pool("maxpool", 4), Fc(3), L("softmax")}));
  EXPECT_THAT(s.message(), HasSubstr("layers[0] (maxpool 'maxpool_1')"));
  EXPECT_THAT(s.message(), HasSubstr("[3, 3, 2]"));
  EXPECT_FALSE(Network::Build(LeNet(), backend_.get(), 0).ok());
}

// Whether the kernel grants every allocation (vm.overcommit_memory 1): an
// allocation beyond the machine would then succeed, and zeroing it would
// exhaust the machine.
bool KernelGrantsEveryAllocation() {
  std::ifstream overcommit("/proc/sys/vm/overcommit_memory");
  int mode = -1;
  overcommit >> mode;
  return mode == 1;
}

// Parameters that cannot be allocated: the error says the network, not the
// mini-batch, is too large (785 x 2e8 weights and biases are 628 GB).
TEST_F(NetworkTest,
       ParametersBeyondMemoryAreAnErrorThatSaysToShrinkTheNetwork) {
  if (KernelGrantsEveryAllocation()) {
    GTEST_SKIP() << "vm.overcommit_memory is 1: a 628 GB allocation would "
                    "succeed here";
  }
  absl::Status s =
      Network::Build(Net({28, 28, 1}, {Fc(200000000), L("softmax")}),
                     backend_.get(), 1)
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(),
              HasSubstr("cannot allocate 628.0 GB of host memory for the "
                        "network's weights"));
  EXPECT_THAT(s.message(), HasSubstr("use fewer filters or units"));
}

// A layer whose tensors at this batch size cannot be allocated (a 1024 x
// 1024 output of 4096 filters is 274 GB at batch 16): the error names the
// layer and says to shrink the batch, the layer's own code kept.
TEST_F(NetworkTest, ALayerBeyondMemoryAtThisBatchSaysToShrinkTheBatch) {
  if (KernelGrantsEveryAllocation()) {
    GTEST_SKIP() << "vm.overcommit_memory is 1: a 274 GB allocation would "
                    "succeed here";
  }
  absl::Status s = Network::Build(Net({1024, 1024, 1}, {Conv(4096, 3, 0, true),
                                                        L("globalavgpool"),
                                                        Fc(10), L("softmax")}),
                                  backend_.get(), 16)
                       .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("layers[0] (conv 'conv_1')"));
  EXPECT_THAT(s.message(),
              HasSubstr("cannot allocate the host memory it needs for "
                        "batches of 16; use a smaller mini_batch_size"));
}

TEST_F(NetworkTest, InitializeIsReproducibleAndScaledAsDocumented) {
  auto net = Build(LeNet(), 4);
  ASSERT_NE(net, nullptr);
  net->Initialize(7);
  const std::vector<float> a = Params(*net);
  net->Initialize(7);
  EXPECT_EQ(Params(*net), a);
  net->Initialize(8);
  EXPECT_NE(Params(*net), a);
  // A second network (and backend) with the same seed starts identically.
  auto other = Build(LeNet(), 2);
  other->Initialize(7);
  EXPECT_EQ(Params(*other), a);

  auto stats = [&](const ParamInfo& p, double* mean, double* std,
                   double* max_abs) {
    double s = 0, s2 = 0;
    *max_abs = 0;
    for (int64_t i = 0; i < p.count; ++i) {
      const double v = a[p.offset + i];
      s += v;
      s2 += v * v;
      *max_abs = std::max(*max_abs, std::fabs(v));
    }
    *mean = s / p.count;
    *std = std::sqrt(s2 / p.count - *mean * *mean);
  };
  double mean, std, max_abs;
  const auto& info = net->params_info();
  // fc_5 feeds relu: He-normal, std sqrt(2 / 800).
  stats(info[2], &mean, &std, &max_abs);
  EXPECT_NEAR(mean, 0, 0.002);
  EXPECT_NEAR(std, std::sqrt(2.0 / 800), 0.02 * std::sqrt(2.0 / 800));
  EXPECT_GT(max_abs, 3.5 * std);  // normal tails, not uniform
  // conv_3 feeds maxpool: Glorot-uniform, limit sqrt(6 / (500 + 1250)).
  const double limit = std::sqrt(6.0 / (500 + 1250));
  stats(info[1], &mean, &std, &max_abs);
  EXPECT_LE(max_abs, limit);
  EXPECT_GT(max_abs, 0.99 * limit);
  EXPECT_NEAR(std, limit / std::sqrt(3.0), 0.03 * limit);
  for (size_t k = 4; k < info.size(); ++k) {  // biases are zero
    for (int64_t i = 0; i < info[k].count; ++i) {
      ASSERT_EQ(a[info[k].offset + i], 0.0f) << info[k].name;
    }
  }
}

// A small network with every learnable layer type and no kinks near the
// data (leakyrelu, avgpool), for finite differences of the whole loss.
v1::NetworkSpec SmallNet() {
  v1::LayerSpec leaky = L("leakyrelu");
  leaky.set_alpha(0.2f);
  v1::LayerSpec drop = L("dropout");
  drop.set_probability(0.25f);
  return Net({7, 6, 2},
             {Conv(3, 3, 2, true), L("batchnorm"), leaky, Pool("avgpool", 2, 1),
              Fc(6), drop, Fc(4), L("softmax")});
}

class Batch {
 public:
  Batch(Backend* backend, const Network& net, int n, uint64_t seed)
      : images(backend, RandomVector(n * net.input_shape().size(), seed)),
        labels_buffer(*backend->Allocate(n * 4)),
        stats(backend, 2) {
    for (int i = 0; i < n; ++i) labels.push_back((i * 7 + seed) % 4);
    backend->CopyToDevice(labels_buffer.as<void>(), labels.data(), n * 4);
  }
  const int32_t* label_data() const { return labels_buffer.as<int32_t>(); }
  DeviceArray images;
  std::vector<int32_t> labels;
  Buffer labels_buffer;
  DeviceArray stats;
};

TEST_F(NetworkTest, BackwardMatchesFiniteDifferencesOfTheLoss) {
  auto net = Build(SmallNet(), 5);
  ASSERT_NE(net, nullptr);
  net->Initialize(3);
  const int n = 5;
  Batch batch(backend_.get(), *net, n, 1);
  const float scale = 0.5f;
  backend_->SetDropoutKey(99);
  net->Forward(n, batch.images.data(), /*training=*/true);
  net->Backward(n, batch.label_data(), scale);
  std::vector<float> grads(net->num_params());
  backend_->CopyToHost(grads.data(), net->grads(), grads.size() * 4);

  std::vector<float> params = Params(*net);
  auto loss = [&] {
    backend_->CopyToDevice(net->params(), params.data(), params.size() * 4);
    net->Forward(n, batch.images.data(), true);
    std::vector<float> probs(n * 4);
    backend_->CopyToHost(probs.data(), net->probabilities(), probs.size() * 4);
    double sum = 0;
    for (int i = 0; i < n; ++i)
      sum -= std::log(double{probs[i * 4 + batch.labels[i]]});
    return scale * sum;
  };
  CheckGradient("params", params, grads, loss, 3e-3f, 2e-2, 60);
  // Every parameter array gets a gradient.
  for (const ParamInfo& p : net->params_info()) {
    double s = 0;
    for (int64_t i = 0; i < p.count; ++i) s += std::fabs(grads[p.offset + i]);
    EXPECT_GT(s, 0) << p.name;
  }

  // Gradients are overwritten, not accumulated.
  net->Forward(n, batch.images.data(), true);
  net->Backward(n, batch.label_data(), scale);
  std::vector<float> again(net->num_params());
  backend_->CopyToHost(again.data(), net->grads(), again.size() * 4);
  for (size_t i = 0; i < again.size(); ++i) {
    ASSERT_NEAR(again[i], grads[i], 1e-5 + 1e-4 * std::fabs(grads[i])) << i;
  }
}

TEST_F(NetworkTest, LossAddsCrossEntropyAndCorrectCount) {
  auto net = Build(SmallNet(), 8);
  ASSERT_NE(net, nullptr);
  net->Initialize(5);
  const int n = 8;
  Batch batch(backend_.get(), *net, n, 2);
  net->Forward(n, batch.images.data(), false);
  std::vector<float> probs(n * 4);
  backend_->CopyToHost(probs.data(), net->probabilities(), probs.size() * 4);
  double loss = 0;
  int correct = 0;
  for (int i = 0; i < n; ++i) {
    double row = 0;
    int argmax = 0;
    for (int k = 0; k < 4; ++k) {
      row += probs[i * 4 + k];
      if (probs[i * 4 + k] > probs[i * 4 + argmax]) argmax = k;
    }
    EXPECT_NEAR(row, 1, 1e-5);
    loss -= std::log(double{probs[i * 4 + batch.labels[i]]});
    correct += argmax == batch.labels[i];
  }
  net->Loss(n, batch.label_data(), batch.stats.data());
  net->Loss(n, batch.label_data(), batch.stats.data());  // adds again
  const std::vector<float> stats = batch.stats.Get();
  EXPECT_NEAR(stats[0], 2 * loss, 1e-4 * loss);
  EXPECT_EQ(stats[1], 2 * correct);
}

TEST_F(NetworkTest, BatchNormTrainingMovesRunningStatsInferenceUsesThem) {
  auto net = Build(Net({4, 4, 2}, {L("batchnorm"), Fc(3), L("softmax")}), 6);
  ASSERT_NE(net, nullptr);
  net->Initialize(1);
  const int n = 6;
  std::vector<float> x = RandomVector(n * 32, 4, 1, 3);  // mean 2, var 1/3
  DeviceArray images(backend_.get(), x);
  std::vector<float> state(4);
  backend_->CopyToHost(state.data(), net->state(), 16);
  EXPECT_EQ(state, (std::vector<float>{0, 0, 1, 1}));

  net->Forward(n, images.data(), /*training=*/true);
  std::vector<float> train_probs(n * 3);
  backend_->CopyToHost(train_probs.data(), net->probabilities(), n * 12);
  backend_->CopyToHost(state.data(), net->state(), 16);
  for (int c = 0; c < 2; ++c) {
    double mean = 0, var = 0;
    for (int i = 0; i < n * 16; ++i) mean += x[i * 2 + c];
    mean /= n * 16;
    for (int i = 0; i < n * 16; ++i) var += std::pow(x[i * 2 + c] - mean, 2);
    var /= n * 16;
    EXPECT_NEAR(state[c], 0.1 * mean, 1e-5);
    EXPECT_NEAR(state[2 + c], 0.9 + 0.1 * var, 1e-5);
  }
  // Inference normalises with the running statistics: other outputs.
  net->Forward(n, images.data(), /*training=*/false);
  std::vector<float> infer_probs(n * 3);
  backend_->CopyToHost(infer_probs.data(), net->probabilities(), n * 12);
  EXPECT_NE(infer_probs, train_probs);
  std::vector<float> after(4);
  backend_->CopyToHost(after.data(), net->state(), 16);
  EXPECT_EQ(after, state);  // inference leaves them alone
}

TEST_F(NetworkTest, ForwardOfFewerSamplesThanMaxBatch) {
  auto net = Build(LeNet(), 8);
  ASSERT_NE(net, nullptr);
  net->Initialize(2);
  const int n = 8;
  DeviceArray images(backend_.get(), RandomVector(n * 784, 9, 0, 1));
  net->Forward(n, images.data(), false);
  std::vector<float> all(n * 10);
  backend_->CopyToHost(all.data(), net->probabilities(), all.size() * 4);
  net->Forward(3, images.data(), false);
  std::vector<float> few(3 * 10);
  backend_->CopyToHost(few.data(), net->probabilities(), few.size() * 4);
  for (int i = 0; i < 30; ++i) EXPECT_NEAR(few[i], all[i], 1e-5) << i;
}

// A convolution whose input gradient the backward pass never asks for (its
// input is the data, or only layers without parameters lie before it) does
// not prepare (time) backward data; the next one does.
TEST_F(NetworkTest, ConvolutionsPrepareBackwardDataOnlyWhereItIsAskedFor) {
  auto net = Build(Net({12, 12, 1}, {Pool("maxpool", 2), Conv(4, 3), Conv(4, 3),
                                     Fc(3), L("softmax")}),
                   4);
  ASSERT_NE(net, nullptr);
  const std::string tuning = backend_->SaveTuning();
  EXPECT_THAT(tuning, HasSubstr("[6, 6, 1] -> [4, 4, 4] (3x3, stride 1x1) "
                                "forward, n 4"));
  EXPECT_THAT(tuning, HasSubstr("[6, 6, 1] -> [4, 4, 4] (3x3, stride 1x1) "
                                "backward weights, n 4"));
  EXPECT_THAT(tuning, ::testing::Not(
                          HasSubstr("[6, 6, 1] -> [4, 4, 4] (3x3, stride 1x1) "
                                    "backward data")));
  EXPECT_THAT(tuning, HasSubstr("[4, 4, 4] -> [2, 2, 4] (3x3, stride 1x1) "
                                "backward data, n 4"));
}

TEST_F(NetworkTest, LeNetStepLowersTheLossAsItsGradientPredicts) {
  auto net = Build(LeNet(), 16);
  ASSERT_NE(net, nullptr);
  net->Initialize(4);
  const int n = 16;
  DeviceArray images(backend_.get(), RandomVector(n * 784, 10, 0, 1));
  auto labels = *backend_->Allocate(n * 4);
  std::vector<int32_t> host_labels(n);
  for (int i = 0; i < n; ++i) host_labels[i] = i % 10;
  backend_->CopyToDevice(labels.as<void>(), host_labels.data(), n * 4);
  auto mean_loss = [&] {
    DeviceArray stats(backend_.get(), 2);
    net->Forward(n, images.data(), true);
    net->Loss(n, labels.as<int32_t>(), stats.data());
    return double{stats.Get()[0]} / n;
  };
  DeviceArray velocity(backend_.get(), net->num_params());
  std::vector<double> losses;
  for (int step = 0; step < 5; ++step) {
    const double before = mean_loss();
    losses.push_back(before);
    net->Backward(n, labels.as<int32_t>(), 1.0f / n);
    const double g2 = backend_->SumSquares(net->num_params(), net->grads());
    // Plain gradient descent (no momentum, no L2): to first order the loss
    // drops by lr * |g|^2.
    const float lr = 0.01f;
    backend_->Fill(velocity.data(), net->num_params(), 0);
    backend_->SgdmUpdate(net->num_params(), net->num_decayed(), lr, 0, 0,
                         net->params(), net->grads(), velocity.data());
    const double after = mean_loss();
    EXPECT_NEAR(before - after, lr * g2, 0.1 * lr * g2) << "step " << step;
  }
  for (size_t i = 1; i < losses.size(); ++i)
    EXPECT_LT(losses[i], losses[i - 1]);
}

}  // namespace
}  // namespace dlbatch::trainer
