#include "scheduler/store/backup.h"

#include <fcntl.h>
#include <grp.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status.h"
#include "scheduler/rpc/identity.h"
#include "scheduler/store/sqlite.h"
#include "scheduler/store/store.h"
#include "spdlog/spdlog.h"

namespace dlbatch::scheduler {
namespace {

constexpr size_t kBlock = 512;
// The state folder's files a restored scheduler needs beside its store:
// the first admin's token, and the TLS CA and server certificate (a new CA
// would make every client's and worker's CA file wrong).
constexpr const char* kKeyFiles[] = {"token", "ca.pem", "ca.key", "server.pem",
                                     "server.key"};

int64_t Padded(int64_t size) {
  return (size + static_cast<int64_t>(kBlock) - 1) /
         static_cast<int64_t>(kBlock) * static_cast<int64_t>(kBlock);
}

// Writes `value` as `width - 1` octal digits and a NUL.
void Octal(char* field, size_t width, uint64_t value) {
  for (size_t i = width - 1; i-- > 0;) {
    field[i] = static_cast<char>('0' + (value & 7));
    value >>= 3;
  }
  field[width - 1] = '\0';
}

void Text(char* field, size_t width, absl::string_view text) {
  std::memcpy(field, text.data(), std::min(width, text.size()));
}

std::string GroupName(gid_t gid) {
  long size = ::sysconf(_SC_GETGR_R_SIZE_MAX);
  std::vector<char> buf(size > 0 ? static_cast<size_t>(size) : 16384);
  struct group gr;
  struct group* found = nullptr;
  if (::getgrgid_r(gid, &gr, buf.data(), buf.size(), &found) == 0 &&
      found != nullptr && found->gr_name != nullptr) {
    return found->gr_name;
  }
  return absl::StrCat(gid);
}

absl::StatusOr<struct stat> StatFile(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, "stat", path);
  return st;
}

}  // namespace

absl::StatusOr<std::string> TarHeader(const BackupEntry& entry, uint32_t uid,
                                      uint32_t gid, absl::string_view owner,
                                      absl::string_view group) {
  std::string header(kBlock, '\0');
  char* h = header.data();
  // ustar keeps a long name as prefix + '/' + name.
  absl::string_view name = entry.name;
  absl::string_view prefix;
  if (name.size() > 100) {
    size_t cut = name.rfind('/', std::min<size_t>(name.size() - 1, 155));
    if (cut == absl::string_view::npos || name.size() - cut - 1 > 100 ||
        cut == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", entry.name, "' is too long a name for a tar archive"));
    }
    prefix = name.substr(0, cut);
    name = name.substr(cut + 1);
  }
  const bool folder = !entry.name.empty() && entry.name.back() == '/';
  Text(h, 100, name);
  Octal(h + 100, 8, entry.mode & 07777);
  Octal(h + 108, 8, uid & 07777777);
  Octal(h + 116, 8, gid & 07777777);
  const uint64_t size = folder ? 0 : static_cast<uint64_t>(entry.size);
  if (size < (uint64_t{1} << 33)) {
    Octal(h + 124, 12, size);
  } else {
    // Base-256: a leading 0x80, then the value big-endian.
    h[124] = static_cast<char>(0x80);
    uint64_t v = size;
    for (int i = 11; i >= 1; --i) {
      h[124 + i] = static_cast<char>(v & 0xff);
      v >>= 8;
    }
  }
  Octal(h + 136, 12, static_cast<uint64_t>(std::max<int64_t>(0, entry.mtime)));
  h[156] = folder ? '5' : '0';
  Text(h + 257, 6, absl::string_view("ustar\0", 6));
  Text(h + 263, 2, "00");
  Text(h + 265, 31, owner);
  Text(h + 297, 31, group);
  Octal(h + 329, 8, 0);
  Octal(h + 337, 8, 0);
  Text(h + 345, 155, prefix);
  // The checksum counts its own field as eight spaces.
  std::memset(h + 148, ' ', 8);
  uint32_t sum = 0;
  for (unsigned char c : header) sum += c;
  Octal(h + 148, 7, sum);
  h[155] = ' ';
  return header;
}

