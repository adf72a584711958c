#include "longhaul/base/file.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <string>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "longhaul/base/error.h"

namespace longhaul::file {
namespace {

constexpr size_t kBufferSize = 1 << 20;
// Pieces at least this large skip the buffer (one copy fewer, into the page cache directly).
constexpr size_t kDirectWriteBytes = 64 << 10;
// Writeback pacing: the unit whose writeback is started at once and waited for one chunk later.
// At 1-3 GB/s that is 10-30 ms of disk work, enough to keep a fast device's queue full.
constexpr uint64_t kWritebackChunk = 32 << 20;

std::atomic<uint64_t> temp_counter{0};

// Adds the time from its construction to its destruction to `total`.
class AddElapsed {
 public:
  explicit AddElapsed(double& total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~AddElapsed() {
    total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  AddElapsed(const AddElapsed&) = delete;
  AddElapsed& operator=(const AddElapsed&) = delete;

 private:
  double& total_;
  std::chrono::steady_clock::time_point start_;
};

void write_all(int fd, const char* p, size_t n, const std::filesystem::path& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw_errno("cannot write", path.string(), errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

AtomicFile::AtomicFile(std::filesystem::path path) : path_(std::move(path)) {
  temp_path_ = path_;
  temp_path_ += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(temp_counter++);
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_errno("cannot create", temp_path_.string(), errno);
  buffer_.reserve(kBufferSize);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

void AtomicFile::write_to_kernel(const char* p, size_t n) {
  {
    AddElapsed timed(times_.write_seconds);
    write_all(fd_, p, n, temp_path_);
  }
  bytes_in_kernel_ += n;
  pace_writeback();
}

// Starts the writeback of each whole chunk handed to the kernel, then waits for the chunks
// before it and drops their pages. Both calls are hints: where a filesystem ignores them
// (tmpfs) or they fail, the data is still written, and fsync in commit() reports any error.
void AtomicFile::pace_writeback() {
  if (bytes_in_kernel_ - writeback_started_ < kWritebackChunk) return;
  AddElapsed timed(times_.writeback_seconds);
  while (bytes_in_kernel_ - writeback_started_ >= kWritebackChunk) {
    const uint64_t chunk = writeback_started_;
    ::sync_file_range(fd_, static_cast<off_t>(chunk), static_cast<off_t>(kWritebackChunk),
                      SYNC_FILE_RANGE_WRITE);
    writeback_started_ += kWritebackChunk;
    if (chunk > writeback_finished_) {
      const auto begin = static_cast<off_t>(writeback_finished_);
      const auto length = static_cast<off_t>(chunk - writeback_finished_);
      ::sync_file_range(
          fd_, begin, length,
          SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
      ::posix_fadvise(fd_, begin, length, POSIX_FADV_DONTNEED);
      writeback_finished_ = chunk;
    }
  }
}

void AtomicFile::flush_buffer() {
  if (buffer_.empty()) return;
  write_to_kernel(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void AtomicFile::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  bytes_written_ += n;
  if (n >= kDirectWriteBytes) {
    flush_buffer();
    write_to_kernel(p, n);
    return;
  }
  if (buffer_.size() + n > kBufferSize) flush_buffer();
  buffer_.append(p, n);
}

void AtomicFile::overwrite(uint64_t offset, std::string_view bytes) {
  if (offset + bytes.size() > bytes_written_) {
    throw InvalidArgument("cannot overwrite bytes [" + std::to_string(offset) + ", " +
                          std::to_string(offset + bytes.size()) + ") of " + temp_path_.string() +
                          ": only " + std::to_string(bytes_written_) + " have been written");
  }
  flush_buffer();
  AddElapsed timed(times_.write_seconds);
  while (!bytes.empty()) {
    const ssize_t w = ::pwrite(fd_, bytes.data(), bytes.size(), static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw_errno("cannot write", temp_path_.string(), errno);
    }
    bytes.remove_prefix(static_cast<size_t>(w));
    offset += static_cast<uint64_t>(w);
  }
}

void AtomicFile::commit() { commit(std::function<void()>()); }

void AtomicFile::commit(const std::function<void()>& before_rename) {
  if (committed_) throw Internal("AtomicFile::commit called twice for " + path_.string());
  flush_buffer();
  {
    AddElapsed timed(times_.fsync_seconds);
    if (::fsync(fd_) != 0) throw_errno("cannot fsync", temp_path_.string(), errno);
    if (::close(fd_) != 0) {
      fd_ = -1;
      throw_errno("cannot close", temp_path_.string(), errno);
    }
    fd_ = -1;
  }
  AddElapsed timed(times_.rename_seconds);
  if (before_rename) before_rename();
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    throw_errno("cannot rename " + temp_path_.string() + " to", path_.string(), errno);
  }
  committed_ = true;
  fsync_directory(path_.has_parent_path() ? path_.parent_path() : std::filesystem::path("."));
}

void write_atomically(const std::filesystem::path& path, std::string_view contents) {
  write_atomically(path, contents, std::function<void()>());
}

void write_atomically(const std::filesystem::path& path, std::string_view contents,
                      const std::function<void()>& before_rename) {
  AtomicFile f(path);
  f.write(contents);
  f.commit(before_rename);
}

int open_regular_file(const std::filesystem::path& path, std::string_view what, struct stat& st) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw_errno("cannot open " + std::string(what), path.string(), errno);
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw_errno("cannot stat " + std::string(what), path.string(), e);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "not a file";
    throw InvalidArgument(std::string(what) + " " + path.string() + " is " + kind +
                          ", not a regular file; give the path of a file");
  }
  // Reads of a regular file never block; clear the flag for the readers that follow.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

std::string read_file(const std::filesystem::path& path, uint64_t max_bytes) {
  struct stat st {};
  int fd = open_regular_file(path, "file", st);
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    throw InvalidArgument("file " + path.string() + " is " + std::to_string(st.st_size) +
                          " bytes, more than the " + std::to_string(max_bytes) +
                          " this reader accepts; is it the right file?");
  }
  std::string out;
  if (st.st_size > 0) out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      throw_errno("cannot read", path.string(), e);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) {  // it grew while we read
      ::close(fd);
      throw InvalidArgument("file " + path.string() + " grew past " + std::to_string(max_bytes) +
                            " bytes while being read; is it the right file?");
    }
  }
  ::close(fd);
  return out;
}

void fsync_directory(const std::filesystem::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_errno("cannot open directory", dir.string(), errno);
  int rc = ::fsync(fd);
  int e = errno;
  ::close(fd);
  // Some filesystems (e.g. certain network mounts) refuse fsync on directories: that is not a
  // reason to fail a checkpoint, the rename itself is still atomic there.
  if (rc != 0 && e != EINVAL && e != EROFS) throw_errno("cannot fsync directory", dir.string(), e);
}

void ensure_writable_directory(const std::filesystem::path& dir, std::string_view what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    throw PermissionDenied(std::string(what) + " " + dir.string() +
                           " cannot be created: " + ec.message() + "; choose a writable path");
  }
  auto probe = dir / (".probe." + std::to_string(::getpid()));
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw PermissionDenied(
        errno_message(std::string(what) + " is not writable:", dir.string(), errno) +
        "; choose a writable path");
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace longhaul::file
