#include "longhaul/base/log.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include <unistd.h>

#include "longhaul/base/strings.h"

namespace longhaul::log {
namespace {

Level level_from_env() {
  const char* env = std::getenv("LONGHAUL_LOG_LEVEL");
  if (env == nullptr) return Level::kInfo;
  if (std::strcmp(env, "debug") == 0) return Level::kDebug;
  if (std::strcmp(env, "warning") == 0) return Level::kWarning;
  if (std::strcmp(env, "error") == 0) return Level::kError;
  return Level::kInfo;
}

std::atomic<int>& level_storage() {
  static std::atomic<int> value{static_cast<int>(level_from_env())};
  return value;
}

bool json_format() {
  static const bool json = [] {
    const char* env = std::getenv("LONGHAUL_LOG_FORMAT");
    return env != nullptr && std::strcmp(env, "json") == 0;
  }();
  return json;
}

const char* level_name(Level level) {
  switch (level) {
    case Level::kDebug:
      return "DEBUG";
    case Level::kInfo:
      return "INFO";
    case Level::kWarning:
      return "WARN";
    case Level::kError:
      return "ERROR";
  }
  return "INFO";
}

void append_json_string(std::string& out, std::string_view s) {
  append_quoted(out, s, ControlEscape::kJsonUnicode);
}

std::string timestamp() {
  auto now = std::chrono::system_clock::now();
  auto secs = std::chrono::system_clock::to_time_t(now);
  auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(millis));
  return buf;
}

}  // namespace

void set_level(Level level) { level_storage().store(static_cast<int>(level)); }
Level level() { return static_cast<Level>(level_storage().load(std::memory_order_relaxed)); }
bool enabled(Level l) {
  return static_cast<int>(l) >= level_storage().load(std::memory_order_relaxed);
}

Field kv(std::string_view key, const std::string& value) {
  return Field{std::string(key), value, true};
}
Field kv(std::string_view key, std::string_view value) {
  return Field{std::string(key), std::string(value), true};
}
Field kv(std::string_view key, const char* value) {
  return Field{std::string(key), std::string(value), true};
}

Record::Record(Level level, const char* file, int line) : level_(level), file_(file), line_(line) {}

Record& Record::operator<<(const Field& field) {
  fields_text_ += ' ';
  fields_text_ += field.key;
  fields_text_ += '=';
  if (field.quoted) {
    append_json_string(fields_text_, field.value);
  } else {
    fields_text_ += field.value;
  }
  fields_json_ += ',';
  append_json_string(fields_json_, field.key);
  fields_json_ += ':';
  append_json_string(fields_json_, field.value);
  return *this;
}

Record::~Record() {
  std::string line;
  if (json_format()) {
    line = "{\"ts\":\"" + timestamp() + "\",\"level\":\"" + level_name(level_) + "\",\"msg\":";
    append_json_string(line, message_.str());
    const char* base = std::strrchr(file_, '/');
    line += ",\"caller\":";
    append_json_string(line, std::string(base ? base + 1 : file_) + ":" + std::to_string(line_));
    line += fields_json_;
    line += "}\n";
  } else {
    line = timestamp();
    line += ' ';
    line += level_name(level_);
    line.append(6 - std::strlen(level_name(level_)), ' ');
    line += message_.str();
    line += fields_text_;
    line += '\n';
  }
  // One write(2) per record so concurrent records never interleave.
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n <= 0) break;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace longhaul::log
