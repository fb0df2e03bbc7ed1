// Network::Build and the network's forward, loss and backward passes over
// its layers (layers.h), with every parameter in one buffer.
#include "trainer/network.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/files.h"
#include "common/status.h"
#include "proto/network_shapes.h"
#include "proto/network_wiring.h"
#include "trainer/layers.h"
#include "trainer/rng.h"

namespace dlbatch::trainer {
namespace {

// The communicator the layers see: it keeps the first failure and refuses
// every collective after it, as a peer that failed once would make each of
// them wait out its timeout.
class FailFastCommunicator final : public Communicator {
 public:
  explicit FailFastCommunicator(Communicator* inner) : inner_(inner) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  bool splits_batch() const override { return inner_->splits_batch(); }
  absl::Status AllreduceSum(float* data, int64_t count) override {
    return Keep([&] { return inner_->AllreduceSum(data, count); });
  }
  absl::Status Broadcast(float* data, int64_t count, int root) override {
    return Keep([&] { return inner_->Broadcast(data, count, root); });
  }
  absl::Status Barrier() override {
    return Keep([&] { return inner_->Barrier(); });
  }
  absl::Status StartAllreduceSum(float* data, int64_t count) override {
    return Keep([&] { return inner_->StartAllreduceSum(data, count); });
  }
  absl::Status WaitAll() override {
    return Keep([&] { return inner_->WaitAll(); });
  }

  const absl::Status& status() const { return status_; }

 private:
  template <typename F>
  absl::Status Keep(const F& collective) {
    if (status_.ok()) status_ = collective();
    return status_;
  }

  Communicator* const inner_;
  absl::Status status_;
};

class NetworkImpl final : public Network {
 public:
  Shape input_shape() const override { return input_; }
  int num_classes() const override { return classes_; }
  int max_batch() const override { return max_batch_; }
  const std::vector<LayerInfo>& layers() const override { return infos_; }
  const std::vector<ParamInfo>& params_info() const override {
    return params_info_;
  }
  const std::vector<ParamInfo>& state_info() const override {
    return state_info_;
  }
  int64_t num_params() const override { return num_params_; }
  int64_t num_decayed() const override { return num_decayed_; }
  float* params() override { return params_.f32(); }
  float* grads() override { return grads_.f32(); }
  int64_t state_size() const override { return state_size_; }
  float* state() override { return state_.f32(); }

  void Initialize(uint64_t seed) override;
  void SetLabelSmoothing(float smoothing) override { smoothing_ = smoothing; }
  void Forward(int n, const float* images, bool training) override;
  const float* probabilities() const override { return output_.back(); }
  void Loss(int n, const int32_t* labels, float* stats) override;
  using Network::Backward;
  void Backward(int n, const int32_t* labels, float scale,
                const GradsReady& on_grads_ready) override;
  absl::Status collective_status() const override {
    return communicator_ ? communicator_->status() : absl::OkStatus();
  }

 private:
  friend class dlbatch::trainer::Network;

  // What Backward does at one layer, fixed at build time.
  struct BackwardStep {
    bool run = false;  // the layer learns or an input's producer does
    // Per input: where its gradient goes (null: nowhere), and which of
    // those are a scratch to add into the producer's gradient after it.
    std::vector<float*> dx;
    std::vector<std::pair<float*, const float*>> accumulate;  // (into, from)
    std::vector<int64_t> accumulate_size;  // floats per sample of each
  };

  // Places the gradient buffers and plans each layer's backward step.
  absl::Status PlanBackward(
      const std::function<absl::Status(int64_t, Buffer*)>& allocate);

  // The output of layer `i` (-1: the input images of the last Forward).
  const float* Output(int i) const { return i < 0 ? images_ : output_[i]; }

