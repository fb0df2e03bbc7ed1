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
  void Forward(int n, const float* images, bool training) override;
  const float* probabilities() const override {
    return activations_.back().f32();
  }
  void Loss(int n, const int32_t* labels, float* stats) override;
  using Network::Backward;
  void Backward(int n, const int32_t* labels, float scale,
                const GradsReady& on_grads_ready) override;
  absl::Status collective_status() const override {
    return communicator_ ? communicator_->status() : absl::OkStatus();
  }

 private:
  friend class dlbatch::trainer::Network;

  const float* LayerInput(size_t i) const {
    return i == 0 ? images_ : activations_[i - 1].f32();
  }

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
  // Per layer, its parameters' ranges of grads() (first, count), adjacent
  // ones merged, highest first: what Backward reports after the layer.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> grad_ranges_;
  Buffer params_, grads_, state_;
  std::vector<Buffer> activations_;  // each layer's output
  Buffer gradient_[2];               // ping-pong for activation gradients
  const float* images_ = nullptr;    // of the last Forward
};

// The type of the first layer after `i` that is not a batchnorm.
std::string NextActivation(const v1::NetworkSpec& spec, int i) {
  for (int j = i + 1; j < spec.layers_size(); ++j) {
    if (spec.layers(j).type() != "batchnorm") return spec.layers(j).type();
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
  if (spec.layers_size() == 0 ||
      spec.layers(spec.layers_size() - 1).type() != "softmax") {
    return absl::InvalidArgumentError(
        "network: the last layer must be softmax (after an fc layer with "
        "one unit per class)");
  }

  auto net = std::make_unique<NetworkImpl>();
  net->backend_ = backend;
  net->max_batch_ = max_batch;
  net->input_ = Shape{spec.input(0), spec.input(1), spec.input(2)};
  if (communicator != nullptr) {
    net->communicator_ = std::make_unique<FailFastCommunicator>(communicator);
  }

  // Make the layers, checking shapes as they chain.
  std::vector<LayerPlan> plans;
  Shape in = net->input_;
  for (int i = 0; i < spec.layers_size(); ++i) {
    const v1::LayerSpec& layer = spec.layers(i);
    LayerContext ctx;
    ctx.spec = &layer;
    ctx.index = i;
    ctx.name = layer.name().empty() ? absl::StrCat(layer.type(), "_", i + 1)
                                    : layer.name();
    ctx.in = in;
    ctx.backend = backend;
    ctx.max_batch = max_batch;
    ctx.communicator = net->communicator_.get();
    if (layer.type() == "softmax" && i + 1 != spec.layers_size()) {
      return ctx.Error("softmax must be the last layer");
    }
    absl::StatusOr<LayerPlan> plan = MakeLayer(ctx);
    if (!plan.ok()) return plan.status();
    in = plan->info.out;
    plans.push_back(*std::move(plan));
  }
  net->classes_ = in.c;

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
          const std::string next = NextActivation(spec, i);
          init = next == "relu" || next == "leakyrelu"
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
  int64_t largest = net->input_.size();
  for (const LayerPlan& plan : plans) {
    largest = std::max(largest, plan.info.out.size());
    Buffer act;
    if (auto s = allocate(max_batch * plan.info.out.size(), &act); !s.ok()) {
      return s;
    }
    net->activations_.push_back(std::move(act));
  }
  for (Buffer& g : net->gradient_) {
    if (auto s = allocate(max_batch * largest, &g); !s.ok()) return s;
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
  return std::unique_ptr<Network>(std::move(net));
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
    layers_[i]->Forward(n, LayerInput(i), activations_[i].f32(), training, i);
  }
}

void NetworkImpl::Loss(int n, const int32_t* labels, float* stats) {
  const size_t softmax = layers_.size() - 1;
  backend_->SoftmaxCrossEntropy(n, classes_, LayerInput(softmax), labels,
                                activations_[softmax].f32(), stats);
}

void NetworkImpl::Backward(int n, const int32_t* labels, float scale,
                           const GradsReady& on_grads_ready) {
  if (first_learning_ < 0) return;  // nothing to learn
  const int softmax = static_cast<int>(layers_.size()) - 1;
  int current = 0;
  backend_->SoftmaxCrossEntropyBackward(n, classes_,
                                        activations_[softmax].f32(), labels,
                                        scale, gradient_[current].f32());
  for (int i = softmax - 1; i >= first_learning_; --i) {
    float* dx = gradient_[1 - current].f32();
    if (i == first_learning_ && layers_[i]->can_skip_dx()) dx = nullptr;
    layers_[i]->Backward(n, LayerInput(i), activations_[i].f32(),
                         gradient_[current].f32(), dx);
    current = 1 - current;
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
