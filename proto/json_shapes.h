// `--json` of every read command: plain JSON values, the same in every
// command, with shapes kept stable (README "JSON output" documents each).
//
// The rules every shape follows:
//   - ids and counts are JSON numbers (64-bit ones too), never strings;
//   - a job state is the lower-case name the CLI accepts ("finished");
//   - a point in time is an RFC 3339 string in UTC with milliseconds
//     ("2026-11-25T11:22:33.456Z"), or null when it has not happened; its
//     key drops the "_ms" of the protobuf field (submit_time_ms ->
//     submit_time). Durations stay numbers and keep their unit in the key
//     (time_limit_s, half_life_ms);
//   - every key of a shape is always present: zero values are written
//     (0, "", false, [], {}), never left out.
//
// A command builds a Json value with the mappers below (or by hand, with
// JsonTime and JsonState for its times and states) and prints it with
// PrintJson. Nothing here throws: text that is not UTF-8 is written with
// U+FFFD in place of each bad byte.
#ifndef DLBATCH_PROTO_JSON_SHAPES_H_
#define DLBATCH_PROTO_JSON_SHAPES_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "dlbatch/v1/job.pb.h"
#include "dlbatch/v1/scheduler.pb.h"
#include "google/protobuf/message.h"

namespace dlbatch {

// Keys keep the order they are added in, so output reads like the shape
// documented in the README.
using Json = nlohmann::ordered_json;

// RFC 3339 in UTC with milliseconds; null for ms <= 0 (not happened yet).
Json JsonTime(int64_t ms);
// The lower-case state name (JobStateName): "queued", "finished", ...
Json JsonState(v1::JobState state);

// The shapes (README "JSON output").
// A job as `show` has it: everything the scheduler returned.
Json JobJson(const v1::Job& job);
// One line of `diary --json`: n (its number in the job's diary, from 1),
// time, stream, attempt, seq, text (valid UTF-8; each bad byte U+FFFD),
// text_base64 (the exact bytes) and ending ("\n", "\r\n" or "": what
// followed them in the job's output).
Json DiaryLineJson(const v1::DiaryLine& line);
// The bytes that ended `line` in the job's output: "\n", "\r\n" or "".
const char* DiaryLineEnding(const v1::DiaryLine& line);
Json WorkerJson(const v1::WorkerInfo& worker);
Json ProfileJson(const v1::ProfileInfo& profile);
Json OutputFileJson(const v1::OutputFile& file);
Json CredentialJson(const v1::Credential& credential);
Json UserLimitJson(const v1::UserLimitEntry& limit);
Json UsageJson(const v1::GetUsageReply& usage);

// A protobuf message as plain JSON by its descriptor, for nested settings
// that have no shape of their own here (a train job's network, data and
// options): proto field names, every field present (an unset optional is
// null), 64-bit integers as numbers, enums by name, bytes as base64.
Json ProtoJson(const google::protobuf::Message& message);

// Indented JSON and a newline on stdout (`compact`: one line, for JSON
// Lines output such as `diary --json`).
void PrintJson(const Json& value, bool compact = false);
// The text PrintJson writes, without the newline.
std::string JsonText(const Json& value, bool compact = false);

}  // namespace dlbatch

#endif  // DLBATCH_PROTO_JSON_SHAPES_H_
