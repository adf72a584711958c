#include "longhaul/base/error.h"

#include <cerrno>
#include <cstring>

namespace longhaul {

std::string_view code_name(Code code) {
  switch (code) {
    case Code::kCancelled:
      return "Cancelled";
    case Code::kInvalidArgument:
      return "InvalidArgument";
    case Code::kDeadlineExceeded:
      return "DeadlineExceeded";
    case Code::kNotFound:
      return "NotFound";
    case Code::kAlreadyExists:
      return "AlreadyExists";
    case Code::kPermissionDenied:
      return "PermissionDenied";
    case Code::kFailedPrecondition:
      return "FailedPrecondition";
    case Code::kAborted:
      return "Aborted";
    case Code::kOutOfRange:
      return "OutOfRange";
    case Code::kUnavailable:
      return "Unavailable";
    case Code::kDataLoss:
      return "DataLoss";
    case Code::kInternal:
      return "Internal";
  }
  return "Unknown";
}

void throw_error(Code code, const std::string& message) {
  switch (code) {
    case Code::kCancelled:
      throw Cancelled(message);
    case Code::kInvalidArgument:
      throw InvalidArgument(message);
    case Code::kDeadlineExceeded:
      throw DeadlineExceeded(message);
    case Code::kNotFound:
      throw NotFound(message);
    case Code::kAlreadyExists:
      throw AlreadyExists(message);
    case Code::kPermissionDenied:
      throw PermissionDenied(message);
    case Code::kFailedPrecondition:
      throw FailedPrecondition(message);
    case Code::kAborted:
      throw Aborted(message);
    case Code::kOutOfRange:
      throw OutOfRange(message);
    case Code::kUnavailable:
      throw Unavailable(message);
    case Code::kDataLoss:
      throw DataLoss(message);
    case Code::kInternal:
      throw Internal(message);
  }
  throw Internal(message);
}

std::string errno_message(std::string_view what, std::string_view path, int errnum) {
  std::string m(what);
  if (!path.empty()) {
    m += " ";
    m += path;
  }
  m += ": ";
  m += std::strerror(errnum);
  return m;
}

void throw_errno(std::string_view what, std::string_view path, int errnum) {
  std::string m = errno_message(what, path, errnum);
  switch (errnum) {
    case ENOENT:
    case ENOTDIR:
      throw NotFound(m);
    case EACCES:
    case EPERM:
    case EROFS:
      throw PermissionDenied(m);
    case EEXIST:
      throw AlreadyExists(m);
    case ENOSPC:
    case EDQUOT:
    case EIO:
    case EAGAIN:
    case EINTR:
      throw Unavailable(m);
    default:
      throw Internal(m);
  }
}

}  // namespace longhaul
