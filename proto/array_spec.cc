// ParseArraySpec and ExpandArray: every check an array needs happens here,
// so the client (which parses job.yaml and --array) and the scheduler
// (which sees specs from any client) refuse the same arrays with the same
// messages.
#include "proto/array_spec.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace dlbatch {
namespace {

constexpr absl::string_view kArrayHowTo =
    "write indexes (7), ranges (0-99) or ranges with a step (0-15:4), "
    "separated by commas, and %N to run at most N at once (0-99%10)";

// Past this many indexes named (repeats included), the exact number of jobs
// is not worked out: the array is refused as too large at once.
constexpr int64_t kMaxArrayIndexesNamed = 1'000'000;

absl::Status ArrayInvalid(absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("array: ", problem));
}

enum class ArrayNumber { kOk, kNotOne, kTooLarge };

// A whole number written in decimal digits alone (no sign, no spaces).
ArrayNumber ParseArrayNumber(absl::string_view text, int64_t* out) {
  if (text.empty()) return ArrayNumber::kNotOne;
  int64_t n = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return ArrayNumber::kNotOne;
    n = n * 10 + (c - '0');
    if (n > kMaxArrayIndex) return ArrayNumber::kTooLarge;
  }
  *out = n;
  return ArrayNumber::kOk;
}

struct ArrayEntry {
  int64_t first = 0;
  int64_t last = 0;
  int64_t step = 1;
  int64_t count() const { return (last - first) / step + 1; }
};

absl::Status NotAnArrayEntry(absl::string_view entry) {
  return ArrayInvalid(
      absl::StrCat("'", entry, "' is not an index or a range; ", kArrayHowTo));
}

absl::StatusOr<int64_t> ArrayIndexOf(absl::string_view entry,
                                     absl::string_view text) {
  int64_t n = 0;
  switch (ParseArrayNumber(text, &n)) {
    case ArrayNumber::kOk:
      return n;
    case ArrayNumber::kTooLarge:
      return ArrayInvalid(absl::StrCat("'", entry, "': ", text,
                                       " is too large; indexes go from 0 to ",
                                       kMaxArrayIndex));
    case ArrayNumber::kNotOne:
      break;
  }
  return NotAnArrayEntry(entry);
}

absl::StatusOr<ArrayEntry> ParseArrayEntry(absl::string_view entry) {
  if (entry.empty()) {
    return ArrayInvalid(
        "an entry between commas is empty; remove the extra comma");
  }
  ArrayEntry e;
  absl::string_view range = entry;
  if (size_t colon = entry.find(':'); colon != absl::string_view::npos) {
    range = entry.substr(0, colon);
    absl::string_view step = entry.substr(colon + 1);
    int64_t s = 1;
    if (ParseArrayNumber(step, &s) == ArrayNumber::kNotOne)
      return NotAnArrayEntry(entry);
    if (s == 0) {
      return ArrayInvalid(
          absl::StrCat("'", entry,
                       "' has step 0; a step is 1 or more, as in "
                       "0-15:4 (0, 4, 8, 12)"));
    }
    // A step too large to parse passes every index: the range's first.
    e.step =
        ParseArrayNumber(step, &s) == ArrayNumber::kOk ? s : kMaxArrayIndex + 1;
    if (range.find('-') == absl::string_view::npos) {
      return ArrayInvalid(absl::StrCat("'", entry,
                                       "' has a step but no range; write the "
                                       "range it steps through, like 0-15:4"));
    }
  }
  const size_t dash = range.find('-');
  if (dash == absl::string_view::npos) {
    absl::StatusOr<int64_t> n = ArrayIndexOf(entry, range);
    if (!n.ok()) return n.status();
    e.first = e.last = *n;
    return e;
  }
  absl::StatusOr<int64_t> first = ArrayIndexOf(entry, range.substr(0, dash));
  if (!first.ok()) return first.status();
  absl::StatusOr<int64_t> last = ArrayIndexOf(entry, range.substr(dash + 1));
  if (!last.ok()) return last.status();
  if (*last < *first) {
    return ArrayInvalid(
        absl::StrCat("'", entry,
                     "' ends before it starts; write the smaller "
                     "index first (",
                     *last, "-", *first, ")"));
  }
  e.first = *first;
  e.last = *last;
  return e;
}

}  // namespace

