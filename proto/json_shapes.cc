#include "proto/json_shapes.h"

#include <cmath>
#include <iostream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/utf8.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"
#include "proto/job_state.h"

namespace dlbatch {
namespace {

namespace pb = google::protobuf;

// NaN and infinities have no JSON form: null.
Json Number(double value) {
  return std::isfinite(value) ? Json(value) : Json();
}

Json StringList(const pb::RepeatedPtrField<std::string>& items) {
  Json out = Json::array();
  for (const std::string& item : items) out.push_back(item);
  return out;
}

Json StringMap(const pb::Map<std::string, std::string>& map) {
  // Sorted keys: the same job prints the same way every time.
  std::map<std::string, std::string> sorted(map.begin(), map.end());
  Json out = Json::object();
  for (const auto& [key, value] : sorted) out[key] = value;
  return out;
}

Json ProgressJson(const v1::TrainProgress& p) {
  Json metrics = Json::object();
  for (const auto& [name, value] : p.metrics()) metrics[name] = Number(value);
  return Json{{"time", JsonTime(p.time_ms())},
              {"iteration", p.iteration()},
              {"iterations", p.iterations()},
              {"epoch", p.epoch()},
              {"epochs", p.epochs()},
              {"loss", Number(p.loss())},
              {"accuracy", Number(p.accuracy())},
              {"learn_rate", Number(p.learn_rate())},
              {"images_per_s", Number(p.images_per_s())},
              {"elapsed_s", Number(p.elapsed_s())},
              {"eta_s", Number(p.eta_s())},
              {"has_validation", p.has_validation()},
              {"validation_loss", Number(p.validation_loss())},
              {"validation_accuracy", Number(p.validation_accuracy())},
              {"checkpoint_iteration", p.checkpoint_iteration()},
              {"done", p.done()},
              {"metrics", std::move(metrics)}};
}

Json SpecJson(const v1::JobSpec& spec) {
  Json attach = Json::array();
  for (const v1::Attachment& a : spec.attach()) {
    attach.push_back(Json{{"path", a.path()},
                          {"size", a.size()},
                          {"sha256", a.sha256()},
                          {"mode", a.mode()}});
  }
  return Json{{"name", spec.name()},
              {"profile", spec.profile()},
              {"pool", spec.pool()},
              {"priority", spec.priority()},
              {"time_limit_s", spec.time_limit_s()},
              {"max_nodes", spec.max_nodes()},
              {"launch", spec.launch()},
              {"checkpoint", spec.checkpoint()},
              {"program", spec.has_train()     ? "train"
                          : spec.has_command() ? "command"
                                               : ""},
              {"command", StringList(spec.command().argv())},
              {"train", spec.has_train() ? ProtoJson(spec.train()) : Json()},
              {"env", StringMap(spec.env())},
              {"attach", std::move(attach)},
              {"sweep_point", StringMap(spec.sweep_point())}};
}

Json ScalarField(const pb::Message& m, const pb::FieldDescriptor* f, int i) {
  const pb::Reflection* r = m.GetReflection();
  const bool rep = f->is_repeated();
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32:
      return rep ? r->GetRepeatedInt32(m, f, i) : r->GetInt32(m, f);
    case pb::FieldDescriptor::CPPTYPE_INT64:
      return rep ? r->GetRepeatedInt64(m, f, i) : r->GetInt64(m, f);
    case pb::FieldDescriptor::CPPTYPE_UINT32:
      return rep ? r->GetRepeatedUInt32(m, f, i) : r->GetUInt32(m, f);
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      return rep ? r->GetRepeatedUInt64(m, f, i) : r->GetUInt64(m, f);
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      return Number(rep ? r->GetRepeatedDouble(m, f, i) : r->GetDouble(m, f));
    case pb::FieldDescriptor::CPPTYPE_FLOAT:
      return Number(rep ? r->GetRepeatedFloat(m, f, i) : r->GetFloat(m, f));
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      return rep ? r->GetRepeatedBool(m, f, i) : r->GetBool(m, f);
    case pb::FieldDescriptor::CPPTYPE_ENUM:
      return std::string(
          (rep ? r->GetRepeatedEnum(m, f, i) : r->GetEnum(m, f))->name());
    case pb::FieldDescriptor::CPPTYPE_STRING: {
      std::string s = rep ? r->GetRepeatedString(m, f, i) : r->GetString(m, f);
      if (f->type() == pb::FieldDescriptor::TYPE_BYTES) {
        return absl::Base64Escape(s);
      }
      return s;
    }
    case pb::FieldDescriptor::CPPTYPE_MESSAGE:
      return ProtoJson(rep ? r->GetRepeatedMessage(m, f, i)
                           : r->GetMessage(m, f));
  }
  return Json();
}

}  // namespace

Json JsonTime(int64_t ms) {
  if (ms <= 0) return Json();
  return absl::FormatTime("%Y-%m-%d%ET%H:%M:%E3SZ", absl::FromUnixMillis(ms),
                          absl::UTCTimeZone());
}

