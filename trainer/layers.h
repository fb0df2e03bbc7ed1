// The layers a Network is built from (network.cc). A layer is made to the
// shapes its spec was checked against (InferNetworkShapes: its input and
// output shapes and its window come resolved), checks what only the
// trainer uses of its spec, declares the parameters and state it needs (the
// network places them in its buffers), and runs forward and backward
// through its Backend's kernels. One file
// per layer family: layer_conv.cc, layer_fc.cc, layer_pool.cc,
// layer_norm.cc, layer_elementwise.cc, layer_join.cc (add, concat).
#ifndef DLBATCH_TRAINER_LAYERS_H_
#define DLBATCH_TRAINER_LAYERS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "dlbatch/v1/job.pb.h"
#include "proto/network_shapes.h"
#include "trainer/backend.h"
#include "trainer/comm/communicator.h"
#include "trainer/network.h"
#include "trainer/shape.h"

namespace dlbatch::trainer {

// How Network::Initialize fills a parameter or state array.
enum class ParamInit { kHeNormal, kGlorotUniform, kZeros, kOnes };

// A parameter (or state) array a layer asks for.
struct ParamRequest {
  std::string suffix;  // "weight", "bias", "scale", "running_mean", ...
  std::vector<int64_t> dims;
  bool decayed = false;  // a weight: placed first, L2 applies
  ParamInit init = ParamInit::kZeros;
  int64_t fan_in = 0, fan_out = 0;  // for kHeNormal and kGlorotUniform
};

// Where a layer's parameters, their gradients and its state live, in the
// order of its requests.
struct LayerBuffers {
  std::vector<float*> params;
  std::vector<float*> grads;
  std::vector<float*> state;
};

class Layer {
 public:
  virtual ~Layer() = default;

  // Called once, after the network has placed the buffers.
  virtual void Bind(const LayerBuffers& buffers) { buffers_ = buffers; }

  // y = layer(x[0], x[1], ...) for n samples, one x per input
  // (LayerInfo::inputs). `dropout_salt` is this layer's own
  // (Backend::DropoutForward).
  virtual void ForwardInputs(int n, absl::Span<const float* const> x, float* y,
                             bool training, uint64_t dropout_salt) = 0;
  // From dy (the gradient of this layer's output) computes its parameter
  // gradients and, for each dx[i] that is not null, the gradient of input i
  // (overwritten). x and y are those of the last training Forward.
  virtual void BackwardInputs(int n, absl::Span<const float* const> x,
                              const float* y, const float* dy,
                              absl::Span<float* const> dx) = 0;
  // False where Backward needs a dx even when nothing uses it (its kernel
  // always computes one).
  virtual bool can_skip_dx() const { return true; }

 protected:
  LayerBuffers buffers_;
};

// A layer of one input: all but add and concat.
class OneInputLayer : public Layer {
 public:
  void ForwardInputs(int n, absl::Span<const float* const> x, float* y,
                     bool training, uint64_t dropout_salt) final {
    Forward(n, x[0], y, training, dropout_salt);
  }
  void BackwardInputs(int n, absl::Span<const float* const> x, const float* y,
                      const float* dy, absl::Span<float* const> dx) final {
    Backward(n, x[0], y, dy, dx[0]);
  }

  // As above, of the one input; dx may be null.
  virtual void Forward(int n, const float* x, float* y, bool training,
                       uint64_t dropout_salt) = 0;
  virtual void Backward(int n, const float* x, const float* y, const float* dy,
                        float* dx) = 0;
};

// conv and fc: weights and a bias applied by one kernel (ConvKernel or
// FcKernel, which share their calls' form).
template <typename Kernel>
class WeightedLayer final : public OneInputLayer {
 public:
  explicit WeightedLayer(std::unique_ptr<Kernel> kernel)
      : kernel_(std::move(kernel)) {}

  void Forward(int n, const float* x, float* y, bool /*training*/,
               uint64_t /*dropout_salt*/) override {
    kernel_->Forward(n, x, buffers_.params[0], buffers_.params[1], y);
  }

  void Backward(int n, const float* x, const float* /*y*/, const float* dy,
                float* dx) override {
    kernel_->BackwardWeights(n, x, dy, buffers_.grads[0], buffers_.grads[1]);
    if (dx != nullptr) kernel_->BackwardData(n, dy, buffers_.params[0], dx);
  }

