// CPU GPT-2: activations, forward, backward and AdamW over the CPU kernels, on the parameter
// layout and initialisation shared with the CUDA backend (gpt2_layout.h).
#include "longhaul/model/cpu/gpt2_cpu.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#include <longhaul/base/error.h>
#include <longhaul/kernels/cpu/adamw.h>
#include <longhaul/kernels/cpu/attention.h>
#include <longhaul/kernels/cpu/crossentropy.h>
#include <longhaul/kernels/cpu/encoder.h>
#include <longhaul/kernels/cpu/gelu.h>
#include <longhaul/kernels/cpu/global_norm.h>
#include <longhaul/kernels/cpu/layernorm.h>
#include <longhaul/kernels/cpu/matmul.h>
#include <longhaul/kernels/cpu/platform.h>
#include <longhaul/kernels/cpu/residual.h>
#include <longhaul/model/gpt2_layout.h>

namespace longhaul::model {
namespace {

namespace k = longhaul::kernels::cpu;

// A zero-initialised, 64-byte aligned float array.
class AlignedFloats {
 public:
  AlignedFloats() = default;
  explicit AlignedFloats(size_t n) : size_(n) {
    const size_t bytes = ((n * sizeof(float) + 63) / 64) * 64;
    data_ = static_cast<float*>(std::aligned_alloc(64, bytes == 0 ? 64 : bytes));
    if (data_ == nullptr) throw std::bad_alloc();
    std::memset(data_, 0, bytes);
  }
  AlignedFloats(AlignedFloats&& o) noexcept : data_(o.data_), size_(o.size_) {
    o.data_ = nullptr;
    o.size_ = 0;
  }
  AlignedFloats& operator=(AlignedFloats&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  AlignedFloats(const AlignedFloats&) = delete;
  AlignedFloats& operator=(const AlignedFloats&) = delete;
  ~AlignedFloats() { std::free(data_); }

  float* data() const { return data_; }
  size_t size() const { return size_; }
  void zero() { std::memset(data_, 0, size_ * sizeof(float)); }

 private:
  float* data_ = nullptr;
  size_t size_ = 0;
};

// Activations of one block kept for the backward pass (pointers into one allocation).
struct BlockActivations {
  float* ln1;        // (B, T, C)
  float* ln1_mean;   // (B, T)
  float* ln1_rstd;   // (B, T)
  float* qkv;        // (B, T, 3C)
  float* atty;       // (B, T, C)
  float* att;        // (B, NH, T, T)
  float* residual2;  // (B, T, C)
  float* ln2;        // (B, T, C)
  float* ln2_mean;   // (B, T)
  float* ln2_rstd;   // (B, T)
  float* fch;        // (B, T, 4C)
  float* fch_gelu;   // (B, T, 4C)
  float* residual3;  // (B, T, C)
};

class CpuGPT2 final : public LanguageModel {
 public:
  CpuGPT2(const GPT2Config& config, int max_batch_size, int max_seq_len);

  const GPT2Config& config() const override { return config_; }
  std::string_view device_name() const override { return "cpu"; }
  MemorySpace memory_space() const override { return MemorySpace::kHost; }
  std::string numerical_environment() const override {
    const kernels::cpu::CpuPlatform p = kernels::cpu::cpu_platform();
    return "cpu: " + p.blas + ", " + std::to_string(p.threads) + " threads";
  }
  int64_t num_parameters() const override { return static_cast<int64_t>(num_params_); }
  int max_batch_size() const override { return max_B_; }
  int max_seq_len() const override { return max_T_; }
  bool reports_gradients_per_layer() const override { return true; }

  void init_weights(uint64_t seed) override;
  float forward_backward(const int32_t* inputs, const int32_t* targets, int B, int T,
                         float loss_scale) override;
  float forward_loss(const int32_t* inputs, const int32_t* targets, int B, int T) override;
  void zero_grad() override { grads_.zero(); }
  float gradient_norm() override;
  void optimizer_step(const AdamWOptions& options, float lr, float grad_scale) override;

