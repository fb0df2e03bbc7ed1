#include "common/edit_distance.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dlbatch {

size_t EditDistance(std::string_view a, std::string_view b,
                    bool swap_is_one_edit) {
  std::vector<std::vector<size_t>> d(a.size() + 1,
                                     std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] =
          std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (swap_is_one_edit && i > 1 && j > 1 && a[i - 1] == b[j - 2] &&
          a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

std::string DidYouMean(absl::string_view word,
                       const std::vector<absl::string_view>& known) {
  absl::string_view closest;
  size_t best = 3;  // suggest only within two edits
  for (absl::string_view k : known) {
    const size_t d =
        EditDistance({word.data(), word.size()}, {k.data(), k.size()});
    if (d < best) best = d, closest = k;
  }
  return closest.empty() ? ""
                         : absl::StrCat(" (did you mean '", closest, "'?)");
}

}  // namespace dlbatch
