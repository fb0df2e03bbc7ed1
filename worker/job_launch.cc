#include "worker/job_launch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/files.h"
#include "common/status.h"
#include "worker/devices.h"
#include "worker/train_job.h"

namespace dlbatch::worker {

absl::StatusOr<SubprocessOptions> PrepareJob(const v1::StartJob& start,
                                             const std::string& dir,
                                             const LaunchContext& context,
                                             BlobTransfers* transfers,
                                             std::vector<std::string>* notes) {
  const v1::JobSpec& spec = start.spec();
  const std::string out_dir = dir + "/output";
  RETURN_IF_ERROR(RemoveTree(dir));
  RETURN_IF_ERROR(MakeDirs(out_dir, 0755));
  for (const auto& a : spec.attach()) {
    RETURN_IF_ERROR(Annotate(
        transfers->Fetch(a.sha256(), a.size(), dir + "/" + a.path(), a.mode()),
        absl::StrCat("fetching attachment '", a.path(), "'")));
  }
  SubprocessOptions sp;
  if (spec.has_train()) {
    // A requeued attempt continues from the checkpoint an earlier one stored.
    for (const auto& f : start.checkpoint()) {
      RETURN_IF_ERROR(Annotate(
          transfers->Fetch(f.sha256(), f.size(), out_dir + "/" + f.path(),
                           0644),
          absl::StrCat("fetching the stored checkpoint's '", f.path(), "'")));
    }
    TrainLaunch launch;
    launch.trainer = context.trainer;
    launch.job_dir = dir;
    launch.output_dir = out_dir;
    launch.rendezvous = context.rendezvous;
    // Ranks of a one-worker job talk over loopback.
    launch.host = start.parts() > 1 ? context.host : "127.0.0.1";
    launch.resume = start.checkpoint_size() > 0;
    RETURN_IF_ERROR(PrepareTrainCommand(start, launch, &sp));
    if (launch.resume) {
      notes->push_back(
          absl::StrCat("resuming from the stored checkpoint at iteration ",
                       start.checkpoint_iteration()));
    }
  } else {
    sp.argv.assign(spec.command().argv().begin(), spec.command().argv().end());
    sp.cwd = dir;
  }
  std::string visible;
  if (context.gpus) {
    absl::StatusOr<std::string> v =
        ChildVisibleDevices(start.devices(), context.visible_devices);
    if (!v.ok()) return v.status();
    visible = *std::move(v);
  }
  sp.env.insert(
      sp.env.begin(),
      {
          {"DLBATCH_JOB_ID", absl::StrCat(start.job_id())},
          {"DLBATCH_ATTEMPT", absl::StrCat(start.attempt())},
          {"DLBATCH_POOL", absl::StrCat(start.pool())},
          {"DLBATCH_PART", absl::StrCat(start.part())},
          {"DLBATCH_PARTS", absl::StrCat(std::max(1, start.parts()))},
          {"DLBATCH_DEVICES", absl::StrJoin(start.devices(), ",")},
          {"DLBATCH_OUTPUT_DIR", out_dir},
          // Exactly the job's GPUs (named as the worker's own
          // CUDA_VISIBLE_DEVICES names them); none on a worker of CPU slots.
          {"CUDA_VISIBLE_DEVICES", visible},
      });
  if (!context.gpus)
    sp.env.emplace_back("OMP_NUM_THREADS", absl::StrCat(start.devices_size()));
  for (const auto& [k, v] : spec.env()) sp.env.emplace_back(k, v);
  return sp;
}

}  // namespace dlbatch::worker
