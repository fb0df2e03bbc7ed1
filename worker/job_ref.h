// Names one part of one attempt of a job, as the scheduler and the worker
// speak of it on the worker stream.
#ifndef DLBATCH_WORKER_JOB_REF_H_
#define DLBATCH_WORKER_JOB_REF_H_

#include <cstdint>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace dlbatch::worker {

struct JobRef {
  int64_t job_id = 0;
  int attempt = 0;
  int part = 0;

  // From any message with job_id(), attempt() and part().
  template <typename M>
  static JobRef Of(const M& m) {
    return JobRef{m.job_id(), m.attempt(), m.part()};
  }
  // Fills a message's job_id, attempt and part.
  template <typename M>
  void To(M* m) const {
    m->set_job_id(job_id);
    m->set_attempt(attempt);
    m->set_part(part);
  }
  std::string ToString() const {
    return absl::StrCat("job ", job_id, " (attempt ", attempt, ", part ", part,
                        ")");
  }
  friend bool operator<(const JobRef& a, const JobRef& b) {
    return std::tie(a.job_id, a.attempt, a.part) <
           std::tie(b.job_id, b.attempt, b.part);
  }
  friend bool operator==(const JobRef& a, const JobRef& b) {
    return !(a < b) && !(b < a);
  }
};

}  // namespace dlbatch::worker

#endif  // DLBATCH_WORKER_JOB_REF_H_
