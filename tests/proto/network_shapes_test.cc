// InferLayerShape and InferNetworkShapes: each layer type's rule, the
// networks of examples/, and a job whose layers do not fit its input
// refused by the parser at the layer's line.
#include "proto/network_shapes.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "proto/jobspec_yaml.h"
#include "proto/network_wiring.h"

namespace dlbatch {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

v1::LayerSpec Layer(const std::string& type, int size = 0, int stride = 0,
                    int padding = 0, bool same = false) {
  v1::LayerSpec l;
  l.set_type(type);
  l.set_size(size);
  l.set_stride(stride);
  l.set_padding(padding);
  l.set_padding_same(same);
  return l;
}

v1::LayerSpec Conv(int filters, int size, int stride = 0, int padding = 0,
                   bool same = false) {
  v1::LayerSpec l = Layer("conv", size, stride, padding, same);
  l.set_filters(filters);
  return l;
}

absl::StatusOr<LayerShape> Infer(const v1::LayerSpec& layer,
                                 std::vector<SampleShape> ins) {
  std::vector<std::string> names;
  for (size_t i = 0; i < ins.size(); ++i)
    names.push_back("in" + std::to_string(i));
  return InferLayerShape(layer, ins, names);
}

SampleShape Out(const v1::LayerSpec& layer, std::vector<SampleShape> ins) {
  absl::StatusOr<LayerShape> s = Infer(layer, std::move(ins));
  EXPECT_TRUE(s.ok()) << layer.type() << ": " << s.status();
  return s.ok() ? s->out : SampleShape{};
}

std::string Error(const v1::LayerSpec& layer, std::vector<SampleShape> ins) {
  absl::StatusOr<LayerShape> s = Infer(layer, std::move(ins));
  EXPECT_FALSE(s.ok()) << layer.type() << " made " << s->out.ToString();
  if (s.ok()) return "";
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(s.status().message());
}

TEST(LayerShapes, ConvSlidesItsWindowWithStrideAndPadding) {
  const SampleShape in{28, 28, 3};
  EXPECT_EQ(Out(Conv(20, 5), {in}), (SampleShape{24, 24, 20}));
  EXPECT_EQ(Out(Conv(8, 3, 2), {in}), (SampleShape{13, 13, 8}));
  EXPECT_EQ(Out(Conv(8, 3, 1, 1), {in}), (SampleShape{28, 28, 8}));
  absl::StatusOr<LayerShape> same = Infer(Conv(4, 4, 3, 0, true), {in});
  ASSERT_TRUE(same.ok()) << same.status();
  // ceil(28 / 3) = 10 positions; (10 - 1) * 3 + 4 - 28 = 3 padded, the
  // extra one at the bottom and right.
  EXPECT_EQ(same->out, (SampleShape{10, 10, 4}));
  EXPECT_EQ(same->pad, (WindowPadding{1, 1, 2, 2}));
  EXPECT_EQ(same->kh, 4);
  EXPECT_EQ(same->stride_w, 3);
}

TEST(LayerShapes, PoolingStridesByItsSizeUnlessTold) {
  const SampleShape in{24, 24, 20};
  EXPECT_EQ(Out(Layer("maxpool", 2), {in}), (SampleShape{12, 12, 20}));
  EXPECT_EQ(Out(Layer("avgpool", 3, 1), {in}), (SampleShape{22, 22, 20}));
  EXPECT_EQ(Out(Layer("maxpool", 3, 2, 1), {in}), (SampleShape{12, 12, 20}));
  absl::StatusOr<LayerShape> global = Infer(Layer("globalavgpool"), {in});
  ASSERT_TRUE(global.ok()) << global.status();
  EXPECT_EQ(global->out, (SampleShape{1, 1, 20}));
  EXPECT_EQ(global->kh, 24);
  EXPECT_EQ(global->kw, 24);
}

TEST(LayerShapes, FcFlattensAndTheElementwiseLayersKeepTheirInput) {
  v1::LayerSpec fc = Layer("fc");
  fc.set_units(500);
  EXPECT_EQ(Out(fc, {{4, 4, 50}}), (SampleShape{1, 1, 500}));
  for (const char* type :
       {"batchnorm", "relu", "leakyrelu", "gelu", "dropout"}) {
    EXPECT_EQ(Out(Layer(type), {{7, 5, 3}}), (SampleShape{7, 5, 3})) << type;
  }
  EXPECT_EQ(Out(Layer("softmax"), {{1, 1, 10}}), (SampleShape{1, 1, 10}));
}

TEST(LayerShapes, AddKeepsAShapeAndConcatSumsChannels) {
  EXPECT_EQ(Out(Layer("add"), {{8, 8, 16}, {8, 8, 16}, {8, 8, 16}}),
            (SampleShape{8, 8, 16}));
  EXPECT_EQ(Out(Layer("concat"), {{8, 8, 16}, {8, 8, 32}}),
            (SampleShape{8, 8, 48}));
}

TEST(LayerShapes, RefusesWhatDoesNotFitSayingWhatToChange) {
  // The trainer's words for a conv after an fc.
  EXPECT_THAT(Error(Conv(4, 5), {{1, 1, 100}}),
              AllOf(HasSubstr("window [5, 5] is larger than its input "
                              "[1, 1, 100] padded to [1, 1]"),
                    HasSubstr("use a smaller size, padding or padding: same"),
                    HasSubstr("put conv and pooling layers before them")));
  EXPECT_THAT(Error(Layer("maxpool", 4), {{3, 3, 2}}),
              HasSubstr("window [4, 4] is larger than its input [3, 3, 2]"));
  // Padding makes room for the window.
  EXPECT_EQ(Out(Layer("maxpool", 4, 1, 1), {{3, 3, 2}}),
            (SampleShape{2, 2, 2}));
  EXPECT_THAT(Error(Layer("add"), {{8, 8, 16}, {4, 4, 16}}),
              HasSubstr("adds inputs of one shape, got 'in0' [8, 8, 16], "
                        "'in1' [4, 4, 16]"));
  EXPECT_THAT(Error(Layer("concat"), {{8, 8, 16}, {4, 4, 16}}),
              HasSubstr("one height and width"));
  EXPECT_THAT(Error(Layer("add"), {{8, 8, 16}}),
              HasSubstr("joins two or more outputs, got 1"));
  EXPECT_THAT(Error(Layer("relu"), {{8, 8, 16}, {8, 8, 16}}),
              HasSubstr("takes one input, not 2 (in0, in1)"));
  EXPECT_THAT(Error(Layer("softmax"), {{6, 6, 10}}),
              AllOf(HasSubstr("input [6, 6, 10] must be [1, 1, classes]"),
                    HasSubstr("got [6, 6] positions")));
  EXPECT_THAT(Error(Conv(0, 3), {{8, 8, 1}}), HasSubstr("filters must be > 0"));
  EXPECT_THAT(Error(Layer("fc"), {{8, 8, 1}}), HasSubstr("units must be > 0"));
  EXPECT_THAT(Error(Layer("maxpool"), {{8, 8, 1}}),
              HasSubstr("size must be > 0"));
  EXPECT_THAT(Error(Layer("avgpool", 2, -1), {{8, 8, 1}}),
              HasSubstr("stride must be >= 0"));
  EXPECT_THAT(Error(Layer("avgpool", 2, 1, 1, true), {{8, 8, 1}}),
              HasSubstr("not both"));
  EXPECT_THAT(Error(Layer("conv3d"), {{8, 8, 1}}),
              HasSubstr("unknown layer type 'conv3d'"));
  // Sizes near the int limit are refused, not overflowed.
  EXPECT_THAT(Error(Conv(1, 1, 1, 2000000000), {{8, 8, 1}}),
              HasSubstr("beyond 2147483647"));
  EXPECT_THAT(Error(Layer("concat"), {{1, 1, 2000000000}, {1, 1, 2000000000}}),
              HasSubstr("beyond 2147483647"));
}

absl::StatusOr<std::vector<LayerShape>> Network(const v1::NetworkSpec& net) {
  absl::StatusOr<NetworkWiring> wiring = WireNetwork(net);
  if (!wiring.ok()) return wiring.status();
  return InferNetworkShapes(net, *wiring);
}

v1::NetworkSpec ExampleNetwork(const std::string& name) {
  absl::StatusOr<ParsedJobFile> parsed =
      ReadJobFile(std::string(DLBATCH_EXAMPLES_DIR) + "/" + name);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return parsed.ok() ? parsed->spec.train().network() : v1::NetworkSpec();
}

TEST(NetworkShapes, TheExamplesFit) {
  absl::StatusOr<std::vector<LayerShape>> lenet =
      Network(ExampleNetwork("lenet-fashion-mnist.yaml"));
  ASSERT_TRUE(lenet.ok()) << lenet.status();
  std::vector<std::string> outs;
  for (const LayerShape& s : *lenet) outs.push_back(s.out.ToString());
  EXPECT_EQ(outs,
            (std::vector<std::string>{
                "[24, 24, 20]", "[12, 12, 20]", "[8, 8, 50]", "[4, 4, 50]",
                "[1, 1, 500]", "[1, 1, 500]", "[1, 1, 10]", "[1, 1, 10]"}));

  const v1::NetworkSpec resnet = ExampleNetwork("resnet-fashion-mnist.yaml");
  absl::StatusOr<std::vector<LayerShape>> shapes = Network(resnet);
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  ASSERT_EQ(shapes->size(), static_cast<size_t>(resnet.layers_size()));
  EXPECT_EQ((*shapes)[8].out, (SampleShape{28, 28, 16}));   // sum1
  EXPECT_EQ((*shapes)[10].out, (SampleShape{14, 14, 16}));  // maxpool
  EXPECT_EQ((*shapes)[21].out, (SampleShape{7, 7, 32}));    // maxpool
  EXPECT_EQ(shapes->back().out, (SampleShape{1, 1, 10}));

  for (const char* name : {"blocks-fashion-mnist.yaml", "resnet9-cifar10.yaml",
                           "sweep-fashion-mnist.yaml"}) {
    absl::StatusOr<std::vector<LayerShape>> s = Network(ExampleNetwork(name));
    ASSERT_TRUE(s.ok()) << name << ": " << s.status();
    EXPECT_EQ(s->back().out.h, 1) << name;
  }
}

TEST(NetworkShapes, TheNetworksRulesNameTheLayer) {
  v1::NetworkSpec net;
  for (int x : {8, 8, 1}) net.add_input(x);
  *net.add_layers() = Conv(4, 3);
  v1::LayerSpec fc = Layer("fc");
  fc.set_units(3);
  *net.add_layers() = fc;
  absl::StatusOr<std::vector<LayerShape>> s = Network(net);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()),
              AllOf(StartsWith("layers[1] (fc 'fc_2'): the last layer must be "
                               "softmax"),
                    HasSubstr("add `- softmax` after it")));

  *net.add_layers() = Layer("softmax");
  EXPECT_TRUE(Network(net).ok());
  *net.mutable_layers(1) = Layer("softmax");
  s = Network(net);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()),
              StartsWith("layers[1] (softmax 'softmax_2'): softmax must be "
                         "the last layer"));

  net.clear_input();
  net.add_input(8);
  EXPECT_THAT(std::string(Network(net).status().message()),
              HasSubstr("input: must be [height, width, channels]"));
}