absl::StatusOr<std::unique_ptr<StagedBackup>> StagedBackup::Stage(
    const std::string& state_dir, const std::string& db_path,
    const BlobStore& blobs, const std::string& staging_dir,
    int64_t reserve_bytes) {
  // The database's copy is the one thing written here: it needs room.
  const int64_t db_bytes = StoreFileBytes(db_path);
  ASSIGN_OR_RETURN(const int64_t free_bytes, FreeBytesIn(state_dir));
  if (free_bytes - db_bytes < reserve_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "no room for the backup's copy of the database: it needs up to ",
        HumanBytes(db_bytes), " and ", HumanBytes(free_bytes), " is free in ",
        state_dir, " (", HumanBytes(reserve_bytes),
        " of it kept in reserve); free space there and try again"));
  }
  if (::mkdir(staging_dir.c_str(), 0700) != 0) {
    return ErrnoStatus(errno, "mkdir", staging_dir);
  }
  std::unique_ptr<StagedBackup> backup(new StagedBackup(staging_dir));
  RETURN_IF_ERROR(backup->CopyDatabase(db_path));
  RETURN_IF_ERROR(backup->LinkBlobs(blobs));
  RETURN_IF_ERROR(backup->CopyKeys(state_dir));
  return backup;
}

StagedBackup::~StagedBackup() {
  if (auto s = RemoveTree(staging_dir_); !s.ok()) {
    spdlog::warn("backup: {}", s.ToString());
  }
}

absl::Status StagedBackup::CopyDatabase(const std::string& db_path) {
  const std::string copy = staging_dir_ + "/dlbatch.db";
  std::vector<std::string> shas;  // the blobs the copy's jobs hold
  {
    ASSIGN_OR_RETURN(std::unique_ptr<Database> source,
                     Database::Open(db_path, /*read_only=*/true,
                                    /*sync_full=*/false));
    ASSIGN_OR_RETURN(std::unique_ptr<Database> target,
                     Database::Open(copy, /*read_only=*/false,
                                    /*sync_full=*/false));
    // One step of every page: a single read transaction on the source, so
    // the copy is one committed state; writers go on meanwhile (WAL).
    sqlite3_backup* b =
        sqlite3_backup_init(target->raw(), "main", source->raw(), "main");
    if (b == nullptr) return target->Error("backup of the store");
    int rc = SQLITE_OK;
    for (int tries = 0; tries < 100; ++tries) {
      rc = sqlite3_backup_step(b, -1);
      if (rc != SQLITE_BUSY && rc != SQLITE_LOCKED) break;
      sqlite3_sleep(50);
    }
    sqlite3_backup_finish(b);
    if (rc != SQLITE_DONE) {
      return absl::UnavailableError(
          absl::StrCat("backup of the store: ", sqlite3_errstr(rc),
                       " (copying into ", copy, ")"));
    }
    ASSIGN_OR_RETURN(Statement * count,
                     target->Prepare("SELECT COUNT(*) FROM jobs"));
    ASSIGN_OR_RETURN(bool row, count->Step());
    jobs_ = row ? count->Int(0) : 0;
    count->Reset();
    ASSIGN_OR_RETURN(
        Statement * held,
        target->Prepare("SELECT DISTINCT sha256 FROM job_blobs ORDER BY 1"));
    for (;;) {
      ASSIGN_OR_RETURN(bool more, held->Step());
      if (!more) break;
      shas.push_back(held->Text(0));
    }
    held->Reset();
    // Closing the copy folds its write-ahead log into the file.
  }
  ASSIGN_OR_RETURN(struct stat st, StatFile(copy));
  entries_.push_back({"dlbatch.db", copy, st.st_size, 0600, st.st_mtime});
  held_ = std::move(shas);
  return absl::OkStatus();
}

