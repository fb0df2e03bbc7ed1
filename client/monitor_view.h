// What `dlbatch monitor` shows, as pure functions of what it knows: the
// cluster panel, the jobs table, the diary pane and the plain snapshot.
// No I/O and no clock reads (time comes in as `now_ms`, on the scheduler's
// clock), so every line can be tested for its content and its width.
//
// Every line a Render* function returns is at most `cols` display cells
// and safe for a terminal: text from jobs (names, reasons, diary lines) is
// shown as TerminalText (terminal_text.h: valid UTF-8 as itself, control
// characters and broken bytes as \xHH), laid out by display width (a wide
// character takes two cells), and columns that do not fit are cut from the
// right, never inside a character.
#ifndef DLBATCH_CLIENT_MONITOR_VIEW_H_
#define DLBATCH_CLIENT_MONITOR_VIEW_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "dlbatch/v1/scheduler.pb.h"

namespace dlbatch::client {

// The cluster as a WatchEvents stream has described it so far.
struct ClusterModel {
  std::map<int64_t, v1::Job> jobs;
  std::map<int64_t, v1::WorkerInfo> workers;
  int64_t server_time_ms = 0;  // the scheduler's clock at the last event

  // Takes one job or worker entry (the latest state wins). Ended jobs
  // beyond the `keep_ended` most recent are dropped.
  void Apply(const v1::ClusterEvent& event, size_t keep_ended = 50);
};

// `text` made safe (TerminalText) and cut or padded with spaces to exactly
// `width` display cells (terminal_text.h: PadToWidth).
std::string Fit(std::string_view text, int width);
// `text` made safe and cut to at most `width` display cells.
std::string Clip(std::string_view text, int width);
// "[####...]" of `width` characters in all; empty brackets when total <= 0.
std::string Bar(int64_t done, int64_t total, int width);
// "42s", "12:05", "1h02m", "3d04h"; "-" for a negative duration.
std::string ShortDuration(int64_t ms);

// The jobs the table lists, in its order: running and cancelling (by id),
// then queued (by id), then ended (newest first). `filter` keeps jobs whose
// name, user or state contains it (case-insensitive); empty keeps all.
std::vector<const v1::Job*> ListedJobs(const ClusterModel& model,
                                       std::string_view filter);

// The jobs table's header and one job's row, `cols` wide at most. Columns:
// ID NAME USER STATE POOL PROGRESS LOSS ACC% ELAPSED/ETA; a queued job's
// wait reason and an ended job's reason (without progress) take the place
// of the columns after POOL. NAME takes what the others leave.
std::string JobsHeader(int cols);
std::string JobRow(const v1::Job& job, int64_t now_ms, int cols, bool selected);

// One line per worker: name, state, slot kind and count, a mark per slot
// ('.' free, '-' offline, '1'..'9','a'.. the job holding it), and which job
// each mark stands for.
std::vector<std::string> WorkerLines(const ClusterModel& model, int cols);

// What the main screen needs besides the model.
struct MonitorScreen {
  int rows = 24;
  int cols = 80;
  std::string title;            // the first line's left part
  std::string filter;           // shown when not empty
  bool editing_filter = false;  // shows a cursor after the filter
  int64_t selected_job = 0;     // 0: none
  std::string footer;           // the last line: keys, a prompt or a message
};

// The whole main screen: exactly `screen.rows` lines. The cluster panel
// takes at most a third of the rows; the jobs table scrolls to keep the
// selected job in view.
std::vector<std::string> RenderMain(const ClusterModel& model,
                                    const MonitorScreen& screen,
                                    int64_t now_ms);

// The diary pane: a title line, the last lines of the diary that fit, and
// a footer; exactly `rows` lines.
std::vector<std::string> RenderDiary(const std::string& title,
                                     const std::deque<std::string>& lines,
                                     const std::string& footer, int rows,
                                     int cols);

// The cluster and jobs as plain tables, for output that is not a terminal.
std::string PlainSnapshot(const ClusterModel& model, int64_t now_ms);

}  // namespace dlbatch::client

#endif  // DLBATCH_CLIENT_MONITOR_VIEW_H_