Json JsonState(v1::JobState state) { return JobStateName(state); }

Json JobJson(const v1::Job& job) {
  Json placement = Json::array();
  for (const v1::DevicePart& part : job.placement()) {
    Json devices = Json::array();
    for (int d : part.devices()) devices.push_back(d);
    placement.push_back(Json{{"worker_id", part.worker_id()},
                             {"worker_name", part.worker_name()},
                             {"devices", std::move(devices)}});
  }
  Json history = Json::array();
  for (const v1::StateChange& h : job.history()) {
    history.push_back(Json{{"state", JsonState(h.state())},
                           {"time", JsonTime(h.time_ms())},
                           {"attempt", h.attempt()},
                           {"reason", h.reason()}});
  }
  Json checkpoint = Json::array();
  for (const v1::OutputFile& f : job.checkpoint()) {
    checkpoint.push_back(OutputFileJson(f));
  }
  Json checkpoints = Json::array();
  for (const v1::KeptCheckpoint& k : job.checkpoints()) {
    Json files = Json::array();
    for (const v1::OutputFile& f : k.files())
      files.push_back(OutputFileJson(f));
    checkpoints.push_back(Json{{"part", k.part()},
                               {"iteration", k.iteration()},
                               {"attempt", k.attempt()},
                               {"resume", k.resume()},
                               {"files", std::move(files)}});
  }
  Json after = Json::array();
  for (int64_t id : job.after()) after.push_back(id);
  Json preemptions = Json::array();
  for (const v1::Preemption& p : job.preemptions()) {
    preemptions.push_back(Json{{"by_job", p.by_job()},
                               {"by_priority", p.by_priority()},
                               {"kind", p.kind()},
                               {"time", JsonTime(p.time_ms())},
                               {"attempt", p.attempt()},
                               {"deadline", JsonTime(p.deadline_ms())},
                               {"done", p.done()},
                               {"resume_iteration", p.resume_iteration()},
                               {"lost_s", p.lost_ms() / 1000.0}});
  }
  const v1::JobSpec& spec = job.spec();
  Json position =
      job.queue_position() > 0 ? Json(job.queue_position()) : Json(nullptr);
  return Json{{"id", job.id()},
              {"name", spec.name()},
              {"user", job.user()},
              {"state", JsonState(job.state())},
              {"held", job.held()},
              {"after", after},
              {"attempt", job.attempt()},
              {"profile", spec.profile()},
              {"pool", spec.pool()},
              {"priority", spec.priority()},
              {"sweep_id", job.sweep_id()},
              {"array_id", job.array_id()},
              {"array_index", job.array_index()},
              {"array_limit", job.array_limit()},
              {"submit_time", JsonTime(job.submit_time_ms())},
              {"start_time", JsonTime(job.start_time_ms())},
              {"end_time", JsonTime(job.end_time_ms())},
              {"exit_code", job.exit_code()},
              {"reason", job.reason()},
              {"wait_reason", job.wait_reason()},
              {"queue_position", std::move(position)},
              {"diary_lines", job.diary_lines()},
              {"placement", std::move(placement)},
              {"progress", ProgressJson(job.progress())},
              {"checkpoint", std::move(checkpoint)},
              {"checkpoints", std::move(checkpoints)},
              {"preemptions", std::move(preemptions)},
              {"history", std::move(history)},
              {"spec", SpecJson(spec)}};
}

const char* DiaryLineEnding(const v1::DiaryLine& line) {
  switch (line.ending()) {
    case v1::DiaryLine::ENDING_CRLF:
      return "\r\n";
    case v1::DiaryLine::ENDING_NONE:
      return "";
    default:
      return "\n";
  }
}

Json DiaryLineJson(const v1::DiaryLine& line) {
  // n: the line's number in its job's diary (a scheduler that predates
  // DiaryLine.line gives only its store cursor).
  return Json{{"n", line.line() > 0 ? line.line() : line.n()},
              {"time", JsonTime(line.time_ms())},
              {"stream", line.stream()},
              {"attempt", line.attempt()},
              {"seq", line.seq()},
              {"text", ValidUtf8(line.text())},
              {"text_base64", absl::Base64Escape(line.text())},
              {"ending", DiaryLineEnding(line)},
              // The part and global rank of the process that wrote it; rank
              // null for dlbatch's own lines.
              {"part", line.part()},
              {"rank", line.has_rank() ? Json(line.rank()) : Json(nullptr)}};
}

