// The `tiny` preset learns byte-level text: a few hundred optimizer steps with the warmup +
// cosine schedule and clipping, as the quick start runs them, bring the held-out loss far
// below ln(256). Labelled slow (several seconds of training).
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <longhaul/model/config.h>
#include <longhaul/model/cpu/gpt2_cpu.h>
#include <longhaul/model/lr_schedule.h>

namespace longhaul::model {
namespace {

// Deterministic English-like text: sentences drawn from a small vocabulary of words.
std::string make_text(size_t bytes, uint64_t seed) {
  static const char* kWords[] = {"the",  "a",    "model", "learns", "to",   "predict", "next",
                                 "byte", "of",   "text",  "and",    "loss", "falls",   "when",
                                 "it",   "sees", "more",  "data",   "with", "every",   "step",
                                 "cat",  "sat",  "on",    "mat",    "long", "haul",    "train"};
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> word(0, std::size(kWords) - 1);
  std::uniform_int_distribution<int> length(4, 9);
  std::string text;
  while (text.size() < bytes) {
    const int n = length(rng);
    for (int i = 0; i < n; ++i) {
      std::string w = kWords[word(rng)];
      if (i == 0) w[0] = static_cast<char>(w[0] - 'a' + 'A');
      text += w;
      text += i + 1 < n ? " " : ". ";
    }
  }
  text.resize(bytes);
  return text;
}

TEST(TinyPreset, LearnsByteLevelText) {
  const GPT2Config config = GPT2Config::preset("tiny");
  const int B = 4, T = 64, steps = 150;
  auto model = make_cpu_gpt2(config, B, T);
  model->init_weights(1234);
  const std::string train = make_text(200000, 1), val = make_text(B * T + 1, 2);
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<size_t> start(0, train.size() - T - 2);
  std::vector<int32_t> x(B * T), y(B * T), vx(B * T), vy(B * T);
  for (int i = 0; i < B * T; ++i) {
    vx[i] = static_cast<unsigned char>(val[i]);
    vy[i] = static_cast<unsigned char>(val[i + 1]);
  }
  const float initial = model->forward_loss(vx.data(), vy.data(), B, T);
  const LearningRateSchedule schedule{
      .max_lr = 3e-3, .min_lr = 3e-4, .warmup_steps = 10, .total_steps = steps};
  for (int step = 0; step < steps; ++step) {
    for (int b = 0; b < B; ++b) {
      const size_t s = start(rng);
      for (int t = 0; t < T; ++t) {
        x[b * T + t] = static_cast<unsigned char>(train[s + t]);
        y[b * T + t] = static_cast<unsigned char>(train[s + t + 1]);
      }
    }
    model->zero_grad();
    model->forward_backward(x.data(), y.data(), B, T, 1.0f);
    const float norm = model->gradient_norm();
    model->optimizer_step(AdamWOptions{}, static_cast<float>(learning_rate_at(schedule, step)),
                          norm > 1.0f ? 1.0f / norm : 1.0f);
  }
  const float final_loss = model->forward_loss(vx.data(), vy.data(), B, T);
  EXPECT_NEAR(initial, std::log(256.0), 0.1);
  EXPECT_LT(final_loss, 2.0f) << "initial " << initial;
}

}  // namespace
}  // namespace longhaul::model
