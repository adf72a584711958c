// Error -> exit code, see exit_codes.h.
#include <csignal>
#include <new>

#include "exit_codes.h"
#include "longhaul/base/error.h"
#include "longhaul/base/log.h"
#include "longhaul/supervisor/logdir_lease.h"
#include "longhaul/trainer/trainer.h"

namespace longhaul::cli {

int report_error(std::exception_ptr error) {
  int code = kExitFailure;
  std::string kind = "error";
  std::string message;
  try {
    std::rethrow_exception(error);
  } catch (const trainer::DataError& e) {
    code = kExitBadData;
    kind = "bad data";
    message = e.what();
  } catch (const trainer::NumericalError& e) {
    code = kExitNumerical;
    kind = "numerical fault";
    message = e.what();
  } catch (const supervisor::LeaseLost& e) {  // an Aborted, told apart
    code = kExitLeaseLost;
    kind = "writer lock lost";
    message = e.what();
  } catch (const supervisor::LogdirBusy& e) {  // an AlreadyExists, told apart
    code = kExitLogdirBusy;
    kind = "logdir busy";
    message = e.what();
  } catch (const trainer::CheckpointError& e) {
    code = kExitBadCheckpoint;
    kind = "bad checkpoint";
    message = e.what();
  } catch (const Error& e) {
    message = e.what();
    kind = std::string(code_name(e.code()));
    switch (e.code()) {
      case Code::kInvalidArgument:
        code = kExitUsage;
        break;
      case Code::kFailedPrecondition:
      case Code::kDataLoss:
        code = kExitBadCheckpoint;
        break;
      case Code::kAborted:
        code = kExitAborted;
        break;
      default:
        code = kExitFailure;
    }
  } catch (const std::bad_alloc&) {
    message = "out of memory: use a smaller model or batch";
  } catch (const std::exception& e) {
    message = e.what();
  } catch (...) {
    message = "unknown exception";
  }
  LH_LOG(ERROR) << message << kv("kind", kind) << kv("exit_code", code);
  return code;
}

}  // namespace longhaul::cli