Json WorkerJson(const v1::WorkerInfo& w) {
  Json devices = Json::array();
  for (const v1::Device& d : w.devices()) {
    devices.push_back(Json{{"index", d.index()},
                           {"kind", d.kind()},
                           {"name", d.name()},
                           {"memory_bytes", d.memory_bytes()},
                           {"compute_capability", d.compute_capability()}});
  }
  Json running = Json::array();
  for (int64_t id : w.running_jobs()) running.push_back(id);
  // NVML's GPUs as the worker last read them; a reading it refused is null.
  Json gpus = Json::array();
  for (const v1::GpuReading& g : w.gpus()) {
    auto known = [](bool has, int64_t value) {
      return has ? Json(value) : Json(nullptr);
    };
    gpus.push_back(
        Json{{"index", g.index()},
             {"uuid", g.uuid()},
             {"utilization_percent",
              known(g.has_utilization_percent(), g.utilization_percent())},
             {"memory_used_bytes",
              known(g.has_memory_used_bytes(), g.memory_used_bytes())},
             {"memory_total_bytes",
              known(g.has_memory_total_bytes(), g.memory_total_bytes())}});
  }
  return Json{{"id", w.id()},
              {"name", w.name()},
              {"host", w.host()},
              {"profile", w.profile()},
              {"online", w.online()},
              {"draining", w.draining()},
              {"drain_reason", w.drain_reason()},
              {"version", w.version()},
              {"slots", w.devices_size()},
              {"free_slots", w.free_slots()},
              {"devices", std::move(devices)},
              {"running_jobs", std::move(running)},
              {"last_seen", JsonTime(w.last_seen_ms())},
              {"gpus", std::move(gpus)},
              {"gpus_read", JsonTime(w.gpus_read_ms())}};
}

Json ProfileJson(const v1::ProfileInfo& p) {
  Json j{{"name", p.name()},
         {"type", p.type().empty() ? "workers" : p.type()},
         {"workers", p.workers()},
         {"workers_online", p.workers_online()},
         {"total_slots", p.total_slots()},
         {"free_slots", p.free_slots()},
         {"max_pool", p.max_pool()},
         {"slot_kind", p.slot_kind()},
         {"queued_jobs", p.queued_jobs()},
         {"running_jobs", p.running_jobs()}};
  if (p.has_slurm()) {
    const v1::SlurmPartition& s = p.slurm();
    j["slurm"] = Json{{"partition", s.partition()},
                      {"nodes", s.nodes()},
                      {"idle", s.idle()},
                      {"allocated", s.busy()},
                      {"unavailable", s.unavailable()},
                      {"gpus", s.gpus()},
                      {"gpus_allocated", s.gpus_used()},
                      {"error", s.error()}};
  }
  return j;
}

Json OutputFileJson(const v1::OutputFile& f) {
  return Json{{"path", f.path()},
              {"size", f.size()},
              {"sha256", f.sha256()},
              {"mode", f.mode()},
              {"symlink", f.symlink()}};
}

Json CredentialJson(const v1::Credential& c) {
  return Json{{"name", c.name()},
              {"kind", c.worker() ? "worker" : (c.admin() ? "admin" : "user")},
              {"worker", c.worker()},
              {"admin", c.admin()},
              {"created", JsonTime(c.created_ms())}};
}

Json UserLimitJson(const v1::UserLimitEntry& l) {
  return Json{{"user", l.user()},
              {"profile", l.profile()},
              {"max_slots", l.max_slots()},
              {"max_queued", l.max_queued()}};
}

Json UsageJson(const v1::GetUsageReply& usage) {
  Json users = Json::array();
  for (const v1::UserUsageEntry& u : usage.users()) {
    users.push_back(Json{{"user", u.user()},
                         {"slot_seconds", Number(u.slot_seconds())},
                         {"share", Number(u.share())},
                         {"running_slots", u.running_slots()}});
  }
  return Json{{"half_life_ms", usage.half_life_ms()},
              {"time", JsonTime(usage.time_ms())},
              {"users", std::move(users)}};
}

Json ProtoJson(const pb::Message& m) {
  const pb::Descriptor* d = m.GetDescriptor();
  const pb::Reflection* r = m.GetReflection();
  Json out = Json::object();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (f->is_map()) {
      Json map = Json::object();
      for (int k = 0; k < r->FieldSize(m, f); ++k) {
        const pb::Message& entry = r->GetRepeatedMessage(m, f, k);
        const pb::Descriptor* e = entry.GetDescriptor();
        Json key = ScalarField(entry, e->map_key(), 0);
        map[key.is_string() ? key.get<std::string>() : key.dump()] =
            ScalarField(entry, e->map_value(), 0);
      }
      out[f->name()] = std::move(map);
    } else if (f->is_repeated()) {
      Json items = Json::array();
      for (int k = 0; k < r->FieldSize(m, f); ++k) {
        items.push_back(ScalarField(m, f, k));
      }
      out[f->name()] = std::move(items);
    } else if (f->has_presence() && !r->HasField(m, f) &&
               f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      out[f->name()] = nullptr;  // an optional scalar left unset
    } else {
      out[f->name()] = ScalarField(m, f, 0);
    }
  }
  return out;
}

std::string JsonText(const Json& value, bool compact) {
  return value.dump(compact ? -1 : 2, ' ', /*ensure_ascii=*/false,
                    Json::error_handler_t::replace);
}

void PrintJson(const Json& value, bool compact) {
  std::string text = JsonText(value, compact);
  text.push_back('\n');
  std::cout.write(text.data(), static_cast<std::streamsize>(text.size()));
}

}  // namespace dlbatch
