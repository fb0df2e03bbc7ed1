#include "scheduler/store/sqlite.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <thread>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace dlbatch::scheduler {
namespace {

// SQLite's default automatic checkpoint threshold.
constexpr int kCheckpointFrames = 1000;

}  // namespace

struct Database::Cache {
  std::unordered_map<const char*, std::unique_ptr<Statement>> statements;
};

struct Database::Background {
  sqlite3* conn = nullptr;  // used by `thread` alone
  absl::Mutex mu;
  bool wanted ABSL_GUARDED_BY(mu) = false;
  bool stop ABSL_GUARDED_BY(mu) = false;
  std::thread thread;
};

absl::StatusOr<std::unique_ptr<Database>> Database::Open(
    const std::string& path, bool read_only, bool sync_full) {
  sqlite3* raw = nullptr;
  int flags = read_only ? SQLITE_OPEN_READONLY
                        : (SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  flags |= SQLITE_OPEN_NOMUTEX;
  int rc = sqlite3_open_v2(path.c_str(), &raw, flags, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = raw ? sqlite3_errmsg(raw) : sqlite3_errstr(rc);
    sqlite3_close(raw);
    return absl::UnavailableError(absl::StrCat("opening ", path, ": ", msg));
  }
  std::unique_ptr<Database> db(new Database(raw, path));
  db->cache_ = std::make_unique<Cache>();
  sqlite3_busy_timeout(raw, 10000);
  if (!read_only) {
    if (auto s = db->Exec("PRAGMA journal_mode=WAL"); !s.ok()) return s;
    // Replaces SQLite's automatic checkpoint (see CheckpointIfRoom).
    sqlite3_wal_hook(raw, &Database::NoteWalFrames, db.get());
  }
  if (auto s = db->Exec(sync_full ? "PRAGMA synchronous=FULL"
                                  : "PRAGMA synchronous=NORMAL");
      !s.ok()) {
    return s;
  }
  if (auto s = db->Exec("PRAGMA foreign_keys=OFF"); !s.ok()) return s;
  return db;
}

Database::Database(sqlite3* db, std::string path)
    : db_(db), path_(std::move(path)) {}

int Database::NoteWalFrames(void* self, sqlite3*, const char*, int frames) {
  static_cast<Database*>(self)->wal_frames_ = frames;
  return SQLITE_OK;
}

void Database::CheckpointIfRoom() {
  if (wal_frames_ < kCheckpointFrames) return;
  if (background_ != nullptr && wal_frames_ < 2 * kCheckpointFrames) {
    absl::MutexLock lock(&background_->mu);
    background_->wanted = true;
    return;
  }
  // Under steady commits a checkpoint beside them never reaches the end of
  // the WAL, and SQLite restarts the WAL only after one has: the writer
  // finishes the job itself, which costs little once the background
  // checkpoints have copied most frames.
  CheckpointWithRoom(db_);
}

void Database::CheckpointWithRoom(sqlite3* db) const {
  int64_t pages = 0, page_size = 0;
  for (auto [sql, out] : {std::pair{"PRAGMA page_count", &pages},
                          std::pair{"PRAGMA page_size", &page_size}}) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db, sql, -1, &st, nullptr) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW) {
      *out = sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
  }
  // The checkpoint writes pages up to the size the last commit gave the
  // database; what the file has no blocks for yet takes new space.
  struct stat st;
  struct statvfs vfs;
  const std::string dir =
      path_.find('/') == std::string::npos
          ? "."
          : path_.substr(0, std::max<size_t>(path_.rfind('/'), 1));
  if (pages > 0 && ::stat(path_.c_str(), &st) == 0 &&
      ::statvfs(dir.c_str(), &vfs) == 0) {
    const int64_t target = pages * page_size;
    const int64_t held =
        std::min<int64_t>(static_cast<int64_t>(st.st_blocks) * 512, target);
    const int64_t free =
        static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize);
    if (target - held > free) return;  // tried again after the next commit
  }
  // Failures are ignored, as SQLite ignores its automatic checkpoint's.
  absl::MutexLock lock(&checkpoint_mu_);
  (void)sqlite3_wal_checkpoint_v2(db, nullptr, SQLITE_CHECKPOINT_PASSIVE,
                                  nullptr, nullptr);
}

absl::Status Database::CheckpointInBackground() {
  if (background_ != nullptr) return absl::OkStatus();
  auto background = std::make_unique<Background>();
  int rc =
      sqlite3_open_v2(path_.c_str(), &background->conn,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = background->conn ? sqlite3_errmsg(background->conn)
                                       : sqlite3_errstr(rc);
    sqlite3_close(background->conn);
    return absl::UnavailableError(
        absl::StrCat("opening ", path_, " to checkpoint it: ", msg));
  }
  sqlite3_busy_timeout(background->conn, 10000);
  Background* b = background.get();
  b->thread = std::thread([this, b] {
    for (;;) {
      {
        absl::MutexLock lock(&b->mu);
        b->mu.Await(absl::Condition(
            +[](Background* g) ABSL_SHARED_LOCKS_REQUIRED(g->mu) {
              return g->wanted || g->stop;
            },
            b));
        if (b->stop) return;
        b->wanted = false;
      }
      CheckpointWithRoom(b->conn);
    }
  });
  background_ = std::move(background);
  return absl::OkStatus();
}

Database::~Database() {
  if (background_ != nullptr) {
    {
      absl::MutexLock lock(&background_->mu);
      background_->stop = true;
    }
    background_->thread.join();
    sqlite3_close(background_->conn);
  }
  cache_.reset();  // finalize statements before closing
  sqlite3_close(db_);
}

