// The worker's termination message (see termination_message.h).
#include "termination_message.h"

#include <cmath>
#include <cstdlib>
#include <fstream>

#include <nlohmann/json.hpp>

#include "longhaul/base/log.h"
#include "longhaul/base/rfc3339.h"

namespace longhaul::cli {

namespace {

constexpr const char* kPathVariable = "LONGHAUL_TERMINATION_MESSAGE_PATH";
constexpr const char* kKubeletPath = "/dev/termination-log";
constexpr size_t kKubeletLimit = 4096;

}  // namespace

TerminationMessage::Target TerminationMessage::default_target() {
  if (const char* env = std::getenv(kPathVariable); env != nullptr && *env != '\0') {
    return {env, true};
  }
  return {kKubeletPath, false};
}

TerminationMessage::TerminationMessage(Target target) : target_(std::move(target)) {}

TerminationMessage::~TerminationMessage() { write(); }

void TerminationMessage::set_max_steps(int64_t max_steps) {
  MutexLock lock(mu_);
  max_steps_ = max_steps;
}

void TerminationMessage::set_chief(bool is_chief) {
  MutexLock lock(mu_);
  chief_ = is_chief;
}

void TerminationMessage::on_session_start(int64_t step) {
  MutexLock lock(mu_);
  step_ = step;
  session_start_.emplace(step, Clock::now());
}

void TerminationMessage::on_step(int64_t step) {
  MutexLock lock(mu_);
  step_ = step;
  last_step_at_ = Clock::now();
}

void TerminationMessage::on_saved(const supervisor::CheckpointStats& stats) {
  MutexLock lock(mu_);
  checkpoint_step_ = stats.step;
  checkpoint_time_ = stats.wall_time;
}

void TerminationMessage::on_restored(const supervisor::RestoredCheckpoint& restored) {
  MutexLock lock(mu_);
  checkpoint_step_ = restored.step;
  checkpoint_time_ = restored.wall_time;
  step_ = restored.step;
}

void TerminationMessage::on_chief_role_taken(const supervisor::RestoredCheckpoint& latest) {
  MutexLock lock(mu_);
  chief_ = true;
  checkpoint_step_ = latest.step;
  checkpoint_time_ = latest.wall_time;
}

std::string TerminationMessage::text() const {
  MutexLock lock(mu_);
  nlohmann::json j = {{"step", step_}};
  if (max_steps_ > 0) j["maxSteps"] = max_steps_;
  if (checkpoint_step_ && checkpoint_time_ > 0) {
    j["lastCheckpointStep"] = *checkpoint_step_;
    j["lastCheckpointTime"] =
        format_rfc3339(Clock::time_point(std::chrono::duration_cast<Clock::duration>(
            std::chrono::duration<double>(checkpoint_time_))));
  }
  if (last_step_at_) j["lastStepTime"] = format_rfc3339(*last_step_at_);
  if (session_start_ && last_step_at_ && step_ > session_start_->first) {
    const double seconds =
        std::chrono::duration<double>(*last_step_at_ - session_start_->second).count();
    if (seconds > 0) {
      const double rate = static_cast<double>(step_ - session_start_->first) / seconds;
      // Three significant digits: the operator shows it as it is.
      const double scale = std::pow(10.0, 2 - std::floor(std::log10(rate)));
      j["stepsPerSecond"] = std::round(rate * scale) / scale;
    }
  }
  j["chief"] = chief_;
  std::string out = j.dump();
  if (out.size() > kKubeletLimit) out.resize(kKubeletLimit);  // cannot happen: a few numbers
  return out;
}

bool TerminationMessage::write() const noexcept {
  try {
    if (!target_.create && !std::filesystem::exists(target_.path)) return false;
    const std::string message = text();
    std::ofstream out(target_.path, std::ios::binary | std::ios::trunc);
    out << message;
    out.close();
    if (!out) {
      LH_LOG(INFO) << "could not write the termination message; the operator reads the progress "
                      "from the metrics instead"
                   << kv("path", target_.path.string());
      return false;
    }
    return true;
  } catch (const std::exception& e) {
    LH_LOG(INFO) << "could not write the termination message" << kv("path", target_.path.string())
                 << kv("error", e.what());
    return false;
  }
}

}  // namespace longhaul::cli