  Backend* backend_ = nullptr;
  // Outlives the layers, which run their collectives through it; null if
  // Build was given no communicator.
  std::unique_ptr<FailFastCommunicator> communicator_;
  Shape input_;
  int classes_ = 0;
  int max_batch_ = 0;
  std::vector<LayerInfo> infos_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<ParamInfo> params_info_, state_info_;
  std::vector<ParamInit> param_init_, state_init_;
  std::vector<std::pair<int64_t, int64_t>> param_fans_;  // (in, out)
  int64_t num_params_ = 0, num_decayed_ = 0, state_size_ = 0;
  // The first layer with parameters: backward stops there.
  int first_learning_ = -1;
  float smoothing_ = 0;
  // Per layer, its parameters' ranges of grads() (first, count), adjacent
  // ones merged, highest first: what Backward reports after the layer.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> grad_ranges_;
  Buffer params_, grads_, state_;
  std::vector<Buffer> activations_;  // each layer's output, but a folded one's
  std::vector<float*> output_;       // per layer, its output (a folded relu's
                                     // is its input's)
  // Gradients of layer outputs, each shared by layers whose gradients are
  // never live at once (two for a list of layers, as a ping-pong).
  std::vector<Buffer> gradient_;
  std::vector<float*> output_grad_;  // per layer, into gradient_; or null
  // Where inputs' gradients wait to be added to others (an output that
  // several layers take) or go unused (a layer that always computes one).
  std::vector<Buffer> scratch_;
  std::vector<BackwardStep> backward_;
  std::vector<std::vector<const float*>> x_;  // per layer, its inputs
  const float* images_ = nullptr;             // of the last Forward
};

// The type of the first layer that the output of `i` flows into that is
// not a batchnorm, add or concat (following each layer's first consumer).
std::string NextActivation(const v1::NetworkSpec& spec,
                           const NetworkWiring& wiring, int i) {
  while (!wiring.consumers[i].empty()) {
    i = wiring.consumers[i].front();
    const std::string& type = spec.layers(i).type();
    if (type != "batchnorm" && type != "add" && type != "concat") return type;
  }
  return "";
}

}  // namespace

absl::Status ParameterMemoryError(const Backend& backend, int64_t floats,
                                  const std::string& what) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "cannot allocate ",
      HumanBytes(floats * static_cast<int64_t>(sizeof(float))), " of ",
      backend.on_gpu() ? "device" : "host", " memory for ", what,
      "; they grow with the network, not the mini-batch: use fewer filters or "
      "units"));
}

