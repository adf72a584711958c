// Durable file writes: a file written for the user (checkpoint, state file, events file) is
// written so that a crash at any instant leaves the previous good version readable.
//
// AtomicFile commit protocol: write to "<path>.tmp.<pid>.<n>" in the same directory, fsync the
// file, rename it over <path>, fsync the directory. A reader sees either the old file or the
// whole new one, never a torn one. An AtomicFile destroyed without commit() removes its
// temporary file.
//
// A large file is written at the disk's pace rather than into the page cache first: once a chunk
// (32 MiB) has been handed to the kernel its writeback is started (sync_file_range), the chunk
// before it is waited for and its pages dropped (posix_fadvise DONTNEED). The disk works while
// the caller is still producing bytes, the final fsync has at most two chunks left to flush, and
// a checkpoint never fills the page cache (which counts against a container's memory) with
// gigabytes of dirty or dead pages. The commit protocol and its guarantees are unchanged.
//
// Thread-safety: an AtomicFile is used by one thread at a time; distinct objects are independent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

#include <sys/stat.h>

namespace longhaul::file {

// Where an AtomicFile's time went, in seconds of the steady clock on the writing thread: what a
// benchmark needs to say where a checkpoint's time goes (bench/README.md).
struct WriteTimes {
  double write_seconds = 0;      // write(2)/pwrite(2): the copy into the page cache
  double writeback_seconds = 0;  // pacing: starting a chunk's writeback, waiting, dropping pages
  double fsync_seconds = 0;      // the final fsync of the file (and its close)
  double rename_seconds = 0;     // before_rename + rename + fsync of the directory
};

class AtomicFile {
 public:
  // Opens a temporary file next to `path`. Throws PermissionDenied / NotFound (errno-mapped)
  // naming the directory when it cannot be created.
  explicit AtomicFile(std::filesystem::path path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends bytes: small pieces are gathered in a buffer, large ones (64 KiB and up) go to the
  // kernel straight from `data`. Throws Unavailable on ENOSPC/EIO naming the file.
  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  uint64_t bytes_written() const { return bytes_written_; }

  // Replaces bytes already written (offset + n <= bytes_written()): a header whose checksums are
  // known only once the data after it has been written. Throws InvalidArgument past the end.
  void overwrite(uint64_t offset, std::string_view bytes);

  // fsync + rename + fsync(dir). After it returns, <path> holds exactly what was written.
  void commit();
  // The same, with `before_rename` called after the fsync, just before the rename: a fence (the
  // logdir lease, supervisor/logdir_lease.h) that throws when this writer may no longer replace
  // <path>. When it throws, nothing was renamed and the temp file is removed with the object.
  void commit(const std::function<void()>& before_rename);

  const std::filesystem::path& path() const { return path_; }
  const std::filesystem::path& temp_path() const { return temp_path_; }
  // Time spent so far in each phase (complete once commit() returned).
  const WriteTimes& times() const { return times_; }

 private:
  void flush_buffer();
  void write_to_kernel(const char* p, size_t n);  // at the end of the file, then pace_writeback
  void pace_writeback();
  std::filesystem::path path_;
  std::filesystem::path temp_path_;
  int fd_ = -1;
  bool committed_ = false;
  uint64_t bytes_written_ = 0;
  uint64_t bytes_in_kernel_ = 0;     // handed to write(); the rest is in buffer_
  uint64_t writeback_started_ = 0;   // [0, this) has had its writeback started
  uint64_t writeback_finished_ = 0;  // [0, this) is on disk and out of the page cache
  std::string buffer_;
  WriteTimes times_;
};

// Writes `contents` to `path` with the AtomicFile protocol.
void write_atomically(const std::filesystem::path& path, std::string_view contents);
// The same, with a fence called just before the rename (AtomicFile::commit(before_rename)).
void write_atomically(const std::filesystem::path& path, std::string_view contents,
                      const std::function<void()>& before_rename);

// Reads a whole regular file of at most `max_bytes`. Throws NotFound / PermissionDenied naming
// the file, and InvalidArgument naming it when it is not a regular file (a FIFO, a device such as
// /dev/zero, a directory: never opened in a way that blocks or reads forever) or is larger.
inline constexpr uint64_t kDefaultMaxReadBytes = uint64_t{64} << 20;
std::string read_file(const std::filesystem::path& path, uint64_t max_bytes = kDefaultMaxReadBytes);

// Opens `path` read-only for a reader that must not block: O_NONBLOCK (a FIFO opens at once),
// then refuses anything but a regular file. Returns the descriptor (close it) and fills `st`.
// Throws NotFound / PermissionDenied, or InvalidArgument "<what> <path> is a FIFO, not a regular
// file" and the like.
int open_regular_file(const std::filesystem::path& path, std::string_view what, struct stat& st);

// fsync of a directory, so that a rename or unlink inside it survives a crash.
void fsync_directory(const std::filesystem::path& dir);

// Creates `dir` (and parents) and checks it is writable by creating and removing a probe file.
// Throws PermissionDenied "logdir <dir> is not writable: ...; choose a writable --logdir".
void ensure_writable_directory(const std::filesystem::path& dir, std::string_view what);

}  // namespace longhaul::file
