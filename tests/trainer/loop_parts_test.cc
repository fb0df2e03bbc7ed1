// Options with MATLAB's defaults, learning-rate schedules, and the
// checkpoint format: pure parts of the training loop.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "common/files.h"
#include "google/protobuf/util/json_util.h"
#include "trainer/options.h"
#include "trainer/output/checkpoint.h"
#include "trainer/output/progress.h"
#include "trainer/solver.h"

namespace dlbatch::trainer {
namespace {

TEST(Options, MatlabDefaultsPerSolver) {
  v1::TrainingOptions spec;
  Options o = ResolveOptions(spec);
  EXPECT_EQ(o.solver, SolverKind::kSgdm);
  EXPECT_DOUBLE_EQ(o.initial_learn_rate, 0.01);
  EXPECT_DOUBLE_EQ(o.momentum, 0.9);
  EXPECT_EQ(o.mini_batch_size, 128);
  EXPECT_EQ(o.max_epochs, 30);
  EXPECT_EQ(o.shuffle, "once");
  EXPECT_EQ(o.schedule.type(), "none");
  spec.set_solver("adam");
  o = ResolveOptions(spec);
  EXPECT_DOUBLE_EQ(o.initial_learn_rate, 0.001);
  EXPECT_DOUBLE_EQ(o.beta2, 0.999);
  spec.set_solver("rmsprop");
  spec.set_initial_learn_rate(0.5);
  o = ResolveOptions(spec);
  EXPECT_DOUBLE_EQ(o.initial_learn_rate, 0.5);
  EXPECT_DOUBLE_EQ(o.beta2, 0.9);
}

TEST(LearnRate, Schedules) {
  v1::TrainingOptions spec;
  spec.set_initial_learn_rate(0.1);
  spec.mutable_learn_rate_schedule()->set_type("piecewise");
  spec.mutable_learn_rate_schedule()->set_drop_period(2);
  Options o = ResolveOptions(spec);  // drop_factor defaults to 0.1
  EXPECT_DOUBLE_EQ(LearnRate(o, 0, 1, 100), 0.1);
  EXPECT_DOUBLE_EQ(LearnRate(o, 50, 2, 100), 0.1);
  EXPECT_NEAR(LearnRate(o, 60, 3, 100), 0.01, 1e-15);
  EXPECT_NEAR(LearnRate(o, 90, 5, 100), 0.001, 1e-15);

  // Caffe's lenet_solver: inv, gamma 1e-4, power 0.75.
  spec.mutable_learn_rate_schedule()->Clear();
  spec.mutable_learn_rate_schedule()->set_type("inv");
  spec.mutable_learn_rate_schedule()->set_gamma(1e-4);
  spec.mutable_learn_rate_schedule()->set_power(0.75);
  o = ResolveOptions(spec);
  EXPECT_DOUBLE_EQ(LearnRate(o, 0, 1, 100), 0.1);
  EXPECT_NEAR(LearnRate(o, 10000, 1, 100), 0.1 * std::pow(2.0, -0.75), 1e-12);

  spec.mutable_learn_rate_schedule()->Clear();
  spec.mutable_learn_rate_schedule()->set_type("step");
  spec.mutable_learn_rate_schedule()->set_step_size(10);
  o = ResolveOptions(spec);
  EXPECT_DOUBLE_EQ(LearnRate(o, 9, 1, 100), 0.1);
  EXPECT_NEAR(LearnRate(o, 10, 1, 100), 0.01, 1e-15);

  spec.mutable_learn_rate_schedule()->Clear();
  spec.mutable_learn_rate_schedule()->set_type("cosine");
  spec.mutable_learn_rate_schedule()->set_warmup_iterations(10);
  o = ResolveOptions(spec);
  EXPECT_NEAR(LearnRate(o, 0, 1, 110), 0.01, 1e-12);   // warm-up 1/10
  EXPECT_NEAR(LearnRate(o, 9, 1, 110), 0.1, 1e-12);    // end of warm-up
  EXPECT_NEAR(LearnRate(o, 60, 1, 110), 0.05, 1e-12);  // half way
  EXPECT_NEAR(LearnRate(o, 110, 1, 110), 0.0, 1e-12);
}

Checkpoint Sample() {
  Checkpoint c;
  c.network_fingerprint = "abc";
  c.solver = "adam";
  c.iteration = 1234;
  c.epoch = 3;
  c.epoch_iteration = 7;
  c.mini_batch_size = 64;
  c.seed = 42;
  c.elapsed_s = 12.5;
  c.best_validation_loss = 0.25;
  c.validations_without_improvement = 2;
  c.normalization.mean = {0.5f};
  c.normalization.std = {0.25f};
  c.tuning = "2\tconvolution forward, n 64\n";
  for (int i = 0; i < 1000; ++i) c.params.push_back(0.001f * i - 0.3f);
  c.state = {1, 2, 3, 4};
  c.solver_state.assign(2000, 0.125f);
  return c;
}

TEST(Checkpoint, RoundTripsEveryField) {
  const Checkpoint c = Sample();
  absl::StatusOr<Checkpoint> d = DecodeCheckpoint(EncodeCheckpoint(c), "x");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->network_fingerprint, "abc");
  EXPECT_EQ(d->solver, "adam");
  EXPECT_EQ(d->iteration, 1234);
  EXPECT_EQ(d->epoch, 3);
  EXPECT_EQ(d->epoch_iteration, 7);
  EXPECT_EQ(d->mini_batch_size, 64);
  EXPECT_EQ(d->seed, 42u);
  EXPECT_DOUBLE_EQ(d->elapsed_s, 12.5);
  EXPECT_DOUBLE_EQ(d->best_validation_loss, 0.25);
  EXPECT_EQ(d->validations_without_improvement, 2);
  EXPECT_EQ(d->normalization.mean, c.normalization.mean);
  EXPECT_EQ(d->tuning, c.tuning);
  EXPECT_EQ(d->params, c.params);
  EXPECT_EQ(d->state, c.state);
  EXPECT_EQ(d->solver_state, c.solver_state);

