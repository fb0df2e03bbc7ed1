// Training throughput of LeNet on the CPU backend: one step is forward,
// loss, backward and an SGDM update, on random 28x28x1 images. Prints
// images/s per batch size and where a step's time goes, kernel by kernel.
//
//   lenet_step_bench [threads=2] [seconds per measurement=2]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trainer/backend.h"
#include "trainer/network.h"
#include "trainer/rng.h"

namespace dlbatch::trainer {
namespace {

using Clock = std::chrono::steady_clock;

// Seconds per call of `fn`, run for about `seconds` after a warm-up: the
// median and the fastest call. On a machine shared with other work the
// fastest is the closer to what the code does on its own.
struct Timing {
  double median = 0, best = 0;
};
Timing TimeCalls(const std::function<void()>& fn, double seconds) {
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> times;
  const auto start = Clock::now();
  while (std::chrono::duration<double>(Clock::now() - start).count() <
             seconds ||
         times.size() < 5) {
    const auto t0 = Clock::now();
    fn();
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return {times[times.size() / 2], times.front()};
}

v1::NetworkSpec LeNet() {
  v1::NetworkSpec spec;
  for (int d : {28, 28, 1}) spec.add_input(d);
  auto add = [&](const char* type, int a = 0, int size = 0) {
    v1::LayerSpec* l = spec.add_layers();
    l->set_type(type);
    if (std::string(type) == "conv") l->set_filters(a);
    if (std::string(type) == "fc") l->set_units(a);
    l->set_size(size);
  };
  add("conv", 20, 5);
  add("maxpool", 0, 2);
  add("conv", 50, 5);
  add("maxpool", 0, 2);
  add("fc", 500);
  add("relu");
  add("fc", 10);
  add("softmax");
  return spec;
}

Buffer Random(Backend* backend, int64_t count, uint64_t seed) {
  std::vector<float> host(count);
  Rng rng(seed);
  for (float& v : host) v = static_cast<float>(rng.Uniform());
  Buffer b = *backend->Allocate(count * sizeof(float));
  backend->CopyToDevice(b.as<void>(), host.data(), count * sizeof(float));
  return b;
}

void Breakdown(Backend* backend, int n, double seconds) {
  struct Row {
    std::string name;
    double ms;
  };
  std::vector<Row> rows;
  auto time = [&](std::string name, const std::function<void()>& fn) {
    rows.push_back({std::move(name), 1e3 * TimeCalls(fn, seconds / 8).median});
  };
  auto conv_desc = [](Shape in, int filters) {
    ConvDesc d;
    d.in = in;
    d.filters = filters;
    d.kh = d.kw = 5;
    d.out = Shape{in.h - 4, in.w - 4, filters};
    return d;
  };
  auto pool_desc = [](Shape in) {
    PoolDesc d;
    d.in = in;
    d.kh = d.kw = d.stride_h = d.stride_w = 2;
    d.out = Shape{in.h / 2, in.w / 2, in.c};
    return d;
  };
  Buffer big1 = Random(backend, int64_t{n} * 24 * 24 * 20, 1);
  Buffer big2 = Random(backend, int64_t{n} * 24 * 24 * 20, 2);
  Buffer big3 = Random(backend, int64_t{n} * 24 * 24 * 20, 3);
  Buffer w = Random(backend, 500 * 800, 4);
  Buffer dw = Random(backend, 500 * 800, 5);
  Buffer b = Random(backend, 500, 6);
  Buffer db = Random(backend, 500, 7);
  Buffer ws = *backend->Allocate(int64_t{n} * 24 * 24 * 20 * 4);

  const ConvDesc c1 = conv_desc({28, 28, 1}, 20),
                 c2 = conv_desc({12, 12, 20}, 50);
  auto conv1 = *backend->MakeConv(c1, n);
  auto conv2 = *backend->MakeConv(c2, n);
  auto pool1 = *backend->MakePool(pool_desc({24, 24, 20}), n);
  auto pool2 = *backend->MakePool(pool_desc({8, 8, 50}), n);
  auto fc1 = *backend->MakeFc({800, 500}, n);
  auto fc2 = *backend->MakeFc({500, 10}, n);
  float* x = big1.f32();
  float* y = big2.f32();
  float* z = big3.f32();
  time("conv1 forward", [&] { conv1->Forward(n, x, w.f32(), b.f32(), y); });
  time("conv1 backward weights",
       [&] { conv1->BackwardWeights(n, x, y, dw.f32(), db.f32()); });
  time("pool1 forward", [&] { pool1->Forward(n, x, y, ws.as<void>()); });
  time("pool1 backward",
       [&] { pool1->Backward(n, x, y, z, ws.as<void>(), x); });
  time("conv2 forward", [&] { conv2->Forward(n, x, w.f32(), b.f32(), y); });
  time("conv2 backward data", [&] { conv2->BackwardData(n, y, w.f32(), x); });
  time("conv2 backward weights",
       [&] { conv2->BackwardWeights(n, x, y, dw.f32(), db.f32()); });
  time("pool2 forward", [&] { pool2->Forward(n, x, y, ws.as<void>()); });
  time("pool2 backward",
       [&] { pool2->Backward(n, x, y, z, ws.as<void>(), x); });
  time("fc1 forward", [&] { fc1->Forward(n, x, w.f32(), b.f32(), y); });
  time("fc1 backward data", [&] { fc1->BackwardData(n, y, w.f32(), x); });
  time("fc1 backward weights",
       [&] { fc1->BackwardWeights(n, x, y, dw.f32(), db.f32()); });
  time("relu forward+backward", [&] {
    backend->ActivationForward({0}, int64_t{n} * 500, x, y);
    backend->ActivationBackward({0}, int64_t{n} * 500, x, y, z);
  });
  time("fc2 forward+backward", [&] {
    fc2->Forward(n, x, w.f32(), b.f32(), y);
    fc2->BackwardData(n, y, w.f32(), x);
    fc2->BackwardWeights(n, x, y, dw.f32(), db.f32());
  });
  Buffer p = Random(backend, 431080, 8), g = Random(backend, 431080, 9),
         v = Random(backend, 431080, 10);
  time("sgdm update (431,080 params)", [&] {
    backend->SgdmUpdate(431080, 430500, 1e-3f, 0.9f, 1e-4f, p.f32(), g.f32(),
                        v.f32());
  });
  double total = 0;
  for (const Row& r : rows) total += r.ms;
  std::printf("  per kernel at batch %d (median ms; sum %.3f):\n", n, total);
  for (const Row& r : rows) {
    std::printf("    %-30s %7.3f  %4.1f%%\n", r.name.c_str(), r.ms,
                100 * r.ms / total);
  }
}

int Main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const double seconds = argc > 2 ? std::atof(argv[2]) : 2.0;
  auto backend = MakeCpuBackend(threads);
  if (!backend.ok()) {
    std::fprintf(stderr, "%s\n", backend.status().ToString().c_str());
    return 1;
  }
  std::printf("LeNet training step on %s\n", (*backend)->Describe().c_str());
  for (int n : {64, 256}) {
    auto net = Network::Build(LeNet(), backend->get(), n);
    if (!net.ok()) {
      std::fprintf(stderr, "%s\n", net.status().ToString().c_str());
      return 1;
    }
    Network& network = **net;
    network.Initialize(1);
    Buffer images = Random(backend->get(), int64_t{n} * 784, 11);
    std::vector<int32_t> host_labels(n);
    for (int i = 0; i < n; ++i) host_labels[i] = i % 10;
    Buffer labels = *(*backend)->Allocate(n * sizeof(int32_t));
    (*backend)->CopyToDevice(labels.as<void>(), host_labels.data(),
                             n * sizeof(int32_t));
    Buffer stats = *(*backend)->Allocate(2 * sizeof(float));
    Buffer velocity = *(*backend)->Allocate(network.num_params() * 4);
    const Timing step = TimeCalls(
        [&] {
          network.Forward(n, images.f32(), /*training=*/true);
          network.Loss(n, labels.as<int32_t>(), stats.f32());
          network.Backward(n, labels.as<int32_t>(), 1.0f / n);
          (*backend)->SgdmUpdate(network.num_params(), network.num_decayed(),
                                 1e-3f, 0.9f, 1e-4f, network.params(),
                                 network.grads(), velocity.f32());
          (*backend)->Synchronize();
        },
        seconds);
    std::printf(
        "batch %3d: median %.3f ms/step (%.0f images/s), best %.3f ms/step "
        "(%.0f images/s)\n",
        n, 1e3 * step.median, n / step.median, 1e3 * step.best, n / step.best);
    Breakdown(backend->get(), n, seconds);
  }
  return 0;
}

}  // namespace
}  // namespace dlbatch::trainer

int main(int argc, char** argv) { return dlbatch::trainer::Main(argc, argv); }
