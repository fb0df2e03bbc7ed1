// The communicator of a job with one rank: every collective is the identity.
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "trainer/comm/communicator.h"

namespace dlbatch::trainer {
namespace {

class SoloCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::Status AllreduceSum(float* /*data*/, int64_t count) override {
    return CheckCount(count);
  }
  absl::Status Broadcast(float* /*data*/, int64_t count, int root) override {
    if (root != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("broadcast root ", root, " is not a rank of 1"));
    }
    return CheckCount(count);
  }
  absl::Status Barrier() override { return absl::OkStatus(); }

 private:
  static absl::Status CheckCount(int64_t count) {
    if (count < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("collective over a negative count ", count));
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Communicator> MakeSoloCommunicator() {
  return std::make_unique<SoloCommunicator>();
}

}  // namespace dlbatch::trainer