  Checkpoint fresh = c;
  fresh.best_validation_loss = INFINITY;
  d = DecodeCheckpoint(EncodeCheckpoint(fresh), "x");
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(std::isinf(d->best_validation_loss));
}

TEST(Checkpoint, DamageIsDetectedAndNamed) {
  const std::string good = EncodeCheckpoint(Sample());
  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x10;
  absl::Status s = DecodeCheckpoint(flipped, "run/checkpoint.dlbc").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("run/checkpoint.dlbc"), std::string::npos) << s;
  EXPECT_NE(s.message().find("checksum"), std::string::npos) << s;

  s = DecodeCheckpoint(good.substr(0, good.size() - 100), "c").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);

  s = DecodeCheckpoint("PK\x03\x04 something else entirely, long enough......",
                       "c")
          .status();
  EXPECT_NE(s.message().find("magic"), std::string::npos) << s;

  std::string newer = good;
  newer[8] = 9;  // version 9
  s = DecodeCheckpoint(newer, "c").status();
  EXPECT_NE(s.message().find("version 9"), std::string::npos) << s;
}

TEST(Checkpoint, WrittenAtomicallyAndReadBack) {
  char tmpl[] = "/tmp/dlbatch-ckpt-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/checkpoint.dlbc";
  ASSERT_TRUE(WriteCheckpoint(path, Sample()).ok());
  absl::StatusOr<Checkpoint> d = ReadCheckpoint(path);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->params, Sample().params);
  EXPECT_FALSE(ReadCheckpoint(std::string(tmpl) + "/missing").ok());
  ASSERT_TRUE(RemoveTree(tmpl).ok());
}

