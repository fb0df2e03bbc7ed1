#include "worker/train_job.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status.h"

namespace dlbatch::worker {

absl::Status PrepareTrainCommand(const v1::StartJob& start,
                                 const TrainLaunch& launch,
                                 SubprocessOptions* sp) {
  const std::string spec_path =
      absl::StrCat(launch.job_dir, "/", kTrainSpecFile);
  RETURN_IF_ERROR(WriteFileAtomic(spec_path, start.spec().SerializeAsString()));
  const int ranks = std::max(1, start.devices_size());
  const int world = std::max(ranks, start.pool());
  sp->argv = {launch.trainer, spec_path, "--spec-binary", "--output-dir",
              launch.output_dir, "--progress", "fd:3", "--ranks",
              absl::StrCat(ranks), "--first-rank",
              absl::StrCat(start.first_rank()), "--world", absl::StrCat(world),
              // A CPU slot is a core: one thread per rank.
              "--threads", "1", "--host", launch.host};
  if (launch.resume) sp->argv.push_back("--resume");
  sp->cwd = launch.job_dir;
  sp->channel = true;
  if (world > 1) {
    sp->env.emplace_back("DLBATCH_RENDEZVOUS", launch.rendezvous);
    sp->env.emplace_back("DLBATCH_RENDEZVOUS_SECRET",
                         start.rendezvous_secret());
  }
  return absl::OkStatus();
}

ChannelEvent ApplyChannelLine(const std::string& line, int64_t now_ms,
                              v1::TrainProgress* p) {
  ChannelEvent event;
  nlohmann::json j =
      nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("event") || !j["event"].is_string())
    return event;
  auto num = [&](const char* key, double fallback) {
    auto it = j.find(key);
    return it != j.end() && it->is_number() ? it->get<double>() : fallback;
  };
  const std::string what = j["event"].get<std::string>();
  if (what == "start") {
    p->set_iteration(static_cast<int64_t>(num("iteration", 0)));
    p->set_iterations(static_cast<int64_t>(num("iterations", 0)));
    event.kind = ChannelEvent::kProgress;
  } else if (what == "progress") {
    p->set_iteration(static_cast<int64_t>(num("iteration", p->iteration())));
    p->set_iterations(static_cast<int64_t>(num("iterations", p->iterations())));
    p->set_epoch(static_cast<int32_t>(num("epoch", p->epoch())));
    p->set_epochs(static_cast<int32_t>(num("epochs", p->epochs())));
    p->set_loss(num("loss", p->loss()));
    p->set_accuracy(num("accuracy", p->accuracy()));
    p->set_learn_rate(num("learn_rate", p->learn_rate()));
    p->set_images_per_s(num("images_per_s", p->images_per_s()));
    p->set_elapsed_s(num("elapsed_s", p->elapsed_s()));
    p->set_eta_s(num("eta_s", p->eta_s()));
    event.kind = ChannelEvent::kProgress;
  } else if (what == "validation") {
    p->set_has_validation(true);
    p->set_validation_loss(num("loss", 0));
    p->set_validation_accuracy(num("accuracy", 0));
    event.kind = ChannelEvent::kProgress;
  } else if (what == "checkpoint") {
    event.kind = ChannelEvent::kCheckpoint;
    event.iteration = static_cast<int64_t>(num("iteration", 0));
  } else if (what == "done") {
    p->set_done(true);
    p->set_eta_s(0);
    p->set_iteration(static_cast<int64_t>(num("iteration", p->iteration())));
    p->set_images_per_s(num("images_per_s", p->images_per_s()));
    if (j.contains("validation_accuracy")) {
      p->set_has_validation(true);
      p->set_validation_accuracy(num("validation_accuracy", 0));
    }
    event.kind = ChannelEvent::kProgress;
  } else {
    return event;
  }
  p->set_time_ms(now_ms);
  return event;
}

}  // namespace dlbatch::worker