  std::span<float> parameters_flat() override { return {params_.data(), num_params_}; }
  std::span<float> gradients_flat() override { return {grads_.data(), num_params_}; }
  std::vector<NamedTensor> named_parameters() override { return layout_.named(params_.data()); }
  std::vector<NamedTensor> named_optimizer_state() override {
    return layout_.named_optimizer_state(m_.data(), v_.data());
  }
  int64_t optimizer_step_count() const override { return step_; }
  void set_optimizer_step_count(int64_t steps) override {
    if (steps < 0) {
      throw InvalidArgument("optimizer step count " + std::to_string(steps) + " is negative");
    }
    step_ = steps;
  }

 private:
  // Pointer to tensor `index` of block `layer` inside `buffer`.
  float* block(const AlignedFloats& buffer, int layer, BlockTensor index) const {
    return at(buffer, layout_.block(layer, index));
  }
  static float* at(const AlignedFloats& buffer, const TensorLayout& t) {
    return buffer.data() + t.offset;
  }
  void forward(const int32_t* inputs, int B, int T);
  void backward(const int32_t* inputs, int B, int T);
  float mean_loss(int N) const;

  GPT2Config config_;
  int max_B_, max_T_;
  ParameterLayout layout_;  // validates config_
  size_t num_params_;
  AlignedFloats params_, grads_, m_, v_;
  int64_t step_ = 0;

  AlignedFloats activation_memory_;
  float* encoded_ = nullptr;  // (B, T, C)
  std::vector<BlockActivations> blocks_;
  float* proj_ = nullptr;      // (B, T, C) scratch: projection outputs
  float* lnf_ = nullptr;       // (B, T, C)
  float* lnf_mean_ = nullptr;  // (B, T)
  float* lnf_rstd_ = nullptr;  // (B, T)
  float* logits_ = nullptr;    // (B, T, V); dlogits in place after backward
  float* losses_ = nullptr;    // (B, T)
  // Backward scratch, reused by every block.
  float* dresidual_ = nullptr;  // (B, T, C)
  float* dln_ = nullptr;        // (B, T, C)
  float* datty_ = nullptr;      // (B, T, C)
  float* dqkv_ = nullptr;       // (B, T, 3C)
  float* datt_ = nullptr;       // (B, NH, T, T)
  float* dfch_ = nullptr;       // (B, T, 4C)
  float* dfch_gelu_ = nullptr;  // (B, T, 4C)
};

CpuGPT2::CpuGPT2(const GPT2Config& config, int max_batch_size, int max_seq_len)
    : config_(config),
      max_B_(max_batch_size),
      max_T_(max_seq_len),
      layout_(config_),
      num_params_(layout_.num_parameters()) {
  if (max_B_ < 1) {
    throw InvalidArgument("max_batch_size = " + std::to_string(max_B_) + " must be >= 1");
  }
  if (max_T_ < 1 || max_T_ > config_.context_length) {
    throw InvalidArgument("max_seq_len = " + std::to_string(max_T_) + " must be in [1, " +
                          std::to_string(config_.context_length) + "] (the context_length)");
  }
  const int64_t V = config_.vocab_size, C = config_.n_embd;
  params_ = AlignedFloats(num_params_);
  grads_ = AlignedFloats(num_params_);
  m_ = AlignedFloats(num_params_);
  v_ = AlignedFloats(num_params_);

  // Activations, sized for (max_B, max_T).
  const size_t BT = static_cast<size_t>(max_B_) * max_T_;
  const size_t BTC = BT * static_cast<size_t>(C);
  const size_t att = static_cast<size_t>(max_B_) * config_.n_head * max_T_ * max_T_;
  const size_t per_block = BTC * 16 + BT * 4 + att;
  const size_t total = BTC                                               // encoded
                       + per_block * config_.n_layer + BTC * 2 + BT * 3  // proj, lnf, stats, losses
                       + BT * static_cast<size_t>(V)                     // logits
                       + BTC * 3 + BTC * 3 + att + BTC * 8;              // backward scratch
  activation_memory_ = AlignedFloats(total);
  float* cursor = activation_memory_.data();
  auto take = [&](size_t n) {
    float* p = cursor;
    cursor += n;
    return p;
  };
  encoded_ = take(BTC);
  blocks_.resize(config_.n_layer);
  for (BlockActivations& a : blocks_) {
    a.ln1 = take(BTC);
    a.ln1_mean = take(BT);
    a.ln1_rstd = take(BT);
    a.qkv = take(3 * BTC);
    a.atty = take(BTC);
    a.att = take(att);
    a.residual2 = take(BTC);
    a.ln2 = take(BTC);
    a.ln2_mean = take(BT);
    a.ln2_rstd = take(BT);
    a.fch = take(4 * BTC);
    a.fch_gelu = take(4 * BTC);
    a.residual3 = take(BTC);
  }
  proj_ = take(BTC);
  lnf_ = take(BTC);
  lnf_mean_ = take(BT);
  lnf_rstd_ = take(BT);
  losses_ = take(BT);
  logits_ = take(BT * static_cast<size_t>(V));
  dresidual_ = take(BTC);
  dln_ = take(BTC);
  datty_ = take(BTC);
  dqkv_ = take(3 * BTC);
  datt_ = take(att);
  dfch_ = take(4 * BTC);
  dfch_gelu_ = take(4 * BTC);
  if (cursor > activation_memory_.data() + activation_memory_.size()) {
    throw Internal("CPU GPT-2 activation buffer overflow");
  }
  init_weights(0);
}

void CpuGPT2::init_weights(uint64_t seed) {
  layout_.init_weights(seed, {params_.data(), num_params_});
  grads_.zero();
  m_.zero();
  v_.zero();
  step_ = 0;
}

void CpuGPT2::forward(const int32_t* inputs, int B, int T) {
  const int C = config_.n_embd, NH = config_.n_head, V = config_.vocab_size;
  const int N = B * T;
  const size_t NC = static_cast<size_t>(N) * C;
  k::encoder_forward(encoded_, inputs, at(params_, layout_.wte()), at(params_, layout_.wpe()), B, T,
                     C);
  for (int l = 0; l < config_.n_layer; ++l) {
    BlockActivations& a = blocks_[l];
    const float* residual = l == 0 ? encoded_ : blocks_[l - 1].residual3;
    k::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, block(params_, l, kLn1W),
                         block(params_, l, kLn1B), N, C);
    k::matmul_forward(a.qkv, a.ln1, block(params_, l, kQkvW), block(params_, l, kQkvB), N, C,
                      3 * C);
    k::attention_forward(a.atty, a.att, a.qkv, B, T, C, NH);
    k::matmul_forward(proj_, a.atty, block(params_, l, kAttProjW), block(params_, l, kAttProjB), N,
                      C, C);
    k::residual_forward(a.residual2, residual, proj_, NC);
    k::layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, block(params_, l, kLn2W),
                         block(params_, l, kLn2B), N, C);
    k::matmul_forward(a.fch, a.ln2, block(params_, l, kFcW), block(params_, l, kFcB), N, C, 4 * C);
    k::gelu_forward(a.fch_gelu, a.fch, NC * 4);
    k::matmul_forward(proj_, a.fch_gelu, block(params_, l, kFcProjW), block(params_, l, kFcProjB),
                      N, 4 * C, C);
    k::residual_forward(a.residual3, a.residual2, proj_, NC);
  }
  k::layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, blocks_.back().residual3,
                       at(params_, layout_.lnf_weight()), at(params_, layout_.lnf_bias()), N, C);
  k::matmul_nt_forward(logits_, lnf_, at(params_, layout_.wte()), N, C, V);
}

