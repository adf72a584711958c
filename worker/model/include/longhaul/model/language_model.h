// The interface every training backend implements (CPU in worker/model/cpu, CUDA in
// worker/model/cuda), so the trainer, the checkpointing glue and data-parallel gradient averaging
// are written once. Moving state between host memory and the model (download, upload,
// snapshot_to_host) is part of the interface: host backends keep the defaults (memcpy), device
// backends override them, and callers never need to know which one they hold.
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
// Gradient-ready notifications (set_gradient_ready_callback) let a data-parallel layer start
// all-reducing the gradients of the last layers while the backward pass is still computing the
// first ones; the contract is at the declaration below.
//
// Thread-safety: not thread-safe; one training thread drives a model. Internally the backend
// uses its own threads (CPU: OpenMP + OpenBLAS). The gradient-ready callback runs on the
// training thread; the memory of a range it reports may be read and written by another thread
// until forward_backward returns, because the backend no longer touches it in that call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <longhaul/kernels/adamw_hyper.h>
#include <longhaul/model/config.h>
#include <longhaul/model/pretrained.h>

namespace longhaul::model {

struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;  // row-major
  float* data = nullptr;       // into the flat buffer, backend memory space

  int64_t numel() const;
};

// One copy of a snapshot: `model_src` is a NamedTensor::data of the model (parameters or
// optimizer state, backend memory space), `host_dst` receives exactly numel * 4 bytes.
struct HostCopy {
  const float* model_src = nullptr;
  std::span<std::byte> host_dst;
};

// AdamW hyper-parameters (learning rate and clipping scale are per step arguments), one
// definition with the kernels' (longhaul/kernels/adamw_hyper.h). The defaults are GPT-2 /
// nanoGPT's. Weight decay applies only to 2-D tensors (wte, wpe and the four matmul weights of
// each block), never to biases or layernorm parameters: is_weight_decayed below.
using AdamWOptions = kernels::AdamWOptions;

// Where a backend keeps its flat buffers (the memory contract above).
enum class MemorySpace {
  kHost,    // host memory ("cpu"): host code may read and write them
  kDevice,  // device memory ("cuda"): only the transfers below and the backend's own kernels
};

class LanguageModel {
 public:
  virtual ~LanguageModel() = default;

  virtual const GPT2Config& config() const = 0;
  virtual std::string_view device_name() const = 0;  // "cpu", "cuda": for people to read
  // Where the flat buffers live: what a data-parallel layer all-reduces them with (host: Gloo,
  // in place and overlapped with the backward pass; device: the device's collective, NCCL).
  virtual MemorySpace memory_space() const = 0;
  // Where the bits of a step are computed, which bit-identical resume depends on, as one line:
  // "cpu: <BLAS build and core>, <n> threads", or "cuda: <GPU> (compute X.Y), CUDA runtime and
  // cuBLAS <version>, driver <version>". Checkpoints record it (`numerics` metadata).
  virtual std::string numerical_environment() const = 0;
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

  // --- Moving state between host memory and the model (synchronous) ---
  //
  // `model_span` / `model_src` must lie in the model's own buffers (parameters_flat(),
  // gradients_flat() or a NamedTensor's data) and the host side must have the same size, else
  // InvalidArgument. The defaults are host memcpys (a host backend's buffers are host memory);
  // a device backend overrides all three.
  //
  // Copies model memory into host memory.
  virtual void download(std::span<const float> model_span, std::span<float> host);
  // Copies host memory into the model. A backend that keeps a derived copy of the parameters
  // (CUDA: the bf16 working copy) refreshes it, so a restore is: upload every parameter and
  // moment, then set_optimizer_step_count().
  virtual void upload(std::span<const float> host, std::span<float> model_span);
  // A step-consistent checkpoint snapshot, called at a step boundary: every copy holds the state
  // after all work issued so far (the last optimizer step) when this returns. The caller's
  // buffers may be any host memory (the supervisor's Snapshot vectors).
  virtual void snapshot_to_host(std::span<const HostCopy> copies);

  // Fills parameters from a pre-trained tensor set (see pretrained.h for name resolution).
  PretrainedLoadReport load_pretrained(const PretrainedTensorReader& reader,
                                       const PretrainedLoadOptions& options = {});

  // --- Gradient-ready notifications (opt-in; for overlapping communication with backward) ---
  //
  // callback(begin, end): the gradients_flat() elements [begin, end) (element offsets) are
  // FINAL for the current forward_backward call: the backend will neither read nor write them
  // again before that call returns, so another thread may all-reduce them in place meanwhile.
  // A backend that reports (reports_gradients_per_layer() true) calls it during every
  // forward_backward while it is set: on the training thread, outside its parallel regions,
  // with ranges that are non-empty, disjoint and together cover the whole buffer exactly once
  // per call. For GPT-2 the layout is wte, wpe, block 0..L-1, ln_f and the backward pass
  // finishes ln_f first, then block L-1 ... block 0, then wte and wpe together (wte is also the
  // tied lm_head, whose gradient is written first and completed by the embedding backward):
  // ranges come as suffixes growing towards the front, in decreasing offset order, each
  // adjacent to the previous one. With accumulation the reported values are the accumulated
  // sums (earlier calls' gradients plus this call's).
  // A backend that does not report (the default; e.g. CUDA, which keeps one NCCL call over the
  // whole buffer) never calls it: there the whole buffer is final when forward_backward
  // returns, which a caller treats as one range [0, num_parameters()) after the call.
  // An exception thrown by the callback propagates out of forward_backward (gradients are then
  // partial). An empty callback turns the notifications off. forward_loss never calls it.
  using GradientReadyCallback = std::function<void(size_t begin, size_t end)>;
  void set_gradient_ready_callback(GradientReadyCallback callback) {
    gradient_ready_callback_ = std::move(callback);
  }
  bool has_gradient_ready_callback() const { return static_cast<bool>(gradient_ready_callback_); }
  // Whether forward_backward calls the gradient-ready callback per layer (see above).
  virtual bool reports_gradients_per_layer() const { return false; }

 protected:
  // The argument checks forward_backward / forward_loss promise (B, T against max_batch_size()
  // / max_seq_len(), every token id in [0, vocab_size)); InvalidArgument naming the value.
  void check_batch(const int32_t* inputs, const int32_t* targets, int B, int T) const;

  // Whether [p, p + n) lies inside one of the four flat buffers (parameters, gradients, exp_avg,
  // exp_avg_sq), located through the public accessors; the host transfers' argument check.
  bool in_model_buffers(const float* p, size_t n);

  // For backends that report: invokes the callback (if set) for [begin, end).
  void report_gradients_ready(size_t begin, size_t end) {
    if (gradient_ready_callback_) gradient_ready_callback_(begin, end);
  }

 private:
  GradientReadyCallback gradient_ready_callback_;  // empty: notifications off
};

// Whether a parameter gets weight decay (2-D tensors only); every backend's optimizer uses it.
bool is_weight_decayed(std::span<const int64_t> shape);
bool is_weight_decayed(const NamedTensor& parameter);

}  // namespace longhaul::model
