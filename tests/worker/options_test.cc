// dlbatch-worker's settings from its command line, a configuration file and
// a fake environment: defaults, each source, their precedence, and the
// messages bad values give (those dlbatch-worker prints).
#include "worker/options.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dlbatch::worker {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

EnvLookup Env(std::map<std::string, std::string> vars = {}) {
  auto shared =
      std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [shared](const char* name) -> const char* {
    auto it = shared->find(name);
    return it == shared->end() ? nullptr : it->second.c_str();
  };
}

const ConfigSetting* Setting(const WorkerFlags& f, const std::string& key) {
  for (const auto& s : f.settings) {
    if (s.key == key) return &s;
  }
  return nullptr;
}

class OptionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dlbatch-options-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    // The default configuration file of these tests: none unless written.
    default_config_ = dir_ + "/worker.yaml";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  absl::StatusOr<WorkerFlags> Parse(std::vector<std::string> args,
                                    const EnvLookup& env = Env()) {
    args.insert(args.begin(), "dlbatch-worker");
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    out_.str("");
    err_.str("");
    return ParseWorkerFlags(static_cast<int>(argv.size()), argv.data(), env,
                            default_config_, out_, err_);
  }
  // Parses and resolves; the parse must succeed.
  absl::StatusOr<DaemonOptions> Resolve(std::vector<std::string> args,
                                        const EnvLookup& env = Env()) {
    absl::StatusOr<WorkerFlags> f = Parse(std::move(args), env);
    EXPECT_TRUE(f.ok()) << f.status();
    if (!f.ok()) return f.status();
    EXPECT_FALSE(f->exit_code.has_value()) << err_.str();
    return ResolveWorkerOptions(*std::move(f), env);
  }

  std::string dir_;
  std::string default_config_;
  std::ostringstream out_;
  std::ostringstream err_;
};

TEST_F(OptionsTest, Defaults) {
  absl::StatusOr<WorkerFlags> f = Parse({"--work-dir", "/w"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_FALSE(f->exit_code.has_value());
  EXPECT_EQ(f->work_dir, "/w");
  EXPECT_EQ(f->scheduler, "");
  EXPECT_EQ(f->profile, "local");
  EXPECT_EQ(f->log_format, "text");
  EXPECT_EQ(f->cpu_slots, 0);
  EXPECT_FALSE(f->no_gpus);
  EXPECT_FALSE(f->no_cgroups);
  EXPECT_FALSE(f->keep_job_dirs);
  EXPECT_TRUE(f->job_env.empty());
  EXPECT_EQ(f->slurm_job, 0);
  EXPECT_EQ(f->config_path, "");  // the default file is missing: none read
  const ConfigSetting* profile = Setting(*f, "profile");
  ASSERT_NE(profile, nullptr);
  EXPECT_EQ(profile->source, ConfigSource::kDefault);
  EXPECT_TRUE(out_.str().empty());
  EXPECT_TRUE(err_.str().empty());
}

TEST_F(OptionsTest, TheDefaultConfigurationFileIsRead) {
  Write("worker.yaml",
        "scheduler: unix:/run/s.sock\nprofile: gpus\ncpu_slots: 3\n"
        "no_cgroups: true\njob_env: [LD_LIBRARY_PATH, NCCL_SOCKET_IFNAME]\n"
        "work_dir: /from/file\n");
  absl::StatusOr<WorkerFlags> f = Parse({});
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_FALSE(f->exit_code.has_value()) << err_.str();
  EXPECT_EQ(f->config_path, default_config_);
  EXPECT_EQ(f->scheduler, "unix:/run/s.sock");
  EXPECT_EQ(f->profile, "gpus");
  EXPECT_EQ(f->cpu_slots, 3);
  EXPECT_TRUE(f->no_cgroups);
  EXPECT_EQ(f->work_dir, "/from/file");  // --work-dir is required no more
  EXPECT_EQ(f->job_env, (std::vector<std::string>{"LD_LIBRARY_PATH",
                                                  "NCCL_SOCKET_IFNAME"}));
  const ConfigSetting* profile = Setting(*f, "profile");
  ASSERT_NE(profile, nullptr);
  EXPECT_EQ(profile->source, ConfigSource::kFile);
  EXPECT_EQ(profile->origin, "file " + default_config_ + ":2");
}

TEST_F(OptionsTest, ConfigNamesAnotherFileAndAnEmptyOneReadsNone) {
  Write("worker.yaml", "profile: default-file\n");
  const std::string other = Write("other.yaml", "profile: other-file\n");
  absl::StatusOr<WorkerFlags> f =
      Parse({"--work-dir", "/w", "--config", other});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->profile, "other-file");
  EXPECT_EQ(f->config_path, other);
  f = Parse({"--work-dir", "/w", "--config", ""});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->profile, "local");
  EXPECT_EQ(f->config_path, "");
}

