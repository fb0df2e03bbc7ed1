// Where a train job reads its data, checked before the job is queued. A
// job runs in a fresh working folder that holds its attachments and nothing
// else, so a relative data path is read from there and must name one of the
// job's attached files (a folders source: a folder holding some); an
// absolute path is read on the worker itself (a shared filesystem), which
// only a client on a machine that mounts it can look for.
#ifndef DLBATCH_PROTO_DATA_PATHS_H_
#define DLBATCH_PROTO_DATA_PATHS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "dlbatch/v1/job.pb.h"

namespace dlbatch {

// One path a data source names.
struct DataPath {
  std::string field;    // dotted: "train.data.validation.files[1]"
  std::string path;     // as written
  bool folder = false;  // a folders source's path; else a file
};

// Every path the train job's data sources name (train, validation, test:
// images, labels, files, path), in that order. Empty ones are left out
// (ValidateJobSpec refuses those).
std::vector<DataPath> DataPaths(const v1::TrainSpec& train);

// Checks each relative data path against the job's files: `attached` holds
// their paths in the working folder ('/'-separated, as Attachment.path),
// `attach_written` the entries that laid them out, as the user wrote them
// (for messages). InvalidArgument, beginning with the field's dotted path
// (so that LocateInJobFile can point at its line) and saying what to
// attach or which attached file was perhaps meant, where a file path names
// no attached file (or an attached folder), a folders path names no folder
// of attached files (or names a file), or a path climbs out of the working
// folder (".."). Absolute paths are not looked at.
absl::Status CheckDataAttached(const v1::TrainSpec& train,
                               absl::Span<const std::string> attached,
                               absl::Span<const std::string> attach_written);

}  // namespace dlbatch

#endif  // DLBATCH_PROTO_DATA_PATHS_H_
