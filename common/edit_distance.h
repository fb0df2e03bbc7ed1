// How far apart two words are, for "did you mean" on an unknown key or
// command.
#ifndef DLBATCH_COMMON_EDIT_DISTANCE_H_
#define DLBATCH_COMMON_EDIT_DISTANCE_H_

#include <cstddef>
#include <string_view>

namespace dlbatch {

// Edits that turn `a` into `b`: inserting, deleting or replacing a
// character (Levenshtein), and, with `swap_is_one_edit`, swapping two
// neighbours as one edit ("jbos" is one from "jobs").
size_t EditDistance(std::string_view a, std::string_view b,
                    bool swap_is_one_edit = false);

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_EDIT_DISTANCE_H_
