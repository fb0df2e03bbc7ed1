#include "scheduler/kept_checkpoints.h"

#include <algorithm>
#include <string>

#include "absl/container/flat_hash_set.h"

namespace dlbatch::scheduler {

bool PerPartCheckpoints(const v1::JobSpec& spec) {
  return spec.checkpoint() == "per-part";
}

int ResumeParts(const v1::JobSpec& spec, int parts) {
  return PerPartCheckpoints(spec) ? parts : 1;
}

std::vector<CheckpointKey> KeysOf(
    const std::vector<v1::CheckpointStored>& kept) {
  std::vector<CheckpointKey> keys;
  keys.reserve(kept.size());
  for (const auto& c : kept) keys.push_back({c.part(), c.iteration()});
  return keys;
}

const v1::CheckpointStored* FindKept(
    const std::vector<v1::CheckpointStored>& kept, int part,
    std::optional<int64_t> step) {
  if (!step) return nullptr;
  for (const auto& c : kept) {
    if (c.part() == part && c.iteration() == *step) return &c;
  }
  return nullptr;
}

void PutKept(std::vector<v1::CheckpointStored>* kept,
             const v1::CheckpointStored& checkpoint) {
  EraseKept(kept, {checkpoint.part(), checkpoint.iteration()});
  auto at = std::find_if(kept->begin(), kept->end(),
                         [&](const v1::CheckpointStored& c) {
                           return c.part() != checkpoint.part()
                                      ? c.part() > checkpoint.part()
                                      : c.iteration() > checkpoint.iteration();
                         });
  kept->insert(at, checkpoint);
}

void EraseKept(std::vector<v1::CheckpointStored>* kept, CheckpointKey key) {
  std::erase_if(*kept, [&](const v1::CheckpointStored& c) {
    return c.part() == key.part && c.iteration() == key.step;
  });
}

std::optional<int64_t> NewestOfPart(
    const std::vector<v1::CheckpointStored>& kept, int part) {
  std::optional<int64_t> newest;
  for (const auto& c : kept) {
    if (c.part() == part && (!newest || c.iteration() > *newest))
      newest = c.iteration();
  }
  return newest;
}

int64_t KeptBytes(const std::vector<v1::CheckpointStored>& kept) {
  absl::flat_hash_set<std::string> counted;
  int64_t total = 0;
  for (const auto& c : kept) {
    for (const auto& f : c.files()) {
      if (f.symlink().empty() && counted.insert(f.sha256()).second)
        total += f.size();
    }
  }
  return total;
}

bool SameCheckpoint(const v1::CheckpointStored& a,
                    const v1::CheckpointStored& b) {
  if (a.files_size() == 0 && b.files_size() == 0) return true;
  return a.SerializeAsString() == b.SerializeAsString();
}

void SetKeptCheckpoints(const std::vector<v1::CheckpointStored>& kept,
                        const v1::CheckpointStored& resume, v1::Job* job) {
  job->clear_checkpoints();
  for (const auto& c : kept) {
    v1::KeptCheckpoint* k = job->add_checkpoints();
    k->set_part(c.part());
    k->set_iteration(c.iteration());
    k->set_attempt(c.attempt());
    *k->mutable_files() = c.files();
    k->set_resume(resume.files_size() > 0 &&
                  c.iteration() == resume.iteration());
  }
}

}  // namespace dlbatch::scheduler