absl::StatusOr<std::unique_ptr<Network>> Network::Build(
    const v1::NetworkSpec& spec, Backend* backend, int max_batch,
    Communicator* communicator) {
  if (max_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("network: max_batch must be >= 1, not ", max_batch));
  }
  if (spec.input_size() != 3 || spec.input(0) <= 0 || spec.input(1) <= 0 ||
      spec.input(2) <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "network: input must be [height, width, channels], all > 0; got [",
        absl::StrJoin(spec.input(), ", "), "]"));
  }
  auto net = std::make_unique<NetworkImpl>();
  net->backend_ = backend;
  net->max_batch_ = max_batch;
  net->input_ = Shape{spec.input(0), spec.input(1), spec.input(2)};
  if (communicator != nullptr) {
    net->communicator_ = std::make_unique<FailFastCommunicator>(communicator);
  }

  ASSIGN_OR_RETURN(NetworkWiring wiring, WireNetwork(spec));
  // The shapes a submitted job was checked against, with the same messages.
  ASSIGN_OR_RETURN(std::vector<LayerShape> shapes,
                   InferNetworkShapes(spec, wiring));

  // Make the layers to those shapes. learns[j]: layer j or
  // one before it has parameters, so the backward pass wants j's output
  // gradient (as PlanBackward's wants_grad).
  std::vector<LayerPlan> plans;
  std::vector<bool> learns;
  for (int i = 0; i < spec.layers_size(); ++i) {
    const v1::LayerSpec& layer = spec.layers(i);
    LayerContext ctx;
    ctx.spec = &layer;
    ctx.index = i;
    ctx.name = wiring.names[i];
    for (int j : wiring.inputs[i]) {
      ctx.ins.push_back(j < 0 ? net->input_ : plans[j].info.out);
      ctx.in_names.push_back(j < 0 ? kNetworkInputName : wiring.names[j]);
    }
    ctx.in = ctx.ins[0];
    ctx.shape = shapes[i];
    ctx.input_grad = wiring.inputs[i][0] >= 0 && learns[wiring.inputs[i][0]];
    ctx.backend = backend;
    ctx.max_batch = max_batch;
    ctx.communicator = net->communicator_.get();
    const std::vector<int>& consumers = wiring.consumers[i];
    ctx.relu_follows = backend->folds_relu() && consumers.size() == 1 &&
                       spec.layers(consumers[0]).type() == "relu";
    // bf16 between a conv and the batch norm it alone feeds, and between
    // that batch norm (or the relu folded into it) and the one conv it feeds
    // (Backend::bf16_activations).
    if (backend->bf16_activations() && layer.type() == "conv" &&
        consumers.size() == 1) {
      const v1::LayerSpec& next = spec.layers(consumers[0]);
      const bool sync = SyncsOverRanks(next, communicator) &&
                        !SpansRanks(next, communicator, *backend);
      ctx.bf16_output = next.type() == "batchnorm" && !sync;
    }
    // ...or as the last input of an add, which sums in float32.
    auto in_bf16 = [&](int j) {
      return OutputInBf16(
          j, [&](int k) -> const LayerInfo& { return plans[k].info; });
    };
    if (layer.type() == "batchnorm" || layer.type() == "conv") {
      ctx.bf16_input = in_bf16(wiring.inputs[i][0]);
    } else if (layer.type() == "add") {
      ctx.bf16_input = in_bf16(wiring.inputs[i].back());
    }
    if (layer.type() == "batchnorm" && ctx.bf16_input) {
      const int k = ctx.relu_follows ? consumers[0] : i;
      if (wiring.consumers[k].size() == 1) {
        const int next = wiring.consumers[k][0];
        const std::vector<int>& ins = wiring.inputs[next];
        const std::string& type = spec.layers(next).type();
        ctx.bf16_output =
            type == "conv" || (type == "add" && ins.back() == k &&
                               std::count(ins.begin(), ins.end(), k) == 1);
      }
    }
    absl::StatusOr<LayerPlan> plan = MakeLayer(ctx);
    if (!plan.ok()) return plan.status();
    plan->info.inputs = wiring.inputs[i];
    plan->info.bf16_output = plan->bf16_output;
    const int from = wiring.inputs[i][0];
    plan->info.folded =
        layer.type() == "relu" && from >= 0 && plans[from].folds_relu;
    bool learned = !plan->params.empty();
    for (int j : wiring.inputs[i]) learned = learned || (j >= 0 && learns[j]);
    learns.push_back(learned);
    plans.push_back(*std::move(plan));
  }
  net->classes_ = plans.back().info.out.c;

  // Place parameters: every weight first, then biases and batchnorm's.
  for (int pass = 0; pass < 2; ++pass) {
    const bool weights = pass == 0;
    for (int i = 0; i < static_cast<int>(plans.size()); ++i) {
      for (const ParamRequest& req : plans[i].params) {
        if (req.decayed != weights) continue;
        ParamInfo p;
        p.name = absl::StrCat(plans[i].info.name, ".", req.suffix);
        p.layer = i;
        p.offset = net->num_params_;
        p.count = 1;
        for (int64_t d : req.dims) p.count *= d;
        p.dims = req.dims;
        net->num_params_ += p.count;
        if (weights) net->num_decayed_ += p.count;
        ParamInit init = req.init;
        if (weights) {
          const std::string next = NextActivation(spec, wiring, i);
          init = next == "relu" || next == "leakyrelu" || next == "gelu"
                     ? ParamInit::kHeNormal
                     : ParamInit::kGlorotUniform;
        }
        net->param_init_.push_back(init);
        net->param_fans_.emplace_back(req.fan_in, req.fan_out);
        net->params_info_.push_back(std::move(p));
      }
    }
  }
  for (int i = 0; i < static_cast<int>(plans.size()); ++i) {
    for (const ParamRequest& req : plans[i].state) {
      ParamInfo p;
      p.name = absl::StrCat(plans[i].info.name, ".", req.suffix);
      p.layer = i;
      p.offset = net->state_size_;
      p.count = 1;
      for (int64_t d : req.dims) p.count *= d;
      p.dims = req.dims;
      net->state_size_ += p.count;
      net->state_init_.push_back(req.init);
      net->state_info_.push_back(std::move(p));
    }
  }

  auto allocate = [&](int64_t floats, Buffer* out) -> absl::Status {
    absl::StatusOr<Buffer> b =
        backend->Allocate(static_cast<size_t>(floats) * sizeof(float));
    if (!b.ok()) return b.status();
    *out = *std::move(b);
    return absl::OkStatus();
  };
  // Sized by the network, not the mini-batch.
  if (!allocate(net->num_params_, &net->params_).ok()) {
    return ParameterMemoryError(*backend, net->num_params_,
                                "the network's weights");
  }
  if (!allocate(net->num_params_, &net->grads_).ok()) {
    return ParameterMemoryError(*backend, net->num_params_,
                                "the network's gradients");
  }
  if (!allocate(net->state_size_, &net->state_).ok()) {
    return ParameterMemoryError(*backend, net->state_size_,
                                "the normalisation layers' running statistics");
  }
  for (const LayerPlan& plan : plans) {
    Buffer act;
    if (plan.info.folded) {
      net->output_.push_back(net->output_[plan.info.inputs[0]]);
    } else {
      if (auto s = allocate(max_batch * plan.info.out.size(), &act); !s.ok()) {
        return s;
      }
      net->output_.push_back(act.f32());
    }
    net->activations_.push_back(std::move(act));
    net->x_.emplace_back(plan.info.inputs.size(), nullptr);
  }

  // Bind each layer to its arrays.
  for (int i = 0; i < static_cast<int>(plans.size()); ++i) {
    LayerPlan& plan = plans[i];
    LayerBuffers buffers;
    // A layer's params in its own request order.
    for (const ParamRequest& req : plan.params) {
      const std::string name = absl::StrCat(plan.info.name, ".", req.suffix);
      for (int k = 0; k < static_cast<int>(net->params_info_.size()); ++k) {
        const ParamInfo& p = net->params_info_[k];
        if (p.layer != i || p.name != name) continue;
        buffers.params.push_back(net->params_.f32() + p.offset);
        buffers.grads.push_back(net->grads_.f32() + p.offset);
        plan.info.params.push_back(k);
      }
    }
    for (int k = 0; k < static_cast<int>(net->state_info_.size()); ++k) {
      const ParamInfo& p = net->state_info_[k];
      if (p.layer != i) continue;
      buffers.state.push_back(net->state_.f32() + p.offset);
      plan.info.state.push_back(k);
    }
    if (!plan.params.empty() && net->first_learning_ < 0) {
      net->first_learning_ = i;
    }
    plan.layer->Bind(buffers);
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (int k : plan.info.params) {
      ranges.emplace_back(net->params_info_[k].offset,
                          net->params_info_[k].count);
    }
    std::sort(ranges.begin(), ranges.end());
    std::vector<std::pair<int64_t, int64_t>> merged;
    for (const auto& [first, count] : ranges) {
      if (!merged.empty() &&
          merged.back().first + merged.back().second == first) {
        merged.back().second += count;
      } else {
        merged.emplace_back(first, count);
      }
    }
    std::reverse(merged.begin(), merged.end());
    net->grad_ranges_.push_back(std::move(merged));
    net->infos_.push_back(std::move(plan.info));
    net->layers_.push_back(std::move(plan.layer));
  }
  RETURN_IF_ERROR(net->PlanBackward(allocate));
  return std::unique_ptr<Network>(std::move(net));
}

