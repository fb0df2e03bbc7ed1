// Gloo ranks as threads of one test process (dlbatch-train runs them as
// processes), for the tests of what several ranks compute together.
#ifndef DLBATCH_TESTS_TRAINER_THREAD_RANKS_H_
#define DLBATCH_TESTS_TRAINER_THREAD_RANKS_H_

#include <stdlib.h>

#include <dnnl.hpp>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/files.h"
#include "gtest/gtest.h"
#include "trainer/comm/communicator.h"

namespace dlbatch::trainer::testing {

// Runs body(rank, rendezvous) on `size` threads that meet in a fresh
// folder rendezvous; returns each rank's Status: its rendezvous's failure,
// else body's.
inline std::vector<absl::Status> RunRendezvousRanks(
    int size, const std::function<absl::Status(int, Rendezvous*)>& body) {
  std::string dir = ::testing::TempDir() + "/thread_ranks_XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) {
    return std::vector<absl::Status>(
        size, absl::InternalError("cannot make a rendezvous folder"));
  }
  std::vector<absl::Status> statuses(size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      auto rdv = OpenFileRendezvous(dir);
      statuses[rank] = rdv.ok() ? body(rank, rdv->get()) : rdv.status();
    });
  }
  for (std::thread& t : threads) t.join();
  RemoveTree(dir).IgnoreError();
  return statuses;
}

// Runs body(rank, communicator) on `size` threads, Gloo ranks over
// loopback that meet in a fresh folder; returns each rank's Status: its
// rendezvous's or connection's failure, else body's.
//
// oneDNN's primitive cache is turned off for the process: oneDNN 2.6
// crashes now and then when two threads execute the one cached
// convolution primitive both asked for, so each thread gets its own.
inline std::vector<absl::Status> RunThreadRanks(
    int size, const std::function<absl::Status(int, Communicator*)>& body) {
  dnnl::set_primitive_cache_capacity(0);
  return RunRendezvousRanks(size, [&](int rank, Rendezvous* rdv) {
    auto comm =
        MakeGlooCommunicator(rdv, rank, size, "127.0.0.1", absl::Seconds(30));
    return comm.ok() ? body(rank, comm->get()) : comm.status();
  });
}

}  // namespace dlbatch::trainer::testing

#endif  // DLBATCH_TESTS_TRAINER_THREAD_RANKS_H_
