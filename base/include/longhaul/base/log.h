// Structured, leveled logging to stderr: one line per record,
//   2026-11-21T13:20:39.123Z INFO  checkpoint saved step=1200 path="runs/x/model.ckpt-1200..."
// or, with LONGHAUL_LOG_FORMAT=json, one JSON object per line (for log collectors in a cluster).
//
// Usage:
//   LH_LOG(INFO) << "checkpoint saved" << kv("step", step) << kv("path", path);
//
// Thread-safety: every record is formatted into a local buffer and written with one write(2),
// so lines from different threads never interleave. The level is read atomically.
#pragma once

#include <atomic>
#include <sstream>
#include <string>
#include <string_view>

namespace longhaul::log {

enum class Level { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Records below this level are dropped. Initialised from LONGHAUL_LOG_LEVEL
// (debug|info|warning|error), default info.
void set_level(Level level);
Level level();
bool enabled(Level level);

// A key=value field of a record. Strings are quoted in text format.
struct Field {
  std::string key;
  std::string value;
  bool quoted;
};
template <typename T>
Field kv(std::string_view key, const T& value) {
  std::ostringstream os;
  os << value;
  return Field{std::string(key), os.str(), false};
}
Field kv(std::string_view key, const std::string& value);
Field kv(std::string_view key, std::string_view value);
Field kv(std::string_view key, const char* value);

class Record {
 public:
  Record(Level level, const char* file, int line);
  ~Record();  // writes the record
  Record(const Record&) = delete;
  Record& operator=(const Record&) = delete;

  Record& operator<<(const Field& field);
  template <typename T>
  Record& operator<<(const T& message_part) {
    message_ << message_part;
    return *this;
  }

 private:
  Level level_;
  const char* file_;
  int line_;
  std::ostringstream message_;
  std::string fields_text_;
  std::string fields_json_;
};

}  // namespace longhaul::log

namespace longhaul {
using log::kv;
}

#define LH_LOG(severity)                                         \
  if (!::longhaul::log::enabled(::longhaul::log::k##severity)) { \
  } else                                                         \
    ::longhaul::log::Record(::longhaul::log::k##severity, __FILE__, __LINE__)

// Severities usable with LH_LOG: DEBUG, INFO, WARNING, ERROR.
namespace longhaul::log {
inline constexpr Level kDEBUG = Level::kDebug;
inline constexpr Level kINFO = Level::kInfo;
inline constexpr Level kWARNING = Level::kWarning;
inline constexpr Level kERROR = Level::kError;
}  // namespace longhaul::log
