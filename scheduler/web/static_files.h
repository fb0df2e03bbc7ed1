// The dashboard's files (the front-end's build: index.html, login.html and
// assets/), served from one folder: never a listing, never a path outside
// it (no "..", no NUL, no symbolic link leading out), and where the folder
// lacks index.html a small page of our own that says the assets were not
// built. Also the parsing of a Range header, which the server applies to
// every file it sends.
#ifndef DLBATCH_SCHEDULER_WEB_STATIC_FILES_H_
#define DLBATCH_SCHEDULER_WEB_STATIC_FILES_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "scheduler/web/http_message.h"

namespace dlbatch::scheduler::web {

// SHARE/web, SHARE being ../share/dlbatch from this program's folder (the
// build tree and an installed package alike), as the worker finds its
// Python module.
std::string DefaultAssetsDir();

// The Content-Type of a file by its extension (application/octet-stream
// for one not known).
std::string ContentTypeFor(absl::string_view name);

class StaticFiles {
 public:
  explicit StaticFiles(std::string dir);

  // The single-page app's index.html, or the built-in page.
  HttpResponse Index() const;
  // login.html, or the built-in page.
  HttpResponse LoginPage() const;
  // The file `name` under assets/ ("app.js", "fonts/x.woff2"); 404 when it
  // is not a regular file inside the folder.
  HttpResponse Asset(absl::string_view name) const;
  const std::string& dir() const { return dir_; }

 private:
  // A file of the folder by its path inside it, or "" when `relative` is
  // unsafe or names no regular file there.
  std::string Resolve(absl::string_view relative) const;
  HttpResponse Page(const char* file) const;

  std::string dir_;       // as given
  std::string real_dir_;  // its canonical path; "" when it does not exist
};

// One byte range of a file of `size` bytes, as a Range header asks it.
struct ByteRange {
  enum Kind { kWhole, kPartial, kUnsatisfiable };
  Kind kind = kWhole;
  int64_t first = 0;
  int64_t last = 0;  // inclusive
};
// "bytes=a-b", "bytes=a-", "bytes=-n". An empty, malformed or multi-range
// header is kWhole (RFC 9110 lets a server ignore what it does not
// serve); a range that starts past the end is kUnsatisfiable.
ByteRange ParseRange(absl::string_view header, int64_t size);

}  // namespace dlbatch::scheduler::web

#endif  // DLBATCH_SCHEDULER_WEB_STATIC_FILES_H_