absl::Status NetworkImpl::PlanBackward(
    const std::function<absl::Status(int64_t, Buffer*)>& allocate) {
  const int count = static_cast<int>(infos_.size());
  const int last = count - 1;  // softmax: its gradient is the loss's
  backward_.assign(count, BackwardStep{});
  for (int i = 0; i < last; ++i) {
    bool run = !infos_[i].params.empty();
    for (int j : infos_[i].inputs) run = run || (j >= 0 && backward_[j].run);
    backward_[i].run = run;
  }
  auto wants_grad = [&](int j) { return j >= 0 && backward_[j].run; };

  // Output gradients that are another's buffer (alias_of[i], below i): a
  // folded relu's is its input's; an add's is that of one input that no
  // other layer takes, which gets the add's gradient as it is (masked in
  // place where the add folds a relu) instead of a copy.
  std::vector<int> uses(count, 0);
  for (int i = 0; i < count; ++i) {
    for (int j : infos_[i].inputs) {
      if (j >= 0) ++uses[j];
    }
  }
  // A bf16 gradient (LayerInfo::bf16_output) shares no float32 one's.
  auto in_bf16 = [&](int j) {
    return OutputInBf16(j,
                        [&](int k) -> const LayerInfo& { return infos_[k]; });
  };
  std::vector<int> alias_of(count, -1);
  for (int i = 0; i < last; ++i) {
    if (infos_[i].folded) {
      alias_of[i] = infos_[i].inputs[0];
    } else if (infos_[i].spec.type() == "add") {
      for (int j : infos_[i].inputs) {
        if (wants_grad(j) && uses[j] == 1 && !in_bf16(j)) {
          alias_of[i] = std::max(alias_of[i], j);
        }
      }
    }
  }

  // A layer's output gradient is live from the backward step of the last
  // layer that takes it (its first write) to its own (its read). Layers
  // whose spans do not meet share a buffer. An aliased gradient's span is
  // its buffer's owner's too.
  std::vector<int> written_at(count, -1);
  for (int i = 0; i < count; ++i) {
    for (int j : infos_[i].inputs) {
      if (wants_grad(j)) written_at[j] = std::max(written_at[j], i);
    }
  }
  for (int i = count - 1; i >= 0; --i) {
    if (alias_of[i] < 0) continue;
    const int j = alias_of[i];
    written_at[j] = std::max(written_at[j], written_at[i]);
    written_at[i] = -1;
  }
  std::vector<int> order;
  for (int j = 0; j < count; ++j) {
    if (written_at[j] >= 0) order.push_back(j);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return written_at[a] > written_at[b]; });
  std::vector<int> buffer_of(count, -1);
  std::vector<int> lowest;     // per buffer: the lowest layer placed in it
  std::vector<int64_t> sizes;  // per buffer: floats per sample
  for (int j : order) {
    int b = 0;
    while (b < static_cast<int>(lowest.size()) && lowest[b] <= written_at[j]) {
      ++b;
    }
    if (b == static_cast<int>(lowest.size())) {
      lowest.push_back(j);
      sizes.push_back(0);
    }
    lowest[b] = j;
    sizes[b] = std::max(sizes[b], infos_[j].out.size());
    buffer_of[j] = b;
  }
  gradient_.resize(sizes.size());
  for (size_t b = 0; b < sizes.size(); ++b) {
    RETURN_IF_ERROR(allocate(max_batch_ * sizes[b], &gradient_[b]));
  }
  output_grad_.assign(count, nullptr);
  for (int j = 0; j < count; ++j) {
    if (buffer_of[j] >= 0) output_grad_[j] = gradient_[buffer_of[j]].f32();
    if (alias_of[j] >= 0) output_grad_[j] = output_grad_[alias_of[j]];
  }

  // Each input's gradient: straight into its producer's buffer where it is
  // the first written (layers go last first), else into a scratch added to
  // it after the layer's step.
  std::vector<bool> started(count, false);
  std::vector<int64_t> scratch_sizes;
  std::vector<std::vector<std::pair<int, int>>> scratch_use(count);
  for (int i = last; i >= 0; --i) {
    const std::vector<int>& inputs = infos_[i].inputs;
    if (i == last) {
      if (wants_grad(inputs[0])) started[inputs[0]] = true;
      continue;
    }
    BackwardStep& step = backward_[i];
    if (!step.run || infos_[i].folded) continue;
    step.dx.assign(inputs.size(), nullptr);
    int used = 0;
    for (size_t k = 0; k < inputs.size(); ++k) {
      const int j = inputs[k];
      if (wants_grad(j) && !started[j]) {
        step.dx[k] = output_grad_[j];
        started[j] = true;
        continue;
      }
      if (!wants_grad(j) && layers_[i]->can_skip_dx()) continue;
      // Scratch `used` of this step: to accumulate, or to throw away.
      const int64_t size = j < 0 ? input_.size() : infos_[j].out.size();
      if (used == static_cast<int>(scratch_sizes.size())) {
        scratch_sizes.push_back(0);
      }
      scratch_sizes[used] = std::max(scratch_sizes[used], size);
      scratch_use[i].emplace_back(static_cast<int>(k), used);
      ++used;
    }
  }
  scratch_.resize(scratch_sizes.size());
  for (size_t s = 0; s < scratch_sizes.size(); ++s) {
    RETURN_IF_ERROR(allocate(max_batch_ * scratch_sizes[s], &scratch_[s]));
  }
  for (int i = 0; i < last; ++i) {
    for (const auto& [k, s] : scratch_use[i]) {
      BackwardStep& step = backward_[i];
      step.dx[k] = scratch_[s].f32();
      const int j = infos_[i].inputs[k];
      if (wants_grad(j)) {
        step.accumulate.emplace_back(output_grad_[j], scratch_[s].f32());
        step.accumulate_size.push_back(infos_[j].out.size());
      }
    }
  }
  return absl::OkStatus();
}

