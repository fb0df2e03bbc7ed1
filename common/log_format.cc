#include "common/log_format.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <ctime>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace dlbatch {
namespace {

// Length of the valid UTF-8 sequence at text[i], or 0.
size_t Utf8Length(const std::string& text, size_t i) {
  const auto b = static_cast<unsigned char>(text[i]);
  size_t n = b >= 0xF0 && b <= 0xF4 ? 4 : b >= 0xE0 ? 3 : b >= 0xC2 ? 2 : 0;
  if (b >= 0xF8 || n == 0 || i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) return 0;
  }
  return n;
}

// Control characters as \n, \t or \xNN; the rest as it is. One line.
std::string TextEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7F) {
      out += absl::StrFormat("\\x%02x", u);
    } else {
      out += c;
    }
  }
  return out;
}

std::string Level(spdlog::level::level_enum level) {
  auto name = spdlog::level::to_string_view(level);
  return std::string(name.data(), name.size());
}

// "2026-11-25 14:02:03.004" in local time, or "2026-11-25T14:02:03.004"
// in UTC (the caller adds the zone).
std::string Stamp(std::chrono::system_clock::time_point time, bool utc) {
  const auto t = std::chrono::system_clock::to_time_t(time);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      time.time_since_epoch())
                      .count() %
                  1000;
  std::tm tm;
  if (utc) {
    ::gmtime_r(&t, &tm);
  } else {
    ::localtime_r(&t, &tm);
  }
  char when[32];
  std::strftime(when, sizeof(when),
                utc ? "%Y-%m-%dT%H:%M:%S" : "%Y-%m-%d %H:%M:%S", &tm);
  return absl::StrFormat("%s.%03d", when, static_cast<int>(ms));
}

class TextFormatter : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg,
              spdlog::memory_buf_t& dest) override {
    std::string line = absl::StrFormat(
        "%s %s %s\n", Stamp(msg.time, /*utc=*/false), Level(msg.level),
        TextEscape(std::string_view(msg.payload.data(), msg.payload.size())));
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<TextFormatter>();
  }
};

class JsonFormatter : public spdlog::formatter {
 public:
  explicit JsonFormatter(std::string process)
      : process_(std::move(process)), pid_(::getpid()) {}
  void format(const spdlog::details::log_msg& msg,
              spdlog::memory_buf_t& dest) override {
    std::string line = absl::StrFormat(
        "{\"time\":\"%sZ\",\"level\":\"%s\",\"msg\":\"%s\","
        "\"process\":\"%s\",\"pid\":%d,\"tid\":%d}\n",
        Stamp(msg.time, /*utc=*/true), Level(msg.level),
        JsonEscape(std::string(msg.payload.data(), msg.payload.size())),
        JsonEscape(process_), pid_, static_cast<int>(msg.thread_id));
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>(process_);
  }

 private:
  const std::string process_;
  const int pid_;
};

}  // namespace

std::string JsonEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size() + 8);
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7F) {
      out += absl::StrFormat("\\u%04x", u);
    } else if (u >= 0x80) {
      const size_t n = Utf8Length(text, i);
      if (n == 0) {
        out += "\\ufffd";  // not UTF-8: the JSON stays valid
        ++i;
        continue;
      }
      out.append(text, i, n);
      i += n;
      continue;
    } else {
      out += c;
    }
    ++i;
  }
  return out;
}

absl::Status SetUpLogging(const std::string& format,
                          const std::string& process) {
  std::unique_ptr<spdlog::formatter> formatter;
  if (format == "text") {
    formatter = std::make_unique<TextFormatter>();
  } else if (format == "json") {
    formatter = std::make_unique<JsonFormatter>(process);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--log-format ", format, ": write text or json"));
  }
  auto logger = spdlog::stderr_color_mt(absl::StrCat(process, "-log"));
  logger->set_formatter(std::move(formatter));
  logger->set_level(spdlog::default_logger()->level());
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(std::move(logger));
  gpr_set_log_function(LogGrpcLine);
  return absl::OkStatus();
}

void LogGrpcLine(gpr_log_func_args* args) {
  // gRPC has already kept only what GRPC_VERBOSITY asks for (errors by
  // default), so its debug lines show too when they were asked for.
  const spdlog::level::level_enum level =
      args->severity == GPR_LOG_SEVERITY_ERROR ? spdlog::level::err
                                               : spdlog::level::info;
  const char* file = args->file != nullptr ? args->file : "";
  const char* slash = std::strrchr(file, '/');
  spdlog::log(level, "gRPC: {} ({}:{})",
              args->message != nullptr ? args->message : "",
              slash != nullptr ? slash + 1 : file, args->line);
}

}  // namespace dlbatch
