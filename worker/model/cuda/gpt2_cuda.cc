// The CUDA GPT-2: the bf16 working-copy layout, activation plan, forward, backward, AdamW and
// state transfer, over longhaul::kernels_cuda. Plain C++ (g++); every kernel is behind a
// launcher. Parameter names, order, fp32 offsets and init_weights are model::ParameterLayout's
// (gpt2_layout.h), shared with the CPU backend, so a seed gives the same weights on both.
//
// Precision: fp32 master weights, gradients and AdamW moments in the unpadded layout of
// language_model.h; a bf16 working copy of the parameters for the kernels, in the same order
// except that wte has Vp = round_up(V, 128) rows (the padding rows are zero and never updated),
// so the classifier GEMM and the logits rows are aligned. Activations are bf16, statistics and
// losses fp32; matmuls accumulate in fp32 and write weight gradients straight into fp32.
//
// Activations kept per layer for the backward pass (bf16 unless noted), N = B*T:
//   ln1 (N,C) + mean/rstd (N fp32), q/k/v by head (3NC), attention probabilities (B,NH,T,T),
//   attention output (N,C), residual2 (N,C), ln2 (N,C) + mean/rstd, fc pre-activation (N,4C),
//   residual3 (N,C).
// The GELU output (N,4C) is one shared buffer recomputed in the backward pass (CudaOptions::
// recompute_gelu), saving (L-1) * N * 4C * 2 bytes. Scratch shared by all layers: qkv (N,3C),
// the projection output (N,C), the attention head output (N,C), and in the backward pass
// dresidual, dfch (N,4C), attention head gradients (4NC) and dP (B,NH,T,T).
//
// Fusions: each residual add is fused into the layernorm that follows it (the next block's ln_1,
// or ln_f after the last block), the biases and GELU into the GEMM epilogues, softmax +
// cross-entropy + dlogits into one kernel, all AdamW tensors into one launch.
//
// Determinism: every reduction has a fixed order (see the kernels), AdamW's stochastic rounding
// is keyed by (seed, step, index), so two runs from the same seed and data are bit-identical on
// the same GPU model and library versions.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include <longhaul/base/error.h>
#include <longhaul/base/log.h>
#include <longhaul/kernels/cuda/adamw.h>
#include <longhaul/kernels/cuda/attention.h>
#include <longhaul/kernels/cuda/cast.h>
#include <longhaul/kernels/cuda/check.h>
#include <longhaul/kernels/cuda/classifier.h>
#include <longhaul/kernels/cuda/encoder.h>
#include <longhaul/kernels/cuda/gelu.h>
#include <longhaul/kernels/cuda/global_norm.h>
#include <longhaul/kernels/cuda/layernorm.h>
#include <longhaul/kernels/cuda/matmul.h>
#include <longhaul/model/gpt2_layout.h>

#include "longhaul/model/cuda/cuda_backend.h"
#include "longhaul/model/cuda/device_info.h"

namespace longhaul::backend_cuda {
namespace {

namespace k = longhaul::kernels::cuda;
using k::bf16;
using model::BlockTensor;
using model::GPT2Config;
using model::NamedTensor;
using model::ParameterLayout;
using model::TensorLayout;
using enum model::BlockTensor;  // kLn1W, kQkvW, ...

constexpr int kVocabPadding = 128;
constexpr size_t kAlignment = 256;  // every activation buffer starts 256-byte aligned
// Snapshot copies are grouped into stretches of about this many bytes; the host copies a stretch
// out of the pinned staging buffer while the GPU still transfers the next ones.
constexpr size_t kSnapshotGroupBytes = size_t{64} << 20;
constexpr int kSnapshotCopyThreads = 8;

// Carves typed, aligned sub-buffers out of one allocation. Run once with base == nullptr to
// measure, then with the real base.
class Carver {
 public:
  explicit Carver(std::byte* base) : base_(base) {}
  template <typename T>
  T* take(size_t count) {
    used_ = (used_ + kAlignment - 1) / kAlignment * kAlignment;
    T* p = reinterpret_cast<T*>(base_ + used_);
    used_ += count * sizeof(T);
    return p;
  }
  size_t used() const { return used_; }