absl::StatusOr<ArraySpec> ParseArraySpec(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  if (text.empty())
    return ArrayInvalid(absl::StrCat("is empty; ", kArrayHowTo));
  if (text.size() > kMaxArrayTextLength) {
    return ArrayInvalid(absl::StrCat(
        "is ", text.size(), " characters long; at most ", kMaxArrayTextLength,
        " (use ranges, like 0-999, instead of lists)"));
  }
  ArraySpec out;
  absl::string_view body = text;
  if (size_t pct = text.find('%'); pct != absl::string_view::npos) {
    body = text.substr(0, pct);
    absl::string_view limit = text.substr(pct + 1);
    int64_t n = 0;
    switch (ParseArrayNumber(limit, &n)) {
      case ArrayNumber::kNotOne:
        return ArrayInvalid(absl::StrCat("'%", limit,
                                         "' is not a limit; write %N, a whole "
                                         "number, to run at most N of the "
                                         "array's jobs at once (0-99%10)"));
      case ArrayNumber::kTooLarge:
        n = kMaxArrayJobs;  // no array has more jobs: no limit at all
        break;
      case ArrayNumber::kOk:
        break;
    }
    if (n == 0) {
      return ArrayInvalid(
          "%0 would run none of its jobs; use %1 or more, or leave out the "
          "% to run as many at once as there are slots");
    }
    if (body.empty()) {
      return ArrayInvalid(absl::StrCat("'", text,
                                       "' names no indexes before the %; write "
                                       "them first, like 0-9",
                                       text.substr(pct)));
    }
    out.limit = static_cast<int32_t>(std::min(n, kMaxArrayJobs));
  }
  std::vector<ArrayEntry> entries;
  int64_t named = 0;
  for (absl::string_view piece : absl::StrSplit(body, ',')) {
    absl::StatusOr<ArrayEntry> e = ParseArrayEntry(piece);
    if (!e.ok()) return e.status();
    named += e->count();
    if (named > kMaxArrayIndexesNamed) {
      return ArrayInvalid(
          absl::StrCat("'", text, "' names more than ", kMaxArrayIndexesNamed,
                       " indexes; an array makes at most ", kMaxArrayJobs,
                       " jobs; use fewer indexes, or split it "
                       "into several arrays"));
    }
    entries.push_back(*e);
  }
  out.indexes.reserve(static_cast<size_t>(named));
  for (const ArrayEntry& e : entries) {
    for (int64_t i = e.first; i <= e.last; i += e.step)
      out.indexes.push_back(i);
  }
  std::sort(out.indexes.begin(), out.indexes.end());
  out.indexes.erase(std::unique(out.indexes.begin(), out.indexes.end()),
                    out.indexes.end());
  if (static_cast<int64_t>(out.indexes.size()) > kMaxArrayJobs) {
    return ArrayInvalid(absl::StrCat("'", text, "' makes ", out.indexes.size(),
                                     " jobs; an array makes at most ",
                                     kMaxArrayJobs,
                                     "; use fewer indexes, or split it into "
                                     "several arrays"));
  }
  return out;
}

std::string ArrayJobName(const std::string& base, int64_t index) {
  return absl::StrCat(base, "[", index, "]");
}

void SetJobArrayFields(const v1::JobSpec& spec, v1::Job* job) {
  job->set_array_id(spec.array_task().id());
  job->set_array_index(spec.array_task().index());
  job->set_array_limit(spec.array_task().limit());
}

absl::StatusOr<std::vector<v1::JobSpec>> ExpandArray(const v1::JobSpec& spec) {
  if (spec.has_array_task()) {
    return absl::InvalidArgumentError(
        "array_task: is set by the scheduler for each job of an array; "
        "remove it and give the indexes in `array:` (or submit --array)");
  }
  if (spec.array().empty()) return std::vector<v1::JobSpec>{spec};
  absl::StatusOr<ArraySpec> array = ParseArraySpec(spec.array());
  if (!array.ok()) return array.status();
  v1::JobSpec base = spec;
  base.clear_array();
  std::vector<v1::JobSpec> jobs;
  jobs.reserve(array->indexes.size());
  for (int64_t index : array->indexes) {
    v1::JobSpec& job = jobs.emplace_back(base);
    v1::ArrayTask* task = job.mutable_array_task();
    task->set_index(index);
    task->set_limit(array->limit);
    task->set_count(static_cast<int32_t>(array->indexes.size()));
    job.set_name(ArrayJobName(spec.name(), index));
  }
  return jobs;
}

}  // namespace dlbatch
