// LogdirLease: the writer lease on a logdir. See logdir_lease.h.
#include "longhaul/supervisor/logdir_lease.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <utility>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "longhaul/base/crc32c.h"
#include "longhaul/base/file.h"
#include "longhaul/base/log.h"

namespace longhaul::supervisor {
namespace {

using SteadyClock = std::chrono::steady_clock;

// Records are padded to this size and written with one pwrite at offset 0, so a rewrite never
// leaves the tail of a longer record behind.
constexpr size_t kRecordBytes = 384;

double wall_now() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::string boot_id() {
  try {
    std::string id = file::read_file("/proc/sys/kernel/random/boot_id", 4096);
    while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
    return id;
  } catch (const Error&) {
    return "unknown";
  }
}

std::string this_host() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

std::string me() {
  return "host " + this_host() + ", pid " + std::to_string(::getpid()) + ", boot_id " + boot_id() +
         ", since " + std::to_string(static_cast<int64_t>(::time(nullptr)));
}

std::string secs(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string body_of(const LeaseRecord& r) {
  char renewed[64];
  std::snprintf(renewed, sizeof renewed, "%.3f", r.renewed);
  char lease[64];
  std::snprintf(lease, sizeof lease, "%g", r.lease_secs);
  return "holder: " + r.holder + "\ngeneration: " + std::to_string(r.generation) +
         "\nrenewed: " + renewed + "\nlease_secs: " + lease + "\n";
}

// Reads what `fd` holds (at most a few KiB). Empty on errors.
std::string read_fd(int fd) {
  std::string out(4096, '\0');
  const ssize_t n = ::pread(fd, out.data(), out.size(), 0);
  out.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return out;
}

// The record in `fd`, read again a few times when it was caught in the middle of a rewrite.
std::optional<LeaseRecord> read_record(int fd) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    if (auto r = LeaseRecord::parse(read_fd(fd))) return r;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a rewrite takes microseconds
  }
  return std::nullopt;
}

// For messages: the holder named in the lock file at `fd` (a record or an older single line).
std::string describe_holder(int fd) {
  if (auto r = read_record(fd)) {
    return r->holder + ", generation " + std::to_string(r->generation);
  }
  std::string text = read_fd(fd);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text.empty() ? std::string("holder unknown") : text;
}

// Retries the acquisition flock for a short while: it is held only while someone acquires.
bool lock_briefly(int fd) {
  const auto deadline = SteadyClock::now() + std::chrono::seconds(5);
  while (true) {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return true;
    if (errno != EWOULDBLOCK && errno != EINTR) return false;
    if (SteadyClock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void write_record(int fd, const LeaseRecord& r, const std::filesystem::path& path) {
  const std::string text = r.to_text();
  const ssize_t n = ::pwrite(fd, text.data(), text.size(), 0);
  if (n != static_cast<ssize_t>(text.size())) {
    throw_errno("cannot write the logdir lock", path.string(), n < 0 ? errno : EIO);
  }
  if (::fdatasync(fd) != 0) throw_errno("cannot sync the logdir lock", path.string(), errno);
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  int release() { return std::exchange(fd, -1); }
};

}  // namespace

std::string LeaseRecord::to_text() const {
  const std::string body = body_of(*this);
  char crc[32];
  std::snprintf(crc, sizeof crc, "crc32c: %08" PRIx32 "\n", crc32c::value(body));
  std::string text = body + crc;
  if (text.size() < kRecordBytes) text.append(kRecordBytes - text.size() - 1, ' ').append("\n");
  return text;
}

std::optional<LeaseRecord> LeaseRecord::parse(std::string_view text) {
  const size_t crc_at = text.find("crc32c: ");
  if (crc_at == std::string_view::npos || !text.starts_with("holder: ")) return std::nullopt;
  const std::string_view body = text.substr(0, crc_at);
  uint32_t crc = 0;
  if (std::sscanf(std::string(text.substr(crc_at)).c_str(), "crc32c: %" SCNx32, &crc) != 1 ||
      crc != crc32c::value(body)) {
    return std::nullopt;
  }
  LeaseRecord r;
  bool generation = false, renewed = false, lease = false;
  size_t at = 0;
  while (at < body.size()) {
    size_t end = body.find('\n', at);
    if (end == std::string_view::npos) end = body.size();
    const std::string line(body.substr(at, end - at));
    at = end + 1;
    if (line.starts_with("holder: ")) {
      r.holder = line.substr(8);
    } else if (std::sscanf(line.c_str(), "generation: %" SCNd64, &r.generation) == 1) {
      generation = true;
    } else if (std::sscanf(line.c_str(), "renewed: %lf", &r.renewed) == 1) {
      renewed = true;
    } else if (std::sscanf(line.c_str(), "lease_secs: %lf", &r.lease_secs) == 1) {
      lease = true;
    }
  }
  if (!generation || !renewed || !lease) return std::nullopt;
  return r;
}

std::unique_ptr<LogdirLease> LogdirLease::acquire(const LeaseOptions& options, LostCallback on_lost,
                                                  const std::function<bool()>& cancelled) {
  LeaseWatch watch;
  while (true) {
    if (auto lease = try_acquire(options, on_lost, watch)) return lease;
    if (cancelled && cancelled()) {
      throw Cancelled("stop requested while waiting for the writer lock " + options.path.string());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the next look at the record
  }
}

std::unique_ptr<LogdirLease> LogdirLease::try_acquire(const LeaseOptions& options,
                                                      LostCallback on_lost, LeaseWatch& watch) {
  if (!(options.lease_secs >= 0) || !(options.heartbeat_secs >= 0)) {
    throw InvalidArgument("supervisor lock_lease_secs and its heartbeat must be >= 0, got " +
                          secs(options.lease_secs) + " and " + secs(options.heartbeat_secs));
  }
  const std::filesystem::path& path = options.path;
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : ".";

  // 1. One acquirer at a time (held for milliseconds): two contenders never both take over.
  Fd guard;
  const std::string guard_path = path.string() + ".acquire";
  guard.fd = ::open(guard_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (guard.fd < 0) throw_errno("cannot open the logdir lock", guard_path, errno);
  if (!lock_briefly(guard.fd)) {
    throw LogdirBusy("logdir " + dir.string() +
                     " is in use: another process has been taking its writer lock " + guard_path +
                     " for 5 s. Stop that process, or give this run another "
                     "--logdir");
  }
  // Temp files of an acquirer that died between its write and its rename.
  std::error_code ec;
  const std::string temp_prefix = path.filename().string() + ".tmp.";
  for (const auto& de : std::filesystem::directory_iterator(dir, ec)) {
    if (de.path().filename().string().starts_with(temp_prefix)) {
      std::filesystem::remove(de.path(), ec);
    }
  }

  // 2. The current lock file, if any: free, stale, or held.
  Fd old;
  old.fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (old.fd < 0 && errno != ENOENT)
    throw_errno("cannot open the logdir lock", path.string(), errno);
  int64_t generation = 0;
  if (old.fd >= 0) {
    const std::optional<LeaseRecord> previous = read_record(old.fd);
    if (previous) generation = previous->generation;
    if (::flock(old.fd, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK) throw_errno("cannot lock the logdir", path.string(), errno);
      // Held. Stale when its holder (by the lease it advertises) has not renewed for a whole
      // lease: by the record's time, or unchanged for that long as watched from here (immune to
      // clock skew, as Kubernetes' leader election judges a Lease).
      const auto now = SteadyClock::now();
      const double age = previous ? wall_now() - previous->renewed : 0;
      const bool renewed_since_watched =
          previous && watch.seen &&
          (watch.generation != previous->generation || watch.renewed != previous->renewed);
      const double unchanged_for = previous && watch.seen && !renewed_since_watched
                                       ? std::chrono::duration<double>(now - watch.since).count()
                                       : 0;
      const bool can_go_stale = previous && previous->lease_secs > 0;
      const bool stale =
          can_go_stale && (age > previous->lease_secs || unchanged_for > previous->lease_secs);
      if (!stale) {
        if (can_go_stale && !renewed_since_watched) {
          if (!watch.seen) {
            watch.seen = true;
            watch.generation = previous->generation;
            watch.renewed = previous->renewed;
            watch.since = now;
          }
          return nullptr;  // undecided: look again
        }
        std::string renewed;
        if (previous) {
          char buf[128];
          std::snprintf(buf, sizeof buf, "; it renewed its lease %.1f s ago (lease %g s)",
                        std::max(age, 0.0), previous->lease_secs);
          renewed = buf;
        }
        throw LogdirBusy("logdir " + dir.string() + " is in use by another training process (" +
                         describe_holder(old.fd) + renewed +
                         "); two writers would overwrite each other's checkpoints. Stop that "
                         "process, or give this run another --logdir");
      }
      LH_LOG(WARNING) << "taking over the logdir lock: its holder stopped renewing its lease "
                         "(frozen, cut off by a partition, or its node is gone)"
                      << kv("lock", path.string()) << kv("previous_holder", previous->holder)
                      << kv("previous_generation", previous->generation)
                      << kv("renewed_secs_ago", age) << kv("watched_unchanged_secs", unchanged_for)
                      << kv("lease_secs", previous->lease_secs);
    }
  }

  // 3. A new lock file, renamed over the path: the old holder's descriptor (if it still lives)
  // names an unlinked inode from now on.
  static std::atomic<int> counter{0};
  const std::filesystem::path temp =
      dir / (temp_prefix + std::to_string(::getpid()) + "." + std::to_string(counter++));
  Fd fresh;
  fresh.fd = ::open(temp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fresh.fd < 0) throw_errno("cannot create the logdir lock", temp.string(), errno);
  if (::flock(fresh.fd, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    ::unlink(temp.c_str());
    throw_errno("cannot lock the new logdir lock", temp.string(), e);
  }
  LeaseRecord record;
  record.holder = me();
  record.generation = generation + 1;
  record.renewed = wall_now();
  record.lease_secs = options.lease_secs;
  try {
    write_record(fresh.fd, record, temp);
  } catch (...) {
    ::unlink(temp.c_str());
    throw;
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(temp.c_str());
    throw_errno("cannot rename the new logdir lock over", path.string(), e);
  }
  file::fsync_directory(dir);
  return std::unique_ptr<LogdirLease>(
      new LogdirLease(options, std::move(on_lost), fresh.release(), std::move(record)));
  // `old` closes here, releasing the old inode's flock if it was free; `guard` likewise.
}

LogdirLease::LogdirLease(LeaseOptions options, LostCallback on_lost, int fd, LeaseRecord record)
    : options_(std::move(options)),
      on_lost_(std::move(on_lost)),
      fd_(fd),
      generation_(record.generation),
      holder_(record.holder) {
  struct stat st {};
  if (::fstat(fd_, &st) == 0) {
    dev_ = st.st_dev;
    ino_ = st.st_ino;
  }
  {
    MutexLock lock(mu_);
    record_ = std::move(record);
    last_renewed_ = SteadyClock::now();
  }
  heartbeat_ = std::thread([this] { heartbeat_loop(); });
}

LogdirLease::~LogdirLease() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  ::close(fd_);  // releases the flock
}

bool LogdirLease::lost() const {
  MutexLock lock(mu_);
  return lost_ != nullptr;
}

void LogdirLease::check_held() {
  std::exception_ptr error;
  {
    MutexLock lock(mu_);
    error = lost_ ? lost_ : verify(/*renew=*/false);
  }
  if (error) {
    report_lost(error);
    std::rethrow_exception(error);
  }
}

std::exception_ptr LogdirLease::verify(bool renew) {
  if (lost_) return lost_;
  const auto started = SteadyClock::now();
  std::string why;
  int e = 0;
  // Opened afresh, not stat'ed: NFS revalidates a file's attributes on open (close-to-open).
  Fd current;
  current.fd = ::open(options_.path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  struct stat st {};
  if (current.fd < 0) {
    e = errno;
  } else if (::fstat(current.fd, &st) != 0) {
    e = errno;
  } else if (st.st_dev != dev_ || st.st_ino != ino_) {
    why = "another process took the logdir lock over (" + describe_holder(current.fd) +
          "): this one did not renew its lease for longer than lock_lease_secs=" +
          secs(options_.lease_secs) + " s (frozen, cut off from the shared filesystem, or stalled)";
  }
  if (e == ENOENT) {
    why = "the logdir lock " + options_.path.string() + " was removed";
    e = 0;
  }
  if (why.empty() && e == 0 && renew) {
    record_.renewed = wall_now();
    try {
      write_record(fd_, record_, options_.path);
    } catch (const Error& err) {
      why.clear();
      e = EIO;
      LH_LOG(WARNING) << "cannot renew the logdir lease; retrying" << kv("error", err.what());
    }
  }
  if (why.empty() && e == 0) {
    if (renew) last_renewed_ = started;
    return nullptr;
  }
  if (why.empty()) {
    // The lock cannot be checked (the shared filesystem is unreachable): still ours while no
    // contender can have judged it stale.
    const double since = std::chrono::duration<double>(started - last_renewed_).count();
    if (options_.lease_secs <= 0 || since < options_.lease_secs) {
      if (e != EIO) {
        LH_LOG(WARNING) << "cannot check the logdir lock; retrying"
                        << kv("lock", options_.path.string()) << kv("errno", e);
      }
      if (!renew) {
        // A commit must not go ahead unverified; the caller's write fails instead.
        return std::make_exception_ptr(Unavailable(errno_message(
            "cannot check the logdir lock before a commit", options_.path.string(), e)));
      }
      return nullptr;
    }
    why = "its lease could not be renewed for " + secs(since) +
          " s, longer than lock_lease_secs=" + secs(options_.lease_secs) +
          " (the logdir is unreachable); another process may have taken it over";
  }
  lost_ = std::make_exception_ptr(LeaseLost(
      "lost the writer lock of logdir " + options_.path.parent_path().string() + " (generation " +
      std::to_string(generation_) + "): " + why +
      ". Stopped without writing anything more to the logdir; the newer writer's checkpoints "
      "and state file stand"));
  return lost_;
}

void LogdirLease::report_lost(std::exception_ptr error) {
  {
    MutexLock lock(mu_);
    if (reported_ || error != lost_) return;  // Unavailable is the caller's, not a loss
    reported_ = true;
  }
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    LH_LOG(ERROR) << "lost the logdir lock; stopping without writing anything more"
                  << kv("error", e.what());
  }
  if (on_lost_) on_lost_(error);
}

void LogdirLease::heartbeat_loop() {
  double interval = options_.heartbeat_secs;
  if (interval <= 0) interval = options_.lease_secs > 0 ? options_.lease_secs / 6 : 5;
  const auto period =
      std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(interval));
  auto next = SteadyClock::now() + period;
  while (true) {
    std::exception_ptr error;
    {
      MutexLock lock(mu_);
      wake_.wait_until(mu_, next, [&]() REQUIRES(mu_) { return stopping_; });
      if (stopping_) return;
      next = SteadyClock::now() + period;
      if (lost_) continue;
      error = verify(/*renew=*/true);
    }
    if (error) report_lost(error);
  }
}

}  // namespace longhaul::supervisor
