// The interface every training backend implements (CPU here, CUDA later), so the trainer, the
// checkpointing glue and data-parallel gradient averaging are written once.
//
// Memory contract: parameters, gradients and the two AdamW moments each live in one flat,
// contiguous fp32 buffer (llm.c style), laid out tensor after tensor in named_parameters()
// order with no padding. parameters_flat()/gradients_flat() expose the whole buffer so a
// data-parallel layer can all-reduce gradients in one call. Pointers and spans are in the
// backend's memory space (host for "cpu", device for "cuda"); they stay valid for the life of
// the model.
//
// Parameter names are Hugging Face GPT-2's, with the "transformer." prefix, in this order:
//   transformer.wte.weight (V, C)                transformer.wpe.weight (maxT, C)
//   per block i: transformer.h.{i}.ln_1.weight (C), .ln_1.bias (C),
//     .attn.c_attn.weight (C, 3C), .attn.c_attn.bias (3C),
//     .attn.c_proj.weight (C, C), .attn.c_proj.bias (C), .ln_2.weight (C), .ln_2.bias (C),
//     .mlp.c_fc.weight (C, 4C), .mlp.c_fc.bias (4C), .mlp.c_proj.weight (4C, C), .mlp.c_proj.bias
//     (C)
//   transformer.ln_f.weight (C), transformer.ln_f.bias (C)
// lm_head.weight is tied to transformer.wte.weight and not stored. Moments are named
// "optimizer.exp_avg.<name>" and "optimizer.exp_avg_sq.<name>" (torch.optim.AdamW's state keys).
//
// Thread-safety: not thread-safe; one training thread drives a model. Internally the backend
// uses its own threads (CPU: OpenMP + OpenBLAS).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <longhaul/model/config.h>
#include <longhaul/model/pretrained.h>

namespace longhaul::model {

struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;  // row-major
  float* data = nullptr;       // into the flat buffer, backend memory space

  int64_t numel() const;
};

// AdamW hyper-parameters (learning rate and clipping scale are per step arguments). The
// defaults are GPT-2 / nanoGPT's. Weight decay applies only to 2-D tensors (wte, wpe and the
// four matmul weights of each block), never to biases or layernorm parameters.
struct AdamWOptions {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
};

class LanguageModel {
 public:
  virtual ~LanguageModel() = default;

  virtual const GPT2Config& config() const = 0;
  virtual std::string_view device_name() const = 0;  // "cpu", "cuda"
  virtual int64_t num_parameters() const = 0;
  // The largest batch / sequence length forward calls accept (activations are sized for them).
  virtual int max_batch_size() const = 0;
  virtual int max_seq_len() const = 0;

  // GPT-2 initialisation, deterministic for a seed: weights ~ N(0, 0.02), the two residual
  // projections (attn.c_proj.weight, mlp.c_proj.weight) ~ N(0, 0.02/sqrt(2 n_layer)), biases 0,
  // layernorm weight 1 and bias 0. Also zeroes gradients, moments and the step count.
  virtual void init_weights(uint64_t seed) = 0;

  // Forward and backward of one micro-batch: inputs and targets are (B, T) token ids with
  // 1 <= B <= max_batch_size(), 1 <= T <= max_seq_len(). Gradients ACCUMULATE, scaled by
  // loss_scale (1/accumulation_steps gives the gradient of the mean over micro-batches).
  // Returns the mean cross-entropy loss over the B*T positions (unscaled).
  // Throws InvalidArgument for a bad B or T or a token id outside [0, vocab_size).
  virtual float forward_backward(const int32_t* inputs, const int32_t* targets, int B, int T,
                                 float loss_scale) = 0;
  // Mean loss only, for evaluation; gradients are untouched.
  virtual float forward_loss(const int32_t* inputs, const int32_t* targets, int B, int T) = 0;

  virtual void zero_grad() = 0;
  // Global L2 norm of all gradients.
  virtual float gradient_norm() = 0;
  // One AdamW step over all parameters with gradients multiplied by grad_scale first
  // (min(1, max_norm / gradient_norm()) gives global-norm clipping). Increments the step count
  // used for bias correction before the update (the first step uses t = 1). Gradients are left
  // as they are: call zero_grad() before the next accumulation.
  virtual void optimizer_step(const AdamWOptions& options, float lr, float grad_scale) = 0;

  virtual std::span<float> parameters_flat() = 0;
  virtual std::span<float> gradients_flat() = 0;
  virtual std::vector<NamedTensor> named_parameters() = 0;
  // exp_avg tensors for every parameter, then exp_avg_sq tensors, same order and shapes.
  virtual std::vector<NamedTensor> named_optimizer_state() = 0;
  virtual int64_t optimizer_step_count() const = 0;
  virtual void set_optimizer_step_count(int64_t steps) = 0;  // for restore

  // Fills parameters from a pre-trained tensor set (see pretrained.h for name resolution).
  PretrainedLoadReport load_pretrained(const PretrainedTensorReader& reader,
                                       const PretrainedLoadOptions& options = {});

 protected:
  // Copies host fp32 values into one parameter (src.size() == dst.numel()). The default is a
  // host memcpy; device backends override it.
  virtual void upload_parameter(const NamedTensor& dst, std::span<const float> src);
};

// Whether a parameter gets weight decay (2-D tensors only).
bool is_weight_decayed(const NamedTensor& parameter);

}  // namespace longhaul::model
