// Networks as graphs on the CPU backend: the wiring's refusals, add and
// concat, gradients summed over the layers that take one output (by finite
// differences of the whole loss), and the fast recipes' parts: gelu, label
// smoothing and Nesterov's momentum, against numbers worked by hand.
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/jobspec_yaml.h"
#include "tests/trainer/test_util.h"
#include "trainer/backend.h"
#include "trainer/network.h"
#include "trainer/options.h"
#include "trainer/solver.h"

namespace dlbatch::trainer {
namespace {

using ::testing::AllOf;
using testing::CheckGradient;
using testing::DeviceArray;
using ::testing::HasSubstr;
using testing::RandomVector;

// A layer of `type` named `name` (empty: the default) taking `inputs`.
v1::LayerSpec L(const std::string& type, const std::string& name = "",
                std::vector<std::string> inputs = {}) {
  v1::LayerSpec l;
  l.set_type(type);
  l.set_name(name);
  for (auto& i : inputs) l.add_inputs(i);
  return l;
}
v1::LayerSpec Conv(const std::string& name, int filters, int size,
                   std::vector<std::string> inputs = {}) {
  v1::LayerSpec l = L("conv", name, std::move(inputs));
  l.set_filters(filters);
  l.set_size(size);
  l.set_padding_same(true);
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

// A residual block (the stem's output taken by a conv and by the add) and
// a concat of two branches; gelu and avgpool keep the loss smooth for
// finite differences.
v1::NetworkSpec ResidualNet() {
  v1::LayerSpec pool = L("avgpool");
  pool.set_size(2);
  pool.set_stride(1);
  return Net({6, 5, 2},
             {Conv("stem", 4, 3), L("gelu", "g"), Conv("a", 4, 3),
              L("batchnorm", "bn"), L("add", "sum", {"g", "bn"}),
              Conv("side", 3, 1, {"g"}), L("concat", "cat", {"sum", "side"}),
              pool, Fc(4), L("softmax")});
}

class GraphNetworkTest : public testing::CpuBackendTest {
 protected:
  absl::Status BuildError(const v1::NetworkSpec& spec) {
    return Network::Build(spec, backend_.get(), 4).status();
  }
  std::unique_ptr<Network> Build(const v1::NetworkSpec& spec, int max_batch) {
    auto net = Network::Build(spec, backend_.get(), max_batch);
    EXPECT_TRUE(net.ok()) << net.status();
    return net.ok() ? *std::move(net) : nullptr;
  }
  std::vector<float> Get(const float* device, int64_t count) {
    std::vector<float> host(count);
    backend_->CopyToHost(host.data(), device, count * 4);
    return host;
  }

  // Checks the network's gradient of scale * its loss (label smoothing s)
  // on n random samples against central differences of that loss.
  void CheckNetworkGradient(const v1::NetworkSpec& spec, float smoothing) {
    const int n = 3;
    auto net = Build(spec, n);
    ASSERT_NE(net, nullptr);
    net->Initialize(11);
    net->SetLabelSmoothing(smoothing);
    const int k = net->num_classes();
    DeviceArray images(backend_.get(),
                       RandomVector(n * net->input_shape().size(), 5));
    std::vector<int32_t> labels = {1, 0, k - 1};
    Buffer label_buffer = *backend_->Allocate(n * 4);
    backend_->CopyToDevice(label_buffer.as<void>(), labels.data(), n * 4);
    const float scale = 0.5f;
    net->Forward(n, images.data(), /*training=*/true);
    net->Backward(n, label_buffer.as<int32_t>(), scale);
    std::vector<float> grads = Get(net->grads(), net->num_params());
    std::vector<float> params = Get(net->params(), net->num_params());
    auto loss = [&] {
      backend_->CopyToDevice(net->params(), params.data(), params.size() * 4);
      net->Forward(n, images.data(), true);
      std::vector<float> p = Get(net->probabilities(), n * k);
      double sum = 0;
      for (int i = 0; i < n; ++i) {
        for (int c = 0; c < k; ++c) {
          const double q = (c == labels[i] ? 1 - smoothing : 0) + smoothing / k;
          sum -= q * std::log(double{p[i * k + c]});
        }
      }
      return scale * sum;
    };
    CheckGradient("params", params, grads, loss, 3e-3f, 2e-2, 80);
    for (const ParamInfo& p : net->params_info()) {
      double s = 0;
      for (int64_t i = 0; i < p.count; ++i) s += std::fabs(grads[p.offset + i]);
      EXPECT_GT(s, 0) << p.name << " gets no gradient";
    }
  }
};

TEST_F(GraphNetworkTest, RefusesDuplicateNames) {
  absl::Status s = BuildError(
      Net({4, 4, 1}, {Conv("a", 2, 3), Conv("a", 2, 3), Fc(3), L("softmax")}));
  EXPECT_THAT(s.message(), AllOf(HasSubstr("layers[1] (conv 'a')"),
                                 HasSubstr("taken by layers[0] (conv 'a')")));
  // A default name counts too, and "input" is the network's.
  s = BuildError(Net(
      {4, 4, 1}, {Conv("fc_3", 2, 3), Conv("", 2, 3), Fc(3), L("softmax")}));
  EXPECT_THAT(s.message(), HasSubstr("layers[2] (fc 'fc_3'): the name 'fc_3' "
                                     "is taken by layers[0]"));
  s = BuildError(Net({4, 4, 1}, {Conv("input", 2, 3), Fc(3), L("softmax")}));
  EXPECT_THAT(s.message(), HasSubstr("network's input"));
}

TEST_F(GraphNetworkTest, RefusesAnUnknownInput) {
  absl::Status s = BuildError(
      Net({4, 4, 1}, {Conv("a", 2, 3), Conv("b", 2, 3),
                      L("add", "s", {"a", "bee"}), Fc(3), L("softmax")}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("layers[2] (add 's')"),
                    HasSubstr("input 'bee' is the name of no layer"),
                    HasSubstr("input, a, b")));
}

TEST_F(GraphNetworkTest, RefusesACycleNamingItsLayers) {
  absl::Status s =
      BuildError(Net({4, 4, 1}, {Conv("a", 2, 3), L("add", "s", {"a", "c"}),
                                 Conv("c", 2, 3), Fc(3), L("softmax")}));
  EXPECT_THAT(s.message(), AllOf(HasSubstr("layers[1] (add 's')"),
                                 HasSubstr("cycle (s -> c -> s)")));
  // A layer that takes its own output.
  s = BuildError(Net({4, 4, 1}, {Conv("a", 2, 3), Conv("b", 2, 3, {"b"}), Fc(3),
                                 L("softmax")}));
  EXPECT_THAT(s.message(), HasSubstr("cycle (b -> b)"));
  // Taking a later layer's output without a cycle: listed out of order.
  s = BuildError(
      Net({4, 4, 1}, {Conv("a", 2, 3, {"b"}), Conv("b", 2, 3, {"input"}), Fc(3),
                      L("softmax")}));
  EXPECT_THAT(s.message(), AllOf(HasSubstr("layers[0] (conv 'a')"),
                                 HasSubstr("layers[1] (conv 'b'), which is "
                                           "listed after it")));
}

TEST_F(GraphNetworkTest, RefusesAnUnusedOutput) {
  // "side" feeds nothing: the next layer takes "a" instead.
  absl::Status s = BuildError(Net(
      {4, 4, 1}, {Conv("a", 2, 3), Conv("side", 2, 3), Fc(3), L("softmax")}));
  EXPECT_TRUE(s.ok()) << s;  // a plain list uses every output
  v1::LayerSpec fc = Fc(3);
  fc.add_inputs("a");
  s = BuildError(
      Net({4, 4, 1}, {Conv("a", 2, 3), Conv("side", 2, 3), fc, L("softmax")}));
  EXPECT_THAT(s.message(), AllOf(HasSubstr("layers[1] (conv 'side')"),
                                 HasSubstr("used by no layer")));
}

TEST_F(GraphNetworkTest, RefusesShapesThatDoNotFitNamingLayersAndShapes) {
  v1::LayerSpec pool = L("maxpool", "p");
  pool.set_size(2);
  absl::Status s = BuildError(Net(
      {4, 4, 1},
      {Conv("a", 2, 3), pool, L("add", "s", {"a", "p"}), Fc(3), L("softmax")}));
  EXPECT_THAT(s.message(), AllOf(HasSubstr("layers[2] (add 's')"),
                                 HasSubstr("'a' [4, 4, 2], 'p' [2, 2, 2]")));
  s = BuildError(
      Net({4, 4, 1}, {Conv("a", 2, 3), Conv("b", 3, 3),
                      L("add", "s", {"a", "b"}), Fc(3), L("softmax")}));
  EXPECT_THAT(s.message(), HasSubstr("'a' [4, 4, 2], 'b' [4, 4, 3]"));
  s = BuildError(
      Net({4, 4, 1}, {Conv("a", 2, 3), pool, L("concat", "c", {"a", "p"}),
                      Fc(3), L("softmax")}));
  EXPECT_THAT(s.message(), AllOf(HasSubstr("layers[2] (concat 'c')"),
                                 HasSubstr("one height and width"),
                                 HasSubstr("'a' [4, 4, 2], 'p' [2, 2, 2]")));
  // One input where two are needed, two where one is.
  s = BuildError(Net(
      {4, 4, 1}, {Conv("a", 2, 3), L("add", "s", {"a"}), Fc(3), L("softmax")}));
  EXPECT_THAT(s.message(), HasSubstr("two or more"));
  s = BuildError(
      Net({4, 4, 1}, {Conv("a", 2, 3), Conv("b", 2, 3),
                      Conv("c", 2, 3, {"a", "b"}), Fc(3), L("softmax")}));
  EXPECT_THAT(s.message(), AllOf(HasSubstr("layers[2] (conv 'c')"),
                                 HasSubstr("takes one input, not 2 (a, b)")));
}

TEST_F(GraphNetworkTest, ExplicitInputsOfAListBuildTheSameNetwork) {
  v1::NetworkSpec list = Net({8, 8, 1}, {Conv("", 3, 3), L("relu"), Fc(5),
                                         L("gelu"), Fc(3), L("softmax")});
  v1::NetworkSpec wired = list;
  wired.mutable_layers(0)->add_inputs("input");
  for (int i = 1; i < wired.layers_size(); ++i) {
    wired.mutable_layers(i)->add_inputs(
        absl::StrCat(list.layers(i - 1).type(), "_", i));
  }
  auto a = Build(list, 2), b = Build(wired, 2);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  a->Initialize(4);
  b->Initialize(4);
  EXPECT_EQ(Get(a->params(), a->num_params()),
            Get(b->params(), b->num_params()));
  DeviceArray images(backend_.get(), RandomVector(2 * 64, 9));
  a->Forward(2, images.data(), false);
  b->Forward(2, images.data(), false);
  EXPECT_EQ(Get(a->probabilities(), 6), Get(b->probabilities(), 6));
  EXPECT_EQ(b->layers()[3].inputs, std::vector<int>{2});
  EXPECT_EQ(b->layers()[0].inputs, std::vector<int>{-1});
}

TEST_F(GraphNetworkTest, AddAndConcatForward) {
  // out = concat(add(relu(x), x), x): values checkable by hand.
  auto net = Build(
      Net({1, 2, 2}, {L("relu", "r"), L("add", "s", {"r", "input"}),
                      L("concat", "c", {"s", "input"}), Fc(2), L("softmax")}),
      1);
  ASSERT_NE(net, nullptr);
  EXPECT_EQ(net->layers()[2].out.ToString(), "[1, 2, 4]");
  // The fc's weight [2, 8]: row 0 sums the concat's output, row 1 is 0, so
  // the first probability is 1 / (1 + exp(-sum)).
  std::vector<float> params(net->num_params(), 0.0f);
  for (int i = 0; i < 8; ++i) params[i] = 1;
  backend_->CopyToDevice(net->params(), params.data(), params.size() * 4);
  DeviceArray x(backend_.get(), std::vector<float>{1, -2, -3, 4});
  net->Forward(1, x.data(), false);
  // concat: [s(0), s(1), x(0), x(1)] per position, s = relu(x) + x:
  // position 0: s = [2, -2], x = [1, -2]; position 1: s = [-3, 8],
  // x = [-3, 4]. Sum = 2 - 2 + 1 - 2 - 3 + 8 - 3 + 4 = 5.
  const std::vector<float> p = Get(net->probabilities(), 2);
  EXPECT_NEAR(p[0], 1 / (1 + std::exp(-5.0)), 1e-6);
}

TEST_F(GraphNetworkTest, ResidualAndConcatGradientsMatchFiniteDifferences) {
  CheckNetworkGradient(ResidualNet(), 0);
}

TEST_F(GraphNetworkTest, AnOutputTakenTwiceByOneLayerGetsBothGradients) {
  CheckNetworkGradient(
      Net({5, 5, 2},
          {Conv("a", 3, 3), L("add", "twice", {"a", "a"}),
           L("concat", "both", {"twice", "a", "twice"}), Fc(3), L("softmax")}),
      0);
}

TEST_F(GraphNetworkTest, LabelSmoothingGradientMatchesFiniteDifferences) {
  CheckNetworkGradient(ResidualNet(), 0.2f);
}

TEST_F(GraphNetworkTest, GradientBuffersAreSharedWhereTheyNeverMeet) {
  // Backward of a residual net of many blocks still completes with finite,
  // repeatable gradients (the buffers' sharing leaves nothing stale).
  std::vector<v1::LayerSpec> layers = {Conv("b0", 4, 3)};
  for (int b = 1; b <= 4; ++b) {
    const std::string prev = absl::StrCat("b", b - 1);
    layers.push_back(Conv(absl::StrCat("c", b), 4, 3, {prev}));
    layers.push_back(L("gelu", absl::StrCat("g", b)));
    layers.push_back(
        L("add", absl::StrCat("b", b), {prev, absl::StrCat("g", b)}));
  }
  layers.push_back(Fc(3));
  layers.push_back(L("softmax"));
  CheckNetworkGradient(Net({4, 4, 1}, layers), 0);
}

TEST_F(GraphNetworkTest, GeluMatchesHandWorkedValues) {
  const std::vector<float> x = {-2, -1, 0, 0.5f, 1, 2};
  // x Phi(x) and Phi(x) + x phi(x), from erf tables.
  const std::vector<double> y = {-0.0455003, -0.1586553, 0,
                                 0.3457312,  0.8413447,  1.9544997};
  const std::vector<double> dy = {-0.0852318, -0.0833155, 0.5,
                                  0.8674951,  1.0833155,  1.0852318};
  DeviceArray in(backend_.get(), x), out(backend_.get(), 6),
      ones(backend_.get(), std::vector<float>(6, 1.0f)), dx(backend_.get(), 6);
  ActivationDesc gelu;
  gelu.kind = ActivationKind::kGelu;
  backend_->ActivationForward(gelu, 6, in.data(), out.data());
  backend_->ActivationBackward(gelu, 6, in.data(), ones.data(), dx.data());
  const std::vector<float> got = out.Get(), grad = dx.Get();
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(got[i], y[i], 1e-6) << x[i];
    EXPECT_NEAR(grad[i], dy[i], 1e-6) << x[i];
  }
}

TEST_F(GraphNetworkTest, LabelSmoothingLossAndGradientByHand) {
  // Logits log 1, log 2, log 5: p = 1/8, 2/8, 5/8; label 2, s = 0.3:
  // q = 0.1, 0.1, 0.8; loss = -(0.1 log 1/8 + 0.1 log 1/4 + 0.8 log 5/8)
  // = 0.7225765; dlogits = p - q = 0.025, 0.15, -0.175.
  DeviceArray logits(backend_.get(),
                     std::vector<float>{0, std::log(2.0f), std::log(5.0f)});
  DeviceArray probs(backend_.get(), 3), stats(backend_.get(), 2),
      dlogits(backend_.get(), 3);
  Buffer label = *backend_->Allocate(4);
  const int32_t two = 2;
  backend_->CopyToDevice(label.as<void>(), &two, 4);
  backend_->SoftmaxCrossEntropy(1, 3, logits.data(), label.as<int32_t>(), 0.3f,
                                probs.data(), stats.data());
  EXPECT_NEAR(stats.Get()[0], 0.7225765, 1e-6);
  EXPECT_EQ(stats.Get()[1], 1.0f);
  backend_->SoftmaxCrossEntropyBackward(1, 3, probs.data(), label.as<int32_t>(),
                                        0.3f, 2.0f, dlogits.data());
  const std::vector<float> d = dlogits.Get();
  EXPECT_NEAR(d[0], 2 * 0.025, 1e-6);
  EXPECT_NEAR(d[1], 2 * 0.15, 1e-6);
  EXPECT_NEAR(d[2], 2 * -0.175, 1e-6);
}

TEST_F(GraphNetworkTest, NesterovUpdateByHandAndThroughTheSolver) {
  // p = 1, v = 0.5, g = 0.2, lr = 0.1, momentum 0.9: v' = 0.45 - 0.02 =
  // 0.43, p' = 1 + 0.9 * 0.43 - 0.02 = 1.367 (PyTorch's nesterov=True with
  // its buffer -v / lr = -5: buf' = -4.3, p' = 1 - 0.1 (0.2 - 3.87)). The
  // first element is a weight with l2 = 0.5: g = 0.2 + 0.5 = 0.7,
  // v' = 0.45 - 0.07 = 0.38, p' = 1 + 0.342 - 0.07 = 1.272.
  DeviceArray p(backend_.get(), std::vector<float>{1, 1}),
      g(backend_.get(), std::vector<float>{0.2f, 0.2f}),
      v(backend_.get(), std::vector<float>{0.5f, 0.5f});
  backend_->SgdmNesterovUpdate(2, 1, 0.1f, 0.9f, 0.5f, p.data(), g.data(),
                               v.data());
  EXPECT_NEAR(p.Get()[0], 1.272, 1e-6);
  EXPECT_NEAR(v.Get()[0], 0.38, 1e-6);
  EXPECT_NEAR(p.Get()[1], 1.367, 1e-6);
  EXPECT_NEAR(v.Get()[1], 0.43, 1e-6);

  // The solver takes it from the options.
  auto net = Build(Net({1, 1, 2}, {Fc(2), L("softmax")}), 1);
  ASSERT_NE(net, nullptr);
  v1::TrainingOptions spec;
  spec.set_nesterov(true);
  spec.set_l2_regularization(0);
  spec.set_momentum(0.9);
  Options options = ResolveOptions(spec);
  ASSERT_TRUE(options.nesterov);
  auto solver = Solver::Create(options, backend_.get(), net.get());
  ASSERT_TRUE(solver.ok()) << solver.status();
  std::vector<float> params(net->num_params(), 1.0f),
      grads(net->num_params(), 0.2f);
  backend_->CopyToDevice(net->params(), params.data(), params.size() * 4);
  backend_->CopyToDevice(net->grads(), grads.data(), grads.size() * 4);
  (*solver)->LoadState(std::vector<float>(net->num_params(), 0.5f));
  (*solver)->Step(0.1, 1);
  for (float x : Get(net->params(), net->num_params())) {
    EXPECT_NEAR(x, 1.367, 1e-6);
  }
}

// The example files parse, pass validation and build to the shapes their
// comments give.
// The CPU backend folds a relu into the batchnorm or add layer that alone
// feeds it (Backend::folds_relu): the network computes exactly what it
// computes with every relu a layer of its own (DLBATCH_FOLD_RELU=0).
TEST_F(GraphNetworkTest, FoldedRelusComputeWhatRelusOfTheirOwnDo) {
  v1::LayerSpec pool = L("maxpool");
  pool.set_size(2);
  const v1::NetworkSpec spec =
      Net({6, 6, 3},
          {Conv("stem", 8, 3), L("batchnorm", "bn0"), L("relu", "r0"),  // folds
           Conv("a", 8, 3), L("batchnorm", "bn1"),
           L("add", "sum", {"r0", "bn1"}), L("relu", "r1"),  // folds into add
           Conv("b", 8, 3), L("batchnorm", "bn2"),
           L("relu", "r2"),  // bn2 is also the concat's: no fold
           Conv("c", 8, 1, {"r2"}), L("relu", "r3"),  // after a conv: no fold
           L("concat", "cat", {"r3", "bn2"}), pool, Fc(5), L("softmax")});
  ASSERT_EQ(setenv("DLBATCH_FOLD_RELU", "0", 1), 0);
  absl::StatusOr<std::unique_ptr<Backend>> plain_backend = MakeCpuBackend(1);
  unsetenv("DLBATCH_FOLD_RELU");
  ASSERT_TRUE(plain_backend.ok()) << plain_backend.status();
  EXPECT_TRUE(backend_->folds_relu());
  EXPECT_FALSE((*plain_backend)->folds_relu());

  const int max_batch = 4;
  auto folded = Build(spec, max_batch);
  // The same convolution implementations on both sides, whatever each
  // would time fastest under this machine's load.
  (*plain_backend)->LoadTuning(backend_->SaveTuning());
  auto plain = Network::Build(spec, plain_backend->get(), max_batch);
  ASSERT_NE(folded, nullptr);
  ASSERT_TRUE(plain.ok()) << plain.status();
  std::vector<std::string> which;
  for (const LayerInfo& l : folded->layers()) {
    if (l.folded) which.push_back(l.name);
  }
  EXPECT_EQ(which, (std::vector<std::string>{"r0", "r1"}));
  for (const LayerInfo& l : (*plain)->layers()) EXPECT_FALSE(l.folded);

  folded->Initialize(3);
  (*plain)->Initialize(3);
  const int k = folded->num_classes();
  const int64_t size = folded->input_shape().size();
  // Two steps of a full batch and one of a smaller one (the last batch of
  // an epoch): the mask of the zeroed outputs is kept for each.
  for (int n : {max_batch, max_batch, 3}) {
    SCOPED_TRACE(n);
    DeviceArray images(backend_.get(), RandomVector(n * size, 7 + n));
    std::vector<int32_t> labels = {0, 4, 2, 1};
    Buffer label_buffer = *backend_->Allocate(n * 4);
    backend_->CopyToDevice(label_buffer.as<void>(), labels.data(), n * 4);
    for (Network* net : {folded.get(), plain->get()}) {
      // A new batch size is tuned on its first use: by the folded side.
      if (net == plain->get()) {
        (*plain_backend)->LoadTuning(backend_->SaveTuning());
      }
      net->Forward(n, images.data(), /*training=*/true);
      net->Backward(n, label_buffer.as<int32_t>(), 0.25f);
    }
    EXPECT_EQ(Get(folded->probabilities(), n * k),
              Get((*plain)->probabilities(), n * k));
    const std::vector<float> grads = Get(folded->grads(), folded->num_params());
    EXPECT_EQ(grads, Get((*plain)->grads(), (*plain)->num_params()));
    // Every parameter learns: the folded relus pass their gradients on.
    for (const ParamInfo& p : folded->params_info()) {
      double sum = 0;
      for (int64_t i = 0; i < p.count; ++i)
        sum += std::fabs(grads[p.offset + i]);
      EXPECT_GT(sum, 0) << p.name;
    }
    EXPECT_EQ(Get(folded->state(), folded->state_size()),
              Get((*plain)->state(), (*plain)->state_size()));
    // Inference, with the running statistics, folds the relu too.
    folded->Forward(n, images.data(), /*training=*/false);
    (*plain)->Forward(n, images.data(), /*training=*/false);
    EXPECT_EQ(Get(folded->probabilities(), n * k),
              Get((*plain)->probabilities(), n * k));
  }
}

TEST_F(GraphNetworkTest, ResNetExamplesBuild) {
  struct Example {
    const char* file;
    const char* before_pool;  // the name of the layer before the last pool
    Shape expect;             // its output
    int64_t params;
  };
  // ResNet-9: 64*27 + 128*576 + 2*128*1152 + 256*1152 + 512*2304 +
  // 2*512*4608 + 512*10 weights, 2240 + 10 biases, 2 * 2240 of batchnorm's;
  // the small one: 144 + 2*2304 + 4608 + 2*9216 + 18432 + 640 weights,
  // 208 + 10 biases, 2 * 208 of batchnorm's.
  const Example examples[] = {
      {DLBATCH_EXAMPLES_DIR "/resnet9-cifar10.yaml",
       "layer3",
       {4, 4, 512},
       6575370},
      {DLBATCH_EXAMPLES_DIR "/resnet-fashion-mnist.yaml",
       "sum2",
       {14, 14, 32},
       47498},
  };
  for (const Example& e : examples) {
    SCOPED_TRACE(e.file);
    absl::StatusOr<ParsedJobFile> parsed = ReadJobFile(e.file);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    auto net = Build(parsed->spec.train().network(), 2);
    ASSERT_NE(net, nullptr);
    EXPECT_EQ(net->num_classes(), 10);
    EXPECT_EQ(net->num_params(), e.params);
    bool found = false;
    for (const LayerInfo& l : net->layers()) {
      if (l.name != e.before_pool) continue;
      found = true;
      EXPECT_EQ(l.out.ToString(), e.expect.ToString());
      EXPECT_EQ(l.spec.type(), "add");
    }
    EXPECT_TRUE(found) << e.before_pool;
  }
}

}  // namespace
}  // namespace dlbatch::trainer
