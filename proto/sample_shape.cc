#include "proto/sample_shape.h"

#include "absl/strings/str_cat.h"

namespace dlbatch {

std::string SampleShape::ToString() const {
  return absl::StrCat("[", h, ", ", w, ", ", c, "]");
}

}  // namespace dlbatch
