#include "scheduler/store/job_rows.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace dlbatch::scheduler {

absl::StatusOr<JobRecord> ReadJobRow(const Statement& row, bool with_spec) {
  JobRecord job;
  job.id = row.Int(0);
  job.request_id = row.Text(1);
  job.user = row.Text(2);
  if (with_spec) {
    absl::string_view blob = row.Blob(3);
    if (!job.spec.ParseFromArray(blob.data(), static_cast<int>(blob.size()))) {
      return absl::DataLossError(
          absl::StrCat("job ", job.id, ": stored spec is corrupt"));
    }
  } else {
    job.spec.set_name(row.Text(12));
    job.spec.set_profile(row.Text(13));
    job.spec.set_pool(static_cast<int>(row.Int(14)));
    job.spec.set_priority(static_cast<int>(row.Int(15)));
  }
  job.state = static_cast<v1::JobState>(row.Int(4));
  job.attempt = static_cast<int>(row.Int(5));
  job.submit_ms = row.Int(6);
  job.start_ms = row.Int(7);
  job.end_ms = row.Int(8);
  job.parts = DecodeParts(row.Text(9));
  job.exit_code = static_cast<int>(row.Int(10));
  job.reason = row.Text(11);
  job.sweep_id = row.Int(16);
  return job;
}

absl::StatusOr<TrainState> ReadTrainState(Database* db, int64_t job_id) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db->Prepare(
          "SELECT progress, checkpoint FROM train_state WHERE job_id=?"));
  st->Bind(1, job_id);
  TrainState state;
  absl::StatusOr<bool> row = st->Step();
  if (row.ok() && *row) {
    absl::string_view p = st->Blob(0), c = st->Blob(1);
    if (!state.progress.ParseFromArray(p.data(), static_cast<int>(p.size())) ||
        !state.checkpoint.ParseFromArray(c.data(),
                                         static_cast<int>(c.size()))) {
      st->Reset();
      return absl::DataLossError(
          absl::StrCat("job ", job_id, ": stored progress is corrupt"));
    }
  }
  st->Reset();
  if (!row.ok()) return row.status();
  return state;
}

absl::StatusOr<std::vector<v1::CheckpointStored>> ReadKeptCheckpoints(
    Database* db, int64_t job_id) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db->Prepare("SELECT record FROM job_checkpoints WHERE job_id=? "
                  "ORDER BY part, iteration"));
  st->Bind(1, job_id);
  std::vector<v1::CheckpointStored> out;
  bool corrupt = false;
  RETURN_IF_ERROR(st->ForEachRow([&] {
    absl::string_view r = st->Blob(0);
    v1::CheckpointStored c;
    if (!c.ParseFromArray(r.data(), static_cast<int>(r.size()))) {
      corrupt = true;
      return;
    }
    out.push_back(std::move(c));
  }));
  if (corrupt) {
    return absl::DataLossError(
        absl::StrCat("job ", job_id, ": a stored checkpoint is corrupt"));
  }
  return out;
}

absl::StatusOr<std::vector<v1::Preemption>> ReadPreemptions(Database* db,
                                                            int64_t job_id) {
  ASSIGN_OR_RETURN(Statement * st,
                   db->Prepare("SELECT record FROM preemptions WHERE job_id=? "
                               "ORDER BY seq"));
  st->Bind(1, job_id);
  std::vector<v1::Preemption> out;
  bool corrupt = false;
  RETURN_IF_ERROR(st->ForEachRow([&] {
    absl::string_view r = st->Blob(0);
    v1::Preemption p;
    if (!p.ParseFromArray(r.data(), static_cast<int>(r.size()))) {
      corrupt = true;
      return;
    }
    out.push_back(std::move(p));
  }));
  if (corrupt) {
    return absl::DataLossError(
        absl::StrCat("job ", job_id, ": a stored preemption is corrupt"));
  }
  return out;
}

absl::StatusOr<std::map<std::pair<std::string, v1::JobState>, int64_t>>
CountJobsOn(Database* db) {
  ASSIGN_OR_RETURN(
      Statement * st,
      db->Prepare("SELECT profile, state, COUNT(*) FROM jobs GROUP BY 1, 2"));
  std::map<std::pair<std::string, v1::JobState>, int64_t> counts;
  RETURN_IF_ERROR(st->ForEachRow([&] {
    counts[{st->Text(0), static_cast<v1::JobState>(st->Int(1))}] = st->Int(2);
  }));
  return counts;
}

}  // namespace dlbatch::scheduler
