// The store's diary lines: their numbers in their job's diary and their
// endings (version 10).
#include "common/status.h"
#include "scheduler/store/store.h"

namespace dlbatch::scheduler {

absl::Status AddDiaryLineColumns(Database* db) {
  ASSIGN_OR_RETURN(Statement * columns,
                   db->Prepare("SELECT 1 FROM pragma_table_info('diary') "
                               "WHERE name='line'"));
  ASSIGN_OR_RETURN(bool present, columns->Step());
  columns->Reset();
  if (present) return absl::OkStatus();
  // Lines stored before had their newline dropped (ending 0 says so) and no
  // number: they are numbered in their order, once, in the migration's
  // transaction (one pass over the table, however many jobs it holds).
  return db->Exec(R"sql(
ALTER TABLE diary ADD COLUMN line INTEGER;
ALTER TABLE diary ADD COLUMN ending INTEGER NOT NULL DEFAULT 0;
UPDATE diary SET line = numbered.line
  FROM (SELECT n, ROW_NUMBER() OVER (PARTITION BY job_id ORDER BY n) AS line
        FROM diary) AS numbered
  WHERE diary.n = numbered.n;
)sql");
}

}  // namespace dlbatch::scheduler