void CpuGPT2::backward(const int32_t* inputs, int B, int T) {
  const int C = config_.n_embd, NH = config_.n_head, V = config_.vocab_size;
  const int N = B * T;
  const size_t NC = static_cast<size_t>(N) * C;
  auto zero = [](float* p, size_t n) { std::memset(p, 0, n * sizeof(float)); };

  // Classifier (tied to wte) and final layernorm. logits_ holds dlogits here.
  zero(dln_, NC);
  k::matmul_nt_backward(dln_, at(grads_, layout_.wte()), logits_, lnf_, at(params_, layout_.wte()),
                        N, C, V);
  zero(dresidual_, NC);
  k::layernorm_backward(dresidual_, at(grads_, layout_.lnf_weight()),
                        at(grads_, layout_.lnf_bias()), dln_, blocks_.back().residual3,
                        at(params_, layout_.lnf_weight()), lnf_mean_, lnf_rstd_, N, C);
  // Gradient-ready notifications (language_model.h): ln_f, then each block as it completes, then
  // wte + wpe after the embedding backward. `ready_end` is where the last reported range began.
  size_t ready_end = num_params_;
  auto report_down_to = [&](size_t begin) {
    report_gradients_ready(begin, ready_end);
    ready_end = begin;
  };
  report_down_to(layout_.lnf_weight().offset);
  // Blocks in reverse. dresidual_ holds d(block output) on entry and d(block input) on exit:
  // each residual add passes the gradient through, and each layernorm backward accumulates into it.
  for (int l = config_.n_layer - 1; l >= 0; --l) {
    const BlockActivations& a = blocks_[l];
    const float* residual = l == 0 ? encoded_ : blocks_[l - 1].residual3;
    zero(dfch_gelu_, NC * 4);
    k::matmul_backward(dfch_gelu_, block(grads_, l, kFcProjW), block(grads_, l, kFcProjB),
                       dresidual_, a.fch_gelu, block(params_, l, kFcProjW), N, 4 * C, C);
    zero(dfch_, NC * 4);
    k::gelu_backward(dfch_, a.fch, dfch_gelu_, NC * 4);
    zero(dln_, NC);
    k::matmul_backward(dln_, block(grads_, l, kFcW), block(grads_, l, kFcB), dfch_, a.ln2,
                       block(params_, l, kFcW), N, C, 4 * C);
    k::layernorm_backward(dresidual_, block(grads_, l, kLn2W), block(grads_, l, kLn2B), dln_,
                          a.residual2, block(params_, l, kLn2W), a.ln2_mean, a.ln2_rstd, N, C);
    zero(datty_, NC);
    k::matmul_backward(datty_, block(grads_, l, kAttProjW), block(grads_, l, kAttProjB), dresidual_,
                       a.atty, block(params_, l, kAttProjW), N, C, C);
    zero(dqkv_, NC * 3);
    k::attention_backward(dqkv_, datt_, datty_, a.qkv, a.att, B, T, C, NH);
    zero(dln_, NC);
    k::matmul_backward(dln_, block(grads_, l, kQkvW), block(grads_, l, kQkvB), dqkv_, a.ln1,
                       block(params_, l, kQkvW), N, C, 3 * C);
    k::layernorm_backward(dresidual_, block(grads_, l, kLn1W), block(grads_, l, kLn1B), dln_,
                          residual, block(params_, l, kLn1W), a.ln1_mean, a.ln1_rstd, N, C);
    report_down_to(layout_.block(l, kLn1W).offset);
  }
  k::encoder_backward(at(grads_, layout_.wte()), at(grads_, layout_.wpe()), dresidual_, inputs, B,
                      T, C);
  report_down_to(0);
}

