// LogdirLease: one process at a time writes a logdir (checkpoints, the state file, events), as a
// lease on a plain filesystem, in the spirit of Kubernetes Leases and etcd leases.
//
// The lock file `<logdir>/.writer.lock` holds a short text record, rewritten in place:
//
//   holder: host <hostname>, pid <pid>, boot_id <id>, since <unix seconds>
//   generation: <n>            +1 at every acquisition of this logdir, never reused
//   renewed: <unix seconds>    the holder's last heartbeat, by its wall clock
//   lease_secs: <d>
//   crc32c: <hex>              of the lines above (a record read while it is rewritten is retried)
//
// Acquiring (acquire(); under `<lock>.acquire`, an flock held only while acquiring, so two
// contenders never both take over): the lock is free when an flock on the current lock file
// succeeds (its holder is gone: the kernel dropped the flock however the process died; this is
// immediate, as before leases) or when its holder has not renewed for the lease_secs its record
// advertises — by the record's time against this machine's clock, or as watched from here (the
// record unchanged for that long) — the holder is frozen, partitioned, or its node is gone while
// the shared filesystem still keeps its flock (NFS, CephFS). A contender that finds the lock held
// waits for a verdict: a renewal (refused within a heartbeat) or staleness (taken over). The new
// holder then writes a new lock file (temp file, flock, fsync, rename over the path, fsync the
// directory), so the old holder's descriptor names an unlinked inode from then on and anything it
// still writes to it is invisible. A stale holder is logged (WARNING, its record and how long ago
// it renewed). A live holder, or a record that cannot be read (another version's lock file), is
// LogdirBusy (an AlreadyExists) naming the holder. Clocks of the machines sharing a logdir must
// agree to well within lease_secs (NTP), as Kubernetes Leases assume.
//
// Holding: a heartbeat thread renews the record every heartbeat_secs (default lease_secs / 6)
// after checking that the path still names the inode this process holds. Losing it (the path
// names another inode: a newer holder took over; or no heartbeat could be written for a whole
// lease) is logged once at ERROR naming the new holder, marks the lease lost and calls `on_lost`
// with a LeaseLost error. lease_secs 0 disables takeovers: the lock is then free only when its
// holder's flock is released (the behaviour before leases); the heartbeat still checks.
//
// Fencing: check_held() verifies, at the instant it is called, that the path still names the
// inode this process holds (opened afresh: NFS revalidates its attributes on open) and throws
// LeaseLost otherwise. The checkpoint manager calls it just before each rename and deletion, so a
// holder that was taken over never replaces a newer holder's checkpoint or state file. What is
// left is the instant between that check and the rename: a holder frozen exactly there for a
// whole lease could still rename once (a filesystem cannot fence a rename by itself).
//
// Thread-safety: check_held(), lost(), generation() and holder() may be called from any thread;
// `on_lost` runs on the heartbeat thread or on the thread whose check_held() found the loss,
// at most once. The destructor stops and joins the heartbeat thread and closes the lock file
// (releasing the flock); the lock file itself stays, naming the last holder.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include <sys/types.h>

#include "longhaul/base/error.h"
#include "longhaul/base/mutex.h"

namespace longhaul::supervisor {

// This process no longer holds the logdir's writer lease: a newer holder took it over (this
// process was frozen, cut off or too slow to renew). Nothing more may be written to the logdir.
// longhaul-worker exits 140 on it (worker/cli/exit_codes.h).
class LeaseLost : public Aborted {
 public:
  explicit LeaseLost(const std::string& message) : Aborted(message) {}
};

// Another process holds the logdir's writer lease and is alive (it renewed it while this one
// looked), or is in the middle of taking it. Nothing was written. Transient on a cluster (the
// chief of a group that is being replaced exits within seconds of losing its peers), a mistake
// when two runs name one logdir; longhaul-worker exits 144 on it, which the operator retries.
class LogdirBusy : public AlreadyExists {
 public:
  explicit LogdirBusy(const std::string& message) : AlreadyExists(message) {}
};

struct LeaseRecord {
  std::string holder;  // "host <h>, pid <p>, boot_id <b>, since <s>"
  int64_t generation = 0;
  double renewed = 0;  // unix seconds
  double lease_secs = 0;

