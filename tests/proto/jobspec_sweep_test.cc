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
                              "env.NAME (a variable of the job's "
                              "environment), args (arguments appended to a "
                              "command) or a train.options key: solver, "));
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
                         "train.options keys, env.NAME or args to lists of "
                         "values"));
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

TEST(SweepErrors, OnlyTrainJobsSweepTrainOptions) {
  EXPECT_THAT(ParseError("command: [echo, hi]\nsweep:\n  momentum: [0.1]\n"),
              StartsWith("job.yaml:3:3: sweep.momentum: a command: job has no "
                         "train.options; sweep env.NAME (a variable of its "
                         "environment) or args (arguments appended to its "
                         "command) instead"));
  v1::JobSpec command;
  command.mutable_command()->add_argv("true");
  v1::SweepAxis* axis = command.mutable_sweep()->add_axes();
  axis->set_option("momentum");
  axis->add_values("0.1");
  absl::StatusOr<std::vector<v1::JobSpec>> jobs = ExpandSweep(command);
  ASSERT_FALSE(jobs.ok());
  EXPECT_THAT(std::string(jobs.status().message()),
              StartsWith("sweep.momentum: a command: job has no "
                         "train.options"));
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

// A command job with `sweep` appended at top level.
std::string SweptCommand(const std::string& command, const std::string& sweep) {
  return "name: cmd\ncommand: " + command + "\nenv: {LR: '1', KEEP: k}\n" +
         sweep;
}

TEST(SweepEnvAndArgs, EnvValuesSetTheVariableOverTheJobsEnv) {
  std::vector<v1::JobSpec> jobs = ExpandOk(ParseOk(SweptCommand(
      "[python3, train.py]", "sweep:\n  env.LR: [0.1, '0.01']\n")));
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[0].env().at("LR"), "0.1");
  EXPECT_EQ(jobs[1].env().at("LR"), "0.01");
  EXPECT_EQ(jobs[1].env().at("KEEP"), "k");
  EXPECT_EQ(jobs[1].name(), "cmd[env.LR=0.01]");
  EXPECT_THAT(jobs[1].sweep_point(), ElementsAre(Pair("env.LR", "0.01")));
  EXPECT_THAT(jobs[1].command().argv(), ElementsAre("python3", "train.py"));
  // A train job's environment may be swept too.
  EXPECT_EQ(
      ExpandOk(ParseOk(SweptJob("sweep:\n  env.SEED: [1, 2, 3]\n"))).size(),
      3u);
}

TEST(SweepEnvAndArgs, ArgsAreAppendedToTheCommand) {
  std::vector<v1::JobSpec> jobs = ExpandOk(ParseOk(SweptCommand(
      "[python3, train.py]",
      "sweep:\n  args: [[--lr, '0.1'], [--lr, '0.01', --name, 'a b'], [], "
      "--fast]\n  env.X: [a, b]\n")));
  ASSERT_EQ(jobs.size(), 8u);
  // The first axis varies slowest.
  EXPECT_THAT(jobs[0].command().argv(),
              ElementsAre("python3", "train.py", "--lr", "0.1"));
  EXPECT_THAT(
      jobs[2].command().argv(),
      ElementsAre("python3", "train.py", "--lr", "0.01", "--name", "a b"));
  EXPECT_EQ(jobs[2].name(), "cmd[args=--lr 0.01 --name 'a b',env.X=a]");
  EXPECT_THAT(jobs[4].command().argv(), ElementsAre("python3", "train.py"));
  EXPECT_EQ(jobs[4].sweep_point().at("args"), "(none)");
  EXPECT_THAT(jobs[7].command().argv(),
              ElementsAre("python3", "train.py", "--fast"));
  EXPECT_EQ(jobs[7].env().at("X"), "b");
}

TEST(SweepEnvAndArgs, ArgsOfAShellLineAreAppendedToTheLineQuoted) {
  std::vector<v1::JobSpec> jobs = ExpandOk(
      ParseOk(SweptCommand("'echo $LR'", "sweep:\n  args: [[it's, x], []]\n")));
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_THAT(jobs[0].command().argv(),
              ElementsAre("sh", "-c", "echo $LR 'it'\\''s' x"));
  EXPECT_THAT(jobs[1].command().argv(), ElementsAre("sh", "-c", "echo $LR"));
}

TEST(SweepEnvAndArgs, ErrorsSayWhatToChange) {
  EXPECT_THAT(ParseError(SweptJob("sweep:\n  args: [[--x]]\n")),
              StartsWith("job.yaml:12:3: sweep.args: only a command: job has "
                         "arguments to sweep; sweep train.options keys or "
                         "env.NAME instead"));
  EXPECT_THAT(ParseError(SweptCommand("[a]", "sweep:\n  env.: [1]\n")),
              StartsWith("job.yaml:5:3: sweep.env.: names no variable; write "
                         "env.NAME, like env.LR"));
  EXPECT_THAT(ParseError(SweptCommand("[a]", "sweep:\n  env.X: [[1]]\n")),
              StartsWith("job.yaml:5:11: sweep.env.X[0]: expected a single "
                         "value, got a list"));
  EXPECT_THAT(ParseError(SweptCommand("[a]", "sweep:\n  env.X: 1\n")),
              StartsWith("job.yaml:5:10: sweep.env.X: expected a list of "
                         "values like [1, b], got a single value; for one "
                         "value set env.X instead"));
  EXPECT_THAT(ParseError(SweptCommand("[a]", "sweep:\n  args: --x\n")),
              StartsWith("job.yaml:5:9: sweep.args: expected a list of values "
                         "like [[--lr, 0.1], [--lr, 0.01]], got a single "
                         "value"));
  EXPECT_THAT(
      ParseError(SweptCommand("[a]", "sweep:\n  args: [[--x], [--x]]\n")),
      StartsWith("job.yaml:5:17: sweep.args[1]: '--x' is listed "
                 "twice; keep one"));
  EXPECT_THAT(ParseError(SweptCommand("[a]", "sweep:\n  args: [{a: 1}]\n")),
              StartsWith("job.yaml:5:10: sweep.args[0]: expected a string or "
                         "a list of strings, got a mapping"));
  // The worker's own variables cannot be swept.
  EXPECT_THAT(
      ParseError(
          SweptCommand("[a]", "sweep:\n  env.DLBATCH_ARRAY_INDEX: [1]\n")),
      HasSubstr("sweep.env.DLBATCH_ARRAY_INDEX[0]: '1' makes an invalid job: "
                "env.DLBATCH_ARRAY_INDEX: the worker sets it for each job"));
  // From a client that did not check: lists and values that differ.
  v1::JobSpec spec =
      ParseOk(SweptCommand("[a]", "sweep:\n  args: [[--x], [--y]]\n"));
  spec.mutable_sweep()->mutable_axes(0)->mutable_arg_lists()->RemoveLast();
  absl::StatusOr<std::vector<v1::JobSpec>> jobs = ExpandSweep(spec);
  ASSERT_FALSE(jobs.ok());
  EXPECT_THAT(std::string(jobs.status().message()),
              StartsWith("sweep.args: has 2 values but 1 argument lists"));
}

TEST(SweepEnvAndArgs, ArgsTextQuotesWhatAShellWouldSplit) {
  EXPECT_EQ(SweepArgsText({}), "(none)");
  EXPECT_EQ(SweepArgsText({"--lr=0.1", "a/b.c", ""}), "--lr=0.1 a/b.c ''");
  EXPECT_EQ(SweepArgsText({"a b", "$X", "it's"}), "'a b' '$X' 'it'\\''s'");
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
