#include "client/monitor_view.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/commands_control.h"
#include "client/format.h"
#include "client/terminal_text.h"
#include "proto/job_state.h"

namespace dlbatch::client {
namespace {

// Column widths of the jobs table; NAME takes what is left.
constexpr int kSelW = 1, kIdW = 5, kUserW = 7, kStateW = 10, kPoolW = 4,
              kProgW = 14, kLossW = 6, kAccW = 5, kTimeW = 11, kMinNameW = 6;
constexpr int kFixedW = kSelW + kIdW + 1 + 1 + kUserW + 1 + kStateW + 1 +
                        kPoolW + 1 + kProgW + 1 + kLossW + 1 + kAccW + 1 +
                        kTimeW;
// The columns after POOL, as one: where a wait reason goes.
constexpr int kTailW = kProgW + 1 + kLossW + 1 + kAccW + 1 + kTimeW;

bool Active(v1::JobState s) {
  return s == v1::JOB_STATE_RUNNING || s == v1::JOB_STATE_CANCELLING;
}

int NameWidth(int cols) { return std::max(kMinNameW, cols - kFixedW); }

char SlotMark(size_t i) {
  static constexpr char kMarks[] =
      "123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  return i < sizeof(kMarks) - 1 ? kMarks[i] : '*';
}

int64_t Elapsed(const v1::Job& job, int64_t now_ms) {
  if (job.start_time_ms() <= 0) return -1;
  int64_t end = job.end_time_ms() > 0 ? job.end_time_ms() : now_ms;
  return std::max<int64_t>(0, end - job.start_time_ms());
}

std::string Percent(const v1::TrainProgress& p) {
  if (p.iterations() <= 0) return "";
  int64_t pct =
      std::clamp<int64_t>(p.iteration() * 100 / p.iterations(), 0, 100);
  return absl::StrCat(pct, "%");
}

std::string LossText(const v1::TrainProgress& p) {
  double loss = p.loss();
  if (loss >= 1000) return absl::StrFormat("%.0f", loss);
  if (loss >= 100) return absl::StrFormat("%.1f", loss);
  if (loss >= 10) return absl::StrFormat("%.2f", loss);
  return absl::StrFormat("%.3f", loss);
}

std::string TimeText(const v1::Job& job, int64_t now_ms) {
  int64_t elapsed = Elapsed(job, now_ms);
  if (elapsed < 0) return "-";
  std::string text = ShortDuration(elapsed);
  if (job.has_progress() && job.progress().eta_s() > 0 &&
      !IsTerminal(job.state())) {
    absl::StrAppend(
        &text, "/",
        ShortDuration(static_cast<int64_t>(job.progress().eta_s() * 1000)));
  }
  return text;
}

// The columns after POOL for a job with progress.
std::string ProgressColumns(const v1::Job& job, int64_t now_ms) {
  std::string out;
  if (job.has_progress() && job.progress().iterations() > 0) {
    const v1::TrainProgress& p = job.progress();
    std::string pct = Percent(p);
    std::string bar = Bar(p.iteration(), p.iterations(), kProgW - 5);
    absl::StrAppend(
        &out, Fit(absl::StrCat(bar, " ", std::string(4 - pct.size(), ' '), pct),
                  kProgW));
    // Before the first step there is no loss yet.
    const bool stepped = p.iteration() > 0;
    absl::StrAppend(
        &out, " ", Fit(stepped ? LossText(p) : "-", kLossW), " ",
        Fit(stepped ? absl::StrFormat("%.1f", p.accuracy()) : "-", kAccW));
  } else {
    absl::StrAppend(&out, Fit("-", kProgW), " ", Fit("-", kLossW), " ",
                    Fit("-", kAccW));
  }
  absl::StrAppend(&out, " ", Fit(TimeText(job, now_ms), kTimeW));
  return out;
}

// A mark per slot of `w` ('.' free, '-' offline, else the holding job's
// mark) and the legend "1=#12" of the marks, jobs numbered in id order.
std::string SlotMarks(const ClusterModel& model, const v1::WorkerInfo& w,
                      std::vector<std::string>* legend) {
  const int slots = w.devices_size();
  std::string marks(static_cast<size_t>(slots), w.online() ? '.' : '-');
  size_t n = 0;
  for (const auto& [job_id, job] : model.jobs) {
    if (!Active(job.state())) continue;
    bool here = false;
    for (const auto& part : job.placement()) {
      if (part.worker_id() != w.id()) continue;
      here = true;
      for (int d : part.devices()) {
        if (d >= 0 && d < slots) marks[static_cast<size_t>(d)] = SlotMark(n);
      }
    }
    if (here)
      legend->push_back(
          absl::StrCat(std::string(1, SlotMark(n++)), "=#", job_id));
  }
  return marks;
}

}  // namespace

void ClusterModel::Apply(const v1::ClusterEvent& event, size_t keep_ended) {
  if (event.time_ms() > 0) server_time_ms = event.time_ms();
  if (event.has_worker()) {
    if (event.worker().removed()) {
      workers.erase(event.worker().id());
    } else {
      workers[event.worker().id()] = event.worker();
    }
    return;
  }
  if (!event.has_job()) return;
  jobs[event.job().id()] = event.job();
  if (!IsTerminal(event.job().state())) return;
  // Keep the most recently ended (by id: ids grow with submission).
  size_t ended = 0;
  for (auto it = jobs.rbegin(); it != jobs.rend(); ++it) {
    if (IsTerminal(it->second.state())) ++ended;
  }
  for (auto it = jobs.begin(); ended > keep_ended && it != jobs.end();) {
    if (IsTerminal(it->second.state())) {
      it = jobs.erase(it);
      --ended;
    } else {
      ++it;
    }
  }
}

std::string Clip(std::string_view text, int width) {
  return ClipToWidth(text, width);
}

std::string Fit(std::string_view text, int width) {
  return PadToWidth(text, width);
}

std::string Bar(int64_t done, int64_t total, int width) {
  int inner = std::max(0, width - 2);
  int filled = 0;
  if (total > 0) {
    filled =
        static_cast<int>(std::clamp<int64_t>(done, 0, total) * inner / total);
  }
  return absl::StrCat("[", std::string(filled, '#'),
                      std::string(inner - filled, '.'), "]");
}

std::string ShortDuration(int64_t ms) {
  if (ms < 0) return "-";
  int64_t s = ms / 1000;
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%d:%02d", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, s % 86400 / 3600);
}

std::vector<const v1::Job*> ListedJobs(const ClusterModel& model,
                                       std::string_view filter) {
  std::string needle = absl::AsciiStrToLower(std::string(filter));
  auto keep = [&](const v1::Job& job) {
    if (needle.empty()) return true;
    for (std::string_view field :
         {std::string_view(job.spec().name()), std::string_view(job.user()),
          std::string_view(JobStateName(job.state()))}) {
      if (absl::StrContains(absl::AsciiStrToLower(std::string(field)), needle))
        return true;
    }
    return false;
  };
  std::vector<const v1::Job*> active, queued, ended;
  for (const auto& [id, job] : model.jobs) {
    if (!keep(job)) continue;
    if (Active(job.state())) {
      active.push_back(&job);
    } else if (job.state() == v1::JOB_STATE_QUEUED) {
      queued.push_back(&job);
    } else {
      ended.push_back(&job);
    }
  }
  std::reverse(ended.begin(), ended.end());
  active.insert(active.end(), queued.begin(), queued.end());
  active.insert(active.end(), ended.begin(), ended.end());
  return active;
}

std::string JobsHeader(int cols) {
  std::string line = absl::StrCat(
      " ", Fit("   ID", kIdW), " ", Fit("NAME", NameWidth(cols)), " ",
      Fit("USER", kUserW), " ", Fit("STATE", kStateW), " ", Fit("POOL", kPoolW),
      " ", Fit("PROGRESS", kProgW), " ", Fit("LOSS", kLossW), " ",
      Fit("ACC%", kAccW), " ", Fit("ELAPSED/ETA", kTimeW));
  return Clip(line, cols);
}

std::string JobRow(const v1::Job& job, int64_t now_ms, int cols,
                   bool selected) {
  std::string line = absl::StrCat(
      selected ? ">" : " ", absl::StrFormat("%*d", kIdW, job.id()), " ",
      Fit(job.spec().name(), NameWidth(cols)), " ", Fit(job.user(), kUserW),
      " ", Fit(JobStateName(job.state()), kStateW), " ",
      absl::StrFormat("%*d", kPoolW, job.spec().pool()), " ");
  if (job.state() == v1::JOB_STATE_QUEUED) {
    absl::StrAppend(
        &line,
        Fit(job.wait_reason().empty() ? "waiting" : job.wait_reason(), kTailW));
  } else if (IsTerminal(job.state()) && !job.has_progress() &&
             !job.reason().empty()) {
    std::string time = ShortDuration(Elapsed(job, now_ms));
    absl::StrAppend(&line, Fit(job.reason(), kTailW - kTimeW - 1), " ",
                    Fit(time, kTimeW));
  } else {
    absl::StrAppend(&line, ProgressColumns(job, now_ms));
  }
  // Trailing spaces carry nothing; a shorter line redraws faster.
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return Clip(line, cols);
}

std::vector<std::string> WorkerLines(const ClusterModel& model, int cols) {
  std::vector<std::string> lines;
  for (const auto& [id, w] : model.workers) {
    const int slots = w.devices_size();
    std::string kind = slots > 0 ? w.devices(0).kind() : "-";
    std::vector<std::string> legend;
    std::string marks = SlotMarks(model, w, &legend);
    int busy = 0;
    for (char c : marks) busy += (c != '.' && c != '-') ? 1 : 0;
    std::string line =
        absl::StrCat(" ", Fit(w.name(), 12), " ", Fit(WorkerStateText(w), 8),
                     " ", Fit(absl::StrCat(kind, " ", busy, "/", slots), 9),
                     " [", marks, "] ", absl::StrJoin(legend, " "));
    while (!line.empty() && line.back() == ' ') line.pop_back();
    lines.push_back(Clip(line, cols));
  }
  return lines;
}

std::vector<std::string> RenderMain(const ClusterModel& model,
                                    const MonitorScreen& screen,
                                    int64_t now_ms) {
  const int rows = std::max(1, screen.rows);
  const int cols = std::max(1, screen.cols);
  std::vector<std::string> out;
  int online = 0, slots = 0, busy = 0;
  for (const auto& [id, w] : model.workers) {
    if (!w.online()) continue;
    ++online;
    slots += w.devices_size();
    busy += w.devices_size() - w.free_slots();
  }
  int running = 0, queued = 0;
  for (const auto& [id, job] : model.jobs) {
    running += Active(job.state()) ? 1 : 0;
    queued += job.state() == v1::JOB_STATE_QUEUED ? 1 : 0;
  }
  out.push_back(
      Clip(absl::StrCat(" dlbatch  workers ", online, "/", model.workers.size(),
                        "  slots ", busy, "/", slots, " busy  running ",
                        running, "  queued ", queued, "  ", screen.title),
           cols));

  // The cluster panel: a third of the screen at most.
  std::vector<std::string> workers = WorkerLines(model, cols);
  const int panel = std::max(1, (rows - 3) / 3);
  out.push_back(Clip(" WORKER       STATE   SLOTS", cols));
  if (workers.empty()) out.push_back(Clip(" (no workers have joined)", cols));
  for (int i = 0; i < static_cast<int>(workers.size()); ++i) {
    if (i == panel - 1 && static_cast<int>(workers.size()) > panel) {
      out.push_back(
          Clip(absl::StrCat(" ... and ", workers.size() - i, " more workers"),
               cols));
      break;
    }
    out.push_back(workers[static_cast<size_t>(i)]);
  }
  out.push_back("");

  // The jobs table, scrolled so the selection shows.
  std::vector<const v1::Job*> jobs = ListedJobs(model, screen.filter);
  out.push_back(JobsHeader(cols));
  const int room = rows - static_cast<int>(out.size()) - 1;
  int selected = -1;
  for (int i = 0; i < static_cast<int>(jobs.size()); ++i) {
    if (jobs[static_cast<size_t>(i)]->id() == screen.selected_job) selected = i;
  }
  int first = 0;
  if (room > 0 && selected >= room) first = selected - room + 1;
  for (int i = first; i < static_cast<int>(jobs.size()) && i - first < room;
       ++i) {
    const v1::Job& job = *jobs[static_cast<size_t>(i)];
    out.push_back(JobRow(job, now_ms, cols, job.id() == screen.selected_job));
  }
  if (jobs.empty() && room > 0) {
    out.push_back(Clip(
        screen.filter.empty() ? " (no jobs)" : " (no job matches the filter)",
        cols));
  }
  while (static_cast<int>(out.size()) < rows - 1) out.push_back("");
  out.resize(static_cast<size_t>(rows - 1));
  std::string footer = screen.footer;
  if (!screen.filter.empty() || screen.editing_filter) {
    absl::StrAppend(&footer, "   filter: ", screen.filter,
                    screen.editing_filter ? "_" : "");
  }
  out.push_back(Clip(footer, cols));
  return out;
}

std::vector<std::string> RenderDiary(const std::string& title,
                                     const std::deque<std::string>& lines,
                                     const std::string& footer, int rows,
                                     int cols) {
  rows = std::max(2, rows);
  std::vector<std::string> out;
  out.push_back(Clip(title, cols));
  const size_t room = static_cast<size_t>(rows - 2);
  size_t first = lines.size() > room ? lines.size() - room : 0;
  for (size_t i = first; i < lines.size(); ++i)
    out.push_back(Clip(lines[i], cols));
  while (out.size() < static_cast<size_t>(rows - 1)) out.push_back("");
  out.push_back(Clip(footer, cols));
  return out;
}

std::string PlainSnapshot(const ClusterModel& model, int64_t now_ms) {
  Table workers({"WORKER", "PROFILE", "STATE", "SLOTS", "BUSY", "USE", "JOBS"});
  for (const auto& [id, w] : model.workers) {
    std::vector<std::string> legend;
    std::string marks = SlotMarks(model, w, &legend);
    int busy = w.online() ? w.devices_size() - w.free_slots() : 0;
    workers.Add(
        {w.name(), w.profile(),
         WorkerStateText(w) +
             (w.drain_reason().empty() ? "" : " (" + w.drain_reason() + ")"),
         absl::StrCat(w.devices_size() > 0 ? w.devices(0).kind() : "-", " ",
                      w.devices_size()),
         absl::StrCat(busy, "/", w.devices_size()),
         absl::StrCat("[", marks, "]"),
         legend.empty() ? "-" : absl::StrJoin(legend, " ")});
  }
  Table jobs({"ID", "NAME", "USER", "STATE", "POOL", "PROGRESS", "LOSS", "ACC%",
              "ELAPSED", "ETA", "NOTE"});
  for (const v1::Job* job : ListedJobs(model, "")) {
    const v1::TrainProgress& p = job->progress();
    bool progress = job->has_progress() && p.iterations() > 0;
    std::string note = JobNote(*job);
    jobs.Add({absl::StrCat(job->id()), job->spec().name(), job->user(),
              JobStateName(job->state()), absl::StrCat(job->spec().pool()),
              progress ? absl::StrCat(Bar(p.iteration(), p.iterations(), 12),
                                      " ", Percent(p))
                       : "-",
              progress ? LossText(p) : "-",
              progress ? absl::StrFormat("%.1f", p.accuracy()) : "-",
              ShortDuration(Elapsed(*job, now_ms)),
              progress && p.eta_s() > 0 && !IsTerminal(job->state())
                  ? ShortDuration(static_cast<int64_t>(p.eta_s() * 1000))
                  : "-",
              note.empty() ? "-" : note});
  }
  return absl::StrCat("Cluster\n", workers.Render(), "\nJobs\n", jobs.Render());
}

}  // namespace dlbatch::client
