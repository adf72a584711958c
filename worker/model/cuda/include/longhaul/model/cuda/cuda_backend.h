// The CUDA backend of the GPT-2 LanguageModel: bf16 parameters and activations, fp32 master
// weights, optimizer moments and gradients, kernels from longhaul::kernels_cuda.
//
// This header compiles without the CUDA toolkit. When the project is built without CUDA
// (LONGHAUL_HAVE_CUDA off), cuda_available() returns false with a reason and make_cuda_gpt2()
// throws Unavailable, so `device: auto|cpu|cuda` is decided unconditionally, in one place:
// selfcheck::make_model_on_device (longhaul/selfcheck/device_plan.h), which calls these.
//
// Memory space: as language_model.h says, the flat buffers and NamedTensor::data of a CUDA model
// are DEVICE pointers (fp32, the unpadded layout of language_model.h). Host code must not
// dereference them; it moves state with the LanguageModel transfers (download/upload for restore
// and inspection, snapshot_to_host for checkpoints), which this backend implements with device
// copies. The vocabulary is padded to a multiple of 128 only inside the bf16 working copy and the
// logits; every fp32 buffer, name and shape uses the real vocab_size, so checkpoints are
// interchangeable with the CPU backend.
//
// Snapshots: snapshot_to_host copies device-to-host into a pinned staging buffer the model owns
// (allocated on the first call, sized for the copies, reused) on a side stream, and copies each
// 64 MB group on to the caller's buffers with a few threads as soon as it has arrived, so the
// host copy overlaps the remaining transfer. (Registering the caller's buffers with
// cudaHostRegister instead would save the host copy, but a buffer freed and reallocated at the
// same address would then be written through a stale registration.)
//
// Thread-safety: like every LanguageModel, driven by one training thread. All device work of a
// model is ordered on its own stream; snapshot copies run on a second stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <longhaul/model/language_model.h>

namespace longhaul::backend_cuda {

// True when this build has the CUDA backend and at least one usable GPU is visible. On false,
// *why (if given) says what is missing ("built without CUDA", "no CUDA device: ...").
// Never throws.
bool cuda_available(std::string* why = nullptr);

enum class AttentionKernel {
  kAuto,    // kFlash when the head size is 64 (every GPT-2 size), else kCublas
  kFlash,   // fused flash-style kernels (head size 64 only)
  kCublas,  // cuBLASLt batched products + fused causal softmax (keeps the T x T probabilities)
};

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
std::unique_ptr<model::LanguageModel> make_cuda_gpt2(const model::GPT2Config& config,
                                                     int max_batch_size, int max_seq_len,
                                                     const CudaOptions& options = {});

// Device memory the model would allocate, in bytes (parameters, optimizer state and activations),
// for choosing the largest micro-batch that fits.
int64_t cuda_gpt2_memory_bytes(const model::GPT2Config& config, int max_batch_size, int max_seq_len,
                               const CudaOptions& options = {});

}  // namespace longhaul::backend_cuda
