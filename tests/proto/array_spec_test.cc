// Tests of Slurm's --array syntax (ParseArraySpec), of `array:` in job.yaml
// and of ExpandArray: the indexes named, each once and in order, the %N
// limit, and errors that say what to write instead.
#include "proto/array_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/jobspec_yaml.h"

namespace dlbatch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::vector<int64_t> Indexes(const std::string& text) {
  absl::StatusOr<ArraySpec> spec = ParseArraySpec(text);
  EXPECT_TRUE(spec.ok()) << text << ": " << spec.status();
  return spec.ok() ? spec->indexes : std::vector<int64_t>{};
}

int Limit(const std::string& text) {
  absl::StatusOr<ArraySpec> spec = ParseArraySpec(text);
  EXPECT_TRUE(spec.ok()) << text << ": " << spec.status();
  return spec.ok() ? spec->limit : -1;
}

std::string Error(const std::string& text) {
  absl::StatusOr<ArraySpec> spec = ParseArraySpec(text);
  EXPECT_FALSE(spec.ok()) << "parsed: " << text;
  if (spec.ok()) return "";
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(spec.status().message());
}

TEST(ArraySpecParse, RangesListsStepsAndTheirCombinations) {
  EXPECT_THAT(Indexes("7"), ElementsAre(7));
  EXPECT_THAT(Indexes("0-3"), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(Indexes("1,3,5"), ElementsAre(1, 3, 5));
  EXPECT_THAT(Indexes("0-15:4"), ElementsAre(0, 4, 8, 12));
  EXPECT_THAT(Indexes("1-2:5"), ElementsAre(1));
  EXPECT_THAT(Indexes("10,0-2,7-11:2"), ElementsAre(0, 1, 2, 7, 9, 10, 11));
  EXPECT_THAT(Indexes("3-3"), ElementsAre(3));
  EXPECT_THAT(Indexes(" 0-1 "), ElementsAre(0, 1));
  // Overlaps make one job per index, as Slurm's.
  EXPECT_THAT(Indexes("0-3,2-5,5"), ElementsAre(0, 1, 2, 3, 4, 5));
  EXPECT_EQ(Indexes("0-99").size(), 100u);
  EXPECT_EQ(Indexes("5-99999999:10000000").size(), 10u);
  EXPECT_EQ(Indexes("999999999").front(), kMaxArrayIndex);
  EXPECT_EQ(Indexes("0-3:99999999999").size(), 1u);
}

TEST(ArraySpecParse, PercentLimitsHowManyRunAtOnce) {
  EXPECT_EQ(Limit("0-99"), 0);
  EXPECT_EQ(Limit("0-99%10"), 10);
  EXPECT_EQ(Limit("1,3,5%1"), 1);
  EXPECT_EQ(Limit("0-3%100"), 100);  // more than its jobs: no effect
  EXPECT_EQ(Limit("0-3%99999999999"), kMaxArrayJobs);
  EXPECT_THAT(Indexes("0-15:4%2"), ElementsAre(0, 4, 8, 12));
}

TEST(ArraySpecParse, ErrorsSayWhatToWrite) {
  EXPECT_THAT(Error("5-1"), StartsWith("array: '5-1' ends before it starts; "
                                       "write the smaller index first (1-5)"));
  EXPECT_THAT(Error("0-9%0"),
              StartsWith("array: %0 would run none of its jobs; use %1 or "
                         "more, or leave out the %"));
  EXPECT_THAT(Error("0-9%"), StartsWith("array: '%' is not a limit; write %N"));
  EXPECT_THAT(Error("0-9%x"), StartsWith("array: '%x' is not a limit"));
  EXPECT_THAT(Error("0-9%3%4"), StartsWith("array: '%3%4' is not a limit"));
  EXPECT_THAT(Error("%3"), StartsWith("array: '%3' names no indexes before "
                                      "the %; write them first, like 0-9%3"));
  EXPECT_THAT(Error(""), StartsWith("array: is empty; write indexes (7), "
                                    "ranges (0-99) or ranges with a step "
                                    "(0-15:4)"));
  EXPECT_THAT(Error("1,,3"), StartsWith("array: an entry between commas is "
                                        "empty; remove the extra comma"));
  EXPECT_THAT(Error("1,"), HasSubstr("remove the extra comma"));
  EXPECT_THAT(Error("a"), StartsWith("array: 'a' is not an index or a range; "
                                     "write indexes (7)"));
  EXPECT_THAT(Error("-1"), StartsWith("array: '-1' is not an index"));
  EXPECT_THAT(Error("0 - 9"), StartsWith("array: '0 - 9' is not an index"));
  EXPECT_THAT(Error("1-2-3"), StartsWith("array: '1-2-3' is not an index"));
  EXPECT_THAT(Error("0-15:0"), StartsWith("array: '0-15:0' has step 0; a step "
                                          "is 1 or more"));
  EXPECT_THAT(Error("0-15:x"), StartsWith("array: '0-15:x' is not an index"));
  EXPECT_THAT(Error("5:2"), StartsWith("array: '5:2' has a step but no range; "
                                       "write the range it steps through"));
  EXPECT_THAT(Error("1000000000"),
              StartsWith("array: '1000000000': 1000000000 is too large; "
                         "indexes go from 0 to 999999999"));
  EXPECT_THAT(Error(std::string(5000, '1')), HasSubstr("characters long"));
}

TEST(ArraySpecParse, MoreJobsThanTheLimitAreRefusedSayingTheLimit) {
  EXPECT_EQ(Indexes("1-10000").size(), 10000u);
  EXPECT_EQ(Indexes("0-9999,5000-9999").size(), 10000u);  // overlaps once
  EXPECT_EQ(Error("0-10000"),
            "array: '0-10000' makes 10001 jobs; an array makes at most 10000; "
            "use fewer indexes, or split it into several arrays");
  EXPECT_THAT(Error("0-9999,20000"), StartsWith("array: '0-9999,20000' makes "
                                                "10001 jobs"));
  // Too many to count: refused before any is made.
  EXPECT_THAT(Error("0-999999999%5"),
              StartsWith("array: '0-999999999%5' names more than 1000000 "
                         "indexes; an array makes at most 10000 jobs"));
}

TEST(ArrayExpand, OneSpecPerIndexWithItsTask) {
  v1::JobSpec spec;
  spec.set_name("train");
  spec.mutable_command()->add_argv("true");
  spec.set_array("4,0-2:2%2");
  absl::StatusOr<std::vector<v1::JobSpec>> jobs = ExpandArray(spec);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 3u);
  const int64_t want[] = {0, 2, 4};
  for (int i = 0; i < 3; ++i) {
    const v1::JobSpec& job = (*jobs)[i];
    EXPECT_EQ(job.name(), "train[" + std::to_string(want[i]) + "]");
    EXPECT_TRUE(job.array().empty());
    EXPECT_EQ(job.array_task().index(), want[i]);
    EXPECT_EQ(job.array_task().limit(), 2);
    EXPECT_EQ(job.array_task().count(), 3);
    EXPECT_EQ(job.array_task().id(), 0);
    EXPECT_TRUE(ValidateJobSpec(job).ok()) << ValidateJobSpec(job);
  }

  v1::JobSpec plain = spec;
  plain.clear_array();
  jobs = ExpandArray(plain);
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_FALSE((*jobs)[0].has_array_task());

  // Only the scheduler sets a job's task.
  v1::JobSpec forged = plain;
  forged.mutable_array_task()->set_id(3);
  forged.mutable_array_task()->set_count(1);
  jobs = ExpandArray(forged);
  ASSERT_FALSE(jobs.ok());
  EXPECT_THAT(std::string(jobs.status().message()),
              StartsWith("array_task: is set by the scheduler"));
}

