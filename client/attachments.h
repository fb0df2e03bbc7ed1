// What a job file's `attach:` entries name on this machine, expanded into
// the files to send. The user's own files, but read with care: a symlink
// (the README links a data set's files into a folder) is followed to the
// file or folder it names and sent under the link's name; a FIFO, socket or
// device is refused by its path before anything is opened, so submit never
// waits on one.
#ifndef DLBATCH_CLIENT_ATTACHMENTS_H_
#define DLBATCH_CLIENT_ATTACHMENTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dlbatch::client {

struct LocalFile {
  std::string source;  // on this machine
  std::string path;    // in the job's working folder
};

// Expands `attach` (as written; relative to the job file's folder) into
// regular files. Errors name the entry and the path at fault: not found, a
// dangling symlink, a FIFO/socket/device, a folder that contains itself
// through a symlink, an unreadable folder.
absl::StatusOr<std::vector<LocalFile>> ResolveAttachments(
    const std::vector<std::string>& attach, const std::string& job_file);

}  // namespace dlbatch::client

#endif  // DLBATCH_CLIENT_ATTACHMENTS_H_