float CpuGPT2::mean_loss(int N) const {
  double sum = 0.0;
  for (int i = 0; i < N; ++i) sum += losses_[i];
  return static_cast<float>(sum / N);
}

float CpuGPT2::forward_backward(const int32_t* inputs, const int32_t* targets, int B, int T,
                                float loss_scale) {
  check_batch(inputs, targets, B, T);
  const int N = B * T;
  forward(inputs, B, T);
  k::crossentropy_forward_backward(losses_, logits_, targets, loss_scale / static_cast<float>(N), N,
                                   config_.vocab_size);
  backward(inputs, B, T);
  return mean_loss(N);
}

float CpuGPT2::forward_loss(const int32_t* inputs, const int32_t* targets, int B, int T) {
  check_batch(inputs, targets, B, T);
  const int N = B * T;
  forward(inputs, B, T);
  k::crossentropy_forward(losses_, logits_, targets, N, config_.vocab_size);
  return mean_loss(N);
}

float CpuGPT2::gradient_norm() {
  return static_cast<float>(std::sqrt(k::sum_of_squares(grads_.data(), num_params_)));
}

void CpuGPT2::optimizer_step(const AdamWOptions& options, float lr, float grad_scale) {
  ++step_;
  k::AdamWHyper hyper = kernels::adamw_step(options, lr, grad_scale, step_);
  for (const TensorLayout& t : layout_) {
    hyper.weight_decay = is_weight_decayed(t.shape) ? options.weight_decay : 0.0f;
    k::adamw_update(params_.data() + t.offset, grads_.data() + t.offset, m_.data() + t.offset,
                    v_.data() + t.offset, t.numel, hyper);
  }
}

}  // namespace

std::unique_ptr<LanguageModel> make_cpu_gpt2(const GPT2Config& config, int max_batch_size,
                                             int max_seq_len) {
  return std::make_unique<CpuGPT2>(config, max_batch_size, max_seq_len);
}

}  // namespace longhaul::model
