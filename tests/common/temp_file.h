// A file under /tmp holding the given text, removed when the object goes:
// the configuration files the options tests read.
#ifndef DLBATCH_TESTS_COMMON_TEMP_FILE_H_
#define DLBATCH_TESTS_COMMON_TEMP_FILE_H_

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace dlbatch {

class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    char name[] = "/tmp/dlbatch-test-XXXXXX";
    const int fd = mkstemp(name);
    if (fd >= 0) ::close(fd);
    path_ = name;
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace dlbatch

#endif  // DLBATCH_TESTS_COMMON_TEMP_FILE_H_