void NetworkImpl::Initialize(uint64_t seed) {
  // Drawn on the host, so every backend starts from the same numbers.
  std::vector<float> host(num_params_);
  for (size_t k = 0; k < params_info_.size(); ++k) {
    const ParamInfo& p = params_info_[k];
    float* out = host.data() + p.offset;
    Rng rng(Key(seed, k));
    const auto [fan_in, fan_out] = param_fans_[k];
    switch (param_init_[k]) {
      case ParamInit::kHeNormal: {
        const double std = std::sqrt(2.0 / static_cast<double>(fan_in));
        for (int64_t i = 0; i < p.count; ++i) {
          out[i] = static_cast<float>(rng.Normal() * std);
        }
        break;
      }
      case ParamInit::kGlorotUniform: {
        const double limit =
            std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
        for (int64_t i = 0; i < p.count; ++i) {
          out[i] = static_cast<float>((2 * rng.Uniform() - 1) * limit);
        }
        break;
      }
      case ParamInit::kZeros:
        std::fill(out, out + p.count, 0.0f);
        break;
      case ParamInit::kOnes:
        std::fill(out, out + p.count, 1.0f);
        break;
    }
  }
  backend_->CopyToDevice(params_.f32(), host.data(),
                         host.size() * sizeof(float));
  std::vector<float> state(state_size_);
  for (size_t k = 0; k < state_info_.size(); ++k) {
    const ParamInfo& p = state_info_[k];
    std::fill(state.data() + p.offset, state.data() + p.offset + p.count,
              state_init_[k] == ParamInit::kOnes ? 1.0f : 0.0f);
  }
  backend_->CopyToDevice(state_.f32(), state.data(),
                         state.size() * sizeof(float));
}

