// The networks the precision tests train (bf16_train_run_test on the CPU,
// gpu_mixed_train_run_test on the GPU): LeNet, and examples/'s block
// network and small ResNet, with their solvers, as job-file text; and a
// fixture that writes the job files of their runs.
#ifndef DLBATCH_TESTS_TRAINER_PRECISION_NETS_H_
#define DLBATCH_TESTS_TRAINER_PRECISION_NETS_H_

#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tests/integration/harness.h"
#include "tests/trainer/train_run_fixture.h"

namespace dlbatch::testing {

// A network and its solver: job-file text under `train:` (`network:`, two
// spaces in) and under `options:` (four spaces in, without max_epochs).
struct Net {
  std::string network;
  std::string options;
};

// LeNet with Caffe's lenet_solver at batch 64.
inline Net Lenet() {
  return {kLenetNetworkYaml, R"(    solver: sgdm
    initial_learn_rate: 0.01
    momentum: 0.9
    l2_regularization: 0.0005
    learn_rate_schedule: {type: inv, gamma: 0.0001, power: 0.75}
    mini_batch_size: 64
)"};
}

// examples/blocks-fashion-mnist.yaml's and examples/resnet-fashion-mnist.yaml's
// network and solver: at each of three widths (16, 32, 64) a 3x3
// convolution, batch normalisation and relu, max pooled between widths.
// Where `residual` (the ResNet), the first two widths' relu also feeds a
// residual block: two more such convolutions, the second's batch
// normalisation added to that relu, then relu (the sums' gradients reach
// two layers each).
inline Net ExampleNet(bool residual) {
  std::string layers;
  // A 3x3 convolution of `filters` and its batch normalisation (`bn`, a
  // name where not empty), as job-file list items six spaces in.
  auto conv_bn = [&](int filters, const std::string& bn) {
    absl::StrAppend(&layers, "      - {type: conv, filters: ", filters,
                    ", size: 3, padding: same}\n      - {",
                    bn.empty() ? "" : absl::StrCat("name: ", bn, ", "),
                    "type: batchnorm}\n");
  };
  for (const auto& [filters, in, block] :
       {std::tuple{16, "stem", "1"}, std::tuple{32, "wide", "2"}}) {
    conv_bn(filters, "");
    if (!residual) {
      absl::StrAppend(&layers, "      - {type: relu}\n");
    } else {
      absl::StrAppend(&layers, "      - {name: ", in, ", type: relu}\n");
      conv_bn(filters, "");
      absl::StrAppend(&layers, "      - {type: relu}\n");
      conv_bn(filters, absl::StrCat("bn", block));
      absl::StrAppend(&layers, "      - {name: sum", block,
                      ", type: add, inputs: [", in, ", bn", block,
                      "]}\n      - {type: relu}\n");
    }
    absl::StrAppend(&layers, "      - {type: maxpool, size: 2, stride: 2}\n");
  }
  conv_bn(64, "");
  return {absl::StrCat(R"(
  network:
    input: [28, 28, 1]
    layers:
)",
                       layers, R"(      - {type: relu}
      - {type: globalavgpool}
      - {type: fc, units: 10}
      - {type: softmax}
)"),
          R"(    solver: sgdm
    initial_learn_rate: 0.05
    momentum: 0.9
    l2_regularization: 0.0005
    learn_rate_schedule: {type: cosine, warmup_iterations: 100}
    mini_batch_size: 128
)"};
}

// examples/blocks-fashion-mnist.yaml's network: batch normalisation between
// every convolution and its relu.
inline Net Blocks() { return ExampleNet(false); }

// examples/resnet-fashion-mnist.yaml's network: the blocks with a residual
// block at each of the first two widths.
inline Net ResNet() { return ExampleNet(true); }

// A fixture of a precision test's runs on `environment` ("cpu" or "gpu"):
// job files of a net on Fashion-MNIST, validated on t10k at the end only.
class PrecisionRunFixture : public trainer::testing::TrainRunFixture {
 protected:
  // `iteration_options`: lines (four spaces in) of a job that runs a
  // number of steps, rather than one epoch.
  PrecisionRunFixture(std::string environment, std::string iteration_options)
      : environment_(std::move(environment)),
        iteration_options_(std::move(iteration_options)) {}

  // LeNet for `iterations` steps (0: one epoch) in `precision`.
  std::string Job(const std::string& name, const std::string& precision,
                  int seed, int iterations = 0) {
    return NetJob(Lenet(), name, precision, seed, iterations);
  }

  // `net` for `iterations` steps (0: one epoch) in `precision` (where
  // empty: the default, fp32), seeded with `seed`: written as
  // dir_/`name`.yaml, its path.
  std::string NetJob(const Net& net, const std::string& name,
                     const std::string& precision, int seed,
                     int iterations = 0) {
    return WriteJob(
        name,
        trainer::testing::FashionMnistJobText(
            name, net.network,
            absl::StrCat(
                net.options, "    max_epochs: 1\n",
                iterations > 0
                    ? absl::StrCat("    max_iterations: ", iterations, "\n",
                                   iteration_options_)
                    : "",
                "    shuffle: every-epoch\n    validation_frequency: 100000\n"
                "    execution_environment: ",
                environment_, "\n    seed: ", seed, "\n",
                precision.empty()
                    ? ""
                    : absl::StrCat("    precision: ", precision, "\n"))));
  }

 private:
  std::string environment_;
  std::string iteration_options_;
};

}  // namespace dlbatch::testing

#endif  // DLBATCH_TESTS_TRAINER_PRECISION_NETS_H_
