// Tests of `sweep:` in job.yaml and of ExpandSweep: the product in the
// order written, options set as `train.options:` sets them, and errors that
// name the key and what to change.
#include "proto/jobspec_sweep.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/jobspec_yaml.h"

#ifndef DLBATCH_EXAMPLES_DIR
#error "DLBATCH_EXAMPLES_DIR must name the examples folder"
#endif

namespace dlbatch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::StartsWith;
using ::testing::UnorderedElementsAre;

// A train job named "net" with `sweep` appended at top level.
std::string SweptJob(const std::string& sweep) {
  return "name: net\n"
         "train:\n"
         "  network:\n"
         "    input: [28, 28, 1]\n"
         "    layers: [{type: fc, units: 10}, softmax]\n"
         "  data:\n"
         "    train: {format: idx, images: a.gz, labels: b.gz}\n"
         "  options:\n"
         "    max_epochs: 1\n"
         "    mini_batch_size: 32\n" +
         sweep;
}

v1::JobSpec ParseOk(const std::string& text) {
  absl::StatusOr<ParsedJobFile> parsed = ParseJobYaml(text, "job.yaml");
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return parsed.ok() ? parsed->spec : v1::JobSpec();
}

std::string ParseError(const std::string& text) {
  absl::StatusOr<ParsedJobFile> parsed = ParseJobYaml(text, "job.yaml");
  EXPECT_FALSE(parsed.ok()) << "parsed:\n" << text;
  if (parsed.ok()) return "";
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(parsed.status().message());
}

std::vector<v1::JobSpec> ExpandOk(const v1::JobSpec& spec) {
  absl::StatusOr<std::vector<v1::JobSpec>> jobs = ExpandSweep(spec);
  EXPECT_TRUE(jobs.ok()) << jobs.status();
  return jobs.ok() ? *jobs : std::vector<v1::JobSpec>{};
}

TEST(SweepParse, AxesKeepTheValuesAsWritten) {
  v1::JobSpec spec =
      ParseOk(SweptJob("sweep:\n"
                       "  initial_learn_rate: [0.1, 1e-2, \"0.001\"]\n"
                       "  mini_batch_size: [64, 128]\n"));
  ASSERT_EQ(spec.sweep().axes_size(), 2);
  EXPECT_EQ(spec.sweep().axes(0).option(), "initial_learn_rate");
  EXPECT_THAT(spec.sweep().axes(0).values(),
              ElementsAre("0.1", "1e-2", "0.001"));
  EXPECT_EQ(spec.sweep().axes(1).option(), "mini_batch_size");
  EXPECT_THAT(spec.sweep().axes(1).values(), ElementsAre("64", "128"));
  // The base options are untouched by the sweep.
  EXPECT_EQ(spec.train().options().mini_batch_size(), 32);
  EXPECT_FALSE(spec.train().options().has_initial_learn_rate());
}

TEST(SweepExpand, CartesianProductInTheOrderWritten) {
  v1::JobSpec spec =
      ParseOk(SweptJob("sweep:\n"
                       "  initial_learn_rate: [0.1, 0.01, 0.001]\n"
                       "  mini_batch_size: [64, 128]\n"));
  std::vector<v1::JobSpec> jobs = ExpandOk(spec);
  ASSERT_EQ(jobs.size(), 6u);
  std::vector<std::string> names;
  for (const v1::JobSpec& job : jobs) names.push_back(job.name());
  EXPECT_THAT(names,
              ElementsAre("net[initial_learn_rate=0.1,mini_batch_size=64]",
                          "net[initial_learn_rate=0.1,mini_batch_size=128]",
                          "net[initial_learn_rate=0.01,mini_batch_size=64]",
                          "net[initial_learn_rate=0.01,mini_batch_size=128]",
                          "net[initial_learn_rate=0.001,mini_batch_size=64]",
                          "net[initial_learn_rate=0.001,mini_batch_size=128]"));
  const v1::JobSpec& third = jobs[2];
  EXPECT_DOUBLE_EQ(third.train().options().initial_learn_rate(), 0.01);
  EXPECT_EQ(third.train().options().mini_batch_size(), 64);
  EXPECT_EQ(third.train().options().max_epochs(), 1);  // the rest is kept
  EXPECT_THAT(third.sweep_point(),
              UnorderedElementsAre(Pair("initial_learn_rate", "0.01"),
                                   Pair("mini_batch_size", "64")));
  for (const v1::JobSpec& job : jobs) {
    EXPECT_FALSE(job.has_sweep()) << job.name();
    EXPECT_EQ(job.train().network().layers_size(), 2);
  }
}

