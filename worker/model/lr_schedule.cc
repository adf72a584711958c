#include "longhaul/model/lr_schedule.h"

#include <cmath>
#include <numbers>
#include <string>

#include <longhaul/base/error.h>

namespace longhaul::model {

void LearningRateSchedule::validate() const {
  auto bad = [](const std::string& field, const std::string& value, const char* rule) {
    throw InvalidArgument("learning-rate schedule " + field + " = " + value +
                          " is invalid: " + rule);
  };
  if (!(max_lr > 0)) bad("max_lr", std::to_string(max_lr), "it must be > 0");
  if (!(min_lr >= 0) || min_lr > max_lr) {
    bad("min_lr", std::to_string(min_lr), "it must be >= 0 and <= max_lr");
  }
  if (total_steps < 1) bad("total_steps", std::to_string(total_steps), "it must be >= 1");
  if (warmup_steps < 0 || warmup_steps > total_steps) {
    bad("warmup_steps", std::to_string(warmup_steps), "it must be >= 0 and <= total_steps");
  }
}

double learning_rate_at(const LearningRateSchedule& s, int64_t step) {
  if (step < s.warmup_steps) {
    return s.max_lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  }
  if (step >= s.total_steps) return s.min_lr;
  const double decay_steps = static_cast<double>(s.total_steps - s.warmup_steps);
  const double ratio = static_cast<double>(step - s.warmup_steps) / decay_steps;
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
  return s.min_lr + coeff * (s.max_lr - s.min_lr);
}

}  // namespace longhaul::model