// flag > environment > file > default.
TEST_F(OptionsTest, FlagsBeatTheEnvironmentWhichBeatsTheFile) {
  Write("worker.yaml",
        "scheduler: unix:/file.sock\nprofile: file\n"
        "ca_file: /file/ca.pem\n");
  const EnvLookup env =
      Env({{"DLBATCH_SCHEDULER", "unix:/env.sock"}, {"DLBATCH_CA", "/env/ca"}});
  absl::StatusOr<WorkerFlags> f = Parse({"--work-dir", "/w"}, env);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->scheduler, "unix:/env.sock");
  EXPECT_EQ(f->profile, "file");
  // The environment's CA is read where the CA is resolved; the file's is
  // kept out.
  EXPECT_EQ(f->ca_file, "");
  ASSERT_NE(Setting(*f, "scheduler"), nullptr);
  EXPECT_EQ(Setting(*f, "scheduler")->origin, "env DLBATCH_SCHEDULER");

  f = Parse({"--work-dir", "/w", "--scheduler", "unix:/flag.sock", "--profile",
             "flag"},
            env);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->scheduler, "unix:/flag.sock");
  EXPECT_EQ(f->profile, "flag");
  EXPECT_EQ(Setting(*f, "profile")->origin, "flag --profile");
}

TEST_F(OptionsTest, HelpAndVersionAnswerAndExitZero) {
  absl::StatusOr<WorkerFlags> f = Parse({"--help"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->exit_code, 0);
  EXPECT_THAT(out_.str(), HasSubstr("dlbatch-worker: runs the jobs"));
  EXPECT_THAT(out_.str(), HasSubstr("--work-dir"));
  EXPECT_THAT(out_.str(), HasSubstr(default_config_));
  EXPECT_THAT(out_.str(), Not(HasSubstr("--report-version")));
  EXPECT_TRUE(err_.str().empty());

  // A broken configuration file does not keep --version from answering.
  Write("worker.yaml", "profile: [\n");
  f = Parse({"--version"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->exit_code, 0);
  EXPECT_THAT(out_.str(), HasSubstr("dlbatch-worker "));
}

TEST_F(OptionsTest, UsageErrorsExitTwoSayingWhat) {
  absl::StatusOr<WorkerFlags> f = Parse({});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->exit_code, 2);
  EXPECT_EQ(err_.str(),
            "--work-dir is required\nRun with --help for more information.\n");
  f = Parse({"--work-dir", "/w", "--cpu-slots", "0"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->exit_code, 2);
  EXPECT_THAT(err_.str(), HasSubstr("--cpu-slots: Value 0 not in range"));
  f = Parse({"--work-dir", "/w", "--bogus"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->exit_code, 2);
  EXPECT_THAT(err_.str(), HasSubstr("--bogus"));
}

TEST_F(OptionsTest, BadFileValuesNameTheFileLineAndKey) {
  const std::string bad = Write("bad.yaml",
                                "scheduler: unix:/x\n"
                                "cpu_slots: many\n");
  absl::StatusOr<WorkerFlags> f = Parse({"--work-dir", "/w", "--config", bad});
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().message(),
            bad + ":2: key 'cpu_slots': expected an integer, got 'many'");

  const std::string typo = Write("typo.yaml", "schedular: unix:/x\n");
  f = Parse({"--work-dir", "/w", "--config", typo});
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(),
              HasSubstr(typo + ":1: unknown key 'schedular' (did you mean "
                               "'scheduler'?)"));

  // What only the batch scripts and tests set is not a key of the file.
  const std::string slurm = Write("slurm.yaml", "slurm_job: 5\n");
  f = Parse({"--work-dir", "/w", "--config", slurm});
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(),
              HasSubstr(slurm + ":1: unknown key 'slurm_job'"));

  f = Parse({"--work-dir", "/w", "--config", dir_ + "/missing.yaml"});
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().message(),
            "cannot read configuration file " + dir_ +
                "/missing.yaml: No such file or directory; name an existing "
                "file with --config");
}