TEST(SweepExpand, SetsTheSameFieldsAsTrainOptions) {
  // Every kind of option: a number, an integer, a word, a bool-free enum,
  // an unsigned seed and the schedule's one-word form.
  v1::JobSpec swept =
      ParseOk(SweptJob("sweep:\n"
                       "  solver: [adam]\n"
                       "  momentum: [0.5]\n"
                       "  max_iterations: [40]\n"
                       "  shuffle: [never]\n"
                       "  seed: [18446744073709551615]\n"
                       "  learn_rate_schedule: [cosine]\n"));
  std::vector<v1::JobSpec> jobs = ExpandOk(swept);
  ASSERT_EQ(jobs.size(), 1u);
  v1::JobSpec direct = ParseOk(
      "train:\n"
      "  network:\n"
      "    input: [28, 28, 1]\n"
      "    layers: [{type: fc, units: 10}, softmax]\n"
      "  data:\n"
      "    train: {format: idx, images: a.gz, labels: b.gz}\n"
      "  options:\n"
      "    max_epochs: 1\n"
      "    mini_batch_size: 32\n"
      "    solver: adam\n"
      "    momentum: 0.5\n"
      "    max_iterations: 40\n"
      "    shuffle: never\n"
      "    seed: 18446744073709551615\n"
      "    learn_rate_schedule: cosine\n");
  EXPECT_EQ(jobs[0].train().options().SerializeAsString(),
            direct.train().options().SerializeAsString());
}

TEST(SweepExpand, NoSweepIsTheSpecItself) {
  v1::JobSpec spec = ParseOk(SweptJob(""));
  std::vector<v1::JobSpec> jobs = ExpandOk(spec);
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].SerializeAsString(), spec.SerializeAsString());
}

TEST(SweepErrors, UnknownOptionSuggestsTheNearest) {
  std::string msg =
      ParseError(SweptJob("sweep:\n  initial_learnrate: [0.1]\n"));
  EXPECT_THAT(msg, StartsWith("job.yaml:12:3: sweep: unknown option "
                              "'initial_learnrate' (did you mean "
                              "'initial_learn_rate'?); a sweep varies "
                              "train.options keys: solver, "));
}

TEST(SweepErrors, ValuesMustBeANonEmptyListOfScalars) {
  EXPECT_THAT(ParseError(SweptJob("sweep:\n  momentum: 0.9\n")),
              StartsWith("job.yaml:12:13: sweep.momentum: expected a list of "
                         "values like [0.9, b], got a single value; for one "
                         "value set train.options.momentum instead"));
  EXPECT_THAT(ParseError(SweptJob("sweep:\n  momentum: []\n")),
              StartsWith("job.yaml:12:13: sweep.momentum: the list is empty"));
  EXPECT_THAT(ParseError(SweptJob("sweep:\n  momentum: [[0.9]]\n")),
              StartsWith("job.yaml:12:14: sweep.momentum[0]: expected a "
                         "single value, got a list"));
  EXPECT_THAT(ParseError(SweptJob("sweep: [momentum]\n")),
              StartsWith("job.yaml:11:8: sweep: expected a mapping of "
                         "train.options keys to lists of values"));
  EXPECT_THAT(ParseError(SweptJob("sweep:\n  momentum: [0.9, 0.9]\n")),
              StartsWith("job.yaml:12:19: sweep.momentum[1]: '0.9' is listed "
                         "twice; keep one"));
}

