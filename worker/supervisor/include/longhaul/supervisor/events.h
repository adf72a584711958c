// TensorBoard event files: EventsWriter appends Event records to a new
// `events.out.tfevents.<10-digit seconds>.<hostname>.<pid>.<n>` file in the logdir, EventsReader
// reads them back with every CRC checked (tests, `longhaul-worker inspect`).
//
// Record framing (TFRecord): uint64 little-endian length, masked CRC-32C of those 8 bytes, the
// serialised Event, masked CRC-32C of the Event bytes. The first record of every file is an
// Event with file_version "brain.Event:2". The Event proto is longhaul's own wire-compatible
// definition (worker/supervisor/proto/event.proto, namespace longhaul::tensorboard).
//
// Files: each EventsWriter creates a new file (O_EXCL; <n> is a per-process counter, bumped if
// the name exists) and never appends to an existing one, so a restarted job opens a new file.
//
// Flushing (documented choice): records are framed into an in-memory buffer; a background
// thread writes the buffer to the file every `flush_secs`, and flush()/close() write it at once.
// Every record added before flush() returns is in the file and readable. close() (or the
// destructor) flushes, fsyncs and joins the thread.
//
// Thread-safety: EventsWriter is internally locked; any thread may add records. EventsReader
// is used by one thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "longhaul/base/mutex.h"
#include "longhaul/supervisor/event.pb.h"

namespace longhaul::supervisor {

// The generated protobuf messages (Event, Summary, SessionLog, HistogramProto) are in
// longhaul::tensorboard; this alias makes them reachable as supervisor::tensorboard too.
namespace tensorboard = ::longhaul::tensorboard;

inline constexpr std::string_view kEventsFileVersion = "brain.Event:2";
inline constexpr std::string_view kEventsFilePrefix = "events.out.tfevents.";

// TFRecord framing of one record.
std::string frame_record(std::string_view data);

// TensorFlow's default histogram buckets: limits ±1e-12 * 1.1^k up to ±1e20, 0, and ±DBL_MAX.
// Fills `out` with min/max/num/sum/sum_squares and the non-empty buckets (runs of empty
// buckets collapsed into one, as TF's Histogram::EncodeToProto does).
void make_histogram(std::span<const double> values, tensorboard::HistogramProto& out);

class EventsWriter {
 public:
  struct Options {
    double flush_secs = 10;       // background flush interval; 0: only explicit flush()/close()
    std::string filename_suffix;  // appended to the file name (TF's filename_suffix)
  };

  // Creates the logdir if needed and a new events file holding the file_version record,
  // written to disk at once. Throws PermissionDenied / errno-mapped errors naming the file.
  explicit EventsWriter(const std::filesystem::path& logdir);
  EventsWriter(const std::filesystem::path& logdir, Options options);
  ~EventsWriter();  // close()
  EventsWriter(const EventsWriter&) = delete;
  EventsWriter& operator=(const EventsWriter&) = delete;

  // Appends an event; wall_time is set to now when it is 0.
  void write_event(tensorboard::Event event);
  void add_summary(const tensorboard::Summary& summary, int64_t step);
  void add_scalar(std::string_view tag, double value, int64_t step);
  void add_histogram(std::string_view tag, std::span<const double> values, int64_t step);
  void add_histogram(std::string_view tag, std::span<const float> values, int64_t step);
  // A text summary for TensorBoard's Text dashboard: a scalar DT_STRING tensor with
  // plugin_data {plugin_name: "text"} (what tf.summary.text writes). The dashboard renders it
  // as Markdown.
  void add_text(std::string_view tag, std::string_view text, int64_t step);
  void add_session_log(tensorboard::SessionLog::SessionStatus status, int64_t step,
                       std::string_view checkpoint_path = {}, std::string_view msg = {});

  // Writes buffered records to the file (no fsync). Throws on I/O errors naming the file.
  void flush() EXCLUDES(write_mu_, mu_);
  // flush + fsync + close; joins the flush thread. Later writes throw FailedPrecondition.
  void close() EXCLUDES(write_mu_, mu_);

  const std::filesystem::path& path() const { return path_; }
  uint64_t records_written() const;

 private:
  void write_out(std::string& pending) REQUIRES(write_mu_);
  void flush_loop();

  std::filesystem::path path_;
  Options options_;
  // Lock order: write_mu_ before mu_. mu_ is held only to append to or swap out the buffer, so
  // adding a record never waits for disk I/O; write_mu_ serialises the writes themselves.
  Mutex write_mu_;
  mutable Mutex mu_;
  CondVar cv_;
  int fd_ GUARDED_BY(write_mu_) = -1;
  std::string buffer_ GUARDED_BY(mu_);  // framed records not yet written
  bool closed_ GUARDED_BY(mu_) = false;
  uint64_t records_ GUARDED_BY(mu_) = 0;
  std::thread flusher_;
};

// Reads the records of one events file (any TFRecord file) and checks both CRCs of each.
class EventsReader {
 public:
  explicit EventsReader(const std::filesystem::path& path);  // reads the whole file
  // The next record's bytes, or nullopt at a clean end of file. Throws DataLoss naming the file
  // and offset for a bad length CRC, bad data CRC, or a truncated record.
  std::optional<std::string> next_record();
  // The next record parsed as an Event; DataLoss when it does not parse.
  std::optional<tensorboard::Event> next_event();
  // All events of a file.
  static std::vector<tensorboard::Event> read_all(const std::filesystem::path& path);

 private:
  std::filesystem::path path_;
  std::string contents_;
  size_t offset_ = 0;
};

// The events files in `logdir`, sorted by name (= creation time order).
std::vector<std::filesystem::path> list_events_files(const std::filesystem::path& logdir);

}  // namespace longhaul::supervisor
