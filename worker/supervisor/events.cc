#include "longhaul/supervisor/events.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdio>

#include <fcntl.h>
#include <unistd.h>

#include "longhaul/base/crc32c.h"
#include "longhaul/base/error.h"
#include "longhaul/base/file.h"
#include "longhaul/base/log.h"

namespace longhaul::supervisor {
namespace {

std::atomic<int> file_counter{0};

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void put_u64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
void put_u32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

const std::vector<double>& default_bucket_limits() {
  static const std::vector<double> limits = [] {
    std::vector<double> pos;
    for (double v = 1e-12; v < 1e20; v *= 1.1) pos.push_back(v);
    pos.push_back(DBL_MAX);
    std::vector<double> all;
    all.reserve(2 * pos.size() + 1);
    for (auto it = pos.rbegin(); it != pos.rend(); ++it) all.push_back(-*it);
    all.push_back(0.0);
    all.insert(all.end(), pos.begin(), pos.end());
    return all;
  }();
  return limits;
}

std::string hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace

std::string frame_record(std::string_view data) {
  std::string out(12, '\0');
  put_u64(out.data(), data.size());
  put_u32(out.data() + 8, crc32c::mask(crc32c::value(out.data(), 8)));
  out.append(data);
  char crc[4];
  put_u32(crc, crc32c::mask(crc32c::value(data)));
  out.append(crc, 4);
  return out;
}

void make_histogram(std::span<const double> values, tensorboard::HistogramProto& out) {
  const auto& limits = default_bucket_limits();
  std::vector<double> counts(limits.size(), 0.0);
  double mn = DBL_MAX, mx = -DBL_MAX, sum = 0, sum_sq = 0;
  for (double v : values) {
    // bucket i holds limits[i-1] <= v < limits[i]
    size_t i =
        static_cast<size_t>(std::upper_bound(limits.begin(), limits.end(), v) - limits.begin());
    if (i >= limits.size()) i = limits.size() - 1;
    counts[i] += 1;
    mn = std::min(mn, v);
    mx = std::max(mx, v);
    sum += v;
    sum_sq += v * v;
  }
  out.Clear();
  out.set_min(mn);
  out.set_max(mx);
  out.set_num(static_cast<double>(values.size()));
  out.set_sum(sum);
  out.set_sum_squares(sum_sq);
  // TF's EncodeToProto(preserve_zero_buckets=false): a run of empty buckets becomes one bucket
  // with the run's last limit.
  for (size_t i = 0; i < counts.size();) {
    double end = limits[i];
    double count = counts[i];
    ++i;
    if (count == 0.0) {
      while (i < counts.size() && counts[i] == 0.0) {
        end = limits[i];
        count = counts[i];
        ++i;
      }
    }
    out.add_bucket_limit(end);
    out.add_bucket(count);
  }
}

EventsWriter::EventsWriter(const std::filesystem::path& logdir) : EventsWriter(logdir, Options{}) {}

EventsWriter::EventsWriter(const std::filesystem::path& logdir, Options options)
    : options_(std::move(options)) {
  file::ensure_writable_directory(logdir, "logdir");
  const double wall = now_seconds();
  const std::string host = hostname();
  while (true) {
    char name[512];
    std::snprintf(name, sizeof name, "%s%010lld.%s.%d.%d%s", kEventsFilePrefix.data(),
                  static_cast<long long>(wall), host.c_str(), static_cast<int>(::getpid()),
                  file_counter.fetch_add(1), options_.filename_suffix.c_str());
    path_ = logdir / name;
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ >= 0) break;
    if (errno != EEXIST) throw_errno("cannot create events file", path_.string(), errno);
  }
  tensorboard::Event first;
  first.set_wall_time(wall);
  first.set_file_version(std::string(kEventsFileVersion));
  write_event(std::move(first));
  flush();
  file::fsync_directory(logdir);
  LH_LOG(INFO) << "writing events" << kv("path", path_.string());
  if (options_.flush_secs > 0) flusher_ = std::thread([this] { flush_loop(); });
}

EventsWriter::~EventsWriter() {
  try {
    close();
  } catch (const std::exception& e) {
    LH_LOG(ERROR) << "closing events file failed" << kv("path", path_.string())
                  << kv("error", e.what());
  }
}

void EventsWriter::write_event(tensorboard::Event event) {
  if (event.wall_time() == 0) event.set_wall_time(now_seconds());
  std::string bytes = event.SerializeAsString();
  MutexLock lock(mu_);
  if (closed_) {
    throw FailedPrecondition("events file " + path_.string() + " is closed; cannot add events");
  }
  buffer_ += frame_record(bytes);
  ++records_;
}

void EventsWriter::add_summary(const tensorboard::Summary& summary, int64_t step) {
  tensorboard::Event e;
  e.set_step(step);
  *e.mutable_summary() = summary;
  write_event(std::move(e));
}

void EventsWriter::add_scalar(std::string_view tag, double value, int64_t step) {
  tensorboard::Event e;
  e.set_step(step);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(std::string(tag));
  v->set_simple_value(static_cast<float>(value));
  write_event(std::move(e));
}

void EventsWriter::add_text(std::string_view tag, std::string_view text, int64_t step) {
  tensorboard::Event e;
  e.set_step(step);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(std::string(tag));
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  auto* t = v->mutable_tensor();
  t->set_dtype(tensorboard::DT_STRING);
  t->mutable_tensor_shape();  // no dims: a scalar
  t->add_string_val(std::string(text));
  write_event(std::move(e));
}

void EventsWriter::add_histogram(std::string_view tag, std::span<const double> values,
                                 int64_t step) {
  tensorboard::Event e;
  e.set_step(step);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(std::string(tag));
  make_histogram(values, *v->mutable_histo());
  write_event(std::move(e));
}

void EventsWriter::add_histogram(std::string_view tag, std::span<const float> values,
                                 int64_t step) {
  std::vector<double> d(values.begin(), values.end());
  add_histogram(tag, std::span<const double>(d), step);
}

void EventsWriter::add_session_log(tensorboard::SessionLog::SessionStatus status, int64_t step,
                                   std::string_view checkpoint_path, std::string_view msg) {
  tensorboard::Event e;
  e.set_step(step);
  auto* s = e.mutable_session_log();
  s->set_status(status);
  if (!checkpoint_path.empty()) s->set_checkpoint_path(std::string(checkpoint_path));
  if (!msg.empty()) s->set_msg(std::string(msg));
  write_event(std::move(e));
}

// Writes `pending` to the file; on error keeps the unwritten part in `pending` and throws.
// Caller holds write_mu_.
void EventsWriter::write_out(std::string& pending) {
  size_t done = 0;
  while (done < pending.size()) {
    ssize_t n = ::write(fd_, pending.data() + done, pending.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      pending.erase(0, done);
      throw_errno("cannot write events file", path_.string(), e);
    }
    done += static_cast<size_t>(n);
  }
  pending.clear();
}

void EventsWriter::flush() {
  MutexLock write_lock(write_mu_);
  if (fd_ < 0) return;
  std::string pending;
  {
    MutexLock lock(mu_);
    pending.swap(buffer_);
  }
  try {
    write_out(pending);
  } catch (...) {
    // Put back what was not written, ahead of newer records, so a later flush retries it.
    MutexLock lock(mu_);
    buffer_.insert(0, pending);
    throw;
  }
}

void EventsWriter::flush_loop() {
  auto interval = std::chrono::duration<double>(options_.flush_secs);
  while (true) {
    {
      MutexLock lock(mu_);
      if (cv_.wait_for(mu_, interval, [&]() REQUIRES(mu_) { return closed_; })) return;
    }
    try {
      flush();
    } catch (const std::exception& e) {
      LH_LOG(ERROR) << "background flush of events failed" << kv("path", path_.string())
                    << kv("error", e.what());
    }
  }
}

void EventsWriter::close() {
  {
    MutexLock lock(mu_);
    if (closed_) return;
    closed_ = true;
  }
  cv_.notify_all();
  if (flusher_.joinable()) flusher_.join();
  MutexLock write_lock(write_mu_);
  if (fd_ < 0) return;
  std::string pending;
  {
    MutexLock lock(mu_);
    pending.swap(buffer_);
  }
  const int fd = fd_;
  auto close_fd = [&]() REQUIRES(write_mu_) {
    ::close(fd);
    fd_ = -1;
  };
  try {
    write_out(pending);
  } catch (...) {
    close_fd();
    throw;
  }
  if (::fsync(fd) != 0 && errno != EINVAL) {
    int e = errno;
    close_fd();
    throw_errno("cannot fsync events file", path_.string(), e);
  }
  close_fd();
}

uint64_t EventsWriter::records_written() const {
  MutexLock lock(mu_);
  return records_;
}

EventsReader::EventsReader(const std::filesystem::path& path)
    : path_(path), contents_(file::read_file(path)) {}

std::optional<std::string> EventsReader::next_record() {
  if (offset_ == contents_.size()) return std::nullopt;
  auto fail = [&](const std::string& what) -> DataLoss {
    return DataLoss("events file " + path_.string() + " is corrupt at offset " +
                    std::to_string(offset_) + ": " + what);
  };
  if (contents_.size() - offset_ < 12) throw fail("truncated record header");
  const char* p = contents_.data() + offset_;
  uint64_t len = get_u64(p);
  if (crc32c::unmask(get_u32(p + 8)) != crc32c::value(p, 8)) throw fail("length CRC mismatch");
  if (contents_.size() - offset_ - 12 < len + 4 || len > contents_.size()) {
    throw fail("truncated record (length " + std::to_string(len) + ")");
  }
  std::string data(p + 12, len);
  if (crc32c::unmask(get_u32(p + 12 + len)) != crc32c::value(data)) throw fail("data CRC mismatch");
  offset_ += 12 + len + 4;
  return data;
}

std::optional<tensorboard::Event> EventsReader::next_event() {
  size_t at = offset_;
  auto record = next_record();
  if (!record) return std::nullopt;
  tensorboard::Event e;
  if (!e.ParseFromString(*record)) {
    throw DataLoss("events file " + path_.string() + " holds a record at offset " +
                   std::to_string(at) + " that is not an Event");
  }
  return e;
}

std::vector<tensorboard::Event> EventsReader::read_all(const std::filesystem::path& path) {
  EventsReader r(path);
  std::vector<tensorboard::Event> out;
  while (auto e = r.next_event()) out.push_back(std::move(*e));
  return out;
}

std::vector<std::filesystem::path> list_events_files(const std::filesystem::path& logdir) {
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& de : std::filesystem::directory_iterator(logdir, ec)) {
    if (de.path().filename().string().starts_with(kEventsFilePrefix)) files.push_back(de.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace longhaul::supervisor
