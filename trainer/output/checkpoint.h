// The trainer's checkpoint file (checkpoint.dlbc): everything a run needs
// to continue exactly where it stopped, on any backend.
//
// Format, little-endian:
//   "DLBCKPT\0"                 8-byte magic
//   u32 version                 kCheckpointVersion
//   u32 header_bytes, header    JSON: counters, options fingerprint, sizes
//   f32[params] f32[state] f32[solver_state]
//   32 bytes                    sha256 of everything before it
// Arrays use the network's layouts (network.h), so a checkpoint written on
// one backend resumes on another. Written atomically (temp, fsync, rename).
#ifndef DLBATCH_TRAINER_OUTPUT_CHECKPOINT_H_
#define DLBATCH_TRAINER_OUTPUT_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/data/data.h"

namespace dlbatch::trainer {

inline constexpr uint32_t kCheckpointVersion = 1;

struct Checkpoint {
  // sha256 of the serialized NetworkSpec: a checkpoint resumes only the
  // network it was written for.
  std::string network_fingerprint;
  std::string solver;           // sgdm | adam | rmsprop
  int64_t iteration = 0;        // iterations completed
  int64_t epoch = 1;            // the epoch to continue (1-based)
  int64_t epoch_iteration = 0;  // iterations of that epoch completed
  int64_t mini_batch_size = 0;
  uint64_t seed = 0;
  double elapsed_s = 0;
  double best_validation_loss = 0;  // +inf when none yet
  int64_t validations_without_improvement = 0;
  Normalization normalization;
  std::string tuning;  // Backend::SaveTuning of the run that wrote it
  // Dynamic loss scaling (LossScaler::State) of a run that scaled its loss
  // (precision: fp16); loss_scale 0 where the run did not. A run resumed
  // with scaling continues the scale; one without ignores it.
  double loss_scale = 0;
  int64_t loss_scale_clean_steps = 0;
  int64_t skipped_steps = 0;
  std::vector<float> params;
  std::vector<float> state;
  std::vector<float> solver_state;
};

std::string EncodeCheckpoint(const Checkpoint& checkpoint);
// `source` names the file in messages. Errors: not a checkpoint (magic),
// a newer version, truncated, or a checksum mismatch (a damaged file).
absl::StatusOr<Checkpoint> DecodeCheckpoint(const std::string& bytes,
                                            const std::string& source);

absl::Status WriteCheckpoint(const std::string& path,
                             const Checkpoint& checkpoint);
absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path);

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_OUTPUT_CHECKPOINT_H_
