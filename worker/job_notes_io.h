// Files the worker writes into a job's folder, which is the job's own (its
// processes, or another job of the same user, may have put links there):
// every open is from a directory descriptor down, with O_NOFOLLOW, and
// creates the file afresh (O_EXCL), so nothing of the worker's powers
// reaches a file the job chose.
#ifndef DLBATCH_WORKER_JOB_NOTES_IO_H_
#define DLBATCH_WORKER_JOB_NOTES_IO_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "trainer/output/history.h"

namespace dlbatch::worker {

// Creates `path` (in the job's folder) holding `why` and a newline; one
// already there (an earlier request, or the job's own) is left as it is.
absl::Status WriteStopFile(const std::string& path, const std::string& why);

// Adds a command job's reported history to `output_dir`
// (training_history.csv, training_progress.svg) where the job did not
// write files of those names itself.
absl::Status WriteHistoryFiles(const std::string& output_dir,
                               const trainer::TrainingHistory& history,
                               const std::string& title);

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_JOB_NOTES_IO_H_
