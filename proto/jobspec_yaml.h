// The YAML form of JobSpec (job.yaml), parsed in this one place.
//
// Every key is checked: an unknown key is an error naming it and where it
// is, with the keys allowed there. Malformed YAML reports line and column.
// Messages read "job.yaml:12:5: ..." so editors can jump to them.
#ifndef DLBATCH_PROTO_JOBSPEC_YAML_H_
#define DLBATCH_PROTO_JOBSPEC_YAML_H_

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dlbatch/v1/job.pb.h"

namespace dlbatch {

// A job file parsed: the spec, plus the attach entries as written (local
// paths, relative to the job file's folder unless absolute) that the client
// still has to upload and turn into Attachment messages.
struct ParsedJobFile {
  v1::JobSpec spec;                 // spec.attach is left empty
  std::vector<std::string> attach;  // as written in `attach:`
  // For LocateInJobFile: the source_name, and where each field was written
  // ("train.data.train.images" -> "job.yaml:14:30").
  std::string source;
  std::map<std::string, std::string> where;
};

// `source_name` is used in messages (normally the file's path).
absl::StatusOr<ParsedJobFile> ParseJobYaml(std::string_view text,
                                           const std::string& source_name);
absl::StatusOr<ParsedJobFile> ReadJobFile(const std::string& path);

// `status`, whose message begins with the dotted path of the field it
// concerns (as ValidateJobSpec's do: "train.data.train.images: ..."), with
// the place that field (or the nearest one above it) was written put in
// front, as the parser's own errors are: "job.yaml:14:30: train.data...".
// A check made after parsing (the client's, of the data files) points at
// the line as the parser would have.
absl::Status LocateInJobFile(const ParsedJobFile& parsed,
                             const absl::Status& status);

// Checks what the schema alone can check: exactly one of command/train, a
// non-empty argv, pool >= 1 where given, known layer types and option
// values, network input of three positive numbers, a network whose layers
// fit its input (InferNetworkShapes: proto/network_shapes.h). Called by the
// parser and again by the scheduler on every submitted spec.
absl::Status ValidateJobSpec(const v1::JobSpec& spec);

// Sets the train.options key `option` from `value`, the text of a YAML
// scalar, through the same code that reads `train.options:` (so a sweep's
// `mini_batch_size: [64]` sets exactly what `mini_batch_size: 64` would).
// `path` begins the messages ("sweep.mini_batch_size[0]: expected ...").
absl::Status ApplyTrainingOption(absl::string_view option,
                                 const std::string& value,
                                 const std::string& path,
                                 v1::TrainingOptions* options);

}  // namespace dlbatch

#endif  // DLBATCH_PROTO_JOBSPEC_YAML_H_
