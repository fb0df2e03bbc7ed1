// A thin RAII layer over SQLite: a connection and prepared statements whose
// errors come back as Status values naming the statement and SQLite's reason.
#ifndef DLBATCH_SCHEDULER_STORE_SQLITE_H_
#define DLBATCH_SCHEDULER_STORE_SQLITE_H_

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace dlbatch::scheduler {

class Statement;

// One SQLite connection. Not thread-safe: one thread uses it at a time.
class Database {
 public:
  // Opens (creating) `path` in WAL mode. sync_full: fsync every commit
  // (survives power loss); otherwise synchronous=NORMAL (survives a crash of
  // the process at any moment, which is what kill -9 needs). A writer
  // connection checkpoints only through CheckpointIfRoom, not SQLite's own
  // automatic checkpoint.
  static absl::StatusOr<std::unique_ptr<Database>> Open(const std::string& path,
                                                        bool read_only,
                                                        bool sync_full);
  ~Database();
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  absl::Status Exec(absl::string_view sql);
  // Prepared once per connection and cached; the returned statement is reset.
  absl::StatusOr<Statement*> Prepare(const char* sql);
  int64_t LastInsertId() const;
  int Changes() const;
  sqlite3* raw() { return db_; }
  const std::string& path() const { return path_; }
  absl::Status Error(absl::string_view what) const;

  // Copies the WAL into the database file once it holds enough frames, as
  // SQLite's automatic checkpoint does, but only when the filesystem has
  // room for what the database file must grow by. A checkpoint that runs out
  // of space fails having taken all the space left (the database file grows
  // first), while the WAL, not yet reset, still needs new space for every
  // commit: on a full disk nothing could be written again. Skipped, the WAL
  // grows by the commit alone, which the disk guard's reserve is there for.
  // Transaction::Commit calls it after each commit. With
  // CheckpointInBackground, it only wakes the checkpointing thread.
  void CheckpointIfRoom();

  // Runs checkpoints on a thread of its own, on a connection of its own, so
  // that a commit never waits for one: a checkpoint of 1,000 frames takes
  // tens of milliseconds, which a caller holding a lock across its commit
  // (the scheduler) would make everyone else wait out. Writers go on
  // appending to the WAL while it runs; SQLite restarts the WAL at the next
  // commit after a checkpoint has copied all of it, so past twice the
  // threshold the writer checkpoints inline what the background ones have
  // not copied yet. Stopped by the destructor. Writer connections only.
  absl::Status CheckpointInBackground();

 private:
  Database(sqlite3* db, std::string path);
  static int NoteWalFrames(void* self, sqlite3* db, const char* name,
                           int frames);
  // Checkpoints `db` (a connection to this database) if its filesystem has
  // room for what the database file must grow by. One checkpoint at a
  // time: SQLite refuses a second one outright (SQLITE_BUSY, no busy
  // handler), so the writer's inline checkpoint would do nothing while a
  // background one is slow (a loaded machine) and the WAL would grow
  // without bound; instead it waits for that one, then finishes the rest.
  void CheckpointWithRoom(sqlite3* db) const;

  sqlite3* db_;
  const std::string path_;
  // Frames in the WAL after the last commit: set by the WAL hook as a
  // commit on db_ ends and read by CheckpointIfRoom after it, both on the
  // thread using this connection, so no lock guards it.
  int wal_frames_ = 0;
  // Held while a checkpoint runs, by the writer or the background thread;
  // it guards no member, only SQLite's one checkpoint at a time.
  mutable absl::Mutex checkpoint_mu_;
  struct Cache;
  std::unique_ptr<Cache> cache_;
  struct Background;
  std::unique_ptr<Background> background_;
};

// A cached prepared statement. Bind indexes are 1-based, columns 0-based.
class Statement {
 public:
  Statement(Database* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  ~Statement();
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  Statement& Bind(int index, int64_t value);
  Statement& Bind(int index, int value) { return Bind(index, int64_t{value}); }
  Statement& Bind(int index, absl::string_view text);
  Statement& BindBlob(int index, absl::string_view bytes);
  Statement& BindNull(int index);

  // Steps once: true if a row is ready, false when done.
  absl::StatusOr<bool> Step();
  // Runs a statement that returns no rows.
  absl::Status Run();
  // Steps through every row, calling `row()` at each (it reads the columns
  // of this statement), then resets. `row` returns void, or an
  // absl::Status whose first error ends the walk and is returned.
  template <typename Fn>
  absl::Status ForEachRow(Fn&& row);
  void Reset();

  int64_t Int(int col) const;
  std::string Text(int col) const;
  absl::string_view Blob(int col) const;
  bool IsNull(int col) const;

 private:
  // A failed bind (a value over SQLite's length limit) fails the next Step
  // instead of running the statement with the parameter left NULL.
  void NoteBind(int rc) {
    if (rc != SQLITE_OK && bind_rc_ == SQLITE_OK) bind_rc_ = rc;
  }

  Database* db_;
  sqlite3_stmt* stmt_;
  int bind_rc_ = SQLITE_OK;
};

template <typename Fn>
absl::Status Statement::ForEachRow(Fn&& row) {
  for (;;) {
    absl::StatusOr<bool> more = Step();
    absl::Status status = more.status();
    if (status.ok() && *more) {
      if constexpr (std::is_void_v<std::invoke_result_t<Fn&>>) {
        row();
        continue;
      } else {
        status = row();
        if (status.ok()) continue;
      }
    }
    Reset();
    return status;
  }
}

// True for a failure of the store as a whole (disk full, I/O error, busy,
// corrupt file), after which the open transaction may already be rolled
// back; false for one tied to what was being written (too big, a broken
// constraint), which a savepoint can undo alone.
bool IsStoreFailure(const absl::Status& status);

// BEGIN IMMEDIATE ... COMMIT; rolls back on destruction unless committed.
class Transaction {
 public:
  explicit Transaction(Database* db);
  ~Transaction();
  absl::Status status() const { return begin_; }
  absl::Status Commit();

 private:
  Database* db_;
  absl::Status begin_;
  bool done_ = false;
};

// SAVEPOINT inside an open transaction: Release keeps its writes, Undo (or
// destruction without Release) takes them back and leaves the transaction
// open. A single fixed name: savepoints here never nest.
class Savepoint {
 public:
  explicit Savepoint(Database* db);
  ~Savepoint();
  absl::Status status() const { return begin_; }
  absl::Status Release();
  absl::Status Undo();

 private:
  Database* db_;
  absl::Status begin_;
  bool done_ = false;
};

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_STORE_SQLITE_H_
