// Status helpers shared by every component: propagation macros and the one
// mapping between absl::Status and grpc::Status.
#ifndef DLBATCH_COMMON_STATUS_H_
#define DLBATCH_COMMON_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#define DLBATCH_CONCAT_INNER_(a, b) a##b
#define DLBATCH_CONCAT_(a, b) DLBATCH_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)          \
  do {                                 \
    ::absl::Status _status = (expr);   \
    if (!_status.ok()) return _status; \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(DLBATCH_CONCAT_(_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(var, lhs, expr) \
  auto var = (expr);                           \
  if (!var.ok()) return var.status();          \
  lhs = std::move(var).value()

namespace dlbatch {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Prefixes a status's message with context ("uploading outputs: ...").
absl::Status Annotate(const absl::Status& status, absl::string_view context);

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_STATUS_H_
