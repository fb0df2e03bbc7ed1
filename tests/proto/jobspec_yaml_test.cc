// Tests of job.yaml -> JobSpec: field mapping, locations in messages, and
// ValidateJobSpec's rules.
#include "proto/jobspec_yaml.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/status/status.h"

#ifndef DLBATCH_EXAMPLES_DIR
#error "DLBATCH_EXAMPLES_DIR must name the examples folder"
#endif

namespace dlbatch {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// Parses `text` as "job.yaml"; REQUIRES: it parses.
v1::JobSpec ParseOk(const std::string& text) {
  absl::StatusOr<ParsedJobFile> parsed = ParseJobYaml(text, "job.yaml");
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return parsed.ok() ? parsed->spec : v1::JobSpec();
}

// The message of the error `text` gives; fails the test if it parses.
std::string ParseError(const std::string& text) {
  absl::StatusOr<ParsedJobFile> parsed = ParseJobYaml(text, "job.yaml");
  EXPECT_FALSE(parsed.ok()) << "parsed:\n" << text;
  if (parsed.ok()) return "";
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(parsed.status().message());
}

// A train job to vary (valid with the default layers); `options` is
// spliced under train.options.
std::string TrainJob(const std::string& layers =
                         "      - {type: fc, units: 10}\n      - softmax\n",
                     const std::string& options = "") {
  return "train:\n"
         "  network:\n"
         "    input: [28, 28, 1]\n"
         "    layers:\n" +
         layers +
         "  data:\n"
         "    train: {format: idx, images: a.gz, labels: b.gz}\n"
         "  options:\n"
         "    max_epochs: 1\n" +
         options;
}

v1::JobSpec ValidCommandSpec() {
  v1::JobSpec spec;
  spec.mutable_command()->add_argv("true");
  return spec;
}

std::string ValidateMessage(const v1::JobSpec& spec) {
  absl::Status s = ValidateJobSpec(spec);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  return std::string(s.message());
}

TEST(JobYamlExamples, HelloCommandParses) {
  absl::StatusOr<ParsedJobFile> parsed =
      ReadJobFile(DLBATCH_EXAMPLES_DIR "/hello-command.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const v1::JobSpec& spec = parsed->spec;
  EXPECT_EQ(spec.name(), "hello-command");
  EXPECT_EQ(spec.pool(), 1);
  ASSERT_TRUE(spec.has_command());
  ASSERT_EQ(spec.command().argv_size(), 3);
  EXPECT_EQ(spec.command().argv(0), "sh");
  EXPECT_EQ(spec.command().argv(1), "-c");
  EXPECT_THAT(spec.command().argv(2), HasSubstr("$DLBATCH_OUTPUT_DIR"));
  EXPECT_EQ(spec.env().at("GREETING"), "hello from dlbatch");
}

TEST(JobYamlExamples, LenetFashionMnistParses) {
  absl::StatusOr<ParsedJobFile> parsed =
      ReadJobFile(DLBATCH_EXAMPLES_DIR "/lenet-fashion-mnist.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const v1::JobSpec& spec = parsed->spec;
  EXPECT_THAT(parsed->attach, ElementsAre("data/"));
  EXPECT_EQ(spec.attach_size(), 0);  // the client turns `attach` into these
  EXPECT_EQ(spec.pool(), 2);
  EXPECT_EQ(spec.time_limit_s(), 1800);
  ASSERT_TRUE(spec.has_train());
  const v1::TrainSpec& train = spec.train();
  EXPECT_THAT(train.network().input(), ElementsAre(28, 28, 1));
  ASSERT_EQ(train.network().layers_size(), 8);
  EXPECT_EQ(train.network().layers(2).type(), "conv");
  EXPECT_EQ(train.network().layers(2).filters(), 50);
  EXPECT_EQ(train.network().layers(3).stride(), 2);
  EXPECT_EQ(train.network().layers(7).type(), "softmax");
  EXPECT_EQ(train.data().train().images(), "data/train-images-idx3-ubyte.gz");
  EXPECT_EQ(train.data().validation().labels(),
            "data/t10k-labels-idx1-ubyte.gz");
  EXPECT_EQ(train.options().solver(), "sgdm");
  EXPECT_EQ(train.options().learn_rate_schedule().type(), "cosine");
  EXPECT_EQ(train.options().learn_rate_schedule().warmup_iterations(), 200);
  EXPECT_EQ(train.options().max_epochs(), 2);
  EXPECT_EQ(train.options().mini_batch_size(), 64);
  EXPECT_EQ(train.options().seed(), 1u);
}

TEST(JobYamlParse, TopLevelFieldsMap) {
  absl::StatusOr<ParsedJobFile> parsed = ParseJobYaml(
      "name: sweep-7\n"
      "profile: gpu-cluster\n"
      "pool: 8\n"
      "priority: -3\n"
      "time_limit: 1h30m\n"
      "max_nodes: 2\n"
      "attach: [train.py, conf/]\n"
      "env: {LR: 0.1, MODE: fast, EMPTY: \"\"}\n"
      "command: [python3, train.py, --lr, \"0.1\"]\n",
      "job.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const v1::JobSpec& spec = parsed->spec;
  EXPECT_EQ(spec.name(), "sweep-7");
  EXPECT_EQ(spec.profile(), "gpu-cluster");
  EXPECT_EQ(spec.pool(), 8);
  EXPECT_EQ(spec.priority(), -3);
  EXPECT_EQ(spec.time_limit_s(), 5400);
  EXPECT_EQ(spec.max_nodes(), 2);
  EXPECT_THAT(parsed->attach, ElementsAre("train.py", "conf/"));
  EXPECT_EQ(spec.env_size(), 3);
  EXPECT_EQ(spec.env().at("LR"), "0.1");
  EXPECT_EQ(spec.env().at("MODE"), "fast");
  EXPECT_EQ(spec.env().at("EMPTY"), "");
  EXPECT_THAT(spec.command().argv(),
              ElementsAre("python3", "train.py", "--lr", "0.1"));
}

TEST(JobYamlParse, NodesIsAnAliasOfMaxNodes) {
  EXPECT_EQ(ParseOk("nodes: 3\ncommand: [true]\n").max_nodes(), 3);
  EXPECT_THAT(ParseError("nodes: 3\nmax_nodes: 2\ncommand: [true]\n"),
              HasSubstr("job.yaml:2:12: max_nodes: `nodes` already gives it"));
}

TEST(JobYamlParse, CommandStringMeansShell) {
  v1::JobSpec spec = ParseOk("command: \"echo hi\"\n");
  EXPECT_THAT(spec.command().argv(), ElementsAre("sh", "-c", "echo hi"));
}

TEST(JobYamlParse, LayerFieldsMap) {
  v1::JobSpec spec = ParseOk(TrainJob(
      "      - {type: conv, name: c1, filters: 16, size: 3, stride: 2, "
      "padding: same}\n"
      "      - {type: conv, filters: 8, size: 3, padding: 1}\n"
      "      - {type: batchnorm, epsilon: 0.001, sync: true}\n"
      "      - {type: leakyrelu, alpha: 0.2}\n"
      "      - {type: avgpool, size: 2}\n"
      "      - {type: dropout, probability: 0.25}\n"
      "      - relu\n"
      "      - {type: globalavgpool}\n"
      "      - {type: fc, units: 10}\n"
      "      - softmax\n"));
  const auto& layers = spec.train().network().layers();
  ASSERT_EQ(layers.size(), 10);
  EXPECT_EQ(layers[0].name(), "c1");
  EXPECT_EQ(layers[0].filters(), 16);
  EXPECT_EQ(layers[0].size(), 3);
  EXPECT_EQ(layers[0].stride(), 2);
  EXPECT_TRUE(layers[0].padding_same());
  EXPECT_EQ(layers[0].padding(), 0);
  EXPECT_FALSE(layers[1].padding_same());
  EXPECT_EQ(layers[1].padding(), 1);
  EXPECT_FLOAT_EQ(layers[2].epsilon(), 0.001f);
  EXPECT_TRUE(layers[2].sync());
  EXPECT_FALSE(layers[1].sync());
  EXPECT_FLOAT_EQ(layers[3].alpha(), 0.2f);
  EXPECT_EQ(layers[4].size(), 2);
  EXPECT_FLOAT_EQ(layers[5].probability(), 0.25f);
  EXPECT_EQ(layers[6].type(), "relu");
  EXPECT_EQ(layers[7].type(), "globalavgpool");
  EXPECT_EQ(layers[8].units(), 10);
}

TEST(JobYamlParse, PaddingTakesANumberOrSame) {
  EXPECT_THAT(
      ParseError(TrainJob(
          "      - {type: conv, filters: 1, size: 3, padding: valid}\n")),
      HasSubstr("train.network.layers[0].padding: expected a number "
                "of pixels or `same`, got 'valid'"));
}

TEST(JobYamlParse, OptionsMap) {
  v1::JobSpec spec = ParseOk(
      TrainJob("      - {type: fc, units: 10}\n      - softmax\n",
               "    solver: adam\n"
               "    initial_learn_rate: 1e-3\n"
               "    momentum: 0.8\n"
               "    l2_regularization: 0.0001\n"
               "    gradient_threshold: 5\n"
               "    learn_rate_schedule: {type: step, gamma: 0.5, power: 2, "
               "step_size: 100, warmup_iterations: 10, drop_factor: 0.2, "
               "drop_period: 3}\n"
               "    mini_batch_size: 128\n"
               "    max_iterations: 5000\n"
               "    shuffle: once\n"
               "    validation_frequency: 50\n"
               "    validation_patience: 4\n"
               "    verbose_frequency: 10\n"
               "    execution_environment: multi-gpu\n"
               "    checkpoint_frequency: 200\n"
               "    checkpoint_frequency_unit: iteration\n"
               "    seed: 18446744073709551615\n"
               "    gradient_decay_factor: 0.9\n"
               "    squared_gradient_decay_factor: 0.999\n"
               "    epsilon: 1e-8\n"
               "    precision: tf32\n"));
  const v1::TrainingOptions& o = spec.train().options();
  EXPECT_EQ(o.solver(), "adam");
  EXPECT_DOUBLE_EQ(o.initial_learn_rate(), 1e-3);
  EXPECT_DOUBLE_EQ(o.momentum(), 0.8);
  EXPECT_DOUBLE_EQ(o.l2_regularization(), 0.0001);
  EXPECT_DOUBLE_EQ(o.gradient_threshold(), 5);
  const v1::LearnRateSchedule& s = o.learn_rate_schedule();
  EXPECT_EQ(s.type(), "step");
  EXPECT_DOUBLE_EQ(s.gamma(), 0.5);
  EXPECT_DOUBLE_EQ(s.power(), 2);
  EXPECT_EQ(s.step_size(), 100);
  EXPECT_EQ(s.warmup_iterations(), 10);
  EXPECT_DOUBLE_EQ(s.drop_factor(), 0.2);
  EXPECT_DOUBLE_EQ(s.drop_period(), 3);
  EXPECT_EQ(o.mini_batch_size(), 128);
  EXPECT_EQ(o.max_epochs(), 1);
  EXPECT_EQ(o.max_iterations(), 5000);
  EXPECT_EQ(o.shuffle(), "once");
  EXPECT_EQ(o.validation_frequency(), 50);
  EXPECT_EQ(o.validation_patience(), 4);
  EXPECT_EQ(o.verbose_frequency(), 10);
  EXPECT_EQ(o.execution_environment(), "multi-gpu");
  EXPECT_EQ(o.checkpoint_frequency(), 200);
  EXPECT_EQ(o.checkpoint_frequency_unit(), "iteration");
  EXPECT_EQ(o.seed(), 18446744073709551615ull);
  EXPECT_DOUBLE_EQ(o.gradient_decay_factor(), 0.9);
  EXPECT_DOUBLE_EQ(o.squared_gradient_decay_factor(), 0.999);
  EXPECT_DOUBLE_EQ(o.epsilon(), 1e-8);
  EXPECT_EQ(o.precision(), "tf32");
  // Options not written stay unset, so the trainer applies its defaults.
  v1::JobSpec bare = ParseOk(TrainJob());
  EXPECT_FALSE(bare.train().options().has_momentum());
  EXPECT_FALSE(bare.train().options().has_seed());
}

TEST(JobYamlParse, ScheduleMayBeJustItsType) {
  v1::JobSpec spec =
      ParseOk(TrainJob("      - {type: fc, units: 10}\n      - softmax\n",
                       "    learn_rate_schedule: cosine\n"));
  EXPECT_EQ(spec.train().options().learn_rate_schedule().type(), "cosine");
}

TEST(JobYamlParse, DataMaps) {
  v1::JobSpec spec = ParseOk(
      "train:\n"
      "  network: {input: [32, 32, 3], layers: [{type: fc, units: 10}, "
      "softmax]}\n"
      "  data:\n"
      "    train: {format: cifar10, files: [b1.bin, b2.bin]}\n"
      "    validation: {format: cifar10, files: test.bin}\n"
      "    test: {format: idx, images: ti.gz, labels: tl.gz}\n"
      "    normalize: yes\n"
      "    augmentation:\n"
      "      random_x_reflection: true\n"
      "      random_y_reflection: false\n"
      "      random_x_translation: 4\n"
      "      random_y_translation: 3\n"
      "      random_crop_padding: 2\n");
  const v1::DataSpec& d = spec.train().data();
  EXPECT_EQ(d.train().format(), "cifar10");
  EXPECT_THAT(d.train().files(), ElementsAre("b1.bin", "b2.bin"));
  EXPECT_THAT(d.validation().files(), ElementsAre("test.bin"));
  EXPECT_EQ(d.test().images(), "ti.gz");
  EXPECT_EQ(d.test().labels(), "tl.gz");
  EXPECT_TRUE(d.normalize());
  EXPECT_TRUE(d.augmentation().random_x_reflection());
  EXPECT_FALSE(d.augmentation().random_y_reflection());
  EXPECT_EQ(d.augmentation().random_x_translation(), 4);
  EXPECT_EQ(d.augmentation().random_y_translation(), 3);
  EXPECT_EQ(d.augmentation().random_crop_padding(), 2);
}

TEST(JobYamlParse, FoldersSourceMaps) {
  v1::JobSpec spec = ParseOk(
      "train:\n"
      "  network: {input: [32, 32, 3], layers: [{type: fc, units: 10}, "
      "softmax]}\n"
      "  data:\n"
      "    train: {format: folders, path: images/, skip_bad_images: true}\n"
      "    test: {format: folders, path: /data/test}\n"
      "    validation_split: 0.1\n");
  const v1::DataSpec& d = spec.train().data();
  EXPECT_EQ(d.train().format(), "folders");
  EXPECT_EQ(d.train().path(), "images/");
  EXPECT_TRUE(d.train().skip_bad_images());
  EXPECT_EQ(d.test().path(), "/data/test");
  EXPECT_FALSE(d.test().skip_bad_images());
  EXPECT_DOUBLE_EQ(d.validation_split(), 0.1);
}

TEST(JobYamlParse, AttachStringOrList) {
  absl::StatusOr<ParsedJobFile> one =
      ParseJobYaml("attach: data/\ncommand: [ls]\n", "job.yaml");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_THAT(one->attach, ElementsAre("data/"));
  absl::StatusOr<ParsedJobFile> many = ParseJobYaml(
      "attach:\n  - train.py\n  - data/\ncommand: [ls]\n", "job.yaml");
  ASSERT_TRUE(many.ok()) << many.status();
  EXPECT_THAT(many->attach, ElementsAre("train.py", "data/"));
  EXPECT_THAT(ParseError("attach: {a: b}\ncommand: [ls]\n"),
              HasSubstr("job.yaml:1:9: attach: expected a string or a list"));
}

TEST(JobYamlParse, TimeLimit) {
  EXPECT_EQ(ParseOk("time_limit: 30m\ncommand: [ls]\n").time_limit_s(), 1800);
  EXPECT_EQ(ParseOk("time_limit: 90\ncommand: [ls]\n").time_limit_s(), 90);
  EXPECT_EQ(ParseOk("time_limit: 90s\ncommand: [ls]\n").time_limit_s(), 90);
  EXPECT_EQ(ParseOk("time_limit: 2d\ncommand: [ls]\n").time_limit_s(),
            2 * 86400);
  EXPECT_EQ(ParseOk("command: [ls]\n").time_limit_s(), 0);
  EXPECT_THAT(ParseError("command: [ls]\ntime_limit: soon\n"),
              HasSubstr("job.yaml:2:13: time_limit: 'soon' is not a duration"));
  EXPECT_THAT(ParseError("command: [ls]\ntime_limit: 0\n"),
              HasSubstr("job.yaml:2:13: time_limit: must be more than 0"));
}

// Preemption's per-job keys: unset preemptible means the profile's default.
TEST(JobYamlParse, PreemptibleAndPreemptSignal) {
  v1::JobSpec plain = ParseOk("command: [ls]\n");
  EXPECT_FALSE(plain.has_preemptible());
  EXPECT_EQ(plain.preempt_signal(), "");
  v1::JobSpec set =
      ParseOk("command: [ls]\npreemptible: false\npreempt_signal: USR1\n");
  ASSERT_TRUE(set.has_preemptible());
  EXPECT_FALSE(set.preemptible());
  EXPECT_EQ(set.preempt_signal(), "USR1");
  EXPECT_TRUE(ParseOk("command: [ls]\npreemptible: true\n").preemptible());
  EXPECT_THAT(ParseError("command: [ls]\npreemptible: maybe\n"),
              HasSubstr("job.yaml:2:14: preemptible:"));
  std::string bad = ParseError("command: [ls]\npreempt_signal: KILL\n");
  EXPECT_THAT(bad, HasSubstr("job.yaml:2:17: preempt_signal: 'KILL' is not a "
                             "signal a job may be sent"));
  EXPECT_THAT(bad, HasSubstr("TERM, INT, HUP, USR1"));
  EXPECT_THAT(ParseError(TrainJob("      - {type: fc, units: 10}\n") +
                         "preempt_signal: TERM\n"),
              HasSubstr("preempt_signal: a train job is stopped by the "
                        "trainer's own checkpoint-and-stop"));
}

// launch: how many processes a command job's parts run; the variables it
// sets are the worker's alone when it is given.
TEST(JobYamlParse, Launch) {
  EXPECT_EQ(ParseOk("command: [ls]\n").launch(), "");
  EXPECT_EQ(ParseOk("command: [ls]\nlaunch: per-slot\n").launch(), "per-slot");
  EXPECT_EQ(ParseOk("command: [ls]\nlaunch: per-node\n").launch(), "per-node");
  EXPECT_THAT(ParseError("command: [ls]\nlaunch: all\n"),
              HasSubstr("job.yaml:2:9: launch: 'all' is not a launch mode; "
                        "use per-node (one process per worker), per-slot"));
  EXPECT_THAT(
      ParseError(TrainJob("      - {type: fc, units: 10}\n") +
                 "launch: per-slot\n"),
      HasSubstr("launch: the embedded trainer starts its own ranks; remove"));
  EXPECT_THAT(ParseError("command: [ls]\nlaunch: per-slot\n"
                         "env: {RANK: '3'}\n"),
              HasSubstr("job.yaml:3:7: env.RANK: launch: per-slot sets it for "
                        "each process (as torchrun does); remove it"));
  // Without launch: a job may set them itself, as before.
  EXPECT_EQ(ParseOk("command: [ls]\nenv: {MASTER_ADDR: 127.0.0.1}\n")
                .env()
                .at("MASTER_ADDR"),
            "127.0.0.1");
  EXPECT_THAT(ParseError("command: [ls]\nenv: {DLBATCH_HOSTS: x}\n"),
              HasSubstr("env.DLBATCH_HOSTS: the worker sets it"));
}

// checkpoint: whose $DLBATCH_CHECKPOINT_DIR is stored (command jobs).
TEST(JobYamlParse, Checkpoint) {
  EXPECT_EQ(ParseOk("command: [ls]\n").checkpoint(), "");
  EXPECT_EQ(ParseOk("command: [ls]\npool: 2\nmax_nodes: 2\n"
                    "checkpoint: per-part\n")
                .checkpoint(),
            "per-part");
  EXPECT_THAT(ParseError("command: [ls]\ncheckpoint: per-rank\n"),
              HasSubstr("job.yaml:2:13: checkpoint: 'per-rank' is not a "
                        "checkpoint mode; use per-part (every part stores "
                        "its own $DLBATCH_CHECKPOINT_DIR), or leave it out "
                        "for part 0's to be the job's"));
  EXPECT_THAT(
      ParseError(TrainJob("      - {type: fc, units: 10}\n") +
                 "checkpoint: per-part\n"),
      HasSubstr("checkpoint: the embedded trainer stores rank 0's checkpoint "
                "(its ranks hold the same weights); remove it (it is for "
                "command jobs)"));
  EXPECT_THAT(ParseError("command: [ls]\ncheckpoint: [per-part]\n"),
              HasSubstr("job.yaml:2:13: checkpoint"));
}

TEST(JobYamlErrors, UnknownTopLevelKey) {
  std::string msg = ParseError("name: x\ncommand: [ls]\npoool: 4\n");
  EXPECT_THAT(msg,
              StartsWith("job.yaml:3:1: unknown key 'poool' at top level"));
  EXPECT_THAT(msg, HasSubstr("did you mean 'pool'?"));
  EXPECT_THAT(msg, HasSubstr("allowed keys: name, profile, pool, priority, "
                             "time_limit, preemptible, preempt_signal, "
                             "launch, max_nodes, nodes, attach, env, command, "
                             "train, sweep"));
}

TEST(JobYamlErrors, UnknownKeyUnderOptions) {
  // Line 10 (after TrainJob's 9 lines), indented 4.
  std::string msg = ParseError(
      TrainJob("      - {type: fc, units: 10}\n", "    minibatch: 32\n"));
  EXPECT_THAT(msg, StartsWith("job.yaml:10:5: unknown key 'minibatch' in "
                              "train.options"));
  EXPECT_THAT(msg, HasSubstr("mini_batch_size"));
  EXPECT_THAT(msg, HasSubstr("execution_environment"));
}

TEST(JobYamlErrors, UnknownKeyInFlowLayer) {
  std::string msg =
      ParseError(TrainJob("      - {type: conv, filtres: 20, size: 5}\n"));
  EXPECT_THAT(msg, StartsWith("job.yaml:5:22: unknown key 'filtres' in "
                              "train.network.layers[0] (did you mean "
                              "'filters'?)"));
}

TEST(JobYamlErrors, UnknownKeyInData) {
  std::string msg = ParseError(
      "command: [ls]\n"
      "train:\n"
      "  data:\n"
      "    train: {format: idx, image: a.gz}\n");
  EXPECT_THAT(msg, StartsWith("job.yaml:4:26: unknown key 'image' in "
                              "train.data.train"));
  EXPECT_THAT(msg, HasSubstr("allowed keys: format, images, labels, files"));
}

TEST(JobYamlErrors, MalformedYamlUnclosedBracket) {
  std::string msg = ParseError("name: x\ncommand: [ls, -l\npool: 2\n");
  EXPECT_THAT(msg, testing::MatchesRegex("job\\.yaml:[0-9]+:[0-9]+: "
                                         "malformed YAML: .+"));
  EXPECT_THAT(msg, Not(StartsWith("job.yaml:1:")));  // not on the first line
}

TEST(JobYamlErrors, MalformedYamlBadIndentation) {
  std::string msg = ParseError(
      "train:\n"
      "  network:\n"
      "    input: [1, 1, 1]\n"
      "   layers: []\n");
  EXPECT_THAT(msg, StartsWith("job.yaml:4:"));
  EXPECT_THAT(msg, HasSubstr("malformed YAML"));
}

TEST(JobYamlErrors, WrongTypes) {
  EXPECT_THAT(
      ParseError("command: [ls]\npool: four\n"),
      StartsWith("job.yaml:2:7: pool: expected an integer, got 'four'"));
  EXPECT_THAT(
      ParseError("command: [ls]\npool: [4]\n"),
      StartsWith("job.yaml:2:7: pool: expected an integer, got a list"));
  EXPECT_THAT(ParseError("command: [ls]\npool: 1.5\n"),
              HasSubstr("pool: expected an integer, got '1.5'"));
  EXPECT_THAT(ParseError("command: [ls]\npool: 0x10\n"),
              HasSubstr("pool: expected an integer, got '0x10'"));
  EXPECT_THAT(ParseError("command: [ls]\ntime_limit: [30m]\n"),
              StartsWith("job.yaml:2:13: time_limit: expected a duration"));
  EXPECT_THAT(ParseError("command: [ls]\npool: 99999999999\n"),
              HasSubstr("pool: 99999999999 is out of range"));
  EXPECT_THAT(ParseError("command: {a: b}\n"),
              StartsWith("job.yaml:1:10: command: expected a list"));
  EXPECT_THAT(ParseError(TrainJob("      - {type: fc, units: 10}\n",
                                  "    momentum: high\n")),
              StartsWith("job.yaml:10:15: train.options.momentum: expected a "
                         "number, got 'high'"));
  EXPECT_THAT(
      ParseError(TrainJob("      - {type: fc, units: 10}\n", "    seed: -1\n")),
      HasSubstr("train.options.seed: expected a non-negative integer"));
  EXPECT_THAT(ParseError("train:\n  data:\n    normalize: maybe\n"),
              StartsWith("job.yaml:3:16: train.data.normalize: expected true "
                         "or false"));
  EXPECT_THAT(ParseError("train: [1, 2]\n"),
              StartsWith("job.yaml:1:8: train: expected a mapping"));
  EXPECT_THAT(ParseError("- just\n- a list\n"),
              HasSubstr("job file: expected a mapping"));
  EXPECT_THAT(ParseError("name:\ncommand: [ls]\n"),
              StartsWith("job.yaml:1:1: name: expected a string, got nothing"));
}

TEST(JobYamlErrors, DuplicateKey) {
  EXPECT_THAT(ParseError("pool: 1\ncommand: [ls]\npool: 2\n"),
              StartsWith("job.yaml:3:1: key 'pool' given twice at top level "
                         "(first at job.yaml:1:1)"));
}

TEST(JobYamlErrors, OneDocumentPerFile) {
  EXPECT_THAT(ParseError("command: [ls]\n---\nname: second\n"),
              StartsWith("job.yaml:3:1: a second YAML document starts here"));
}

TEST(JobYamlErrors, EmptyAttachEntry) {
  EXPECT_THAT(ParseError("command: [ls]\nattach: [a, \"\"]\n"),
              StartsWith("job.yaml:2:9: attach: an entry is empty"));
}

TEST(JobYamlErrors, EmptyFile) {
  EXPECT_THAT(ParseError(""), HasSubstr("the job file is empty"));
  EXPECT_THAT(ParseError("# only a comment\n"),
              HasSubstr("the job file is empty"));
}

TEST(JobYamlErrors, EnvValueMustBeGiven) {
  EXPECT_THAT(ParseError("command: [ls]\nenv:\n  FOO:\n"),
              StartsWith("job.yaml:3:3: env.FOO: has no value"));
  EXPECT_THAT(ParseError("command: [ls]\nenv: [A=1]\n"),
              HasSubstr("env: expected a mapping"));
}

TEST(JobYamlErrors, EnvCannotSetWhatTheWorkerSets) {
  EXPECT_THAT(
      ParseError("command: [ls]\nenv:\n  CUDA_VISIBLE_DEVICES: \"3\"\n"),
      AllOf(StartsWith("job.yaml:3:3: env.CUDA_VISIBLE_DEVICES: the "
                       "worker sets it to the GPUs the job is given"),
            HasSubstr("remove it")));
  EXPECT_THAT(ParseError("command: [ls]\nenv: {DLBATCH_OUTPUT_DIR: /tmp}\n"),
              HasSubstr("env.DLBATCH_OUTPUT_DIR: the worker sets it for each "
                        "job; use another name"));
  // Where the worker finds a job's processes without a cgroup, and what a
  // container runtime reads as the GPUs to expose.
  EXPECT_THAT(ParseError("command: [ls]\nenv: {DLBATCH_JOB_MARK: x}\n"),
              HasSubstr("env.DLBATCH_JOB_MARK: the worker sets it"));
  EXPECT_THAT(ParseError("command: [ls]\nenv: {NVIDIA_VISIBLE_DEVICES: all}\n"),
              HasSubstr("env.NVIDIA_VISIBLE_DEVICES: the worker sets it to the "
                        "GPUs the job is given"));
  // The trainer's own switches may be set.
  EXPECT_TRUE(ParseJobYaml("command: [ls]\nenv: {DLBATCH_CUDA_GRAPHS: \"1\"}\n",
                           "job.yaml")
                  .ok());
}

TEST(JobYamlErrors, NegativeAndZeroPool) {
  EXPECT_THAT(ParseError("command: [ls]\npool: -2\n"),
              StartsWith("job.yaml:2:7: pool: -2 is negative"));
  EXPECT_THAT(ParseError("command: [ls]\npool: 0\n"),
              StartsWith("job.yaml:2:7: pool: must be at least 1"));
  EXPECT_THAT(ParseError("command: [ls]\nmax_nodes: -1\n"),
              StartsWith("job.yaml:2:12: max_nodes: -1 is negative"));
}

TEST(JobYamlErrors, NeitherCommandNorTrain) {
  EXPECT_THAT(ParseError("name: nothing-to-do\npool: 1\n"),
              HasSubstr("job has neither `command:` nor `train:`; add one"));
}

TEST(JobYamlErrors, BothCommandAndTrain) {
  std::string msg = ParseError("command: [ls]\n" + TrainJob());
  EXPECT_THAT(msg, StartsWith("job.yaml:3:3: job has both `command:` and "
                              "`train:`; keep one"));
  msg = ParseError(TrainJob() + "command: [ls]\n");
  EXPECT_THAT(msg, StartsWith("job.yaml:11:10: job has both"));
}

TEST(JobYamlErrors, EmptyCommand) {
  EXPECT_THAT(ParseError("command: []\n"),
              StartsWith("job.yaml:1:1: command: is empty"));
}

TEST(JobYamlErrors, UnknownLayerTypeNamesIndexAndLine) {
  std::string msg =
      ParseError(TrainJob("      - {type: conv, filters: 4, size: 3}\n"
                          "      - {type: relu}\n"
                          "      - {type: convolution, filters: 4, size: 3}\n"
                          "      - {type: fc, units: 10}\n"));
  EXPECT_THAT(msg, StartsWith("job.yaml:7:9: train.network.layers[2] "
                              "(convolution): unknown layer type "
                              "'convolution'"));
  EXPECT_THAT(msg, HasSubstr("conv batchnorm relu"));
}

TEST(JobYamlErrors, LayerRules) {
  EXPECT_THAT(ParseError(TrainJob("      - {type: relu}\n"
                                  "      - {type: conv, size: 5}\n")),
              HasSubstr("train.network.layers[1] (conv): filters must be > 0"));
  EXPECT_THAT(ParseError(TrainJob("      - {type: fc}\n")),
              HasSubstr("train.network.layers[0] (fc): units must be > 0"));
  EXPECT_THAT(ParseError(TrainJob("      - {type: maxpool, stride: 2}\n")),
              HasSubstr("layers[0] (maxpool): size must be > 0"));
  EXPECT_THAT(ParseError(TrainJob("      - {type: dropout, probability: 1}\n")),
              HasSubstr("layers[0] (dropout): probability must be in [0, 1)"));
  EXPECT_THAT(ParseError(TrainJob("      - {type: conv, units: 10}\n")),
              HasSubstr("layers[0] (conv): units does not apply to a conv "
                        "layer; remove it"));
  EXPECT_THAT(ParseError(TrainJob("      - {type: conv, filters: 4, size: 3, "
                                  "sync: true}\n")),
              HasSubstr("layers[0] (conv): sync does not apply to a conv "
                        "layer; remove it (only batchnorm layers"));
  EXPECT_THAT(ParseError(TrainJob("      - {type: relu, sync: true}\n")),
              HasSubstr("layers[0] (relu): sync does not apply"));
  EXPECT_THAT(ParseError(TrainJob("      - {type: batchnorm, sync: maybe}\n")),
              HasSubstr("sync"));
  EXPECT_THAT(ParseError(TrainJob("      - {name: x}\n")),
              HasSubstr("layers[0] (no type): add a type"));
  EXPECT_THAT(ParseError(TrainJob("")),
              HasSubstr("train.network.layers: the network has no layers"));
}

TEST(JobYamlErrors, BadOptionValues) {
  std::string msg = ParseError(
      TrainJob("      - {type: fc, units: 10}\n", "    solver: sgd\n"));
  EXPECT_THAT(msg, StartsWith("job.yaml:10:13: train.options.solver: 'sgd' "
                              "is not a solver; use sgdm, adam or rmsprop"));
  EXPECT_THAT(ParseError(TrainJob("      - {type: fc, units: 10}\n",
                                  "    shuffle: always\n")),
              HasSubstr("use never, once or every-epoch"));
  EXPECT_THAT(ParseError(TrainJob("      - {type: fc, units: 10}\n",
                                  "    execution_environment: tpu\n")),
              HasSubstr("use auto, cpu, gpu or multi-gpu"));
  EXPECT_THAT(ParseError(TrainJob("      - {type: fc, units: 10}\n",
                                  "    learn_rate_schedule: linear\n")),
              HasSubstr("use none, piecewise, inv, step or cosine"));
  EXPECT_THAT(ParseError(TrainJob("      - {type: fc, units: 10}\n",
                                  "    mini_batch_size: 0\n")),
              StartsWith("job.yaml:10:22: train.options.mini_batch_size: "
                         "must be > 0"));
  EXPECT_THAT(ParseError(TrainJob("      - {type: fc, units: 10}\n",
                                  "    momentum: 1.5\n")),
              HasSubstr("train.options.momentum: must be in [0, 1)"));
}

TEST(JobYamlErrors, DataRules) {
  EXPECT_THAT(ParseError("train:\n"
                         "  network: {input: [2, 2, 1], layers: [relu]}\n"),
              HasSubstr("train.data.train: missing"));
  EXPECT_THAT(ParseError("train:\n"
                         "  network: {input: [2, 2, 1], layers: [relu]}\n"
                         "  data: {train: {format: csv, images: a}}\n"),
              StartsWith("job.yaml:3:26: train.data.train.format: 'csv' is "
                         "not a data format; use idx, cifar10 or folders"));
  EXPECT_THAT(ParseError("train:\n"
                         "  network: {input: [2, 2, 1], layers: [relu]}\n"
                         "  data: {train: {format: idx, images: a}}\n"),
              HasSubstr("an idx source needs both images: and labels:"));
}

TEST(JobYamlErrors, FoldersRules) {
  const std::string head =
      "train:\n"
      "  network: {input: [2, 2, 1], layers: [relu]}\n"
      "  data:\n";
  EXPECT_THAT(ParseError(head + "    train: {format: folders}\n"),
              HasSubstr("train.data.train: a folders source needs path:"));
  EXPECT_THAT(
      ParseError(head + "    train: {format: folders, path: a, images: b}\n"),
      HasSubstr("a folders source takes path:"));
  EXPECT_THAT(
      ParseError(head + "    train: {format: idx, images: a, labels: b, "
                        "path: c}\n"),
      StartsWith("job.yaml:4:54: train.data.train.path: path: is for "
                 "format: folders"));
  EXPECT_THAT(
      ParseError(head + "    train: {format: idx, images: a, labels: b, "
                        "skip_bad_images: true}\n"),
      HasSubstr("train.data.train.skip_bad_images: is for format: "
                "folders"));
  EXPECT_THAT(ParseError(head + "    train: {format: folders, path: a, "
                                "skip_bad_images: maybe}\n"),
              HasSubstr("train.data.train.skip_bad_images"));
  EXPECT_THAT(ParseError(head + "    train: {format: folders, path: a}\n"
                                "    validation_split: 1.5\n"),
              StartsWith("job.yaml:5:23: train.data.validation_split: 1.5 is "
                         "not a fraction of the training set; give one in "
                         "[0, 1)"));
  EXPECT_THAT(ParseError(head + "    train: {format: folders, path: a}\n"
                                "    validation_split: -0.1\n"),
              HasSubstr("train.data.validation_split: -0.1 is not a fraction"));
  EXPECT_THAT(ParseError(head + "    train: {format: folders, path: a}\n"
                                "    validation_split: ten\n"),
              HasSubstr("train.data.validation_split"));
  EXPECT_THAT(ParseError(head + "    train: {format: folders, path: a}\n"
                                "    validation: {format: folders, path: b}\n"
                                "    validation_split: 0.1\n"),
              HasSubstr("keep either validation: or validation_split:"));
  EXPECT_THAT(ParseError("train:\n"
                         "  network: {input: [2, 2, 4], layers: [relu]}\n"
                         "  data:\n"
                         "    train: {format: folders, path: a}\n"),
              HasSubstr("train.network.input: images from folders have 1 "
                        "channel (grey) or 3 (colour), not 4"));
  EXPECT_THAT(ParseError(head + "    train: {format: folders, pth: a}\n"),
              HasSubstr("unknown key 'pth' in train.data.train (did you mean "
                        "'path'?)"));
}

TEST(JobYamlErrors, NetworkInputRules) {
  EXPECT_THAT(ParseError("train:\n"
                         "  network: {input: [28, 28], layers: [relu]}\n"),
              HasSubstr("train.network.input: needs 3 numbers"));
  EXPECT_THAT(ParseError("train:\n"
                         "  network: {input: [28, 0, 1], layers: [relu]}\n"),
              HasSubstr("must be > 0"));
}

TEST(JobYamlErrors, NoExceptionEscapes) {
  const char* inputs[] = {
      "[",
      "{",
      "}",
      "]",
      "- [",
      "a: [b",
      "a: {b: c",
      ": :",
      "\t- x",
      "a: !!binary x",
      "a: *nope",
      "&a a: *a",
      "? [a]: b\n",
      "pool: 0x10\ncommand: [ls]\n",
      "\"unterminated",
      "a:\n- b\n c: d",
      "command: [ls]\n---\nsecond: doc\n",
      "%YAML 9.9\n---\na: b\n",
      "train:\n  network:\n    layers: [[], {}, 7]\n",
  };
  for (const char* text : inputs) {
    absl::StatusOr<ParsedJobFile> parsed = ParseJobYaml(text, "job.yaml");
    if (!parsed.ok()) {
      EXPECT_THAT(std::string(parsed.status().message()),
                  StartsWith("job.yaml"))
          << "input: " << text;
    }
  }
}

TEST(JobYamlRead, MissingFileIsNotFound) {
  absl::StatusOr<ParsedJobFile> parsed =
      ReadJobFile("/nonexistent/dlbatch/job.yaml");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(parsed.status().message()),
              HasSubstr("/nonexistent/dlbatch/job.yaml"));
}

TEST(ValidateJobSpec, AcceptsAMinimalCommandJob) {
  EXPECT_TRUE(ValidateJobSpec(ValidCommandSpec()).ok());
}

TEST(ValidateJobSpec, RejectsNegativeNumbers) {
  v1::JobSpec spec = ValidCommandSpec();
  spec.set_pool(-1);
  EXPECT_THAT(ValidateMessage(spec), StartsWith("pool: -1 is negative"));
  spec = ValidCommandSpec();
  spec.set_time_limit_s(-5);
  EXPECT_THAT(ValidateMessage(spec), StartsWith("time_limit: -5s is negative"));
  spec = ValidCommandSpec();
  spec.set_max_nodes(-1);
  EXPECT_THAT(ValidateMessage(spec), StartsWith("max_nodes: -1 is negative"));
}

TEST(ValidateJobSpec, PoolZeroMeansNotGiven) {
  v1::JobSpec spec = ValidCommandSpec();
  spec.set_pool(0);
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
}

TEST(ValidateJobSpec, AttachmentPathsStayInside) {
  v1::JobSpec spec = ValidCommandSpec();
  spec.add_attach()->set_path("data/train.gz");
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
  spec.add_attach()->set_path("/etc/passwd");
  EXPECT_THAT(ValidateMessage(spec),
              StartsWith("attach[1]: '/etc/passwd' must be relative"));
  spec.mutable_attach(1)->set_path("data/../../x");
  EXPECT_THAT(ValidateMessage(spec), HasSubstr("remove the '..'"));
  spec.mutable_attach(1)->set_path("");
  EXPECT_THAT(ValidateMessage(spec), HasSubstr("attach[1]: path is empty"));
}

TEST(ValidateJobSpec, CommandAndEnvRules) {
  v1::JobSpec spec;
  spec.mutable_command();
  EXPECT_THAT(ValidateMessage(spec), StartsWith("command: is empty"));
  spec.mutable_command()->add_argv("");
  EXPECT_THAT(ValidateMessage(spec), StartsWith("command[0]:"));
  spec = ValidCommandSpec();
  (*spec.mutable_env())["A=B"] = "1";
  EXPECT_THAT(ValidateMessage(spec), HasSubstr("cannot contain '='"));
}

TEST(ValidateJobSpec, NeitherProgram) {
  EXPECT_THAT(ValidateMessage(v1::JobSpec()),
              StartsWith("job has neither `command:` nor `train:`; add one"));
}

TEST(ValidateJobSpec, TrainWithoutNetwork) {
  v1::JobSpec spec;
  spec.mutable_train();
  EXPECT_THAT(ValidateMessage(spec), StartsWith("train.network: missing"));
}

}  // namespace
}  // namespace dlbatch