 private:
  std::byte* base_;
  size_t used_ = 0;
};

struct BlockActivations {
  bf16* ln1 = nullptr;        // (N, C)
  float* ln1_mean = nullptr;  // (N)
  float* ln1_rstd = nullptr;  // (N)
  bf16* qkvr = nullptr;       // flash: qkv (N, 3C); cuBLAS path: q, k, v by head (3, B, NH, T, HS)
  bf16* att = nullptr;        // (B, NH, T, T), cuBLAS path only
  float* lse = nullptr;       // (B, NH, T), flash only
  bf16* atty = nullptr;       // (N, C)
  bf16* residual2 = nullptr;  // (N, C)
  bf16* ln2 = nullptr;        // (N, C)
  float* ln2_mean = nullptr;  // (N)
  float* ln2_rstd = nullptr;  // (N)
  bf16* fch = nullptr;        // (N, 4C) pre-GELU
  bf16* fch_gelu = nullptr;   // (N, 4C) GELU output (shared when recomputed)
  bf16* residual3 = nullptr;  // (N, C)
};

// Every device buffer of the model, carved from one allocation.
struct Buffers {
  // Parameters and optimizer state.
  float* master = nullptr;  // (P)
  float* grads = nullptr;   // (P)
  float* m = nullptr;       // (P)
  float* v = nullptr;       // (P)
  bf16* params = nullptr;   // (P + (Vp - V) * C)
  k::AdamWChunk* chunks = nullptr;
  // Inputs.
  int32_t* inputs = nullptr;          // (N)
  int32_t* targets = nullptr;         // (N)
  int32_t* unique_tokens = nullptr;   // (N)
  int32_t* bucket_offsets = nullptr;  // (N + 1)
  int32_t* positions = nullptr;       // (N)
  // Forward.
  bf16* encoded = nullptr;  // (N, C)
  std::vector<BlockActivations> blocks;
  bf16* qkv = nullptr;        // (N, 3C) scratch; dqkv in the backward pass
  bf16* proj = nullptr;       // (N, C) scratch; dln in the backward pass
  bf16* heads_out = nullptr;  // (N, C) scratch; datty in the backward pass
  bf16* lnf = nullptr;        // (N, C)
  float* lnf_mean = nullptr;  // (N)
  float* lnf_rstd = nullptr;  // (N)
  bf16* logits = nullptr;     // (N, Vp); dlogits in place
  float* losses = nullptr;    // (N)
  // Backward scratch.
  bf16* dresidual = nullptr;  // (N, C)
  bf16* dfch = nullptr;       // (N, 4C)
  bf16* dheads = nullptr;     // (4, N, C), cuBLAS attention only
  bf16* datt = nullptr;       // (B, NH, T, T), cuBLAS attention only
  float* dot = nullptr;       // (B, NH, T), flash attention only
  float* fscratch = nullptr;  // reductions
  float* scalars = nullptr;   // (2)
};

size_t round_up(size_t x, size_t multiple) { return (x + multiple - 1) / multiple * multiple; }

struct Shape {
  int V, Vp, C, NH, L, maxT;
  int B, T;    // the maxima activations are sized for
  bool flash;  // flash attention kernels (else cuBLASLt products + fused softmax)
};

// Lays out `buffers` from `carver` (measuring when the carver's base is null).
void carve(Carver& carver, Buffers& b, const Shape& s, size_t num_params, size_t num_chunks,
           bool recompute_gelu) {
  const size_t N = static_cast<size_t>(s.B) * s.T, C = s.C;
  const size_t NC = N * C;
  const size_t att = s.flash ? 0 : static_cast<size_t>(s.B) * s.NH * s.T * s.T;
  const size_t stats = s.flash ? N * static_cast<size_t>(s.NH) : 0;  // (B, NH, T)
  b.master = carver.take<float>(num_params);
  b.grads = carver.take<float>(num_params);
  b.m = carver.take<float>(num_params);
  b.v = carver.take<float>(num_params);
  b.params = carver.take<bf16>(num_params + static_cast<size_t>(s.Vp - s.V) * C);
  b.chunks = carver.take<k::AdamWChunk>(num_chunks);
  b.inputs = carver.take<int32_t>(N);
  b.targets = carver.take<int32_t>(N);
  b.unique_tokens = carver.take<int32_t>(N);
  b.bucket_offsets = carver.take<int32_t>(N + 1);
  b.positions = carver.take<int32_t>(N);
  b.encoded = carver.take<bf16>(NC);
  b.blocks.assign(s.L, BlockActivations{});
  bf16* shared_gelu = recompute_gelu ? carver.take<bf16>(4 * NC) : nullptr;
  for (BlockActivations& a : b.blocks) {
    a.ln1 = carver.take<bf16>(NC);
    a.ln1_mean = carver.take<float>(N);
    a.ln1_rstd = carver.take<float>(N);
    a.qkvr = carver.take<bf16>(3 * NC);
    a.att = att != 0 ? carver.take<bf16>(att) : nullptr;
    a.lse = stats != 0 ? carver.take<float>(stats) : nullptr;
    a.atty = carver.take<bf16>(NC);
    a.residual2 = carver.take<bf16>(NC);
    a.ln2 = carver.take<bf16>(NC);
    a.ln2_mean = carver.take<float>(N);
    a.ln2_rstd = carver.take<float>(N);
    a.fch = carver.take<bf16>(4 * NC);
    a.fch_gelu = recompute_gelu ? shared_gelu : carver.take<bf16>(4 * NC);
    a.residual3 = carver.take<bf16>(NC);
  }
  b.qkv = carver.take<bf16>(3 * NC);
  b.proj = carver.take<bf16>(NC);
  b.heads_out = carver.take<bf16>(NC);
  b.lnf = carver.take<bf16>(NC);
  b.lnf_mean = carver.take<float>(N);
  b.lnf_rstd = carver.take<float>(N);
  b.logits = carver.take<bf16>(N * static_cast<size_t>(s.Vp));
  b.losses = carver.take<float>(N);
  b.dresidual = carver.take<bf16>(NC);
  b.dfch = carver.take<bf16>(4 * NC);
  if (s.flash) {
    b.dot = carver.take<float>(stats);
  } else {
    b.dheads =
        carver.take<bf16>(static_cast<size_t>(k::attention_backward_scratch_heads(s.B, s.T, s.C)));
    b.datt = carver.take<bf16>(att);
  }
  const long long fscratch =
      std::max({k::layernorm_backward_scratch_floats(s.C),
                k::linear_backward_scratch_floats(4 * s.C), k::reduction_scratch_floats()});
  b.fscratch = carver.take<float>(static_cast<size_t>(fscratch));
  b.scalars = carver.take<float>(2);
}

// The bf16 working copy lays tensors out like the fp32 buffers (model::ParameterLayout) except
// that wte has Vp rows: fp32 element i is bf16 element i inside wte (its first V rows) and
// i + (Vp - V) * C after it.
size_t working_copy_index(const Shape& s, size_t i) {
  const size_t wte_end = static_cast<size_t>(s.V) * s.C;
  return i < wte_end ? i : i + static_cast<size_t>(s.Vp - s.V) * s.C;
}

std::vector<k::AdamWChunk> make_chunks(const ParameterLayout& layout, const Shape& shape) {
  std::vector<k::AdamWChunk> chunks;
  for (const TensorLayout& t : layout) {
    const size_t param_offset = working_copy_index(shape, t.offset);
    for (size_t start = 0; start < t.numel; start += k::kAdamWChunk) {
      k::AdamWChunk c;
      c.offset = static_cast<long long>(t.offset + start);
      c.param_offset = static_cast<long long>(param_offset + start);
      c.n = static_cast<int>(std::min<size_t>(k::kAdamWChunk, t.numel - start));
      c.decay = model::is_weight_decayed(t.shape) ? 1 : 0;
      chunks.push_back(c);
    }
  }
  return chunks;
}

void validate_for_cuda(const GPT2Config& config, int max_B, int max_T, const CudaOptions& options) {
  config.validate();
  if (max_B < 1) {
    throw InvalidArgument("max_batch_size = " + std::to_string(max_B) + " must be >= 1");
  }
  if (max_T < 1 || max_T > config.context_length) {
    throw InvalidArgument("max_seq_len = " + std::to_string(max_T) + " must be in [1, " +
                          std::to_string(config.context_length) + "] (the context_length)");
  }
  const int HS = config.n_embd / config.n_head;
  if (config.n_embd % 8 != 0 || HS % 8 != 0) {
    throw InvalidArgument(
        "the CUDA backend needs n_embd and n_embd / n_head to be multiples of 8 "
        "(16-byte vector access), got n_embd=" +
        std::to_string(config.n_embd) + " n_head=" + std::to_string(config.n_head) +
        "; use device: cpu for this shape");
  }
  if (options.attention == AttentionKernel::kFlash &&
      !k::flash_attention_supported(config.n_embd, config.n_head)) {
    throw InvalidArgument("the flash attention kernels need head size n_embd / n_head = 64, got " +
                          std::to_string(HS) + "; use the cuBLAS attention path (kAuto picks it)");
  }
}

bool use_flash(const GPT2Config& config, const CudaOptions& options) {
  switch (options.attention) {
    case AttentionKernel::kFlash:
      return true;
    case AttentionKernel::kCublas:
      return false;
    case AttentionKernel::kAuto:
      break;
  }
  return k::flash_attention_supported(config.n_embd, config.n_head);
}

Shape make_shape(const GPT2Config& config, int max_B, int max_T, const CudaOptions& options) {
  Shape s;
  s.V = config.vocab_size;
  s.Vp = static_cast<int>(round_up(static_cast<size_t>(s.V), kVocabPadding));
  s.C = config.n_embd;
  s.NH = config.n_head;
  s.L = config.n_layer;
  s.maxT = config.context_length;
  s.B = max_B;
  s.T = max_T;
  s.flash = use_flash(config, options);
  return s;
}

class GPT2Cuda final : public model::LanguageModel {
 public:
  GPT2Cuda(const GPT2Config& config, int max_B, int max_T, const CudaOptions& options);
  ~GPT2Cuda() override;
  GPT2Cuda(const GPT2Cuda&) = delete;
  GPT2Cuda& operator=(const GPT2Cuda&) = delete;