absl::Status StagedBackup::LinkBlobs(const BlobStore& blobs) {
  // Sorted by name, so each shard's folder entry comes before its files.
  const int64_t now = entries_.front().mtime;
  RETURN_IF_ERROR(MakeDirs(staging_dir_ + "/blobs", 0700));
  entries_.push_back({"blobs/", "", 0, 0700, now});
  std::string shard;
  for (const std::string& sha : held_) {
    if (!IsSha256Hex(sha)) continue;  // not a file of the blob store
    const std::string from = blobs.PathFor(sha);
    const std::string dir = staging_dir_ + "/blobs/" + sha.substr(0, 2);
    if (sha.substr(0, 2) != shard) {
      shard = sha.substr(0, 2);
      if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
        return ErrnoStatus(errno, "mkdir", dir);
      }
      entries_.push_back(
          {absl::StrCat("blobs/", shard, "/"), "", 0, 0700, now});
    }
    const std::string to = dir + "/" + sha;
    if (::link(from.c_str(), to.c_str()) != 0) {
      if (errno == ENOENT) {
        ++missing_blobs_;
        spdlog::warn("backup: stored file {} is held by a job but missing",
                     from);
        continue;
      }
      return ErrnoStatus(errno, "link", from);
    }
    ASSIGN_OR_RETURN(struct stat st, StatFile(to));
    entries_.push_back({absl::StrCat("blobs/", shard, "/", sha), to, st.st_size,
                        0600, st.st_mtime});
    ++blobs_;
  }
  return absl::OkStatus();
}

absl::Status StagedBackup::CopyKeys(const std::string& state_dir) {
  for (const char* name : kKeyFiles) {
    const std::string from = state_dir + "/" + name;
    absl::StatusOr<std::string> content = ReadFile(from);
    if (!content.ok()) {
      if (absl::IsNotFound(content.status())) continue;
      return content.status();
    }
    const std::string to = staging_dir_ + "/" + name;
    RETURN_IF_ERROR(WriteFileAtomic(to, *content, 0600));
    ASSIGN_OR_RETURN(struct stat st, StatFile(from));
    entries_.push_back({name, to, static_cast<int64_t>(content->size()),
                        static_cast<uint32_t>(st.st_mode & 0777), st.st_mtime});
  }
  return absl::OkStatus();
}

int64_t StagedBackup::archive_bytes() const {
  int64_t total = 2 * static_cast<int64_t>(kBlock);  // the end marker
  for (const BackupEntry& e : entries_) {
    total +=
        static_cast<int64_t>(kBlock) + (e.path.empty() ? 0 : Padded(e.size));
  }
  return total;
}

absl::Status StagedBackup::Send(
    const std::function<bool(absl::string_view)>& send,
    size_t piece_bytes) const {
  piece_bytes = std::max(kBlock, piece_bytes / kBlock * kBlock);
  const uint32_t uid = ::geteuid(), gid = ::getegid();
  const std::string owner = UserName(uid);
  const std::string group = GroupName(gid);
  std::string piece;
  piece.reserve(piece_bytes);
  auto flush = [&]() -> absl::Status {
    if (!piece.empty() && !send(piece)) {
      return absl::CancelledError("the receiver of the backup went away");
    }
    piece.clear();
    return absl::OkStatus();
  };
  for (const BackupEntry& e : entries_) {
    ASSIGN_OR_RETURN(std::string header, TarHeader(e, uid, gid, owner, group));
    if (piece.size() + header.size() > piece_bytes) RETURN_IF_ERROR(flush());
    piece += header;
    if (e.path.empty()) continue;
    UniqueFd fd(::open(e.path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) return ErrnoStatus(errno, "open", e.path);
    ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
    for (int64_t done = 0; done < e.size;) {
      if (piece.size() == piece_bytes) RETURN_IF_ERROR(flush());
      const size_t room = piece_bytes - piece.size();
      const size_t want =
          static_cast<size_t>(std::min<int64_t>(e.size - done, room));
      const size_t at = piece.size();
      piece.resize(at + want);
      ASSIGN_OR_RETURN(
          size_t n, PreadFull(fd.get(), piece.data() + at, want, done, e.path));
      if (n < want) {
        return absl::DataLossError(absl::StrCat(
            e.path, " shrank while being backed up: ", e.size, " bytes"));
      }
      done += static_cast<int64_t>(n);
    }
    const size_t pad = static_cast<size_t>(Padded(e.size) - e.size);
    if (piece.size() + pad > piece_bytes) RETURN_IF_ERROR(flush());
    piece.append(pad, '\0');
  }
  if (piece.size() + 2 * kBlock > piece_bytes) RETURN_IF_ERROR(flush());
  piece.append(2 * kBlock, '\0');
  return flush();
}

}  // namespace dlbatch::scheduler
