// The networks the precision tests train (bf16_train_run_test on the CPU,
// gpu_mixed_train_run_test on the GPU): LeNet, and examples/'s block
// network and small ResNet, with their solvers, as job-file text.
#ifndef DLBATCH_TESTS_TRAINER_PRECISION_NETS_H_
#define DLBATCH_TESTS_TRAINER_PRECISION_NETS_H_

#include "tests/integration/harness.h"

namespace dlbatch::testing {

// A network and its solver: job-file text under `train:` (`network:`, two
// spaces in) and under `options:` (four spaces in, without max_epochs).
struct Net {
  const char* network;
  const char* options;
};

// LeNet with Caffe's lenet_solver at batch 64.
inline const Net kLenet = {dlbatch::testing::kLenetNetworkYaml,
                           R"(    solver: sgdm
    initial_learn_rate: 0.01
    momentum: 0.9
    l2_regularization: 0.0005
    learn_rate_schedule: {type: inv, gamma: 0.0001, power: 0.75}
    mini_batch_size: 64
)"};

// examples/blocks-fashion-mnist.yaml's and examples/resnet-fashion-mnist.yaml's
// solver.
inline constexpr char kExampleSolver[] = R"(    solver: sgdm
    initial_learn_rate: 0.05
    momentum: 0.9
    l2_regularization: 0.0005
    learn_rate_schedule: {type: cosine, warmup_iterations: 100}
    mini_batch_size: 128
)";

// examples/blocks-fashion-mnist.yaml's network: batch normalisation between
// every convolution and its relu.
inline const Net kBlocks = {R"(
  network:
    input: [28, 28, 1]
    layers:
      - {type: conv, filters: 16, size: 3, padding: same}
      - {type: batchnorm}
      - {type: relu}
      - {type: maxpool, size: 2, stride: 2}
      - {type: conv, filters: 32, size: 3, padding: same}
      - {type: batchnorm}
      - {type: relu}
      - {type: maxpool, size: 2, stride: 2}
      - {type: conv, filters: 64, size: 3, padding: same}
      - {type: batchnorm}
      - {type: relu}
      - {type: globalavgpool}
      - {type: fc, units: 10}
      - {type: softmax}
)",
                            kExampleSolver};

// examples/resnet-fashion-mnist.yaml's network: the blocks with a residual
// block at each of the first two widths (their sums' gradients reach two
// layers each).
inline const Net kResNet = {R"(
  network:
    input: [28, 28, 1]
    layers:
      - {type: conv, filters: 16, size: 3, padding: same}
      - {type: batchnorm}
      - {name: stem, type: relu}
      - {type: conv, filters: 16, size: 3, padding: same}
      - {type: batchnorm}
      - {type: relu}
      - {type: conv, filters: 16, size: 3, padding: same}
      - {name: bn1, type: batchnorm}
      - {name: sum1, type: add, inputs: [stem, bn1]}
      - {type: relu}
      - {type: maxpool, size: 2, stride: 2}
      - {type: conv, filters: 32, size: 3, padding: same}
      - {type: batchnorm}
      - {name: wide, type: relu}
      - {type: conv, filters: 32, size: 3, padding: same}
      - {type: batchnorm}
      - {type: relu}
      - {type: conv, filters: 32, size: 3, padding: same}
      - {name: bn2, type: batchnorm}
      - {name: sum2, type: add, inputs: [wide, bn2]}
      - {type: relu}
      - {type: maxpool, size: 2, stride: 2}
      - {type: conv, filters: 64, size: 3, padding: same}
      - {type: batchnorm}
      - {type: relu}
      - {type: globalavgpool}
      - {type: fc, units: 10}
      - {type: softmax}
)",
                            kExampleSolver};

}  // namespace dlbatch::testing

#endif  // DLBATCH_TESTS_TRAINER_PRECISION_NETS_H_
