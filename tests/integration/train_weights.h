// What tests of train jobs compare: a finished job's trained weights,
// fetched through the real CLI, and how far two sets of them are apart.
#ifndef DLBATCH_TESTS_INTEGRATION_TRAIN_WEIGHTS_H_
#define DLBATCH_TESTS_INTEGRATION_TRAIN_WEIGHTS_H_

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/integration/harness.h"
#include "trainer/output/checkpoint.h"

namespace dlbatch::testing {

// `dlbatch fetch-outputs ID --output INTO`, then the weights of INTO's
// checkpoint.dlbc; empty (and a test failure) where either step fails.
inline std::vector<float> FetchTrainedWeights(Cluster& cluster, int64_t id,
                                              const std::string& into) {
  Result fetch =
      cluster.Cli({"fetch-outputs", std::to_string(id), "--output", into});
  EXPECT_EQ(fetch.code, 0) << fetch.out << fetch.err;
  absl::StatusOr<trainer::Checkpoint> ckpt =
      trainer::ReadCheckpoint(into + "/checkpoint.dlbc");
  EXPECT_TRUE(ckpt.ok()) << ckpt.status();
  return ckpt.ok() ? ckpt->params : std::vector<float>();
}

// |a - b| / |b| over the whole vectors. REQUIRES: the same size.
inline double RelativeDifference(const std::vector<float>& a,
                                 const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff += std::pow(double{a[i]} - b[i], 2);
    norm += std::pow(double{b[i]}, 2);
  }
  return std::sqrt(diff / norm);
}

}  // namespace dlbatch::testing

#endif  // DLBATCH_TESTS_INTEGRATION_TRAIN_WEIGHTS_H_