  const GPT2Config& config() const override { return config_; }
  std::string_view device_name() const override { return "cuda"; }
  model::MemorySpace memory_space() const override { return model::MemorySpace::kDevice; }
  std::string numerical_environment() const override;
  int64_t num_parameters() const override { return static_cast<int64_t>(num_params_); }
  int max_batch_size() const override { return shape_.B; }
  int max_seq_len() const override { return shape_.T; }

  void init_weights(uint64_t seed) override;
  float forward_backward(const int32_t* inputs, const int32_t* targets, int B, int T,
                         float loss_scale) override;
  float forward_loss(const int32_t* inputs, const int32_t* targets, int B, int T) override;
  void zero_grad() override;
  float gradient_norm() override;
  void optimizer_step(const model::AdamWOptions& options, float lr, float grad_scale) override;

  std::span<float> parameters_flat() override { return {buf_.master, num_params_}; }
  std::span<float> gradients_flat() override { return {buf_.grads, num_params_}; }
  std::vector<NamedTensor> named_parameters() override { return layout_.named(buf_.master); }
  std::vector<NamedTensor> named_optimizer_state() override {
    return layout_.named_optimizer_state(buf_.m, buf_.v);
  }
  int64_t optimizer_step_count() const override { return step_; }
  void set_optimizer_step_count(int64_t steps) override {
    if (steps < 0) {
      throw InvalidArgument("optimizer step count " + std::to_string(steps) + " is negative");
    }
    step_ = steps;
  }

  void download(std::span<const float> device_src, std::span<float> host_dst) override;
  void upload(std::span<const float> host_src, std::span<float> device_dst) override;
  void snapshot_to_host(std::span<const model::HostCopy> copies) override;

 private:
  const TensorLayout& block_tensor(int layer, BlockTensor index) const {
    return layout_.block(layer, index);
  }
  bf16* param(const TensorLayout& t) const {
    return buf_.params + working_copy_index(shape_, t.offset);
  }
  float* grad(const TensorLayout& t) const { return buf_.grads + t.offset; }
  bf16* param(int layer, BlockTensor index) const { return param(block_tensor(layer, index)); }
  float* grad(int layer, BlockTensor index) const { return grad(block_tensor(layer, index)); }