  std::string to_text() const;  // with the crc32c line, padded to a fixed size
  // nullopt when `text` is not a whole record (another format, or read while being rewritten).
  static std::optional<LeaseRecord> parse(std::string_view text);
};

// What a contender saw of a held lock at its first look (try_acquire keeps it up to date).
struct LeaseWatch {
  bool seen = false;
  int64_t generation = 0;
  double renewed = 0;
  std::chrono::steady_clock::time_point since;
};

struct LeaseOptions {
  std::filesystem::path path;  // <logdir>/.writer.lock
  double lease_secs = 30;      // > 0; 0 disables takeovers
  double heartbeat_secs = 0;   // 0: lease_secs / 6 (5 s at the default), or 5 s when lease is 0
};

class LogdirLease {
 public:
  using LostCallback = std::function<void(std::exception_ptr)>;

  // Takes the lease (see the top of this file) and starts the heartbeat; when it is held, waits
  // for a verdict: LogdirBusy naming the holder as soon as the holder renews (within one of
  // its heartbeats, lease/6), or the lease once the holder has not renewed for the lease it
  // advertises (by its record's time, or unchanged for that long as watched from here). A holder
  // that cannot go stale (lease 0, or a lock file of an earlier version) is LogdirBusy at once.
  // `cancelled` is polled while waiting: true ends the wait with Cancelled. Also throws
  // InvalidArgument for bad options and errno-mapped errors naming the lock file.
  static std::unique_ptr<LogdirLease> acquire(const LeaseOptions& options, LostCallback on_lost,
                                              const std::function<bool()>& cancelled = {});
  // One look: the lease; nullptr when the holder has neither renewed since `watch` was first
  // filled in nor gone stale yet (call again with the same watch); LogdirBusy as acquire().
  static std::unique_ptr<LogdirLease> try_acquire(const LeaseOptions& options, LostCallback on_lost,
                                                  LeaseWatch& watch);
  ~LogdirLease();
  LogdirLease(const LogdirLease&) = delete;
  LogdirLease& operator=(const LogdirLease&) = delete;

  // The fence: returns when this process still holds the lease; throws LeaseLost (and reports
  // the loss through on_lost, once) when the path names another holder's lock file, or when it
  // cannot be checked and no heartbeat succeeded for a whole lease.
  void check_held();
  bool lost() const;
  int64_t generation() const { return generation_; }
  const std::string& holder() const { return holder_; }
  const std::filesystem::path& path() const { return options_.path; }

 private:
  LogdirLease(LeaseOptions options, LostCallback on_lost, int fd, LeaseRecord record);
  void heartbeat_loop();
  // Verifies the path still names our inode; renews the record when `renew`. Returns the error
  // (LeaseLost) when the lease is lost, else null. Caller holds mu_.
  std::exception_ptr verify(bool renew) REQUIRES(mu_);
  void report_lost(std::exception_ptr error);

  const LeaseOptions options_;
  const LostCallback on_lost_;
  const int fd_;  // the lock file this process holds (flock'ed); closed by the destructor
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  const int64_t generation_;
  const std::string holder_;

  mutable Mutex mu_;
  CondVar wake_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::exception_ptr lost_ GUARDED_BY(mu_);  // set once the lease is lost
  bool reported_ GUARDED_BY(mu_) = false;
  LeaseRecord record_ GUARDED_BY(mu_);
  // When the last heartbeat that was written (or the acquisition) started.
  std::chrono::steady_clock::time_point last_renewed_ GUARDED_BY(mu_);
  std::thread heartbeat_;
};

}  // namespace longhaul::supervisor