TEST(SweepErrors, AValueTheOptionRejectsIsNamedWhereItStands) {
  // Rejected by the option's parser (not a number)...
  EXPECT_THAT(
      ParseError(SweptJob("sweep:\n  initial_learn_rate: [0.1, fast]\n")),
      StartsWith("job.yaml:12:29: sweep.initial_learn_rate[1]: "
                 "expected a number, got 'fast'"));
  // ...or by the rules of a valid job.
  EXPECT_THAT(ParseError(SweptJob("sweep:\n  mini_batch_size: [64, 0]\n")),
              StartsWith("job.yaml:12:25: sweep.mini_batch_size[1]: '0' makes "
                         "an invalid job: train.options.mini_batch_size: must "
                         "be > 0"));
  EXPECT_THAT(ParseError(SweptJob("sweep:\n  solver: [sgdm, sgd]\n")),
              HasSubstr("sweep.solver[1]: 'sgd' makes an invalid job: "
                        "train.options.solver: 'sgd' is not a solver"));
}

TEST(SweepErrors, OnlyTrainJobsAreSwept) {
  EXPECT_THAT(ParseError("command: [echo, hi]\nsweep:\n  momentum: [0.1]\n"),
              StartsWith("job.yaml:2:1: sweep: only a train: job can be "
                         "swept"));
  v1::JobSpec command;
  command.mutable_command()->add_argv("true");
  v1::SweepAxis* axis = command.mutable_sweep()->add_axes();
  axis->set_option("momentum");
  axis->add_values("0.1");
  absl::StatusOr<std::vector<v1::JobSpec>> jobs = ExpandSweep(command);
  ASSERT_FALSE(jobs.ok());
  EXPECT_THAT(std::string(jobs.status().message()),
              StartsWith("sweep: only a train: job"));
}

TEST(SweepErrors, TooManyCombinations) {
  std::string many = "[";
  for (int i = 1; i <= 40; ++i) many += (i > 1 ? ", " : "") + std::to_string(i);
  many += "]";
  std::string msg = ParseError(SweptJob("sweep:\n  mini_batch_size: " + many +
                                        "\n  max_iterations: " + many + "\n"));
  EXPECT_THAT(msg, StartsWith("job.yaml:11:1: sweep: 40 x 40 values make more "
                              "than 1000 jobs, the most one sweep may make; "
                              "use fewer values"));
}

TEST(SweepErrors, SpecsFromOtherClientsAreCheckedToo) {
  v1::JobSpec spec = ParseOk(SweptJob(""));
  v1::SweepAxis* axis = spec.mutable_sweep()->add_axes();
  axis->set_option("learn_rate");
  axis->add_values("0.1");
  absl::StatusOr<std::vector<v1::JobSpec>> jobs = ExpandSweep(spec);
  ASSERT_FALSE(jobs.ok());
  EXPECT_EQ(jobs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(jobs.status().message()),
              StartsWith("sweep.learn_rate[0]: unknown option 'learn_rate'"));

  v1::JobSpec twice = ParseOk(SweptJob("sweep:\n  momentum: [0.1]\n"));
  *twice.mutable_sweep()->add_axes() = twice.sweep().axes(0);
  jobs = ExpandSweep(twice);
  ASSERT_FALSE(jobs.ok());
  EXPECT_THAT(std::string(jobs.status().message()),
              StartsWith("sweep.momentum: given twice"));

  v1::JobSpec empty = ParseOk(SweptJob("sweep:\n  momentum: [0.1]\n"));
  empty.mutable_sweep()->mutable_axes(0)->clear_values();
  jobs = ExpandSweep(empty);
  ASSERT_FALSE(jobs.ok());
  EXPECT_THAT(std::string(jobs.status().message()),
              StartsWith("sweep.momentum: the list is empty"));
}

TEST(SweepExamples, SweepFashionMnistParsesIntoThreeJobs) {
  absl::StatusOr<ParsedJobFile> parsed =
      ReadJobFile(DLBATCH_EXAMPLES_DIR "/sweep-fashion-mnist.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(parsed->attach, ElementsAre("data/"));
  std::vector<v1::JobSpec> jobs = ExpandOk(parsed->spec);
  ASSERT_EQ(jobs.size(), 3u);
  for (const v1::JobSpec& job : jobs) {
    EXPECT_EQ(job.pool(), 1);
    EXPECT_TRUE(job.train().options().has_validation_frequency());
    EXPECT_EQ(job.sweep_point().size(), 1u);
  }
}

}  // namespace
}  // namespace dlbatch