// A command job with `extra` lines at top level.
std::string CommandJob(const std::string& extra) {
  return "name: a\ncommand: [echo, hi]\n" + extra;
}

std::string YamlError(const std::string& text) {
  absl::StatusOr<ParsedJobFile> parsed = ParseJobYaml(text, "job.yaml");
  EXPECT_FALSE(parsed.ok()) << "parsed:\n" << text;
  return parsed.ok() ? "" : std::string(parsed.status().message());
}

TEST(ArrayYaml, ArrayIsKeptAsWrittenAndCheckedAtItsLine) {
  absl::StatusOr<ParsedJobFile> parsed =
      ParseJobYaml(CommandJob("array: 0-99%10\n"), "job.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->spec.array(), "0-99%10");
  parsed = ParseJobYaml(CommandJob("array: 5\n"), "job.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->spec.array(), "5");

  EXPECT_THAT(YamlError(CommandJob("array: 5-1\n")),
              StartsWith("job.yaml:3:8: array: '5-1' ends before it starts"));
  EXPECT_THAT(YamlError(CommandJob("array: 0-9%0\n")),
              StartsWith("job.yaml:3:8: array: %0 would run none"));
  EXPECT_THAT(YamlError(CommandJob("array: 0-10000\n")),
              StartsWith("job.yaml:3:8: array: '0-10000' makes 10001 jobs; "
                         "an array makes at most 10000"));
  EXPECT_THAT(YamlError(CommandJob("array: ''\n")),
              StartsWith("job.yaml:3:8: array: is empty"));
  EXPECT_THAT(YamlError(CommandJob("array: [1, 2]\n")),
              StartsWith("job.yaml:3:8: array: expected a string, got a list"));
  EXPECT_THAT(
      YamlError(CommandJob("array: 0-3\nsweep:\n  env.X: [a]\n")),
      StartsWith("job.yaml:3:8: array: a job has `array:` or `sweep:`, not "
                 "both"));
  EXPECT_THAT(YamlError(CommandJob("env: {DLBATCH_ARRAY_ID: '1'}\n")),
              StartsWith("job.yaml:3:7: env.DLBATCH_ARRAY_ID: the worker sets "
                         "it for each job"));
}

TEST(ArrayValidate, SpecsFromOtherClientsAreCheckedToo) {
  v1::JobSpec spec;
  spec.mutable_command()->add_argv("true");
  spec.set_array("9-0");
  EXPECT_THAT(std::string(ValidateJobSpec(spec).message()),
              StartsWith("array: '9-0' ends before it starts"));
  spec.clear_array();
  spec.mutable_array_task()->set_count(0);
  EXPECT_THAT(std::string(ValidateJobSpec(spec).message()),
              StartsWith("array_task: index 0, limit 0 and count 0 are not "
                         "one job of an array"));
}

}  // namespace
}  // namespace dlbatch
