// SupervisorOptions for the supervisor suites: a Supervisor on `logdir` that runs no periodic
// service (no timed checkpoints, summaries or event flushes) unless the test turns one on, with
// a stop grace long enough for a loaded machine. Tests that need a service set its interval.
#pragma once

#include <filesystem>

#include "longhaul/supervisor/supervisor.h"

namespace longhaul::supervisor::testing {

inline SupervisorOptions quiet_options(const std::filesystem::path& logdir) {
  SupervisorOptions o;
  o.logdir = logdir;
  o.save_model_secs = 0;
  o.save_summaries_secs = 0;
  o.stop_grace_secs = 10;
  o.events_flush_secs = 0;
  return o;
}

}  // namespace longhaul::supervisor::testing