 private:
  std::unique_ptr<Kernel> kernel_;
};

// A layer as made from its spec, before the network places its buffers.
struct LayerPlan {
  std::unique_ptr<Layer> layer;
  LayerInfo info;  // in, out, window; params and state left to the network
  std::vector<ParamRequest> params;
  std::vector<ParamRequest> state;
  // The layer applies the relu that follows it (LayerContext::relu_follows),
  // which the network then skips.
  bool folds_relu = false;
  // Its output is in bf16 (LayerContext::bf16_output taken).
  bool bf16_output = false;
};

// Everything a layer factory gets.
struct LayerContext {
  const v1::LayerSpec* spec = nullptr;
  int index = 0;
  std::string name;  // spec's name, else "<type>_<index+1>"
  Shape in;          // ins[0]
  // Its output shape and window (InferNetworkShapes), already checked
  // against `ins`.
  LayerShape shape;
  // Each input's shape and name (a layer's, or "input"), in the order of
  // the spec's inputs; one for every layer but add and concat.
  std::vector<Shape> ins;
  std::vector<std::string> in_names;
  Backend* backend = nullptr;
  int max_batch = 0;
  // The ranks a training pass may span (batchnorm with `sync`), or null for
  // a network of one rank. The network keeps the first failure of its
  // collectives and reports it (Network::collective_status), so a layer may
  // ignore the Status one returns.
  Communicator* communicator = nullptr;
  // This layer's output goes only to a relu, which the network skips if the
  // layer folds it in (LayerPlan::folds_relu): its forward then writes
  // relu's output, and its backward gets relu's output gradient. Set only
  // where the backend folds relus (Backend::folds_relu).
  bool relu_follows = false;
  // A conv: its output goes only to a batch norm that can take it in bf16
  // (Backend::bf16_activations). A batch norm: its input is such a conv's,
  // and its output (or its folded relu's) goes only to a conv or as the
  // last input of an add. A conv or batch norm: its input is bf16; an add:
  // its last input is.
  bool bf16_output = false;
  bool bf16_input = false;
  // Whether the network's backward pass asks for the gradient of the
  // layer's first input: false where that is the data, or where no layer
  // before it has parameters (Network::Backward stops short of it).
  bool input_grad = true;

  // InvalidArgument "layers[i] (type 'name'): <message>".
  absl::Status Error(absl::string_view message) const;
  // `cause` (a kernel or buffer the layer could not get) with the same
  // prefix and its own code: ResourceExhausted stays so.
  absl::Status Error(const absl::Status& cause) const;
  // The LayerPlan with info's index, name, spec, in, ins, out and window
  // filled in (from `shape`).
  LayerPlan Plan() const;
};

using ::dlbatch::SamePadding;

// The layer factories, one per family. REQUIRES: ctx.shape is
// InferLayerShape's for ctx.spec and ctx.ins.
absl::StatusOr<LayerPlan> MakeConvLayer(const LayerContext& ctx);
absl::StatusOr<LayerPlan> MakeFcLayer(const LayerContext& ctx);
absl::StatusOr<LayerPlan> MakePoolLayer(const LayerContext& ctx);
absl::StatusOr<LayerPlan> MakeBatchNormLayer(const LayerContext& ctx);
// relu, leakyrelu, gelu, dropout, softmax.
absl::StatusOr<LayerPlan> MakeElementwiseLayer(const LayerContext& ctx);
// add, concat: two or more inputs.
absl::StatusOr<LayerPlan> MakeJoinLayer(const LayerContext& ctx);

// Any layer, by its spec's type (the shapes' checks make an unknown type,
// or a count of inputs it does not take, unreachable here).
absl::StatusOr<LayerPlan> MakeLayer(const LayerContext& ctx);

// Whether a batchnorm of `spec` takes its statistics over the ranks of
// `communicator` (may be null): more than one rank, and `sync` or ranks
// that split one mini-batch (Communicator::splits_batch).
bool SyncsOverRanks(const v1::LayerSpec& spec,
                    const Communicator* communicator);
// Whether a batch norm that syncs does so with the backend's own kernel
// (BatchNormKernel::SpanSums: its folded relu and bf16 tensors kept): for
// ranks that split one mini-batch, on a backend that can.
bool SpansRanks(const v1::LayerSpec& spec, const Communicator* communicator,
                const Backend& backend);

// Whether layer j's output is bf16 (LayerInfo::bf16_output), counting a
// folded relu's, which is its input's; `info(k)` gives layer k's LayerInfo.
template <typename InfoAt>
bool OutputInBf16(int j, const InfoAt& info) {
  if (j < 0) return false;
  const LayerInfo& l = info(j);
  return l.bf16_output || (l.folded && info(l.inputs[0]).bf16_output);
}

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_LAYERS_H_
