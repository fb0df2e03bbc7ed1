#include "trainer/comm/grad_buckets.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dlbatch::trainer {
namespace {

// Adds [first, end) to `runs` (first -> end, disjoint), merging it with the
// runs it touches; returns the merged run.
std::pair<int64_t, int64_t> Merge(std::map<int64_t, int64_t>* runs,
                                  int64_t first, int64_t end) {
  auto next = runs->lower_bound(first);
  if (next != runs->begin()) {
    auto before = std::prev(next);
    if (before->second >= first) {
      first = before->first;
      end = std::max(end, before->second);
      runs->erase(before);
    }
  }
  while (next != runs->end() && next->first <= end) {
    end = std::max(end, next->second);
    next = runs->erase(next);
  }
  runs->emplace(first, end);
  return {first, end};
}

// Whether [first, end) shares an element with a run of `runs`.
bool Overlaps(const std::map<int64_t, int64_t>& runs, int64_t first,
              int64_t end) {
  auto next = runs.upper_bound(first);
  if (next != runs.end() && next->first < end) return true;
  return next != runs.begin() && std::prev(next)->second > first;
}

}  // namespace

int64_t DefaultBucketFloats(bool on_gpu) {
  return (on_gpu ? kGpuBucketBytes : kCpuBucketBytes) /
         static_cast<int64_t>(sizeof(float));
}

GradientBuckets::GradientBuckets(Communicator* comm, float* grads,
                                 int64_t count, int64_t bucket_floats)
    : comm_(comm),
      grads_(grads),
      count_(count),
      bucket_floats_(std::max<int64_t>(bucket_floats, 1)) {}

GradientBuckets::~GradientBuckets() {
  // The step already failed (or its caller returned early); its error was
  // or will be reported from where it happened.
  if (waiting_) comm_->WaitAll().IgnoreError();
}

void GradientBuckets::NewStepIfFinished() {
  if (!finished_) return;
  finished_ = false;
  started_.clear();
}

void GradientBuckets::Ready(int64_t first, int64_t count) {
  NewStepIfFinished();
  if (count == 0) return;
  const int64_t end = first + count;
  if (count < 0 || first < 0 || end > count_) {
    Fail(absl::InternalError(
        absl::StrCat("gradient buckets: range [", first, ", ", end,
                     ") reported final lies outside the ", count_,
                     " gradients; the network's ranges are wrong")));
    return;
  }
  if (Overlaps(reported_, first, end)) {
    Fail(absl::InternalError(absl::StrCat(
        "gradient buckets: range [", first, ", ", end,
        ") was reported final twice in one step; the network's ranges are "
        "wrong")));
    return;
  }
  Merge(&reported_, first, end);
  const auto [run_first, run_end] = Merge(&pending_, first, end);
  if (run_end - run_first >= bucket_floats_) {
    pending_.erase(run_first);
    Start(run_first, run_end - run_first);
  }
}

absl::Status GradientBuckets::Finish() {
  NewStepIfFinished();
  // Elements never reported are summed too, so that a step is right
  // whatever its caller reported.
  int64_t covered = 0;
  for (const auto& [first, end] : reported_) {
    if (first > covered) Merge(&pending_, covered, first);
    covered = end;
  }
  if (covered < count_) Merge(&pending_, covered, count_);
  // Highest first, as backward finishes them.
  for (auto run = pending_.rbegin(); run != pending_.rend(); ++run) {
    Start(run->first, run->second - run->first);
  }
  if (waiting_) {
    waiting_ = false;
    if (absl::Status waited = comm_->WaitAll(); !waited.ok()) {
      Fail(std::move(waited));
    }
  }
  absl::Status status = std::move(status_);
  status_ = absl::OkStatus();
  comm_failed_ = false;
  pending_.clear();
  reported_.clear();
  finished_ = true;
  return status;
}

void GradientBuckets::Start(int64_t first, int64_t count) {
  // After a failure the communicator refuses every collective (or waits out
  // its timeout on a dead peer): start nothing more.
  if (comm_failed_) return;
  started_.emplace_back(first, count);
  waiting_ = true;
  absl::Status status = comm_->StartAllreduceSum(grads_ + first, count);
  if (!status.ok()) {
    comm_failed_ = true;
    Fail(std::move(status));
  }
}

void GradientBuckets::Fail(absl::Status status) {
  if (status_.ok()) status_ = std::move(status);
}

}  // namespace dlbatch::trainer