  void upload_tokens(const int32_t* inputs, const int32_t* targets, int B, int T);
  // Groups the inputs by token for the embedding backward and queues the upload; called while
  // the GPU runs the forward pass.
  void upload_token_buckets(const int32_t* inputs, int B, int T);
  void forward(int B, int T);
  void backward(int B, int T);
  float mean_loss(int N);
  // Refreshes the bf16 working copy of fp32 elements [begin, end) of the master weights.
  void refresh_working_copy(size_t begin, size_t end);
  // Which flat buffer a device span lies in (nullptr when none).
  const float* owning_buffer(const float* p, size_t n) const;
  // owning_buffer() of a transfer's device span, which must match the host side's size; else
  // InvalidArgument naming the transfer.
  const float* checked_buffer(std::span<const float> device, size_t host_size,
                              const char* what) const;
  // The two halves of snapshot_to_host: queue the device-to-host copies into the staging buffer,
  // then copy each group on to the caller's buffers as it arrives.
  void enqueue_snapshot(std::span<const model::HostCopy> copies);
  void copy_out_snapshot();
  // Makes this model's GPU current on the calling thread (the CUDA device is per-thread state;
  // the model may be built on one thread and trained on another).
  void activate() const { LH_CUDA_CHECK(cudaSetDevice(options_.device)); }

  GPT2Config config_;
  Shape shape_;
  CudaOptions options_;
  ParameterLayout layout_;  // wte, wpe, blocks, ln_f; the fp32 buffers' layout
  size_t num_params_;
  int num_chunks_ = 0;
  int64_t step_ = 0;
  uint64_t seed_ = 0;
  int last_unique_tokens_ = 0;

  // Device resources, freed by release(): from the destructor, and from the constructor's catch
  // when building the model fails half-way.
  cudaStream_t stream_ = nullptr;
  cudaStream_t snapshot_stream_ = nullptr;
  cudaEvent_t step_boundary_ = nullptr;
  std::byte* device_memory_ = nullptr;
  int32_t* host_tokens_ = nullptr;  // pinned: inputs, targets, unique, offsets, positions
  float* host_scalar_ = nullptr;    // pinned (2)
  std::unique_ptr<k::Matmul> matmul_;
  Buffers buf_;
  // Snapshot staging: pinned host memory the device-to-host copies land in, then the host copy
  // plan run by copy_out_snapshot(). One event per group of copies (see kSnapshotGroupBytes).
  struct PendingCopy {
    size_t staging_offset;
    std::span<std::byte> host_dst;
    size_t group;
  };
  std::byte* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  std::vector<cudaEvent_t> group_events_;
  std::vector<PendingCopy> pending_copies_;
  size_t pending_groups_ = 0;