TEST(Progress, ElapsedAndChannel) {
  EXPECT_EQ(FormatElapsed(0), "00:00:00");
  EXPECT_EQ(FormatElapsed(3723.9), "01:02:03");
  EXPECT_FALSE(ProgressChannel::Open("fd:987").ok());
  EXPECT_FALSE(ProgressChannel::Open("fd:x").ok());
  char tmpl[] = "/tmp/dlbatch-progress-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/p.jsonl";
  v1::TrainProgress start;
  start.set_time_ms(1700000000123);
  start.set_iterations(937);
  v1::TrainProgress done = start;
  done.set_iteration(937);
  done.set_loss(0.25);
  done.set_checkpoint_iteration(900);
  done.set_done(true);
  {
    absl::StatusOr<ProgressChannel> c = ProgressChannel::Open(path);
    ASSERT_TRUE(c.ok());
    c->Emit(start);
    c->Emit(done);
  }
  absl::StatusOr<std::string> text = ReadFile(path);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, ProgressLine(start) + "\n" + ProgressLine(done) + "\n");
  // One line each, proto names, every field (a zero too), 64-bit numbers
  // as strings; read back it is the same message.
  EXPECT_EQ(ProgressLine(done).find('\n'), std::string::npos);
  for (const char* part :
       {R"("time_ms":"1700000000123")", R"("iteration":"937")",
        R"("checkpoint_iteration":"900")", R"("done":true)", R"("eta_s":0)",
        R"("has_validation":false)"}) {
    EXPECT_NE(ProgressLine(done).find(part), std::string::npos)
        << part << " not in " << ProgressLine(done);
  }
  v1::TrainProgress read;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(ProgressLine(done), &read)
          .ok());
  EXPECT_EQ(read.SerializeAsString(), done.SerializeAsString());
  ASSERT_TRUE(RemoveTree(tmpl).ok());
}

// A real network on the CPU backend, with gradients set by hand.
TEST(Solver, ClipsEachArrayToTheThresholdThenSteps) {
  v1::NetworkSpec spec;
  for (int x : {4, 4, 1}) spec.add_input(x);
  v1::LayerSpec* fc = spec.add_layers();
  fc->set_type("fc");
  fc->set_units(3);
  spec.add_layers()->set_type("softmax");
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCpuBackend(1);
  ASSERT_TRUE(backend.ok());
  absl::StatusOr<std::unique_ptr<Network>> net =
      Network::Build(spec, backend->get(), 2);
  ASSERT_TRUE(net.ok()) << net.status();
  Network& n = **net;
  n.Initialize(1);
  const int64_t count = n.num_params();  // 16 * 3 weights, 3 biases
  ASSERT_EQ(count, 51);
  std::vector<float> before(count), grads(count);
  (*backend)->CopyToHost(before.data(), n.params(), count * 4);
  // Weight gradient of norm 10 (each element 10 / sqrt(48)); bias gradient
  // of norm 0.3, below the threshold.
  for (int64_t i = 0; i < 48; ++i) grads[i] = 10.0f / std::sqrt(48.0f);
  for (int64_t i = 48; i < count; ++i) grads[i] = 0.3f / std::sqrt(3.0f);
  (*backend)->CopyToDevice(n.grads(), grads.data(), count * 4);

  v1::TrainingOptions o;
  o.set_solver("sgdm");
  o.set_momentum(0);
  o.set_l2_regularization(0);
  o.set_gradient_threshold(1.0);
  absl::StatusOr<std::unique_ptr<Solver>> solver =
      Solver::Create(ResolveOptions(o), backend->get(), &n);
  ASSERT_TRUE(solver.ok());
  (*solver)->Step(/*lr=*/0.5, /*step=*/1);
  std::vector<float> after(count);
  (*backend)->CopyToHost(after.data(), n.params(), count * 4);
  double weight_step = 0, bias_step = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double d = double{before[i]} - after[i];
    (i < 48 ? weight_step : bias_step) += d * d;
  }
  // The weights' gradient was scaled to norm 1, the biases' kept 0.3.
  EXPECT_NEAR(std::sqrt(weight_step), 0.5 * 1.0, 1e-5);
  EXPECT_NEAR(std::sqrt(bias_step), 0.5 * 0.3, 1e-5);
  EXPECT_EQ((*solver)->state_size(), count);
}

}  // namespace
}  // namespace dlbatch::trainer
