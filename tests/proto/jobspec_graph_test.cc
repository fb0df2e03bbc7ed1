// job.yaml for networks as graphs and the fast recipes' options: a layer's
// `inputs`, the add, concat and gelu types, `nesterov` and
// `label_smoothing`, and what validation refuses of them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "proto/jobspec_yaml.h"

namespace dlbatch {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Job(const std::string& layers, const std::string& options = "") {
  return "train:\n"
         "  network:\n"
         "    input: [8, 8, 1]\n"
         "    layers:\n" +
         layers +
         "  data:\n"
         "    train: {format: idx, images: a.gz, labels: b.gz}\n"
         "  options:\n"
         "    max_epochs: 1\n" +
         options;
}

absl::StatusOr<ParsedJobFile> Parse(const std::string& text) {
  return ParseJobYaml(text, "job.yaml");
}

TEST(JobYamlGraph, InputsAndTheNewLayerTypesAndOptionsParse) {
  absl::StatusOr<ParsedJobFile> parsed =
      Parse(Job("      - {name: a, type: conv, filters: 2, size: 3, "
                "padding: same}\n"
                "      - {type: gelu}\n"
                "      - {name: s, type: add, inputs: [a, gelu_2]}\n"
                "      - {type: concat, inputs: [s, a, input]}\n"
                "      - type: fc\n"
                "        units: 3\n"
                "        inputs: concat_4\n"  // one name needs no list
                "      - softmax\n",
                "    nesterov: true\n    label_smoothing: 0.1\n"));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const v1::NetworkSpec& net = parsed->spec.train().network();
  EXPECT_THAT(net.layers(2).inputs(), ElementsAre("a", "gelu_2"));
  EXPECT_THAT(net.layers(3).inputs(), ElementsAre("s", "a", "input"));
  EXPECT_THAT(net.layers(4).inputs(), ElementsAre("concat_4"));
  EXPECT_TRUE(net.layers(1).inputs().empty());  // the previous layer's
  EXPECT_TRUE(parsed->spec.train().options().nesterov());
  EXPECT_DOUBLE_EQ(parsed->spec.train().options().label_smoothing(), 0.1);
}

TEST(JobYamlGraph, RefusesWhatDoesNotFit) {
  auto error = [](const std::string& text) {
    absl::StatusOr<ParsedJobFile> parsed = Parse(text);
    EXPECT_FALSE(parsed.ok()) << text;
    return parsed.ok() ? std::string() : std::string(parsed.status().message());
  };
  // Unknown keys stay errors, with the nearest known one.
  EXPECT_THAT(error(Job("      - {type: add, input: [a, b]}\n")),
              HasSubstr("did you mean 'inputs'"));
  EXPECT_THAT(error(Job("      - {type: add, inputs: [a]}\n")),
              HasSubstr("joins two or more outputs"));
  EXPECT_THAT(error(Job("      - {type: relu, inputs: [a, b]}\n")),
              HasSubstr("takes one input, not 2"));
  EXPECT_THAT(error(Job("      - {type: gelu, alpha: 0.1}\n")),
              HasSubstr("alpha does not apply to a gelu layer"));
  EXPECT_THAT(error(Job("      - {type: fc, units: 3}\n",
                        "    solver: adam\n    nesterov: true\n")),
              HasSubstr("Nesterov's momentum is sgdm's"));
  EXPECT_THAT(
      error(Job("      - {type: fc, units: 3}\n", "    label_smoothing: 1\n")),
      HasSubstr("train.options.label_smoothing"));
  EXPECT_THAT(
      error(Job("      - {type: fc, units: 3}\n", "    nesterov: maybe\n")),
      HasSubstr("nesterov"));
}

// The wiring is checked at parse (and submission), at the layer's line.
TEST(JobYamlGraph, RefusesWiringFaultsAtTheLayersLine) {
  auto error = [](const std::string& text) {
    absl::StatusOr<ParsedJobFile> parsed = Parse(text);
    EXPECT_FALSE(parsed.ok()) << text;
    return parsed.ok() ? std::string() : std::string(parsed.status().message());
  };
  const std::string two =
      "      - {name: a, type: conv, filters: 2, size: 3}\n"
      "      - {name: b, type: conv, filters: 2, size: 3}\n";
  // Line 7 is layers[2]: train, network, input, layers, a and b come first.
  EXPECT_THAT(error(Job(two + "      - {name: s, type: add, inputs: [a, c]}\n"
                              "      - softmax\n")),
              AllOf(HasSubstr("job.yaml:7:"),
                    HasSubstr("train.network.layers[2] (add 's'): input 'c' "
                              "is the name of no layer")));
  EXPECT_THAT(error(Job(two + "      - {name: a, type: fc, units: 3}\n")),
              HasSubstr("the name 'a' is taken by layers[0]"));
  EXPECT_THAT(error(Job(two + "      - {type: fc, units: 3, inputs: a}\n"
                              "      - softmax\n")),
              AllOf(HasSubstr("job.yaml:6:"),
                    HasSubstr("layers[1] (conv 'b'): its output is used by "
                              "no layer")));
  EXPECT_THAT(error(Job("      - {name: a, type: conv, filters: 2, size: 3, "
                        "inputs: [b]}\n"
                        "      - {name: b, type: relu, inputs: [a]}\n")),
              HasSubstr("cycle (a -> b -> a)"));
}

}  // namespace
}  // namespace dlbatch
