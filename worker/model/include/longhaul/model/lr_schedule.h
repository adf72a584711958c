// Learning-rate schedule: linear warmup, then cosine decay to min_lr (as in GPT-2 / nanoGPT /
// llm.c).
//
// For the 0-based index `step` of the optimizer step about to be taken:
//   step < warmup_steps:            lr = max_lr * (step + 1) / warmup_steps
//   warmup_steps <= step < total:   r = (step - warmup_steps) / (total_steps - warmup_steps),
//                                   lr = min_lr + 0.5 (1 + cos(pi r)) (max_lr - min_lr)
//   step >= total_steps:            lr = min_lr
// So the first step already has a non-zero lr, the peak is reached at step warmup_steps, and
// the schedule is continuous there.
#pragma once

#include <cstdint>

namespace longhaul::model {

struct LearningRateSchedule {
  double max_lr = 6e-4;
  double min_lr = 6e-5;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;

  // Throws InvalidArgument naming the bad field: max_lr > 0, 0 <= min_lr <= max_lr,
  // 0 <= warmup_steps <= total_steps, total_steps >= 1.
  void validate() const;
};

double learning_rate_at(const LearningRateSchedule& schedule, int64_t step);

}  // namespace longhaul::model
