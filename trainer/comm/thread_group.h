// Ranks as threads of one process: their communicators and rendezvous over
// shared memory, without Gloo's sockets. dlbatch-train runs a CPU job's
// mini-batch this way, split over its threads, and a CPU job's ranks on one
// machine (trainer/thread_ranks.h).
//
// A group may be one process's share of a run over several (Span): its
// ranks are then ranks first..first+size-1 of the run, and a communicator
// between the processes (Gloo, one rank per process) carries every
// collective between them: the threads sum their buffers in shared memory,
// the group's first thread runs the collective between the processes on
// that sum, and every thread takes the result. So each element is summed
// in rank order within each process, then by the processes' allreduce,
// which gives every process the same bits (a bit-identical algorithm,
// communicator_gloo.h): all replicas stay alike.
//
// Every collective is a meeting of all the group's ranks: each publishes
// its buffers and meets the others at a barrier, then sums (or copies) its
// share of the elements across every rank's buffers, and meets them again.
// Started allreduces (StartAllreduceSum) wait for WaitAll or the next
// collective, and are all summed in one such meeting.
// A sum adds the ranks' values in rank order, so that every run computes
// the same bits. A rank that waits spins briefly (the ranks of a balanced
// step arrive within microseconds of each other), then sleeps.
//
// Faults: a rank that fails calls Abort, which ends every collective and
// rendezvous wait of the others with its status; a wait longer than the
// group's timeout aborts the group too, naming what it waited for, so that
// a rank that stopped coming is reported instead of waited on for ever.
//
// Thread safety: each communicator belongs to its rank's thread (as any
// Communicator); the rendezvous and Abort may be used from any thread.
#ifndef DLBATCH_TRAINER_COMM_THREAD_GROUP_H_
#define DLBATCH_TRAINER_COMM_THREAD_GROUP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "trainer/comm/communicator.h"

namespace dlbatch::trainer {

class ThreadGroup {
 public:
  // One process's place in a run over several processes.
  struct Span {
    // The processes' communicator: rank i is process i, this one's rank
    // is this process's index. Used by the group's rank 0 only, between
    // its meetings. Not owned; outlives the group.
    Communicator* between = nullptr;
    // Process i's first rank, ascending from 0; this process's is its
    // group's rank 0. The run's ranks in all: `world`.
    std::vector<int> first_ranks;
    int world = 0;
    // The processes' store (the run's rendezvous): the group's rendezvous
    // sets its keys there too and reads them from there, so that ranks of
    // other processes see them. Not owned; safe to use from several
    // threads at once (as the file and scheduler stores are).
    Rendezvous* store = nullptr;
  };

  // `size` ranks (at least 1); a wait for the others ends the group after
  // `timeout`. `splits_batch`: what the communicators' splits_batch()
  // says: true for the threads that split one rank's mini-batch (batch
  // norms then span them), false for ranks of a pool that train as
  // processes would.
  ThreadGroup(int size, absl::Duration timeout, bool splits_batch = true);
  // This process's `size` ranks of the run `span` describes (its
  // first_ranks hold this process's first rank; the next process's, or
  // world, is size more).
  ThreadGroup(int size, absl::Duration timeout, bool splits_batch, Span span);
  ~ThreadGroup();
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;

  int size() const { return size_; }
  // Rank `rank`'s communicator (owned by the group).
  Communicator* communicator(int rank);
  // The store the ranks share (owned by the group).
  Rendezvous* rendezvous();
  // Ends every wait of every rank, now and later, with `why` (the first
  // status given is kept).
  void Abort(const absl::Status& why);
  // The status the group was aborted with; OK while it is not.
  absl::Status aborted() const;

 private:
  class Member;
  class Store;
  friend class Member;
  friend class Store;

  // Waits until every rank has arrived at this barrier (`what` names the
  // collective for a timeout's message).
  absl::Status Meet(const char* what);
  // For rank 0 between meetings: runs `collective` on span_.between; a
  // failure aborts the group (its other ranks wait in a meeting).
  absl::Status Between(
      const std::function<absl::Status(Communicator*)>& collective);
  bool spans_processes() const { return span_.between != nullptr; }
  // The process of the run's rank `rank`.
  int ProcessOf(int rank) const;

  const int size_;
  const absl::Duration timeout_;
  const bool splits_batch_;
  const Span span_;
  const int first_rank_;  // of this process's ranks, in the run
  const int world_;       // the run's ranks
  // Spanning processes: the threads' sums of an allreduce, one range after
  // another, which rank 0 allreduces between the processes. Sized by rank 0
  // before the meeting that publishes the buffers.
  std::vector<float> staging_;
  std::vector<std::unique_ptr<Member>> members_;
  std::unique_ptr<Store> store_;

  // The barrier: ranks arrived at the current one, and how many have
  // completed; Meet spins on generation_, then sleeps on mu_.
  std::atomic<int> arrived_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> aborting_{false};
  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  absl::Status abort_status_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> keys_ ABSL_GUARDED_BY(mu_);

  // What each rank publishes for the collective under way: its buffers,
  // their elements in all, and the root of a broadcast.
  struct Range {
    float* data;
    int64_t count;
  };
  struct Slot {
    const std::vector<Range>* ranges = nullptr;
    int64_t count = 0;
    int root = 0;
  };
  std::vector<Slot> slots_;
};

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_COMM_THREAD_GROUP_H_
