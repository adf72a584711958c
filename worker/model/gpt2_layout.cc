// The shared GPT-2 parameter layout and its deterministic initialisation (see gpt2_layout.h).
#include "longhaul/model/gpt2_layout.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <random>
#include <utility>

#include <longhaul/base/error.h>

namespace longhaul::model {
namespace {

// Gaussian numbers from a 64-bit Mersenne Twister with an explicit Box-Muller transform, so the
// initialisation is the same with every standard library (std::normal_distribution is not
// specified bit for bit).
class NormalGenerator {
 public:
  explicit NormalGenerator(uint64_t seed) : rng_(seed) {}
  float next() {
    if (has_spare_) {
      has_spare_ = false;
      return static_cast<float>(spare_);
    }
    const double u1 = (static_cast<double>(rng_() >> 11) + 0.5) * 0x1.0p-53;  // (0, 1)
    const double u2 = static_cast<double>(rng_() >> 11) * 0x1.0p-53;          // [0, 1)
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double theta = 2.0 * 3.14159265358979323846 * u2;
    spare_ = r * std::sin(theta);
    has_spare_ = true;
    return static_cast<float>(r * std::cos(theta));
  }

 private:
  std::mt19937_64 rng_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace

ParameterLayout::ParameterLayout(const GPT2Config& config) : config_(config) {
  config_.validate();
  const int64_t V = config_.vocab_size, C = config_.n_embd, maxT = config_.context_length;
  using Init = ParameterInit;
  auto add = [&](std::string name, std::vector<int64_t> shape, Init init) {
    TensorLayout t{std::move(name), std::move(shape), num_parameters_, 1, init};
    for (int64_t d : t.shape) t.numel *= static_cast<size_t>(d);
    num_parameters_ += t.numel;
    tensors_.push_back(std::move(t));
  };
  tensors_.reserve(2 + static_cast<size_t>(config_.n_layer) * kBlockTensors + 2);
  add("transformer.wte.weight", {V, C}, Init::kNormal);
  add("transformer.wpe.weight", {maxT, C}, Init::kNormal);
  const std::array<std::pair<std::vector<int64_t>, Init>, kBlockTensors> block_specs = {{
      {{C}, Init::kOne},                    // ln_1.weight
      {{C}, Init::kZero},                   // ln_1.bias
      {{C, 3 * C}, Init::kNormal},          // attn.c_attn.weight
      {{3 * C}, Init::kZero},               // attn.c_attn.bias
      {{C, C}, Init::kResidualNormal},      // attn.c_proj.weight
      {{C}, Init::kZero},                   // attn.c_proj.bias
      {{C}, Init::kOne},                    // ln_2.weight
      {{C}, Init::kZero},                   // ln_2.bias
      {{C, 4 * C}, Init::kNormal},          // mlp.c_fc.weight
      {{4 * C}, Init::kZero},               // mlp.c_fc.bias
      {{4 * C, C}, Init::kResidualNormal},  // mlp.c_proj.weight
      {{C}, Init::kZero},                   // mlp.c_proj.bias
  }};
  for (int l = 0; l < config_.n_layer; ++l) {
    const std::string prefix = "transformer.h." + std::to_string(l) + ".";
    for (int i = 0; i < kBlockTensors; ++i) {
      add(prefix + kBlockTensorNames[i], block_specs[i].first, block_specs[i].second);
    }
  }
  add("transformer.ln_f.weight", {C}, Init::kOne);
  add("transformer.ln_f.bias", {C}, Init::kZero);
  if (static_cast<int64_t>(num_parameters_) != config_.num_parameters()) {
    throw Internal("GPT-2 parameter layout has " + std::to_string(num_parameters_) +
                   " parameters but GPT2Config::num_parameters() computes " +
                   std::to_string(config_.num_parameters()) + " for " + config_.to_string());
  }
}

std::vector<NamedTensor> ParameterLayout::named(float* buffer, std::string_view prefix) const {
  std::vector<NamedTensor> out;
  out.reserve(tensors_.size());
  for (const TensorLayout& t : tensors_) {
    out.push_back(NamedTensor{std::string(prefix) + t.name, t.shape, buffer + t.offset});
  }
  return out;
}

std::vector<NamedTensor> ParameterLayout::named_optimizer_state(float* exp_avg,
                                                                float* exp_avg_sq) const {
  std::vector<NamedTensor> out = named(exp_avg, "optimizer.exp_avg.");
  std::vector<NamedTensor> second = named(exp_avg_sq, "optimizer.exp_avg_sq.");
  out.insert(out.end(), std::make_move_iterator(second.begin()),
             std::make_move_iterator(second.end()));
  return out;
}

void ParameterLayout::init_weights(uint64_t seed, std::span<float> params) const {
  if (params.size() != num_parameters_) {
    throw InvalidArgument("GPT-2 init_weights: the buffer has " + std::to_string(params.size()) +
                          " floats but the layout of " + config_.to_string() + " needs " +
                          std::to_string(num_parameters_));
  }
  NormalGenerator normal(seed);
  const float std_dev = 0.02f;
  const float residual_std = 0.02f / std::sqrt(2.0f * static_cast<float>(config_.n_layer));
  for (const TensorLayout& t : tensors_) {
    float* p = params.data() + t.offset;
    switch (t.init) {
      case ParameterInit::kNormal:
        for (size_t i = 0; i < t.numel; ++i) p[i] = std_dev * normal.next();
        break;
      case ParameterInit::kResidualNormal:
        for (size_t i = 0; i < t.numel; ++i) p[i] = residual_std * normal.next();
        break;
      case ParameterInit::kZero:
        std::fill(p, p + t.numel, 0.0f);
        break;
      case ParameterInit::kOne:
        std::fill(p, p + t.numel, 1.0f);
        break;
    }
  }
}

}  // namespace longhaul::model