absl::Status Database::Error(absl::string_view what) const {
  int code = sqlite3_errcode(db_);
  std::string msg = absl::StrCat(what, ": ", sqlite3_errmsg(db_));
  if (code == SQLITE_FULL) return absl::ResourceExhaustedError(msg);
  if (code == SQLITE_CONSTRAINT) return absl::AlreadyExistsError(msg);
  if (code == SQLITE_TOOBIG || code == SQLITE_MISMATCH ||
      code == SQLITE_RANGE) {
    return absl::InvalidArgumentError(msg);
  }
  if (code == SQLITE_BUSY || code == SQLITE_LOCKED) {
    return absl::UnavailableError(msg);
  }
  return absl::InternalError(msg);
}

absl::Status Database::Exec(absl::string_view sql) {
  std::string text(sql);
  char* err = nullptr;
  if (sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    absl::Status s = Error(absl::StrCat("sqlite: ", text));
    sqlite3_free(err);
    return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<Statement*> Database::Prepare(const char* sql) {
  auto& slot = cache_->statements[sql];
  if (!slot) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, &stmt,
                           nullptr) != SQLITE_OK) {
      cache_->statements.erase(sql);
      return Error(absl::StrCat("sqlite prepare: ", sql));
    }
    slot = std::make_unique<Statement>(this, stmt);
  }
  slot->Reset();
  return slot.get();
}

int64_t Database::LastInsertId() const {
  return sqlite3_last_insert_rowid(db_);
}
int Database::Changes() const { return sqlite3_changes(db_); }

Statement::~Statement() { sqlite3_finalize(stmt_); }

Statement& Statement::Bind(int index, int64_t value) {
  NoteBind(sqlite3_bind_int64(stmt_, index, value));
  return *this;
}

Statement& Statement::Bind(int index, absl::string_view text) {
  NoteBind(sqlite3_bind_text64(stmt_, index, text.data(), text.size(),
                               SQLITE_TRANSIENT, SQLITE_UTF8));
  return *this;
}

Statement& Statement::BindBlob(int index, absl::string_view bytes) {
  if (bytes.empty()) {
    // A null pointer would bind NULL; an empty value is a zero-length blob.
    NoteBind(sqlite3_bind_zeroblob(stmt_, index, 0));
    return *this;
  }
  NoteBind(sqlite3_bind_blob64(stmt_, index, bytes.data(), bytes.size(),
                               SQLITE_TRANSIENT));
  return *this;
}

Statement& Statement::BindNull(int index) {
  NoteBind(sqlite3_bind_null(stmt_, index));
  return *this;
}

absl::StatusOr<bool> Statement::Step() {
  if (bind_rc_ != SQLITE_OK) {
    std::string msg =
        absl::StrCat("sqlite: binding a value of ", sqlite3_sql(stmt_), ": ",
                     sqlite3_errstr(bind_rc_));
    if (bind_rc_ == SQLITE_TOOBIG || bind_rc_ == SQLITE_RANGE) {
      return absl::InvalidArgumentError(msg);
    }
    return absl::InternalError(msg);
  }
  int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return db_->Error(absl::StrCat("sqlite: ", sqlite3_sql(stmt_)));
}

absl::Status Statement::Run() {
  auto row = Step();
  if (!row.ok()) return row.status();
  return absl::OkStatus();
}

void Statement::Reset() {
  bind_rc_ = SQLITE_OK;
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

int64_t Statement::Int(int col) const {
  return sqlite3_column_int64(stmt_, col);
}

std::string Statement::Text(int col) const {
  const unsigned char* text = sqlite3_column_text(stmt_, col);
  if (text == nullptr) return "";
  return std::string(reinterpret_cast<const char*>(text),
                     static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
}

absl::string_view Statement::Blob(int col) const {
  const void* data = sqlite3_column_blob(stmt_, col);
  if (data == nullptr) return {};
  return absl::string_view(
      static_cast<const char*>(data),
      static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
}

bool Statement::IsNull(int col) const {
  return sqlite3_column_type(stmt_, col) == SQLITE_NULL;
}

Transaction::Transaction(Database* db) : db_(db) {
  begin_ = db_->Exec("BEGIN IMMEDIATE");
  if (!begin_.ok()) done_ = true;
}

Transaction::~Transaction() {
  if (!done_) (void)db_->Exec("ROLLBACK");
}

absl::Status Transaction::Commit() {
  if (done_)
    return begin_.ok() ? absl::FailedPreconditionError("committed twice")
                       : begin_;
  done_ = true;
  absl::Status s = db_->Exec("COMMIT");
  if (!s.ok()) {
    (void)db_->Exec("ROLLBACK");
    return s;
  }
  db_->CheckpointIfRoom();
  return s;
}

bool IsStoreFailure(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return false;
    default:
      return true;
  }
}

Savepoint::Savepoint(Database* db) : db_(db) {
  begin_ = db_->Exec("SAVEPOINT message");
  if (!begin_.ok()) done_ = true;
}

Savepoint::~Savepoint() {
  if (!done_) (void)Undo();
}

absl::Status Savepoint::Release() {
  if (done_) return begin_;
  done_ = true;
  return db_->Exec("RELEASE message");
}

absl::Status Savepoint::Undo() {
  if (done_) return begin_;
  done_ = true;
  absl::Status s = db_->Exec("ROLLBACK TO message");
  if (!s.ok()) return s;
  return db_->Exec("RELEASE message");
}

}  // namespace dlbatch::scheduler
