// Synchronised batch normalisation: the CPU backend's SyncBatchNormKernel
// against its plain BatchNormKernel and finite differences, a batch split
// between ranks by hand, and whole networks of two ranks (threads of this
// process, Gloo over 127.0.0.1) against one.

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/trainer/test_util.h"
#include "tests/trainer/thread_ranks.h"
#include "trainer/backend.h"
#include "trainer/comm/communicator.h"
#include "trainer/network.h"

namespace dlbatch::trainer {
namespace {

using testing::CheckGradient;
using testing::DeviceArray;
using testing::Dot;
using ::testing::HasSubstr;
using testing::RandomVector;
using testing::RelativeError;
using testing::RunThreadRanks;

std::vector<double> AsDouble(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

std::vector<float> Slice(const std::vector<float>& v, int64_t begin,
                         int64_t end) {
  return std::vector<float>(v.begin() + begin, v.begin() + end);
}

using SyncBatchNormTest = testing::CpuBackendTest;

// One training pass of a synchronised batchnorm on one rank's slice, its
// collectives run by `comm`.
struct SyncPass {
  SyncPass(Backend* backend, SyncBatchNormKernel* kernel, int c,
           const std::vector<float>& x, const std::vector<float>& gamma,
           const std::vector<float>& beta, const std::vector<float>& running)
      : kernel(kernel),
        x(backend, x),
        gamma(backend, gamma),
        beta(backend, beta),
        y(backend, x.size()),
        mean(backend, c),
        var(backend, c),
        rmean(backend, running),
        rvar(backend, std::vector<float>(c, 2.0f)),
        sums(backend, 2 * c + 1),
        dy(backend, x.size()),
        dx(backend, x.size()),
        dgamma(backend, c),
        dbeta(backend, c),
        c(c) {}

  void ForwardSums(int n) {
    kernel->ForwardSums(n, x.data(), rmean.data(), sums.data());
  }
  void ForwardNormalize(int n) {
    kernel->ForwardNormalize(n, x.data(), gamma.data(), beta.data(),
                             rmean.data(), sums.data(), y.data(), mean.data(),
                             var.data(), rmean.data(), rvar.data(), 0.1f);
  }
  void BackwardSums(int n) {
    kernel->BackwardSums(n, x.data(), dy.data(), mean.data(), var.data(),
                         dgamma.data(), dbeta.data(), sums.data());
  }
  void BackwardData(int n) {
    kernel->BackwardData(n, x.data(), dy.data(), gamma.data(), mean.data(),
                         var.data(), sums.data(), dx.data());
  }
  // Forward and backward on this rank alone, through `comm`.
  void Run(int n, Communicator* comm) {
    ForwardSums(n);
    ASSERT_TRUE(comm->AllreduceSum(sums.data(), 2 * c + 1).ok());
    ForwardNormalize(n);
    BackwardSums(n);
    ASSERT_TRUE(comm->AllreduceSum(sums.data(), 2 * c + 1).ok());
    BackwardData(n);
  }

  SyncBatchNormKernel* kernel;
  DeviceArray x, gamma, beta, y, mean, var, rmean, rvar, sums, dy, dx, dgamma,
      dbeta;
  int c;
};

TEST_F(SyncBatchNormTest, WithASoloCommunicatorEqualsPlainBatchNorm) {
  for (const Shape in : {Shape{5, 3, 7}, Shape{1, 1, 16}, Shape{12, 12, 3}}) {
    SCOPED_TRACE(in.ToString());
    const int n = 6, c = in.c;
    BatchNormDesc d{in, 1e-5f};
    auto plain = backend_->MakeBatchNorm(d, n);
    auto sync = backend_->MakeSyncBatchNorm(d, n);
    ASSERT_TRUE(plain.ok()) << plain.status();
    ASSERT_TRUE(sync.ok()) << sync.status();
    const std::vector<float> x = RandomVector(n * in.size(), 1, -1, 3);
    const std::vector<float> gamma = RandomVector(c, 2, 0.5, 1.5);
    const std::vector<float> beta = RandomVector(c, 3);
    const std::vector<float> running = RandomVector(c, 4);
    const std::vector<float> dy = RandomVector(n * in.size(), 5);

    SyncPass s(backend_.get(), sync->get(), c, x, gamma, beta, running);
    s.dy.Set(dy);
    std::unique_ptr<Communicator> solo = MakeSoloCommunicator();
    s.Run(n, solo.get());

    SyncPass p(backend_.get(), sync->get(), c, x, gamma, beta, running);
    p.dy.Set(dy);
    (*plain)->ForwardTraining(n, p.x.data(), p.gamma.data(), p.beta.data(),
                              p.y.data(), p.mean.data(), p.var.data(),
                              p.rmean.data(), p.rvar.data(), 0.1f);
    (*plain)->Backward(n, p.x.data(), p.dy.data(), p.gamma.data(),
                       p.mean.data(), p.var.data(), p.dx.data(),
                       p.dgamma.data(), p.dbeta.data());

    EXPECT_LT(RelativeError(s.y.Get(), AsDouble(p.y.Get())), 1e-5);
    EXPECT_LT(RelativeError(s.mean.Get(), AsDouble(p.mean.Get())), 1e-5);
    EXPECT_LT(RelativeError(s.var.Get(), AsDouble(p.var.Get())), 1e-5);
    EXPECT_LT(RelativeError(s.rmean.Get(), AsDouble(p.rmean.Get())), 1e-5);
    EXPECT_LT(RelativeError(s.rvar.Get(), AsDouble(p.rvar.Get())), 1e-5);
    EXPECT_LT(RelativeError(s.dx.Get(), AsDouble(p.dx.Get())), 1e-4);
    EXPECT_LT(RelativeError(s.dgamma.Get(), AsDouble(p.dgamma.Get())), 1e-5);
    EXPECT_LT(RelativeError(s.dbeta.Get(), AsDouble(p.dbeta.Get())), 1e-5);
    // The sums end with the sample count, for the other ranks to add to.
    EXPECT_EQ(s.sums.Get()[2 * c], n);
  }
}

TEST_F(SyncBatchNormTest, GradientsMatchFiniteDifferences) {
  const Shape in{4, 3, 5};
  const int n = 3, c = in.c;
  auto sync = backend_->MakeSyncBatchNorm({in, 1e-5f}, n);
  ASSERT_TRUE(sync.ok()) << sync.status();
  std::vector<float> x = RandomVector(n * in.size(), 11, -1, 3);
  std::vector<float> gamma = RandomVector(c, 12, 0.5, 1.5);
  std::vector<float> beta = RandomVector(c, 13);
  const std::vector<float> r = RandomVector(n * in.size(), 14);
  SyncPass s(backend_.get(), sync->get(), c, x, gamma, beta,
             std::vector<float>(c, 0.0f));
  s.dy.Set(r);
  std::unique_ptr<Communicator> solo = MakeSoloCommunicator();
  s.Run(n, solo.get());
  const std::vector<float> dx = s.dx.Get(), dgamma = s.dgamma.Get(),
                           dbeta = s.dbeta.Get();
  // loss = <y, r>, whose gradient with respect to y is r.
  auto loss = [&] {
    s.x.Set(x);
    s.gamma.Set(gamma);
    s.beta.Set(beta);
    s.ForwardSums(n);
    s.ForwardNormalize(n);
    return Dot(s.y.Get(), r);
  };
  CheckGradient("dx", x, dx, loss, 1e-2f, 1e-2);
  CheckGradient("dgamma", gamma, dgamma, loss, 1e-2f, 1e-2);
  CheckGradient("dbeta", beta, dbeta, loss, 1e-2f, 1e-2);
}

// Large enough that the passes split across the team: two threads add
// their partial sums up to what one thread computes.
TEST_F(SyncBatchNormTest, TwoThreadsAgreeWithOne) {
  const Shape in{24, 24, 16};
  const int n = 8, c = in.c;
  auto two = MakeCpuBackend(2);
  ASSERT_TRUE(two.ok()) << two.status();
  const std::vector<float> x = RandomVector(n * in.size(), 41, -1, 3);
  const std::vector<float> gamma = RandomVector(c, 42, 0.5, 1.5);
  const std::vector<float> beta = RandomVector(c, 43);
  const std::vector<float> running = RandomVector(c, 44);
  const std::vector<float> dy = RandomVector(n * in.size(), 45);
  std::unique_ptr<Communicator> solo = MakeSoloCommunicator();
  std::vector<std::vector<float>> results;
  for (Backend* backend : {backend_.get(), two->get()}) {
    auto sync = backend->MakeSyncBatchNorm({in, 1e-5f}, n);
    ASSERT_TRUE(sync.ok()) << sync.status();
    SyncPass s(backend, sync->get(), c, x, gamma, beta, running);
    s.dy.Set(dy);
    s.Run(n, solo.get());
    std::vector<float> all = s.y.Get();
    for (const DeviceArray* a : {&s.dx, &s.mean, &s.var, &s.dgamma, &s.dbeta}) {
      const std::vector<float> v = a->Get();
      all.insert(all.end(), v.begin(), v.end());
    }
    results.push_back(std::move(all));
  }
  EXPECT_LT(RelativeError(results[1], AsDouble(results[0])), 1e-6);
}

// Two ranks' slices, their sums added as an allreduce would: each rank
// normalises with the whole batch's statistics and gets the whole batch's
// dx for its samples; its dgamma and dbeta are its share of the whole one.
TEST_F(SyncBatchNormTest, RanksSplittingABatchComputeWhatOneRankDoes) {
  const Shape in{3, 4, 5};
  const int n = 7, n0 = 3, n1 = n - n0, c = in.c;
  BatchNormDesc d{in, 1e-5f};
  auto plain = backend_->MakeBatchNorm(d, n);
  auto sync = backend_->MakeSyncBatchNorm(d, n);
  ASSERT_TRUE(plain.ok() && sync.ok());
  // Far from zero: the running mean as shift keeps the variance exact.
  const std::vector<float> x = RandomVector(n * in.size(), 21, 99, 101);
  const std::vector<float> gamma = RandomVector(c, 22, 0.5, 1.5);
  const std::vector<float> beta = RandomVector(c, 23);
  const std::vector<float> running(c, 100.0f);
  const std::vector<float> dy = RandomVector(n * in.size(), 24);
  const int64_t cut = n0 * in.size();

  SyncPass r0(backend_.get(), sync->get(), c, Slice(x, 0, cut), gamma, beta,
              running);
  SyncPass r1(backend_.get(), sync->get(), c, Slice(x, cut, x.size()), gamma,
              beta, running);
  r0.dy.Set(Slice(dy, 0, cut));
  r1.dy.Set(Slice(dy, cut, dy.size()));
  auto allreduce = [&] {
    std::vector<float> a = r0.sums.Get(), b = r1.sums.Get();
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    r0.sums.Set(a);
    r1.sums.Set(a);
  };
  r0.ForwardSums(n0);
  r1.ForwardSums(n1);
  allreduce();
  EXPECT_EQ(r0.sums.Get()[2 * c], n);
  r0.ForwardNormalize(n0);
  r1.ForwardNormalize(n1);
  r0.BackwardSums(n0);
  r1.BackwardSums(n1);
  const std::vector<float> dgamma0 = r0.dgamma.Get(), dbeta0 = r0.dbeta.Get();
  allreduce();
  r0.BackwardData(n0);
  r1.BackwardData(n1);

  SyncPass w(backend_.get(), sync->get(), c, x, gamma, beta, running);
  w.dy.Set(dy);
  (*plain)->ForwardTraining(n, w.x.data(), w.gamma.data(), w.beta.data(),
                            w.y.data(), w.mean.data(), w.var.data(),
                            w.rmean.data(), w.rvar.data(), 0.1f);
  (*plain)->Backward(n, w.x.data(), w.dy.data(), w.gamma.data(), w.mean.data(),
                     w.var.data(), w.dx.data(), w.dgamma.data(),
                     w.dbeta.data());

  auto joined = [&](const DeviceArray& a, const DeviceArray& b) {
    std::vector<float> v = a.Get(), tail = b.Get();
    v.insert(v.end(), tail.begin(), tail.end());
    return v;
  };
  EXPECT_LT(RelativeError(joined(r0.y, r1.y), AsDouble(w.y.Get())), 1e-4);
  EXPECT_LT(RelativeError(joined(r0.dx, r1.dx), AsDouble(w.dx.Get())), 1e-3);
  for (const SyncPass* r : {&r0, &r1}) {
    EXPECT_LT(RelativeError(r->var.Get(), AsDouble(w.var.Get())), 1e-4);
    EXPECT_LT(RelativeError(r->rmean.Get(), AsDouble(w.rmean.Get())), 1e-6);
    EXPECT_LT(RelativeError(r->rvar.Get(), AsDouble(w.rvar.Get())), 1e-5);
  }
  std::vector<float> dgamma = dgamma0, dbeta = dbeta0;
  const std::vector<float> dgamma1 = r1.dgamma.Get(), dbeta1 = r1.dbeta.Get();
  for (int k = 0; k < c; ++k) {
    dgamma[k] += dgamma1[k];
    dbeta[k] += dbeta1[k];
  }
  EXPECT_LT(RelativeError(dgamma, AsDouble(w.dgamma.Get())), 1e-3);
  EXPECT_LT(RelativeError(dbeta, AsDouble(w.dbeta.Get())), 1e-5);
  // Each rank's share alone is not the whole gradient.
  EXPECT_GT(RelativeError(dbeta0, AsDouble(w.dbeta.Get())), 0.05);
}

// --- whole networks ---

// conv -> batchnorm (x batchnorms) -> relu -> fc -> softmax.
v1::NetworkSpec ConvBnNet(bool sync, int batchnorms = 1) {
  v1::NetworkSpec spec;
  for (int d : {8, 8, 2}) spec.add_input(d);
  auto* conv = spec.add_layers();
  conv->set_type("conv");
  conv->set_filters(4);
  conv->set_size(3);
  for (int i = 0; i < batchnorms; ++i) {
    auto* bn = spec.add_layers();
    bn->set_type("batchnorm");
    bn->set_sync(sync);
  }
  spec.add_layers()->set_type("relu");
  auto* fc = spec.add_layers();
  fc->set_type("fc");
  fc->set_units(5);
  spec.add_layers()->set_type("softmax");
  return spec;
}

// What a rank's network computed in one training step.
struct Step {
  std::vector<float> probs, grads, state;
  absl::Status status;
};

// One training step of `spec` over samples [begin, end) of `images`, scaled
// by 1 / total as the trainer does, on a backend of its own.
Step TrainStep(const v1::NetworkSpec& spec, Communicator* comm,
               const std::vector<float>& images,
               const std::vector<int32_t>& labels, int begin, int end,
               int total) {
  Step out;
  auto backend = MakeCpuBackend(1);
  if (!backend.ok()) {
    out.status = backend.status();
    return out;
  }
  const int n = end - begin;
  auto net = Network::Build(spec, backend->get(), n, comm);
  if (!net.ok()) {
    out.status = net.status();
    return out;
  }
  (*net)->Initialize(5);
  const int64_t sample = (*net)->input_shape().size();
  DeviceArray x(backend->get(), Slice(images, begin * sample, end * sample));
  Buffer y = *(*backend)->Allocate(n * sizeof(int32_t));
  (*backend)->CopyToDevice(y.as<int32_t>(), labels.data() + begin,
                           n * sizeof(int32_t));
  (*net)->Forward(n, x.data(), /*training=*/true);
  (*net)->Backward(n, y.as<int32_t>(), 1.0f / total);
  out.status = (*net)->collective_status();
  out.probs.resize(n * (*net)->num_classes());
  (*backend)->CopyToHost(out.probs.data(), (*net)->probabilities(),
                         out.probs.size() * sizeof(float));
  out.grads.resize((*net)->num_params());
  (*backend)->CopyToHost(out.grads.data(), (*net)->grads(),
                         out.grads.size() * sizeof(float));
  out.state.resize((*net)->state_size());
  (*backend)->CopyToHost(out.state.data(), (*net)->state(),
                         out.state.size() * sizeof(float));
  return out;
}

// Runs one step of `spec` as two Gloo ranks (threads), each on its half of
// the batch; returns their steps.
std::vector<Step> TwoRankStep(const v1::NetworkSpec& spec,
                              const std::vector<float>& images,
                              const std::vector<int32_t>& labels, int total) {
  std::vector<Step> steps(2);
  const std::vector<absl::Status> statuses =
      RunThreadRanks(2, [&](int rank, Communicator* comm) {
        const int half = total / 2;
        steps[rank] =
            TrainStep(spec, comm, images, labels, rank == 0 ? 0 : half,
                      rank == 0 ? half : total, total);
        absl::Status s = comm->Barrier();
        return steps[rank].status.ok() ? s : steps[rank].status;
      });
  for (int rank = 0; rank < 2; ++rank) steps[rank].status = statuses[rank];
  return steps;
}

class SyncBatchNormNetworkTest : public ::testing::Test {
 protected:
  static constexpr int kBatch = 8;
  void SetUp() override {
    images_ = RandomVector(kBatch * 8 * 8 * 2, 31, 0, 1);
    // Samples of the second half brighter: per-half statistics differ.
    for (size_t i = images_.size() / 2; i < images_.size(); ++i) {
      images_[i] += 0.5f;
    }
    for (int i = 0; i < kBatch; ++i) labels_.push_back(i % 5);
  }
  std::vector<float> images_;
  std::vector<int32_t> labels_;
};

TEST_F(SyncBatchNormNetworkTest, TwoSyncedRanksComputeTheStepOfOne) {
  const Step one =
      TrainStep(ConvBnNet(true), nullptr, images_, labels_, 0, kBatch, kBatch);
  ASSERT_TRUE(one.status.ok()) << one.status;
  std::vector<Step> two =
      TwoRankStep(ConvBnNet(true), images_, labels_, kBatch);
  for (const Step& s : two) ASSERT_TRUE(s.status.ok()) << s.status;

  std::vector<float> probs = two[0].probs, grads = two[0].grads;
  probs.insert(probs.end(), two[1].probs.begin(), two[1].probs.end());
  for (size_t i = 0; i < grads.size(); ++i) grads[i] += two[1].grads[i];
  EXPECT_LT(RelativeError(probs, AsDouble(one.probs)), 1e-5);
  EXPECT_LT(RelativeError(grads, AsDouble(one.grads)), 1e-4);
  // The running statistics moved alike on both ranks and as on one.
  EXPECT_EQ(two[0].state, two[1].state);
  EXPECT_LT(RelativeError(two[0].state, AsDouble(one.state)), 1e-5);

  // Per-rank statistics (no sync) give another step: sync is what did it.
  std::vector<Step> ddp =
      TwoRankStep(ConvBnNet(false), images_, labels_, kBatch);
  for (const Step& s : ddp) ASSERT_TRUE(s.status.ok()) << s.status;
  std::vector<float> ddp_grads = ddp[0].grads;
  for (size_t i = 0; i < ddp_grads.size(); ++i) ddp_grads[i] += ddp[1].grads[i];
  EXPECT_GT(RelativeError(ddp_grads, AsDouble(one.grads)), 1e-2);
}

// A communicator of two ranks whose collectives fail: the network keeps
// the first failure and runs no collective after it.
class FailingCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  absl::Status AllreduceSum(float*, int64_t) override {
    ++calls;
    return absl::UnavailableError("allreduce: a peer is gone");
  }
  absl::Status Broadcast(float*, int64_t, int) override {
    ++calls;
    return absl::UnavailableError("broadcast: a peer is gone");
  }
  absl::Status Barrier() override {
    ++calls;
    return absl::UnavailableError("barrier: a peer is gone");
  }
  int calls = 0;
};

TEST_F(SyncBatchNormNetworkTest, AFailedCollectiveIsKeptAndEndsCollectives) {
  // Two synchronised batchnorms, so that more collectives are due.
  const v1::NetworkSpec spec = ConvBnNet(true, 2);
  FailingCommunicator comm;
  const Step step =
      TrainStep(spec, &comm, images_, labels_, 0, kBatch / 2, kBatch);
  EXPECT_EQ(step.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(step.status.message(), HasSubstr("a peer is gone"));
  EXPECT_EQ(comm.calls, 1);

  // Without sync, the network runs no collective of its own.
  FailingCommunicator quiet;
  const Step ddp =
      TrainStep(ConvBnNet(false), &quiet, images_, labels_, 0, kBatch, kBatch);
  EXPECT_TRUE(ddp.status.ok()) << ddp.status;
  EXPECT_EQ(quiet.calls, 0);
}

}  // namespace
}  // namespace dlbatch::trainer
