#include "worker/train_job.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status.h"
#include "common/tls_client.h"
#include "google/protobuf/util/json_util.h"

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
  // CPU slots: the ranks as threads of one process, which read the data
  // once and sum without sockets (trainer/thread_ranks.h); Gloo only
  // between the workers' processes.
  if (!launch.gpus) sp->argv.push_back("--thread-ranks");
  if (launch.resume) sp->argv.push_back("--resume");
  if (launch.stop_on_term) sp->argv.push_back("--stop-on-term");
  sp->cwd = launch.job_dir;
  sp->channel = true;
  if (world > 1) {
    sp->env.emplace_back("DLBATCH_RENDEZVOUS", launch.rendezvous);
    sp->env.emplace_back("DLBATCH_RENDEZVOUS_SECRET",
                         start.rendezvous_secret());
    if (!launch.rendezvous_ca.empty()) {
      sp->env.emplace_back(kRendezvousCaEnv, launch.rendezvous_ca);
    }
  }
  return absl::OkStatus();
}

ChannelEvent ApplyChannelLine(const std::string& line, int64_t now_ms,
                              v1::TrainProgress* progress) {
  ChannelEvent event;
  v1::TrainProgress read;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  if (!google::protobuf::util::JsonStringToMessage(line, &read, options).ok())
    return event;
  if (read.checkpoint_iteration() > 0 &&
      read.checkpoint_iteration() != progress->checkpoint_iteration()) {
    event.kind = ChannelEvent::kCheckpoint;
    event.iteration = read.checkpoint_iteration();
  } else {
    event.kind = ChannelEvent::kProgress;
  }
  *progress = std::move(read);
  progress->set_time_ms(now_ms);
  return event;
}

}  // namespace dlbatch::worker