  void release() noexcept;
};

GPT2Cuda::GPT2Cuda(const GPT2Config& config, int max_B, int max_T, const CudaOptions& options)
    : config_(config),
      shape_(make_shape(config, max_B, max_T, options)),
      options_(options),
      layout_(config_),
      num_params_(layout_.num_parameters()) {
  const std::vector<k::AdamWChunk> chunks = make_chunks(layout_, shape_);
  num_chunks_ = static_cast<int>(chunks.size());
  try {
    LH_CUDA_CHECK(cudaSetDevice(options_.device));
    LH_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    LH_CUDA_CHECK(cudaStreamCreateWithFlags(&snapshot_stream_, cudaStreamNonBlocking));
    LH_CUDA_CHECK(cudaEventCreateWithFlags(&step_boundary_, cudaEventDisableTiming));
    Carver measure(nullptr);
    carve(measure, buf_, shape_, num_params_, chunks.size(), options_.recompute_gelu);
    LH_CUDA_CHECK(cudaMalloc(&device_memory_, measure.used()));
    Carver carver(device_memory_);
    carve(carver, buf_, shape_, num_params_, chunks.size(), options_.recompute_gelu);
    const size_t N = static_cast<size_t>(shape_.B) * shape_.T;
    LH_CUDA_CHECK(cudaMallocHost(&host_tokens_, (5 * N + 1) * sizeof(int32_t)));
    LH_CUDA_CHECK(cudaMallocHost(&host_scalar_, 2 * sizeof(float)));
    matmul_ = std::make_unique<k::Matmul>();
    matmul_->set_bias_epilogue(options_.bias_epilogue);
    matmul_->set_gelu_epilogue(options_.gelu_epilogue);
    matmul_->set_bias_grad_epilogue(options_.bias_grad_epilogue);
    LH_CUDA_CHECK(cudaMemcpyAsync(buf_.chunks, chunks.data(), chunks.size() * sizeof(chunks[0]),
                                  cudaMemcpyHostToDevice, stream_));
    LH_LOG(INFO) << "CUDA GPT-2 allocated" << kv("params", num_params_)
                 << kv("device_bytes", measure.used()) << kv("max_batch", shape_.B)
                 << kv("max_seq_len", shape_.T) << kv("padded_vocab", shape_.Vp);
    init_weights(0);
  } catch (...) {
    release();
    throw;
  }
}

GPT2Cuda::~GPT2Cuda() { release(); }

std::string GPT2Cuda::numerical_environment() const {
  const CudaBuildInfo build = cuda_build_info();
  const CudaSystemInfo sys = cuda_system_info();
  std::string gpu = "unknown GPU";
  for (const CudaDeviceInfo& d : sys.devices) {
    if (d.ordinal != options_.device) continue;
    gpu =
        d.name + " (compute " + std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor) + ")";
  }
  return "cuda: " + gpu + ", CUDA runtime and cuBLAS " + build.runtime_version + ", driver " +
         sys.driver_version;
}

void GPT2Cuda::release() noexcept {
  // Errors are ignored here: this runs on error paths and in destructors.
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (snapshot_stream_ != nullptr) cudaStreamSynchronize(snapshot_stream_);
  for (cudaEvent_t event : group_events_) cudaEventDestroy(event);
  group_events_.clear();
  if (staging_ != nullptr) cudaFreeHost(staging_);
  staging_ = nullptr;
  matmul_.reset();
  if (host_scalar_ != nullptr) cudaFreeHost(host_scalar_);
  if (host_tokens_ != nullptr) cudaFreeHost(host_tokens_);
  if (device_memory_ != nullptr) cudaFree(device_memory_);
  if (step_boundary_ != nullptr) cudaEventDestroy(step_boundary_);
  if (snapshot_stream_ != nullptr) cudaStreamDestroy(snapshot_stream_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  host_scalar_ = nullptr;
  host_tokens_ = nullptr;
  device_memory_ = nullptr;
  step_boundary_ = nullptr;
  snapshot_stream_ = stream_ = nullptr;
  (void)cudaGetLastError();
}

void GPT2Cuda::init_weights(uint64_t seed) {
  activate();
  std::vector<float> host(num_params_);
  layout_.init_weights(seed, host);
  const size_t bytes = num_params_ * sizeof(float);
  LH_CUDA_CHECK(cudaMemcpyAsync(buf_.master, host.data(), bytes, cudaMemcpyHostToDevice, stream_));
  LH_CUDA_CHECK(cudaMemsetAsync(buf_.grads, 0, bytes, stream_));
  LH_CUDA_CHECK(cudaMemsetAsync(buf_.m, 0, bytes, stream_));
  LH_CUDA_CHECK(cudaMemsetAsync(buf_.v, 0, bytes, stream_));
  // The padding rows of wte stay zero forever (no gradient reaches them, AdamW skips them).
  LH_CUDA_CHECK(cudaMemsetAsync(
      buf_.params, 0, (num_params_ + static_cast<size_t>(shape_.Vp - shape_.V) * shape_.C) * 2,
      stream_));
  refresh_working_copy(0, num_params_);
  LH_CUDA_CHECK(cudaStreamSynchronize(stream_));  // `host` dies at return
  step_ = 0;
  seed_ = seed;
}

void GPT2Cuda::refresh_working_copy(size_t begin, size_t end) {
  // fp32 index i maps to bf16 index i inside wte (its first V rows) and to i + (Vp - V) * C
  // after it (working_copy_index).
  const size_t wte_end = layout_.wte().numel;
  const size_t shift = static_cast<size_t>(shape_.Vp - shape_.V) * shape_.C;
  if (begin < wte_end) {
    const size_t stop = std::min(end, wte_end);
    k::cast_to_bf16(buf_.params + begin, buf_.master + begin, static_cast<long long>(stop - begin),
                    stream_);
    begin = stop;
  }
  if (begin < end) {
    k::cast_to_bf16(buf_.params + begin + shift, buf_.master + begin,
                    static_cast<long long>(end - begin), stream_);
  }
}

void GPT2Cuda::upload_tokens(const int32_t* inputs, const int32_t* targets, int B, int T) {
  // The pinned staging area is free: every previous call ended with a stream synchronisation.
  const size_t N = static_cast<size_t>(B) * T;
  const size_t maxN = static_cast<size_t>(shape_.B) * shape_.T;
  int32_t* h_inputs = host_tokens_;
  int32_t* h_targets = host_tokens_ + maxN;
  std::memcpy(h_inputs, inputs, N * sizeof(int32_t));
  std::memcpy(h_targets, targets, N * sizeof(int32_t));
  LH_CUDA_CHECK(
      cudaMemcpyAsync(buf_.inputs, h_inputs, N * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  LH_CUDA_CHECK(cudaMemcpyAsync(buf_.targets, h_targets, N * sizeof(int32_t),
                                cudaMemcpyHostToDevice, stream_));
}

void GPT2Cuda::upload_token_buckets(const int32_t* inputs, int B, int T) {
  const size_t N = static_cast<size_t>(B) * T;
  const size_t maxN = static_cast<size_t>(shape_.B) * shape_.T;
  const k::TokenBuckets b = k::bucket_tokens(inputs, static_cast<int>(N));
  int32_t* h_unique = host_tokens_ + 2 * maxN;
  int32_t* h_offsets = host_tokens_ + 3 * maxN;
  int32_t* h_positions = host_tokens_ + 4 * maxN + 1;
  std::copy(b.unique_tokens.begin(), b.unique_tokens.end(), h_unique);
  std::copy(b.offsets.begin(), b.offsets.end(), h_offsets);
  std::copy(b.positions.begin(), b.positions.end(), h_positions);
  last_unique_tokens_ = static_cast<int>(b.unique_tokens.size());
  LH_CUDA_CHECK(cudaMemcpyAsync(buf_.unique_tokens, h_unique, b.unique_tokens.size() * 4,
                                cudaMemcpyHostToDevice, stream_));
  LH_CUDA_CHECK(cudaMemcpyAsync(buf_.bucket_offsets, h_offsets, b.offsets.size() * 4,
                                cudaMemcpyHostToDevice, stream_));
  LH_CUDA_CHECK(cudaMemcpyAsync(buf_.positions, h_positions, b.positions.size() * 4,
                                cudaMemcpyHostToDevice, stream_));
}

void GPT2Cuda::forward(int B, int T) {
  const int C = shape_.C, NH = shape_.NH, L = shape_.L;
  const int N = B * T;
  k::Matmul& mm = *matmul_;
  const TensorLayout& wte = layout_.wte();
  const TensorLayout& wpe = layout_.wpe();
  const TensorLayout& lnf_w = layout_.lnf_weight();
  const TensorLayout& lnf_b = layout_.lnf_bias();

  k::encoder_forward(buf_.encoded, buf_.inputs, param(wte), param(wpe), B, T, C, stream_);
  BlockActivations& first = buf_.blocks[0];
  k::residual_layernorm_forward(nullptr, first.ln1, first.ln1_mean, first.ln1_rstd, buf_.encoded,
                                nullptr, param(0, kLn1W), param(0, kLn1B), N, C, stream_);
  for (int l = 0; l < L; ++l) {
    BlockActivations& a = buf_.blocks[l];
    const bf16* residual = l == 0 ? buf_.encoded : buf_.blocks[l - 1].residual3;
    if (shape_.flash) {
      // The projection output is what the flash backward re-reads: keep it per layer.
      k::linear_forward(mm, a.qkvr, a.ln1, param(l, kQkvW), param(l, kQkvB), N, C, 3 * C, stream_);
      k::flash_attention_forward(a.atty, a.lse, a.qkvr, B, T, C, NH, stream_);
    } else {
      k::linear_forward(mm, buf_.qkv, a.ln1, param(l, kQkvW), param(l, kQkvB), N, C, 3 * C,
                        stream_);
      k::attention_forward(mm, a.atty, a.qkvr, a.att, buf_.heads_out, buf_.qkv, B, T, C, NH,
                           stream_);
    }
    k::linear_forward(mm, buf_.proj, a.atty, param(l, kAttProjW), param(l, kAttProjB), N, C, C,
                      stream_);
    k::residual_layernorm_forward(a.residual2, a.ln2, a.ln2_mean, a.ln2_rstd, residual, buf_.proj,
                                  param(l, kLn2W), param(l, kLn2B), N, C, stream_);
    k::linear_gelu_forward(mm, a.fch_gelu, a.fch, a.ln2, param(l, kFcW), param(l, kFcB), N, C,
                           4 * C, stream_);
    k::linear_forward(mm, buf_.proj, a.fch_gelu, param(l, kFcProjW), param(l, kFcProjB), N, 4 * C,
                      C, stream_);
    // residual3 = residual2 + mlp, fused with the layernorm that reads it next.
    if (l + 1 < L) {
      BlockActivations& next = buf_.blocks[l + 1];
      k::residual_layernorm_forward(a.residual3, next.ln1, next.ln1_mean, next.ln1_rstd,
                                    a.residual2, buf_.proj, param(l + 1, kLn1W),
                                    param(l + 1, kLn1B), N, C, stream_);
    } else {
      k::residual_layernorm_forward(a.residual3, buf_.lnf, buf_.lnf_mean, buf_.lnf_rstd,
                                    a.residual2, buf_.proj, param(lnf_w), param(lnf_b), N, C,
                                    stream_);
    }
  }
  k::classifier_matmul_forward(mm, buf_.logits, buf_.lnf, param(wte), N, C, shape_.Vp, stream_);
}

void GPT2Cuda::backward(int B, int T) {
  const int C = shape_.C, NH = shape_.NH, L = shape_.L;
  const int N = B * T;
  const long long NC = static_cast<long long>(N) * C;
  k::Matmul& mm = *matmul_;
  const TensorLayout& wte = layout_.wte();
  const TensorLayout& wpe = layout_.wpe();
  const TensorLayout& lnf_w = layout_.lnf_weight();
  const TensorLayout& lnf_b = layout_.lnf_bias();
  bf16* dln = buf_.proj;         // (N, C) scratch
  bf16* datty = buf_.heads_out;  // (N, C) scratch
  bf16* dqkv = buf_.qkv;         // (N, 3C) scratch

  // Classifier (tied to wte) and ln_f. buf_.logits holds dlogits.
  k::classifier_matmul_backward(mm, dln, grad(wte), buf_.logits, buf_.lnf, param(wte), N, C,
                                shape_.V, shape_.Vp, stream_);
  LH_CUDA_CHECK(cudaMemsetAsync(buf_.dresidual, 0, NC * sizeof(bf16), stream_));
  k::layernorm_backward(buf_.dresidual, grad(lnf_w), grad(lnf_b), buf_.fscratch, dln,
                        buf_.blocks[L - 1].residual3, param(lnf_w), buf_.lnf_mean, buf_.lnf_rstd, N,
                        C, stream_);
  // dresidual holds d(block output) on entry to each iteration and d(block input) on exit.
  for (int l = L - 1; l >= 0; --l) {
    const BlockActivations& a = buf_.blocks[l];
    const bf16* residual = l == 0 ? buf_.encoded : buf_.blocks[l - 1].residual3;
    if (options_.recompute_gelu) k::gelu_forward(a.fch_gelu, a.fch, 4 * NC, stream_);
    k::linear_backward(mm, buf_.dfch, grad(l, kFcProjW), grad(l, kFcProjB), buf_.fscratch,
                       buf_.dresidual, a.fch_gelu, param(l, kFcProjW), N, 4 * C, C, stream_);
    k::gelu_backward_inplace(buf_.dfch, a.fch, 4 * NC, stream_);
    k::linear_backward(mm, dln, grad(l, kFcW), grad(l, kFcB), buf_.fscratch, buf_.dfch, a.ln2,
                       param(l, kFcW), N, C, 4 * C, stream_);
    k::layernorm_backward(buf_.dresidual, grad(l, kLn2W), grad(l, kLn2B), buf_.fscratch, dln,
                          a.residual2, param(l, kLn2W), a.ln2_mean, a.ln2_rstd, N, C, stream_);
    k::linear_backward(mm, datty, grad(l, kAttProjW), grad(l, kAttProjB), buf_.fscratch,
                       buf_.dresidual, a.atty, param(l, kAttProjW), N, C, C, stream_);
    if (shape_.flash) {
      k::flash_attention_backward(dqkv, buf_.dot, datty, a.atty, a.qkvr, a.lse, B, T, C, NH,
                                  stream_);
    } else {
      k::attention_backward(mm, dqkv, buf_.dheads, buf_.datt, datty, a.qkvr, a.att, B, T, C, NH,
                            stream_);
    }
    k::linear_backward(mm, dln, grad(l, kQkvW), grad(l, kQkvB), buf_.fscratch, dqkv, a.ln1,
                       param(l, kQkvW), N, C, 3 * C, stream_);
    k::layernorm_backward(buf_.dresidual, grad(l, kLn1W), grad(l, kLn1B), buf_.fscratch, dln,
                          residual, param(l, kLn1W), a.ln1_mean, a.ln1_rstd, N, C, stream_);
  }
  k::encoder_backward(grad(wte), grad(wpe), buf_.dresidual, buf_.unique_tokens, buf_.bucket_offsets,
                      buf_.positions, last_unique_tokens_, B, T, C, stream_);
}

float GPT2Cuda::mean_loss(int N) {
  k::sum(buf_.scalars, buf_.fscratch, buf_.losses, N, stream_);
  LH_CUDA_CHECK(
      cudaMemcpyAsync(host_scalar_, buf_.scalars, sizeof(float), cudaMemcpyDeviceToHost, stream_));
  LH_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return host_scalar_[0] / static_cast<float>(N);
}

float GPT2Cuda::forward_backward(const int32_t* inputs, const int32_t* targets, int B, int T,
                                 float loss_scale) {
  activate();
  check_batch(inputs, targets, B, T);
  const int N = B * T;
  upload_tokens(inputs, targets, B, T);
  forward(B, T);
  upload_token_buckets(inputs, B, T);  // host work overlapping the forward pass
  k::fused_classifier(buf_.logits, buf_.losses, buf_.targets, loss_scale / static_cast<float>(N), N,
                      shape_.V, shape_.Vp, /*write_dlogits=*/true, stream_);
  backward(B, T);
  return mean_loss(N);
}

float GPT2Cuda::forward_loss(const int32_t* inputs, const int32_t* targets, int B, int T) {
  activate();
  check_batch(inputs, targets, B, T);
  const int N = B * T;
  upload_tokens(inputs, targets, B, T);
  forward(B, T);
  k::fused_classifier(buf_.logits, buf_.losses, buf_.targets, 0.0f, N, shape_.V, shape_.Vp,
                      /*write_dlogits=*/false, stream_);
  return mean_loss(N);
}

void GPT2Cuda::zero_grad() {
  activate();
  LH_CUDA_CHECK(cudaMemsetAsync(buf_.grads, 0, num_params_ * sizeof(float), stream_));
}

float GPT2Cuda::gradient_norm() {
  activate();
  k::sum_of_squares(buf_.scalars + 1, buf_.fscratch, buf_.grads,
                    static_cast<long long>(num_params_), stream_);
  LH_CUDA_CHECK(cudaMemcpyAsync(host_scalar_ + 1, buf_.scalars + 1, sizeof(float),
                                cudaMemcpyDeviceToHost, stream_));
  LH_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return std::sqrt(host_scalar_[1]);
}

void GPT2Cuda::optimizer_step(const model::AdamWOptions& options, float lr, float grad_scale) {
  activate();
  ++step_;
  k::AdamWHyper hyper = kernels::adamw_step(options, lr, grad_scale, step_);
  // The rounding stream of step t from seed s: distinct for every (s, t).
  hyper.seed = static_cast<uint32_t>((seed_ * 0x9E3779B97F4A7C15ull) ^
                                     (static_cast<uint64_t>(step_) * 0xBF58476D1CE4E5B9ull) ^
                                     (static_cast<uint64_t>(step_) >> 32));
  k::adamw_update_chunks(buf_.params, buf_.master, buf_.grads, buf_.m, buf_.v, buf_.chunks,
                         num_chunks_, hyper, stream_);
}

const float* GPT2Cuda::owning_buffer(const float* p, size_t n) const {
  for (const float* base : {buf_.master, buf_.grads, buf_.m, buf_.v}) {
    if (p >= base && p + n <= base + num_params_) return base;
  }
  return nullptr;
}

const float* GPT2Cuda::checked_buffer(std::span<const float> device, size_t host_size,
                                      const char* what) const {
  const float* base = owning_buffer(device.data(), device.size());
  if (base == nullptr || device.size() != host_size) {
    throw InvalidArgument(std::string("CUDA model ") + what +
                          ": the device side must be a span of the model's parameter, gradient "
                          "or moment buffers and the host side the same size (got " +
                          std::to_string(device.size()) + " and " + std::to_string(host_size) +
                          " floats)");
  }
  return base;
}

void GPT2Cuda::download(std::span<const float> device_src, std::span<float> host_dst) {
  activate();
  checked_buffer(device_src, host_dst.size(), "download");
  LH_CUDA_CHECK(cudaMemcpyAsync(host_dst.data(), device_src.data(), device_src.size_bytes(),
                                cudaMemcpyDeviceToHost, stream_));
  LH_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void GPT2Cuda::upload(std::span<const float> host_src, std::span<float> device_dst) {
  activate();
  const float* base = checked_buffer(device_dst, host_src.size(), "upload");
  LH_CUDA_CHECK(cudaMemcpyAsync(device_dst.data(), host_src.data(), host_src.size_bytes(),
                                cudaMemcpyHostToDevice, stream_));
  if (base == buf_.master) {
    const size_t begin = static_cast<size_t>(device_dst.data() - buf_.master);
    refresh_working_copy(begin, begin + device_dst.size());
  }
  LH_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void GPT2Cuda::snapshot_to_host(std::span<const model::HostCopy> copies) {
  activate();
  for (const model::HostCopy& c : copies) {
    if (c.model_src == nullptr || c.host_dst.size() % sizeof(float) != 0 ||
        owning_buffer(c.model_src, c.host_dst.size() / sizeof(float)) == nullptr) {
      throw InvalidArgument(
          "CUDA model snapshot: each copy must read a span of the model's "
          "buffers into a host buffer of a whole number of floats");
    }
  }
  try {
    enqueue_snapshot(copies);
    copy_out_snapshot();
  } catch (...) {
    // Nothing may still be writing the staging buffer or reading the model when this returns.
    cudaStreamSynchronize(snapshot_stream_);
    pending_copies_.clear();
    throw;
  }
}

void GPT2Cuda::enqueue_snapshot(std::span<const model::HostCopy> copies) {
  size_t total = 0;
  for (const model::HostCopy& c : copies) total += c.host_dst.size();
  if (total > staging_bytes_) {
    // Grown once to the size of a full snapshot, then reused.
    if (staging_ != nullptr) LH_CUDA_CHECK(cudaFreeHost(staging_));
    staging_ = nullptr;
    staging_bytes_ = 0;
    LH_CUDA_CHECK(cudaMallocHost(&staging_, total));
    staging_bytes_ = total;
  }
  LH_CUDA_CHECK(cudaEventRecord(step_boundary_, stream_));
  LH_CUDA_CHECK(cudaStreamWaitEvent(snapshot_stream_, step_boundary_, 0));
  pending_copies_.clear();
  size_t offset = 0, group = 0, group_bytes = 0;
  auto close_group = [&]() {
    if (group >= group_events_.size()) {
      cudaEvent_t event = nullptr;
      LH_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
      group_events_.push_back(event);
    }
    LH_CUDA_CHECK(cudaEventRecord(group_events_[group], snapshot_stream_));
    ++group;
    group_bytes = 0;
  };
  for (const model::HostCopy& c : copies) {
    if (c.host_dst.empty()) continue;
    LH_CUDA_CHECK(cudaMemcpyAsync(staging_ + offset, c.model_src, c.host_dst.size(),
                                  cudaMemcpyDeviceToHost, snapshot_stream_));
    pending_copies_.push_back(PendingCopy{offset, c.host_dst, group});
    offset += c.host_dst.size();
    group_bytes += c.host_dst.size();
    if (group_bytes >= kSnapshotGroupBytes) close_group();
  }
  if (group_bytes > 0 || group == 0) close_group();
  pending_groups_ = group;
}

void GPT2Cuda::copy_out_snapshot() {  // Copy each group out of the staging buffer as soon as its
                                      // transfers are done, spreading the
  // group's bytes over a few threads (a single thread copies ~5-10 GB/s, PCIe delivers ~25).
  for (size_t group = 0; group < pending_groups_; ++group) {
    LH_CUDA_CHECK(cudaEventSynchronize(group_events_[group]));
    std::vector<std::pair<const std::byte*, std::span<std::byte>>> pieces;
    for (const PendingCopy& c : pending_copies_) {
      if (c.group != group) continue;
      // Split large tensors so the threads share the work evenly.
      constexpr size_t kPiece = size_t{4} << 20;
      for (size_t at = 0; at < c.host_dst.size(); at += kPiece) {
        const size_t n = std::min(kPiece, c.host_dst.size() - at);
        pieces.emplace_back(staging_ + c.staging_offset + at, c.host_dst.subspan(at, n));
      }
    }
    auto work = [&pieces](size_t first, size_t stride) {
      for (size_t i = first; i < pieces.size(); i += stride) {
        std::memcpy(pieces[i].second.data(), pieces[i].first, pieces[i].second.size());
      }
    };
    const size_t helpers = std::min<size_t>(kSnapshotCopyThreads - 1, pieces.size() / 2);
    const size_t stride = helpers + 1;
    std::vector<std::thread> threads;
    try {
      for (size_t t = 1; t <= helpers; ++t) threads.emplace_back(work, t, stride);
    } catch (const std::system_error&) {
      // Fewer threads than wanted: this thread takes over the shares of those not started.
    }
    work(0, stride);
    for (size_t t = threads.size() + 1; t <= helpers; ++t) work(t, stride);
    for (std::thread& thread : threads) thread.join();
  }
  // The last group's event follows every copy on the side stream: all of them are complete.
  pending_copies_.clear();
}

}  // namespace

bool cuda_available(std::string* why) { return k::kernels_runnable(why); }

std::unique_ptr<model::LanguageModel> make_cuda_gpt2(const GPT2Config& config, int max_batch_size,
                                                     int max_seq_len, const CudaOptions& options) {
  validate_for_cuda(config, max_batch_size, max_seq_len, options);
  std::string why;
  if (!cuda_available(&why)) {
    throw Unavailable("cannot create the CUDA model: " + why +
                      "; use device: cpu (or auto to fall back)");
  }
  return std::make_unique<GPT2Cuda>(config, max_batch_size, max_seq_len, options);
}

int64_t cuda_gpt2_memory_bytes(const GPT2Config& config, int max_batch_size, int max_seq_len,
                               const CudaOptions& options) {
  validate_for_cuda(config, max_batch_size, max_seq_len, options);
  const Shape shape = make_shape(config, max_batch_size, max_seq_len, options);
  const ParameterLayout layout(config);
  Buffers buffers;
  Carver measure(nullptr);
  carve(measure, buffers, shape, layout.num_parameters(), make_chunks(layout, shape).size(),
        options.recompute_gelu);
  return static_cast<int64_t>(measure.used() + k::Matmul::kDefaultWorkspaceBytes);
}

}  // namespace longhaul::backend_cuda
