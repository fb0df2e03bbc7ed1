// How far apart two words are, for "did you mean" on an unknown key or
// command.
#ifndef DLBATCH_COMMON_EDIT_DISTANCE_H_
#define DLBATCH_COMMON_EDIT_DISTANCE_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/string_view.h"

namespace dlbatch {

// Edits that turn `a` into `b`: inserting, deleting or replacing a
// character (Levenshtein), and, with `swap_is_one_edit`, swapping two
// neighbours as one edit ("jbos" is one from "jobs").
size_t EditDistance(std::string_view a, std::string_view b,
                    bool swap_is_one_edit = false);

// " (did you mean 'K'?)" for the word K of `known` fewest edits from `word`
// (the first of equals), within two; "" where none is.
std::string DidYouMean(absl::string_view word,
                       const std::vector<absl::string_view>& known);

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_EDIT_DISTANCE_H_
