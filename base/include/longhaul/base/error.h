// The one exception hierarchy of longhaul. Every error the project raises derives from
// longhaul::Error and carries a Code, because the supervisor's semantics are built on the kind
// of error (request_stop(error), re-raise after join, OutOfRange as a clean stop), and the
// worker's exit code is derived from it (see exit_code_for).
//
// Messages say what failed, on which file or object, and what to do about it. Third-party
// exceptions are translated into these at the adapter boundary.
//
// Thread-safety: immutable after construction; safe to copy and rethrow across threads.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace longhaul {

enum class Code {
  kCancelled,           // the operation was cancelled by the caller (e.g. a clean stop)
  kInvalidArgument,     // bad config, bad manifest, bad data format: fix the input
  kDeadlineExceeded,    // waited longer than allowed (chief never came, grace period ran out)
  kNotFound,            // a file or object that must exist does not
  kAlreadyExists,       // a file or object that must not exist does
  kPermissionDenied,    // cannot read or write where asked
  kFailedPrecondition,  // the system is not in a state where this can run (shape mismatch, ...)
  kAborted,             // a peer died or a collective failed: retry the whole group
  kOutOfRange,          // input exhausted: a clean end of training, not a failure
  kUnavailable,         // transient: network, API server, device busy; retry with backoff
  kDataLoss,            // unrecoverable corruption (bad CRC, truncated file)
  kInternal,            // a bug in longhaul
};

std::string_view code_name(Code code);

class Error : public std::runtime_error {
 public:
  Error(Code code, const std::string& message) : std::runtime_error(message), code_(code) {}
  Code code() const noexcept { return code_; }

 private:
  Code code_;
};

#define LONGHAUL_DEFINE_ERROR(Name, CodeValue)                               \
  class Name : public Error {                                                \
   public:                                                                   \
    explicit Name(const std::string& message) : Error(CodeValue, message) {} \
  };

LONGHAUL_DEFINE_ERROR(Cancelled, Code::kCancelled)
LONGHAUL_DEFINE_ERROR(InvalidArgument, Code::kInvalidArgument)
LONGHAUL_DEFINE_ERROR(DeadlineExceeded, Code::kDeadlineExceeded)
LONGHAUL_DEFINE_ERROR(NotFound, Code::kNotFound)
LONGHAUL_DEFINE_ERROR(AlreadyExists, Code::kAlreadyExists)
LONGHAUL_DEFINE_ERROR(PermissionDenied, Code::kPermissionDenied)
LONGHAUL_DEFINE_ERROR(FailedPrecondition, Code::kFailedPrecondition)
LONGHAUL_DEFINE_ERROR(Aborted, Code::kAborted)
LONGHAUL_DEFINE_ERROR(OutOfRange, Code::kOutOfRange)
LONGHAUL_DEFINE_ERROR(Unavailable, Code::kUnavailable)
LONGHAUL_DEFINE_ERROR(DataLoss, Code::kDataLoss)
LONGHAUL_DEFINE_ERROR(Internal, Code::kInternal)

#undef LONGHAUL_DEFINE_ERROR

// Throws the subclass of Error that matches `code`, with `message`.
[[noreturn]] void throw_error(Code code, const std::string& message);

// Builds "<what>: <strerror(errnum)>" for errors from POSIX calls on `path`, e.g.
// errno_message("cannot open checkpoint", "/logdir/model.ckpt-5.safetensors", ENOENT).
std::string errno_message(std::string_view what, std::string_view path, int errnum);

// Throws the Error that best matches a POSIX errno: ENOENT -> NotFound, EACCES/EROFS ->
// PermissionDenied, ENOSPC/EIO -> Unavailable, otherwise Internal.
[[noreturn]] void throw_errno(std::string_view what, std::string_view path, int errnum);

}  // namespace longhaul
