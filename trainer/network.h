// A network built from a job's `network:` section on one Backend: its
// layers, their kernels, and all learnable parameters in one contiguous
// device buffer (one allreduce, one solver pass, one checkpoint write), as
// llm.c keeps them.
//
// Layers form a graph: each takes the outputs its spec's `inputs` name
// (proto/network_wiring.h; by default the previous layer's), in the order they
// are listed. An output that several layers take gets the sum of their
// gradients.
//
// Parameter layout: every layer's weights first (the elements that get L2
// regularisation), then every bias and batchnorm scale/offset. Shapes, in
// the job file's channels-last terms:
//   conv  weight [filters, size, size, in_c] (OHWI), bias [filters]
//   fc    weight [units, in] with `in` the input sample's NHWC elements
//         flattened, bias [units]
//   batchnorm  scale [c], offset [c]; state (not learnable, in state()):
//         running mean [c], running variance [c]
// The network ends with `softmax`, and the layer before it yields
// (1, 1, classes): the loss is softmax cross-entropy against class labels.
//
// Thread safety: none; one rank uses its Network from one thread.
#ifndef DLBATCH_TRAINER_NETWORK_H_
#define DLBATCH_TRAINER_NETWORK_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dlbatch/v1/job.pb.h"
#include "trainer/backend.h"
#include "trainer/comm/communicator.h"
#include "trainer/shape.h"

namespace dlbatch::trainer {

// A named array in the parameter (or state) buffer.
struct ParamInfo {
  std::string name;    // "conv_1.weight", "batchnorm_2.running_var"
  int layer = 0;       // index into layers()
  int64_t offset = 0;  // in floats, into params() or state()
  int64_t count = 0;
  std::vector<int64_t> dims;  // as in the layout above
};

struct LayerInfo {
  int index = 0;
  std::string name;  // spec's name, else "<type>_<index+1>"
  v1::LayerSpec spec;
  Shape in, out;  // in: the first input's shape
  // The layers whose outputs this one takes, in order: indices into
  // Network::layers(), all below `index`; -1 is the network's input.
  std::vector<int> inputs;
  std::vector<Shape> ins;  // their shapes
  // Resolved window of conv/maxpool/avgpool (stride defaults to 1 for conv
  // and to `size` for pooling; `padding_same` resolved); globalavgpool:
  // the whole input.
  int kh = 0, kw = 0, stride_h = 1, stride_w = 1;
  Padding pad;
  std::vector<int> params;  // indices into Network::params_info()
  std::vector<int> state;   // indices into Network::state_info()
  // A relu computed by the layer that feeds it (Backend::folds_relu): its
  // output and gradient are that layer's.
  bool folded = false;
  // Its output and that output's gradient are bf16 (a conv and the batch
  // norm it alone feeds, and on to the one conv after: ConvDesc::bf16_out,
  // BatchNormDesc).
  bool bf16_output = false;
};

class Network {
 public:
  virtual ~Network() = default;

  // Builds `spec` on `backend` (which must outlive the network) for batches
  // of up to `max_batch` samples. Refused with InvalidArgument, naming the
  // layer and its index ("layers[4] (conv 'conv_5'): window [5, 5] is
  // larger than its input [1, 1, 100] ..."): the wiring's faults
  // (WireNetwork: duplicate names, unknown inputs, cycles, unused outputs)
  // and the shapes' (InferNetworkShapes: a window larger than its padded
  // input, add's inputs of different shapes, concat's of different height
  // or width, a network that does not end with softmax after a layer of
  // (1, 1, k) output, ...), in the words ValidateJobSpec used at
  // submission.
  // `communicator` (optional; must outlive the network) is this rank's tie
  // to the others: batchnorm layers with `sync` take their training
  // statistics over all its ranks' batches when it has more than one.
  static absl::StatusOr<std::unique_ptr<Network>> Build(
      const v1::NetworkSpec& spec, Backend* backend, int max_batch,
      Communicator* communicator = nullptr);

  virtual Shape input_shape() const = 0;
  virtual int num_classes() const = 0;
  virtual int max_batch() const = 0;
  virtual const std::vector<LayerInfo>& layers() const = 0;
  virtual const std::vector<ParamInfo>& params_info() const = 0;
  virtual const std::vector<ParamInfo>& state_info() const = 0;

  virtual int64_t num_params() const = 0;
  // The first num_decayed() elements of params() are weights (L2 applies).
  virtual int64_t num_decayed() const = 0;
  virtual float* params() = 0;  // device, num_params() floats
  virtual float* grads() = 0;   // device, num_params() floats
  virtual int64_t state_size() const = 0;
  virtual float* state() = 0;  // device, state_size() floats

  // Initialises parameters as the frameworks do, reproducibly from `seed`
  // and identically on every backend: weights of a conv/fc followed (after
  // any batchnorm) by relu/leakyrelu are He-normal, other weights
  // Glorot-uniform; biases 0; batchnorm scale 1, offset 0, running mean 0
  // and variance 1.
  virtual void Initialize(uint64_t seed) = 0;

  // The loss's label smoothing s in [0, 1) (0 until set): Loss and Backward
  // take the cross-entropy against (1 - s) * onehot(label) + s / classes.
  virtual void SetLabelSmoothing(float smoothing) = 0;

  // Runs the network on n samples (device, NHWC, input_shape() each).
  // training: batchnorm uses (and updates the running) batch statistics,
  // dropout draws from the backend's key (Backend::SetDropoutKey, set by
  // the caller: per step, outside a recorded step) with the layer's index
  // as salt; otherwise batchnorm uses the running statistics and dropout is
  // the identity.
  virtual void Forward(int n, const float* images, bool training) = 0;
  // Class probabilities of the last Forward: device, n x num_classes().
  virtual const float* probabilities() const = 0;
  // Adds the last Forward's summed cross-entropy against `labels` (device
  // int32[n]) to stats[0] and its number of correct predictions to
  // stats[1] (device float[2]).
  virtual void Loss(int n, const int32_t* labels, float* stats) = 0;
  // Gradient of scale * (summed cross-entropy of the last training Forward
  // against `labels`) into grads(), every element overwritten.
  void Backward(int n, const int32_t* labels, float scale) {
    Backward(n, labels, scale, nullptr);
  }
  // Called during Backward with ranges [first, first + count) of grads()
  // whose values are final: issued to the backend, and never written again
  // by this Backward. Each element of grads() comes in exactly one range
  // (unless a collective failed: after that, none come). Ranges come layer
  // by layer, last layer first, so with the layout above they grow down
  // from the end of the weights and from the end of the biases. The same
  // network calls it with the same ranges in the same order every time,
  // on every rank.
  using GradsReady = std::function<void(int64_t first, int64_t count)>;
  // Backward, telling `on_grads_ready` (may be empty) as gradients become
  // final, so that their allreduce can start while earlier layers compute
  // (grad_buckets.h).
  virtual void Backward(int n, const int32_t* labels, float scale,
                        const GradsReady& on_grads_ready) = 0;

  // The first failure of a collective that Forward or Backward ran (the
  // allreduces of synchronised batchnorm); OK if none. After one, the
  // network runs no further collective (each would wait out its timeout),
  // its outputs and gradients are garbage, and the run must end.
  virtual absl::Status collective_status() const = 0;
};

// The error for memory that the network's parameters need (`floats` floats
// for `what`: "the network's weights", "the solver's state"...) and that
// `backend` cannot give. Unlike activations they do not shrink with the
// mini-batch, so it says to make the network smaller instead.
absl::Status ParameterMemoryError(const Backend& backend, int64_t floats,
                                  const std::string& what);

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_NETWORK_H_