void NetworkImpl::Forward(int n, const float* images, bool training) {
  images_ = images;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (infos_[i].folded) continue;
    std::vector<const float*>& x = x_[i];
    for (size_t k = 0; k < x.size(); ++k) x[k] = Output(infos_[i].inputs[k]);
    layers_[i]->ForwardInputs(n, x, output_[i], training, i);
  }
}

void NetworkImpl::Loss(int n, const int32_t* labels, float* stats) {
  const size_t softmax = layers_.size() - 1;
  backend_->SoftmaxCrossEntropy(n, classes_, Output(infos_[softmax].inputs[0]),
                                labels, smoothing_, output_[softmax], stats);
}

void NetworkImpl::Backward(int n, const int32_t* labels, float scale,
                           const GradsReady& on_grads_ready) {
  if (first_learning_ < 0) return;  // nothing to learn
  const int softmax = static_cast<int>(layers_.size()) - 1;
  const int logits = infos_[softmax].inputs[0];
  if (logits < 0 || output_grad_[logits] == nullptr) return;
  backend_->SoftmaxCrossEntropyBackward(n, classes_, output_[softmax], labels,
                                        smoothing_, scale,
                                        output_grad_[logits]);
  for (int i = softmax - 1; i >= first_learning_; --i) {
    const BackwardStep& step = backward_[i];
    if (!step.run || infos_[i].folded) continue;
    std::vector<const float*>& x = x_[i];
    for (size_t k = 0; k < x.size(); ++k) x[k] = Output(infos_[i].inputs[k]);
    layers_[i]->BackwardInputs(n, x, output_[i], output_grad_[i], step.dx);
    for (size_t a = 0; a < step.accumulate.size(); ++a) {
      const auto [into, from] = step.accumulate[a];
      backend_->Add(n * step.accumulate_size[a], into, from, into);
    }
    // After a failed collective the gradients are garbage and the run
    // ends: starting their allreduces would only wait on dead peers.
    if (on_grads_ready && collective_status().ok()) {
      for (const auto& [first, count] : grad_ranges_[i]) {
        on_grads_ready(first, count);
      }
    }
  }
}

}  // namespace dlbatch::trainer
