// The fp16 loss scaler: starts at 2^16, halves and skips on an injected
// inf/NaN gradient, doubles after 2,000 clean steps in a row, stays within
// its bounds, and restores a checkpoint's state.
#include "trainer/loss_scaler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace dlbatch::trainer {
namespace {

using ::testing::HasSubstr;

// What a step's finiteness check sees: SumSquares of the gradients.
bool Finite(double sum_squares) { return std::isfinite(sum_squares); }

TEST(LossScaler, StartsAt2To16AndHalvesAndSkipsOnAnInjectedInf) {
  LossScaler s;
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_TRUE(s.Update(Finite(12.5)));
  EXPECT_EQ(s.scale(), 65536.0);
  // An inf in one gradient makes the sum of squares inf: the step is
  // skipped and the scale halved.
  EXPECT_FALSE(s.Update(Finite(std::numeric_limits<double>::infinity())));
  EXPECT_EQ(s.scale(), 32768.0);
  EXPECT_EQ(s.skipped_steps(), 1);
  EXPECT_FALSE(s.Update(Finite(std::nan(""))));
  EXPECT_EQ(s.scale(), 16384.0);
  EXPECT_EQ(s.skipped_steps(), 2);
  EXPECT_DOUBLE_EQ(s.inverse_scale(), 1.0 / 16384);
}

TEST(LossScaler,
     DoublesAfter2000CleanStepsInARowAndAnOverflowRestartsTheCount) {
  LossScaler s;
  for (int i = 0; i < 1999; ++i) ASSERT_TRUE(s.Update(true));
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_TRUE(s.Update(true));  // the 2,000th
  EXPECT_EQ(s.scale(), 131072.0);
  for (int i = 0; i < 1500; ++i) ASSERT_TRUE(s.Update(true));
  EXPECT_FALSE(s.Update(false));
  EXPECT_EQ(s.scale(), 65536.0);
  // The count starts again after the overflow: 1,999 clean steps are not
  // enough.
  for (int i = 0; i < 1999; ++i) ASSERT_TRUE(s.Update(true));
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_TRUE(s.Update(true));
  EXPECT_EQ(s.scale(), 131072.0);
  EXPECT_EQ(s.skipped_steps(), 1);
}

TEST(LossScaler, StaysWithinItsBounds) {
  LossScaler::Options o;
  o.initial_scale = 4;
  o.min_scale = 1;
  o.max_scale = 8;
  o.growth_interval = 1;
  absl::StatusOr<LossScaler> s = LossScaler::Make(o);
  ASSERT_TRUE(s.ok()) << s.status();
  for (int i = 0; i < 5; ++i) s->Update(false);
  EXPECT_EQ(s->scale(), 1.0);
  EXPECT_EQ(s->skipped_steps(), 5);
  for (int i = 0; i < 5; ++i) s->Update(true);
  EXPECT_EQ(s->scale(), 8.0);
}

TEST(LossScaler, RefusesOptionsThatCannotWorkNamingTheField) {
  LossScaler::Options o;
  o.backoff_factor = 1;
  absl::StatusOr<LossScaler> s = LossScaler::Make(o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("backoff_factor"));
  o = {};
  o.growth_interval = 0;
  s = LossScaler::Make(o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("growth_interval"));
  o = {};
  o.initial_scale = 1e30;
  s = LossScaler::Make(o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("initial_scale"));
}

TEST(LossScaler, RestoresACheckpointsStateAndRefusesANonFiniteOne) {
  LossScaler a;
  for (int i = 0; i < 1234; ++i) a.Update(true);
  a.Update(false);
  for (int i = 0; i < 10; ++i) a.Update(true);
  LossScaler b;
  ASSERT_TRUE(b.Restore(a.state()).ok());
  EXPECT_EQ(b.scale(), a.scale());
  EXPECT_EQ(b.skipped_steps(), 1);
  // Both continue alike: 1,990 more clean steps double both.
  for (int i = 0; i < 1990; ++i) {
    a.Update(true);
    b.Update(true);
  }
  EXPECT_EQ(a.scale(), 65536.0);
  EXPECT_EQ(b.scale(), a.scale());

  LossScaler::State bad = a.state();
  bad.scale = std::numeric_limits<double>::infinity();
  absl::Status st = b.Restore(bad);
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(std::string(st.message()), HasSubstr("--resume"));
  EXPECT_EQ(b.scale(), 65536.0);
}

}  // namespace
}  // namespace dlbatch::trainer
