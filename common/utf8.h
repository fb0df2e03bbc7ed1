// UTF-8 as every printer of untrusted text needs it: where a valid
// sequence starts and ends, and text made valid for JSON and HTML.
#ifndef DLBATCH_COMMON_UTF8_H_
#define DLBATCH_COMMON_UTF8_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace dlbatch {

// The length of the valid UTF-8 sequence at the start of `s`, 0 if it does
// not start with one (RFC 3629: no overlong forms, no surrogates, nothing
// past U+10FFFF).
size_t Utf8SequenceLength(std::string_view s);

// `bytes` as valid UTF-8, each byte that is not part of valid UTF-8
// replaced by U+FFFD; exactly `bytes` when they are valid UTF-8.
std::string ValidUtf8(std::string_view bytes);

}  // namespace dlbatch

#endif  // DLBATCH_COMMON_UTF8_H_