// The job file the trainer would refuse when the job ran ("window [5, 5]
// is larger than its input [1, 1, 100]") is refused when it is read, at
// the layer's line and column.
TEST(NetworkShapes, AWindowTooLargeIsRefusedAtItsLine) {
  const std::string job =
      "name: misfit\n"
      "train:\n"
      "  network:\n"
      "    input: [28, 28, 1]\n"
      "    layers:\n"
      "      - {type: fc, units: 100}\n"
      "      - {type: conv, filters: 8, size: 5}\n"
      "      - {type: fc, units: 10}\n"
      "      - softmax\n"
      "  data:\n"
      "    train: {format: idx, images: a.gz, labels: b.gz}\n";
  absl::StatusOr<ParsedJobFile> parsed = ParseJobYaml(job, "job.yaml");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(parsed.status().message()),
              StartsWith("job.yaml:7:9: train.network.layers[1] (conv "
                         "'conv_2'): window [5, 5] is larger than its input "
                         "[1, 1, 100]"));

  // And the scheduler, which sees only the spec, refuses it too.
  std::string fitting = job;
  fitting.replace(fitting.find("size: 5"), 7, "size: 1");
  parsed = ParseJobYaml(fitting, "job.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  v1::JobSpec spec = parsed->spec;
  spec.mutable_train()->mutable_network()->mutable_layers(1)->set_size(5);
  EXPECT_THAT(std::string(ValidateJobSpec(spec).message()),
              StartsWith("train.network.layers[1] (conv 'conv_2'): window"));

  // A network without softmax at the end, at its last layer's line.
  std::string open_ended = job;
  open_ended.resize(open_ended.find("      - softmax\n"));
  open_ended += "  data:\n    train: {format: idx, images: a, labels: b}\n";
  open_ended.replace(open_ended.find("size: 5"), 7, "size: 1");
  parsed = ParseJobYaml(open_ended, "job.yaml");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(std::string(parsed.status().message()),
              StartsWith("job.yaml:8:9: train.network.layers[2] (fc 'fc_3'): "
                         "the last layer must be softmax"));
}

}  // namespace
}  // namespace dlbatch
