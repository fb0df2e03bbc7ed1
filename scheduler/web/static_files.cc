#include "scheduler/web/static_files.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace dlbatch::scheduler::web {
namespace {

// What a browser gets where the front-end was not built. No script, no
// style from elsewhere: the CSP allows neither inline.
constexpr char kNotBuiltPage[] = R"(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>dlbatch</title></head>
<body><h1>dlbatch</h1>
<p>The dashboard's assets were not built, so this scheduler has no web pages
to show. Install nodejs and npm, then rebuild dlbatch (its build makes
share/dlbatch/web), or point dlbatch-scheduler at a built copy with
--web-assets DIR.</p>
<p>The REST API under /api/v1/ works without them.</p>
</body></html>
)";

std::string Canonical(const std::string& path) {
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) == nullptr) return "";
  return buf;
}

// Each part: letters, digits and . _ - only, not "." or "..": no
// traversal, no hidden file, nothing a shell or a header would read
// differently.
bool SafeRelative(absl::string_view relative) {
  if (relative.empty() || relative.size() > 512) return false;
  for (absl::string_view part : absl::StrSplit(relative, '/')) {
    if (part.empty() || part[0] == '.') return false;
    for (char c : part) {
      if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' &&
          c != '_' && c != '-') {
        return false;
      }
    }
  }
  return true;
}

}  // namespace

std::string DefaultAssetsDir() {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "share/dlbatch/web";
  return (self.parent_path().parent_path() / "share" / "dlbatch" / "web")
      .lexically_normal()
      .string();
}

std::string ContentTypeFor(absl::string_view name) {
  static const auto* const kTypes = new std::map<std::string, std::string>{
      {"html", "text/html; charset=utf-8"},
      {"js", "text/javascript; charset=utf-8"},
      {"mjs", "text/javascript; charset=utf-8"},
      {"css", "text/css; charset=utf-8"},
      {"svg", "image/svg+xml"},
      {"png", "image/png"},
      {"ico", "image/x-icon"},
      {"woff2", "font/woff2"},
      {"woff", "font/woff"},
      {"json", "application/json"},
      {"map", "application/json"},
      {"txt", "text/plain; charset=utf-8"},
  };
  size_t dot = name.rfind('.');
  if (dot == absl::string_view::npos) return "application/octet-stream";
  auto it = kTypes->find(absl::AsciiStrToLower(name.substr(dot + 1)));
  return it == kTypes->end() ? "application/octet-stream" : it->second;
}

StaticFiles::StaticFiles(std::string dir)
    : dir_(std::move(dir)), real_dir_(Canonical(dir_)) {}

std::string StaticFiles::Resolve(absl::string_view relative) const {
  if (real_dir_.empty() || !SafeRelative(relative)) return "";
  std::string real = Canonical(real_dir_ + "/" + std::string(relative));
  // A symbolic link may point anywhere; what it resolves to must still be
  // inside the folder.
  if (real.empty() || !absl::StartsWith(real, real_dir_ + "/")) return "";
  struct stat st;
  if (::stat(real.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return "";
  return real;
}

HttpResponse StaticFiles::Page(const char* file) const {
  HttpResponse r;
  r.content_type = "text/html; charset=utf-8";
  // Pages change with each build; assets carry their hash in their names.
  r.headers.emplace_back("Cache-Control", "no-cache");
  std::string path = Resolve(file);
  if (path.empty()) {
    r.body = kNotBuiltPage;
  } else {
    r.file_path = path;
  }
  return r;
}

HttpResponse StaticFiles::Index() const { return Page("index.html"); }
HttpResponse StaticFiles::LoginPage() const { return Page("login.html"); }

HttpResponse StaticFiles::Asset(absl::string_view name) const {
  std::string path = Resolve("assets/" + std::string(name));
  if (path.empty() || name.find('\0') != absl::string_view::npos) {
    return ErrorResponse(absl::NotFoundError("no such asset"));
  }
  HttpResponse r;
  r.content_type = ContentTypeFor(name);
  r.file_path = path;
  return r;
}

ByteRange ParseRange(absl::string_view header, int64_t size) {
  ByteRange whole;
  header = absl::StripAsciiWhitespace(header);
  if (!absl::ConsumePrefix(&header, "bytes=")) return whole;
  if (header.find(',') != absl::string_view::npos) return whole;
  size_t dash = header.find('-');
  if (dash == absl::string_view::npos) return whole;
  absl::string_view a = absl::StripAsciiWhitespace(header.substr(0, dash));
  absl::string_view b = absl::StripAsciiWhitespace(header.substr(dash + 1));
  auto digits = [](absl::string_view s) {
    return !s.empty() && s.size() <= 18 &&
           s.find_first_not_of("0123456789") == absl::string_view::npos;
  };
  ByteRange r;
  r.kind = ByteRange::kPartial;
  int64_t first = 0;
  int64_t last = 0;
  if (a.empty()) {
    // The last n bytes.
    if (!digits(b) || !absl::SimpleAtoi(b, &last)) return whole;
    if (last == 0) return ByteRange{ByteRange::kUnsatisfiable, 0, 0};
    if (size == 0) return ByteRange{ByteRange::kUnsatisfiable, 0, 0};
    r.first = std::max<int64_t>(0, size - last);
    r.last = size - 1;
    return r;
  }
  if (!digits(a) || !absl::SimpleAtoi(a, &first)) return whole;
  if (b.empty()) {
    last = size - 1;
  } else {
    if (!digits(b) || !absl::SimpleAtoi(b, &last)) return whole;
    if (last < first) return whole;
  }
  if (first >= size) return ByteRange{ByteRange::kUnsatisfiable, 0, 0};
  r.first = first;
  r.last = std::min(last, size - 1);
  return r;
}

}  // namespace dlbatch::scheduler::web
