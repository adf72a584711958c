// The CUDA backend of the GPT-2 LanguageModel: bf16 parameters and activations, fp32 master
// weights, optimizer moments and gradients, kernels from longhaul::kernels_cuda.
//
// This header compiles without the CUDA toolkit. When the project is built without CUDA
// (LONGHAUL_HAVE_CUDA off), cuda_available() returns false with a reason and make_cuda_gpt2()
// throws Unavailable, so the trainer can implement `device: auto|cpu|cuda` unconditionally:
//
//   std::string why;
//   if (device == "cuda" || (device == "auto" && backend_cuda::cuda_available(&why))) {
//     model = backend_cuda::make_cuda_gpt2(config, B, T);   // throws Unavailable on failure
//   } else {
//     if (device == "auto") LH_LOG(WARNING) << "no usable GPU, training on CPU" << kv("why", why);
//     model = model::make_cpu_gpt2(config, B, T);
//   }
//
// Memory space: as language_model.h says, the flat buffers and NamedTensor::data of a CUDA model
// are DEVICE pointers (fp32, the unpadded layout of language_model.h). Host code must not
// dereference them; it moves state with the CudaModel methods below (download/upload for
// restore and inspection, snapshot_to_host for checkpoints). The vocabulary is padded to a
// multiple of 128 only inside the bf16 working copy and the logits; every fp32 buffer, name and
// shape uses the real vocab_size, so checkpoints are interchangeable with the CPU backend.
//
// Thread-safety: like every LanguageModel, driven by one training thread. All device work of a
// model is ordered on its own stream; snapshot copies run on a second stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include <longhaul/model/language_model.h>

namespace longhaul::backend_cuda {

// True when this build has the CUDA backend and at least one usable GPU is visible. On false,
// *why (if given) says what is missing ("built without CUDA", "no CUDA device: ...").
// Never throws.
bool cuda_available(std::string* why = nullptr);

// One device-to-host copy of a snapshot: `device_src` is a NamedTensor::data of this model
// (parameters or optimizer state), `host_dst` receives exactly numel * 4 bytes.
struct HostCopy {
  const float* device_src = nullptr;
  std::span<std::byte> host_dst;
};

// The CUDA-only part of the model's API: obtain it with dynamic_cast<CudaModel*>(model.get()).
class CudaModel : public model::LanguageModel {
 public:
  // Synchronous copies between host memory and this model's device buffers (any span of
  // parameters_flat()/gradients_flat()/NamedTensor data). upload() refreshes the bf16 working
  // copy of parameters it touches, so a restore is: upload every parameter and moment, then
  // set_optimizer_step_count(). Throws InvalidArgument when the span is not inside the model's
  // buffers or the sizes differ.
  virtual void download(std::span<const float> device_src, std::span<float> host_dst) = 0;
  virtual void upload(std::span<const float> host_src, std::span<float> device_dst) = 0;

  // Asynchronous checkpoint snapshot at a step boundary: enqueues device-to-host copies on a
  // side stream, ordered after all work issued so far (the last optimizer step), into a pinned
  // staging buffer the model owns (allocated on the first call, sized for the copies, reused),
  // and returns at once. forward/backward of the next step may overlap the transfer; the next
  // optimizer_step() or upload() waits for it on the device. The caller's buffers (any host
  // memory: the supervisor's Snapshot vectors) are written by wait_snapshot() and must stay
  // alive until it returns. (Registering the caller's buffers with cudaHostRegister instead would
  // save the host copy, but a buffer freed and reallocated at the same address would then be
  // written through a stale registration.)
  virtual void snapshot_to_host(std::span<const HostCopy> copies) = 0;
  // Copies the snapshot into the caller's buffers as its transfers complete (64 MB groups, a
  // few threads per group, overlapping the remaining transfer) and returns when all of it is
  // there: the buffers then hold one consistent step.
  virtual void wait_snapshot() = 0;
};

enum class AttentionKernel {
  kAuto,    // kFlash when the head size is 64 (every GPT-2 size), else kCublas
  kFlash,   // fused flash-style kernels (head size 64 only)
  kCublas,  // cuBLASLt batched products + fused causal softmax (keeps the T x T probabilities)
};

// ---- Backend-independent state transfer, for the trainer's checkpoint glue ----
// These work on any LanguageModel: for a CudaModel they use its device copies, for a host
// backend (CPU) they are plain memcpy. `model_span` must be a span of the model's own buffers
// (parameters_flat(), gradients_flat() or a NamedTensor's data); sizes must match (else
// InvalidArgument).
void copy_to_host(model::LanguageModel& model, std::span<const float> model_span,
                  std::span<float> host);
void copy_from_host(model::LanguageModel& model, std::span<const float> host,
                    std::span<float> model_span);
// Starts copying a step-consistent snapshot (CUDA: asynchronous, see CudaModel; CPU: done on
// return) and waits for it. Between the two calls the training loop may run forward/backward.
void start_snapshot(model::LanguageModel& model, std::span<const HostCopy> copies);
void finish_snapshot(model::LanguageModel& model);

struct CudaOptions {
  int device = 0;              // CUDA device ordinal
  bool recompute_gelu = true;  // keep one (B, T, 4C) GELU buffer, recompute it in backward
  AttentionKernel attention = AttentionKernel::kAuto;
  // The cuBLASLt epilogues fused into the dense layers' GEMMs (bias add, bias + GELU, bias
  // gradient); false runs the plain GEMM and a separate kernel instead (the start-up self-check's
  // fallback when an epilogue computes wrong numbers on this GPU or library).
  bool bias_epilogue = true;
  bool gelu_epilogue = true;
  bool bias_grad_epilogue = true;
};

// Creates the model on the GPU, weights initialised with init_weights(0) (the same values as the
// CPU backend for the same seed). Throws Unavailable when CUDA is not built in or no GPU can be
// used, FailedPrecondition when the activations for (max_batch_size, max_seq_len) do not fit in
// device memory, InvalidArgument for a bad config (n_embd and head size must be multiples of 8;
// AttentionKernel::kFlash needs head size 64).
std::unique_ptr<CudaModel> make_cuda_gpt2(const model::GPT2Config& config, int max_batch_size,
                                          int max_seq_len, const CudaOptions& options = {});

// Device memory the model would allocate, in bytes (parameters, optimizer state and activations),
// for choosing the largest micro-batch that fits.
int64_t cuda_gpt2_memory_bytes(const model::GPT2Config& config, int max_batch_size, int max_seq_len,
                               const CudaOptions& options = {});

}  // namespace longhaul::backend_cuda
