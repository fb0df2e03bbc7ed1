#include "trainer/output/checkpoint.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/files.h"

namespace dlbatch::trainer {
namespace {

constexpr char kMagic[8] = {'D', 'L', 'B', 'C', 'K', 'P', 'T', '\0'};
constexpr size_t kDigestBytes = 32;

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= uint32_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return v;
}

void PutFloats(std::string* out, const std::vector<float>& v) {
  out->append(reinterpret_cast<const char*>(v.data()),
              v.size() * sizeof(float));
}

std::string DigestBytes(absl::string_view data) {
  std::string hex = Sha256Hex(data);
  std::string raw(kDigestBytes, '\0');
  for (size_t i = 0; i < kDigestBytes; ++i) {
    raw[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  return raw;
}

absl::Status Damaged(const std::string& source, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(
      source, ": not a usable dlbatch checkpoint: ", what,
      "; resume from another checkpoint or start without --resume"));
}

}  // namespace

std::string EncodeCheckpoint(const Checkpoint& c) {
  nlohmann::json header = {
      {"network_fingerprint", c.network_fingerprint},
      {"solver", c.solver},
      {"iteration", c.iteration},
      {"epoch", c.epoch},
      {"epoch_iteration", c.epoch_iteration},
      {"mini_batch_size", c.mini_batch_size},
      {"seed", c.seed},
      {"elapsed_s", c.elapsed_s},
      {"best_validation_loss", std::isfinite(c.best_validation_loss)
                                   ? nlohmann::json(c.best_validation_loss)
                                   : nlohmann::json(nullptr)},
      {"validations_without_improvement", c.validations_without_improvement},
      {"normalization_mean", c.normalization.mean},
      {"normalization_std", c.normalization.std},
      {"tuning", c.tuning},
      {"params", c.params.size()},
      {"state", c.state.size()},
      {"solver_state", c.solver_state.size()},
  };
  if (c.loss_scale > 0) {
    header["loss_scale"] = c.loss_scale;
    header["loss_scale_clean_steps"] = c.loss_scale_clean_steps;
    header["skipped_steps"] = c.skipped_steps;
  }
  const std::string text = header.dump();
  std::string out(kMagic, sizeof(kMagic));
  PutU32(&out, kCheckpointVersion);
  PutU32(&out, static_cast<uint32_t>(text.size()));
  out += text;
  PutFloats(&out, c.params);
  PutFloats(&out, c.state);
  PutFloats(&out, c.solver_state);
  out += DigestBytes(out);
  return out;
}

absl::StatusOr<Checkpoint> DecodeCheckpoint(const std::string& bytes,
                                            const std::string& source) {
  if (bytes.size() < sizeof(kMagic) + 8 + kDigestBytes ||
      std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return Damaged(source, "it does not start with the checkpoint magic");
  }
  const uint32_t version = GetU32(bytes.data() + 8);
  if (version != kCheckpointVersion) {
    return Damaged(source, absl::StrCat("format version ", version,
                                        "; this dlbatch-train reads version ",
                                        kCheckpointVersion));
  }
  const size_t body = bytes.size() - kDigestBytes;
  if (DigestBytes(absl::string_view(bytes).substr(0, body)) !=
      bytes.substr(body)) {
    return Damaged(source,
                   "its checksum does not match (truncated or damaged)");
  }
  const uint32_t header_bytes = GetU32(bytes.data() + 12);
  const size_t data_start = 16 + size_t{header_bytes};
  if (data_start > body) return Damaged(source, "its header is truncated");
  nlohmann::json h = nlohmann::json::parse(bytes.substr(16, header_bytes),
                                           nullptr, /*allow_exceptions=*/false);
  if (h.is_discarded() || !h.is_object()) {
    return Damaged(source, "its header is not valid JSON");
  }
  Checkpoint c;
  size_t np = 0, ns = 0, nss = 0;
  try {
    c.network_fingerprint = h.at("network_fingerprint").get<std::string>();
    c.solver = h.at("solver").get<std::string>();
    c.iteration = h.at("iteration").get<int64_t>();
    c.epoch = h.at("epoch").get<int64_t>();
    c.epoch_iteration = h.at("epoch_iteration").get<int64_t>();
    c.mini_batch_size = h.at("mini_batch_size").get<int64_t>();
    c.seed = h.at("seed").get<uint64_t>();
    c.elapsed_s = h.at("elapsed_s").get<double>();
    const auto& best = h.at("best_validation_loss");
    c.best_validation_loss = best.is_null()
                                 ? std::numeric_limits<double>::infinity()
                                 : best.get<double>();
    c.validations_without_improvement =
        h.at("validations_without_improvement").get<int64_t>();
    c.normalization.mean = h.at("normalization_mean").get<std::vector<float>>();
    c.normalization.std = h.at("normalization_std").get<std::vector<float>>();
    c.tuning = h.value("tuning", std::string());
    // Optional: only runs that scaled their loss write them.
    c.loss_scale = h.value("loss_scale", 0.0);
    c.loss_scale_clean_steps = h.value("loss_scale_clean_steps", int64_t{0});
    c.skipped_steps = h.value("skipped_steps", int64_t{0});
    np = h.at("params").get<size_t>();
    ns = h.at("state").get<size_t>();
    nss = h.at("solver_state").get<size_t>();
  } catch (const nlohmann::json::exception& e) {
    return Damaged(source,
                   absl::StrCat("its header lacks a field: ", e.what()));
  }
  if ((body - data_start) != (np + ns + nss) * sizeof(float)) {
    return Damaged(source, "its arrays do not have the sizes its header gives");
  }
  const char* p = bytes.data() + data_start;
  auto take = [&p](std::vector<float>* v, size_t n) {
    v->resize(n);
    std::memcpy(v->data(), p, n * sizeof(float));
    p += n * sizeof(float);
  };
  take(&c.params, np);
  take(&c.state, ns);
  take(&c.solver_state, nss);
  return c;
}

absl::Status WriteCheckpoint(const std::string& path, const Checkpoint& c) {
  return WriteFileAtomic(path, EncodeCheckpoint(c), 0644);
}

absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  return DecodeCheckpoint(*bytes, path);
}

}  // namespace dlbatch::trainer