TEST_F(OptionsTest, AUnixSchedulerNeedsNoTokenNorCa) {
  absl::StatusOr<DaemonOptions> o =
      Resolve({"--work-dir", "/w", "--scheduler", "unix:/run/s.sock"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->channel.endpoint.is_unix);
  EXPECT_EQ(o->channel.endpoint.path, "/run/s.sock");
  EXPECT_EQ(o->channel.token, "");
  EXPECT_EQ(o->channel.ca_pem, "");
  EXPECT_EQ(o->work_dir, "/w");
  EXPECT_FALSE(o->slurm.has_value());
  EXPECT_EQ(o->flags.scheduler, "unix:/run/s.sock");
}

TEST_F(OptionsTest, TheTokenComesFromItsFileElseTheEnvironment) {
  const std::string token = Write("token", "from-file\n");
  absl::StatusOr<DaemonOptions> o = Resolve(
      {"--work-dir", "/w", "--scheduler", "unix:/s", "--token-file", token},
      Env({{"DLBATCH_TOKEN", "from-env"}}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->channel.token, "from-file");
  o = Resolve({"--work-dir", "/w", "--scheduler", "unix:/s"},
              Env({{"DLBATCH_TOKEN", "from-env"}}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->channel.token, "from-env");
}

TEST_F(OptionsTest, BadSchedulerSettingsSayWhatToPass) {
  absl::StatusOr<DaemonOptions> o = Resolve({"--work-dir", "/w"});
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().message(),
            "no scheduler given; pass --scheduler unix:PATH or HOST:PORT, set "
            "DLBATCH_SCHEDULER, or write scheduler: in "
            "/etc/dlbatch/worker.yaml (or the file of --config)");

  o = Resolve({"--work-dir", "/w", "--scheduler", "bad::addr"});
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().message(),
            "address 'bad::addr' has no valid port (0-65535) after the last "
            "':'");

  o = Resolve({"--work-dir", "/w", "--scheduler", "127.0.0.1:7"});
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().message(),
            "a TCP scheduler (127.0.0.1:7) needs its token: pass --token-file "
            "STATE_DIR/token or set DLBATCH_TOKEN");

  o = Resolve({"--work-dir", "/w", "--scheduler", "127.0.0.1:7", "--token-file",
               dir_ + "/none"});
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().message(), "reading the token file: open " + dir_ +
                                      "/none: No such file or directory");
}

TEST_F(OptionsTest, ATcpSchedulerNeedsACaFromTheFlagOrTheEnvironment) {
  const EnvLookup token = Env({{"DLBATCH_TOKEN", "t"}});
  absl::StatusOr<DaemonOptions> o =
      Resolve({"--work-dir", "/w", "--scheduler", "127.0.0.1:7"}, token);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().message(),
            "the scheduler at 127.0.0.1:7 speaks TLS: pass --ca-file FILE or "
            "set DLBATCH_CA (the CA it printed at start: its "
            "STATE_DIR/ca.pem, or the CA of its --tls-cert)");

  const std::string junk = Write("junk.pem", "not a certificate\n");
  o = Resolve(
      {"--work-dir", "/w", "--scheduler", "127.0.0.1:7", "--ca-file", junk},
      token);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().message(),
            "the CA file " + junk +
                " (--ca-file) holds no PEM certificate; pass the scheduler's "
                "STATE_DIR/ca.pem (or the CA of its --tls-cert)");

  // The environment given is the one read, not the process's.
  o = Resolve({"--work-dir", "/w", "--scheduler", "127.0.0.1:7"},
              Env({{"DLBATCH_TOKEN", "t"}, {"DLBATCH_CA", dir_ + "/no.pem"}}));
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().message(), "cannot read the CA file " + dir_ +
                                      "/no.pem (DLBATCH_CA): open " + dir_ +
                                      "/no.pem: No such file or directory");
}

TEST_F(OptionsTest, ASlurmJobsWorkerReadsSrunsEnvironment) {
  absl::StatusOr<DaemonOptions> o =
      Resolve({"--work-dir", "/w", "--scheduler", "unix:/s", "--slurm-job", "5",
               "--attempt", "1"});
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().message(),
            "SLURM_JOB_ID is not set: --slurm-job is for the workers a dlbatch "
            "batch script starts with srun, not for starting by hand");
  o = Resolve({"--work-dir", "/w", "--scheduler", "unix:/s", "--attempt", "1"});
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().message(),
            "--slurm-job and --attempt must both be positive");

  const EnvLookup srun = Env({{"SLURM_JOB_ID", "900"},
                              {"SLURM_NODEID", "1"},
                              {"SLURM_JOB_NUM_NODES", "2"},
                              {"SLURMD_NODENAME", "n2"},
                              {"DLBATCH_TOKEN", "t"},
                              {"DLBATCH_CA_PEM", "the scheduler's CA"}});
  o = Resolve({"--work-dir", "/w", "--scheduler", "127.0.0.1:7", "--slurm-job",
               "5", "--attempt", "1"},
              srun);
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_TRUE(o->slurm.has_value());
  EXPECT_EQ(o->slurm->job.job_id(), 5);
  EXPECT_EQ(o->slurm->job.slurm_job_id(), 900);
  EXPECT_EQ(o->work_dir, SlurmWorkDir(*o->slurm, "/w"));
  EXPECT_NE(o->work_dir, "/w");
  // The batch script's CA, without a CA file.
  EXPECT_EQ(o->channel.ca_pem, "the scheduler's CA");
  EXPECT_EQ(o->channel.token, "t");
}

}  // namespace
}  // namespace dlbatch::worker
