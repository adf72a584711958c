// The CUDA kernels (longhaul::kernels_cuda) as self-check implementations; see cuda_registry.h.
// Each implementation uploads the case's host inputs in the dtype the model keeps them in (bf16
// activations/parameters; fp32 master weights, moments, gradients and statistics), poisons its
// outputs (all bits set: NaN) so an element a kernel fails to write shows up, runs the kernels on
// a private stream of `device`, and downloads the outputs as fp32. The classifier and the fused
// cross-entropy run on the model's padded vocabulary (Vp = V rounded up to 128, padding rows and
// columns zero), exactly as the model calls them.
#include "longhaul/selfcheck/cuda_registry.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include <cuda_runtime.h>

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

#include "selfcheck_internal.h"

namespace longhaul::selfcheck {
namespace {

namespace k = longhaul::kernels::cuda;
using k::bf16;
using Vec = std::vector<float>;

// A device buffer freed on every path.
template <typename T>
class Device {
 public:
  explicit Device(size_t n) : n_(std::max<size_t>(n, 1)) {
    LH_CUDA_CHECK(cudaMalloc(&p_, n_ * sizeof(T)));
  }
  ~Device() { cudaFree(p_); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  T* get() const { return p_; }
  void poison(cudaStream_t s) { LH_CUDA_CHECK(cudaMemsetAsync(p_, 0xff, n_ * sizeof(T), s)); }
  void zero(cudaStream_t s) { LH_CUDA_CHECK(cudaMemsetAsync(p_, 0, n_ * sizeof(T), s)); }

 private:
  T* p_ = nullptr;
  size_t n_;
};

// The context of one implementation run: the device, a stream, and host<->device conversions.
class Run {
 public:
  explicit Run(int device) {
    LH_CUDA_CHECK(cudaSetDevice(device));
    LH_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~Run() {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;
  cudaStream_t stream() const { return stream_; }

  std::unique_ptr<Device<bf16>> bf16_of(const Vec& host) {
    std::vector<bf16> h(host.size());
    for (size_t i = 0; i < host.size(); ++i) h[i] = k::float_to_bf16(host[i]);
    auto d = std::make_unique<Device<bf16>>(host.size());
    copy_in(d->get(), h.data(), h.size() * sizeof(bf16));
    return d;
  }
  std::unique_ptr<Device<float>> fp32_of(const Vec& host) {
    auto d = std::make_unique<Device<float>>(host.size());
    copy_in(d->get(), host.data(), host.size() * sizeof(float));
    return d;
  }
  template <typename T>
  std::unique_ptr<Device<T>> of(const std::vector<T>& host) {
    auto d = std::make_unique<Device<T>>(host.size());
    copy_in(d->get(), host.data(), host.size() * sizeof(T));
    return d;
  }
  std::unique_ptr<Device<int32_t>> ints_of(const std::vector<int32_t>& host) { return of(host); }
  template <typename T>
  std::unique_ptr<Device<T>> poisoned(size_t n) {
    auto d = std::make_unique<Device<T>>(n);
    d->poison(stream_);
    return d;
  }
  template <typename T>
  std::unique_ptr<Device<T>> zeros(size_t n) {
    auto d = std::make_unique<Device<T>>(n);
    d->zero(stream_);
    return d;
  }
  Vec get(const Device<bf16>& d, size_t n) {
    std::vector<bf16> h(n);
    copy_out(h.data(), d.get(), n * sizeof(bf16));
    Vec out(n);
    for (size_t i = 0; i < n; ++i) out[i] = k::bf16_to_float(h[i]);
    return out;
  }
  Vec get(const Device<float>& d, size_t n) {
    Vec out(n);
    copy_out(out.data(), d.get(), n * sizeof(float));
    return out;
  }

 private:
  void copy_in(void* dst, const void* src, size_t bytes) {
    // Synchronous: the host vector may die right after.
    LH_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    LH_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void copy_out(void* dst, const void* src, size_t bytes) {
    LH_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    LH_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  cudaStream_t stream_ = nullptr;
};

int padded(int V) { return (V + 127) / 128 * 128; }

// Rows of `x` (rows, cols) widened to `padded_cols` with zeros.
Vec pad_columns(const Vec& x, int rows, int cols, int padded_cols) {
  Vec out(static_cast<size_t>(rows) * padded_cols, 0.0f);
  for (int r = 0; r < rows; ++r) {
    std::copy_n(x.begin() + static_cast<size_t>(r) * cols, cols,
                out.begin() + static_cast<size_t>(r) * padded_cols);
  }
  return out;
}
Vec unpad_columns(const Vec& x, int rows, int cols, int padded_cols) {
  Vec out(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r) {
    std::copy_n(x.begin() + static_cast<size_t>(r) * padded_cols, cols,
                out.begin() + static_cast<size_t>(r) * cols);
  }
  return out;
}

Tensors embedding(int device, const Case& c) {
  Run run(device);
  const CheckShape& s = c.shape;
  const int C = s.C(), N = s.N(), Vp = padded(s.V);
  const auto& tokens = c.ints.at("tokens");
  auto wte = run.bf16_of(pad_columns(c.inputs.at("wte"), 1, s.V * C, Vp * C));
  auto wpe = run.bf16_of(c.inputs.at("wpe"));
  auto dout = run.bf16_of(c.inputs.at("dout"));
  auto d_tokens = run.ints_of(tokens);
  auto out = run.poisoned<bf16>(static_cast<size_t>(N) * C);
  auto dwte = run.zeros<float>(static_cast<size_t>(s.V) * C);
  auto dwpe = run.zeros<float>(static_cast<size_t>(s.T) * C);
  k::encoder_forward(out->get(), d_tokens->get(), wte->get(), wpe->get(), s.B, s.T, C,
                     run.stream());
  const k::TokenBuckets b = k::bucket_tokens(tokens.data(), N);
  auto unique = run.ints_of(b.unique_tokens);
  auto offsets = run.ints_of(b.offsets);
  auto positions = run.ints_of(b.positions);
  k::encoder_backward(dwte->get(), dwpe->get(), dout->get(), unique->get(), offsets->get(),
                      positions->get(), static_cast<int>(b.unique_tokens.size()), s.B, s.T, C,
                      run.stream());
  return {{"out", run.get(*out, static_cast<size_t>(N) * C)},
          {"dwte", run.get(*dwte, static_cast<size_t>(s.V) * C)},
          {"dwpe", run.get(*dwpe, static_cast<size_t>(s.T) * C)}};
}

Tensors layernorm(int device, const Case& c) {
  Run run(device);
  const int N = c.shape.N(), C = c.shape.C();
  const size_t NC = static_cast<size_t>(N) * C;
  auto a = run.bf16_of(c.inputs.at("a"));
  auto b = run.bf16_of(c.inputs.at("b"));
  auto w = run.bf16_of(c.inputs.at("weight"));
  auto bias = run.bf16_of(c.inputs.at("bias"));
  auto residual = run.poisoned<bf16>(NC);
  auto out = run.poisoned<bf16>(NC);
  auto mean = run.poisoned<float>(N);
  auto rstd = run.poisoned<float>(N);
  k::residual_layernorm_forward(residual->get(), out->get(), mean->get(), rstd->get(), a->get(),
                                b->get(), w->get(), bias->get(), N, C, run.stream());
  auto dout = run.bf16_of(c.inputs.at("dout"));
  auto inp = run.bf16_of(c.inputs.at("residual"));
  auto ref_mean = run.fp32_of(c.inputs.at("mean"));
  auto ref_rstd = run.fp32_of(c.inputs.at("rstd"));
  auto dinp = run.zeros<bf16>(NC);
  auto dw = run.zeros<float>(C);
  auto db = run.zeros<float>(C);
  auto scratch = run.zeros<float>(static_cast<size_t>(k::layernorm_backward_scratch_floats(C)));
  k::layernorm_backward(dinp->get(), dw->get(), db->get(), scratch->get(), dout->get(), inp->get(),
                        w->get(), ref_mean->get(), ref_rstd->get(), N, C, run.stream());
  return {{"residual", run.get(*residual, NC)},
          {"out", run.get(*out, NC)},
          {"mean", run.get(*mean, N)},
          {"rstd", run.get(*rstd, N)},
          {"dinp", run.get(*dinp, NC)},
          {"dweight", run.get(*dw, C)},
          {"dbias", run.get(*db, C)}};
}

Tensors matmul_forward(int device, const Case& c, bool fused, bool with_gelu) {
  Run run(device);
  const int N = c.shape.N(), C = c.shape.C(), OC = static_cast<int>(c.scalars.at("OC"));
  const size_t n = static_cast<size_t>(N) * OC;
  k::Matmul mm;
  if (with_gelu) {
    mm.set_gelu_epilogue(fused);
  } else {
    mm.set_bias_epilogue(fused);
  }
  auto inp = run.bf16_of(c.inputs.at("inp"));
  auto w = run.bf16_of(c.inputs.at("weight"));
  auto bias = run.bf16_of(c.inputs.at("bias"));
  auto out = run.poisoned<bf16>(n);
  if (!with_gelu) {
    k::linear_forward(mm, out->get(), inp->get(), w->get(), bias->get(), N, C, OC, run.stream());
    return {{"out", run.get(*out, n)}};
  }
  auto pre = run.poisoned<bf16>(n);
  k::linear_gelu_forward(mm, out->get(), pre->get(), inp->get(), w->get(), bias->get(), N, C, OC,
                         run.stream());
  return {{"pre", run.get(*pre, n)}, {"out", run.get(*out, n)}};
}

Tensors matmul_backward(int device, const Case& c, bool fused) {
  Run run(device);
  const int N = c.shape.N(), C = c.shape.C(), OC = static_cast<int>(c.scalars.at("OC"));
  k::Matmul mm;
  mm.set_bias_grad_epilogue(fused);
  auto inp = run.bf16_of(c.inputs.at("inp"));
  auto w = run.bf16_of(c.inputs.at("weight"));
  auto dout = run.bf16_of(c.inputs.at("dout"));
  auto dinp = run.poisoned<bf16>(static_cast<size_t>(N) * C);
  auto dw = run.zeros<float>(static_cast<size_t>(C) * OC);
  auto db = run.zeros<float>(OC);
  auto scratch = run.zeros<float>(static_cast<size_t>(k::linear_backward_scratch_floats(OC)));
  k::linear_backward(mm, dinp->get(), dw->get(), db->get(), scratch->get(), dout->get(), inp->get(),
                     w->get(), N, C, OC, run.stream());
  return {{"dinp", run.get(*dinp, static_cast<size_t>(N) * C)},
          {"dweight", run.get(*dw, static_cast<size_t>(C) * OC)},
          {"dbias", run.get(*db, OC)}};
}

Tensors classifier_matmul(int device, const Case& c) {
  Run run(device);
  const int N = c.shape.N(), C = c.shape.C(), V = c.shape.V, Vp = padded(V);
  k::Matmul mm;
  auto inp = run.bf16_of(c.inputs.at("inp"));
  auto wte = run.bf16_of(pad_columns(c.inputs.at("wte"), 1, V * C, Vp * C));
  auto logits = run.poisoned<bf16>(static_cast<size_t>(N) * Vp);
  k::classifier_matmul_forward(mm, logits->get(), inp->get(), wte->get(), N, C, Vp, run.stream());
  auto dlogits = run.bf16_of(pad_columns(c.inputs.at("dlogits"), N, V, Vp));
  auto dinp = run.poisoned<bf16>(static_cast<size_t>(N) * C);
  auto dwte = run.zeros<float>(static_cast<size_t>(V) * C);
  k::classifier_matmul_backward(mm, dinp->get(), dwte->get(), dlogits->get(), inp->get(),
                                wte->get(), N, C, V, Vp, run.stream());
  return {{"logits", unpad_columns(run.get(*logits, static_cast<size_t>(N) * Vp), N, V, Vp)},
          {"dinp", run.get(*dinp, static_cast<size_t>(N) * C)},
          {"dwte", run.get(*dwte, static_cast<size_t>(V) * C)}};
}

Tensors attention(int device, const Case& c, bool flash) {
  Run run(device);
  const CheckShape& s = c.shape;
  const int B = s.B, T = s.T, C = s.C(), NH = s.NH;
  const size_t NC = static_cast<size_t>(s.N()) * C;
  auto qkv = run.bf16_of(c.inputs.at("qkv"));
  auto dout = run.bf16_of(c.inputs.at("dout"));
  auto out = run.poisoned<bf16>(NC);
  auto dqkv = run.poisoned<bf16>(3 * NC);
  if (flash) {
    auto lse = run.poisoned<float>(static_cast<size_t>(B) * NH * T);
    auto dot = run.poisoned<float>(static_cast<size_t>(B) * NH * T);
    k::flash_attention_forward(out->get(), lse->get(), qkv->get(), B, T, C, NH, run.stream());
    k::flash_attention_backward(dqkv->get(), dot->get(), dout->get(), out->get(), qkv->get(),
                                lse->get(), B, T, C, NH, run.stream());
  } else {
    k::Matmul mm;
    const size_t att_n = static_cast<size_t>(B) * NH * T * T;
    auto qkvr = run.poisoned<bf16>(3 * NC);
    auto att = run.poisoned<bf16>(att_n);
    auto scratch_y = run.poisoned<bf16>(NC);
    k::attention_forward(mm, out->get(), qkvr->get(), att->get(), scratch_y->get(), qkv->get(), B,
                         T, C, NH, run.stream());
    auto heads =
        run.poisoned<bf16>(static_cast<size_t>(k::attention_backward_scratch_heads(B, T, C)));
    auto datt = run.poisoned<bf16>(att_n);
    k::attention_backward(mm, dqkv->get(), heads->get(), datt->get(), dout->get(), qkvr->get(),
                          att->get(), B, T, C, NH, run.stream());
  }
  return {{"out", run.get(*out, NC)}, {"dqkv", run.get(*dqkv, 3 * NC)}};
}

Tensors gelu(int device, const Case& c) {
  Run run(device);
  const Vec& x = c.inputs.at("inp");
  const size_t n = x.size();
  auto inp = run.bf16_of(x);
  auto out = run.poisoned<bf16>(n);
  auto grad = run.bf16_of(c.inputs.at("dout"));
  k::gelu_forward(out->get(), inp->get(), static_cast<long long>(n), run.stream());
  k::gelu_backward_inplace(grad->get(), inp->get(), static_cast<long long>(n), run.stream());
  return {{"out", run.get(*out, n)}, {"dinp", run.get(*grad, n)}};
}

Tensors classifier(int device, const Case& c) {
  Run run(device);
  const int N = c.shape.N(), V = c.shape.V, Vp = padded(V);
  auto logits = run.bf16_of(pad_columns(c.inputs.at("logits"), N, V, Vp));
  auto targets = run.ints_of(c.ints.at("targets"));
  auto losses = run.poisoned<float>(N);
  k::fused_classifier(logits->get(), losses->get(), targets->get(),
                      static_cast<float>(c.scalars.at("dloss")), N, V, Vp, /*write_dlogits=*/true,
                      run.stream());
  return {{"losses", run.get(*losses, N)},
          {"dlogits", unpad_columns(run.get(*logits, static_cast<size_t>(N) * Vp), N, V, Vp)}};
}

Tensors adamw(int device, const Case& c) {
  Run run(device);
  const size_t n = c.inputs.at("params").size();
  auto master = run.fp32_of(c.inputs.at("params"));
  auto grads = run.fp32_of(c.inputs.at("grads"));
  auto m = run.fp32_of(c.inputs.at("m"));
  auto v = run.fp32_of(c.inputs.at("v"));
  auto params = run.poisoned<bf16>(n);
  // The model's multi-tensor launch: chunks of one "tensor" with weight decay.
  std::vector<k::AdamWChunk> chunks;
  for (size_t start = 0; start < n; start += k::kAdamWChunk) {
    chunks.push_back(k::AdamWChunk{static_cast<long long>(start), static_cast<long long>(start),
                                   static_cast<int>(std::min<size_t>(k::kAdamWChunk, n - start)),
                                   1});
  }
  auto d_chunks = run.of(chunks);  // on the run's stream, complete on return
  k::adamw_update_chunks(params->get(), master->get(), grads->get(), m->get(), v->get(),
                         d_chunks->get(), static_cast<int>(chunks.size()), adamw_hyper(c),
                         run.stream());
  return {{"master", run.get(*master, n)},
          {"m", run.get(*m, n)},
          {"v", run.get(*v, n)},
          {"params_bf16", run.get(*params, n)}};
}

Tensors global_norm(int device, const Case& c) {
  Run run(device);
  const Vec& x = c.inputs.at("x");
  auto d_x = run.fp32_of(x);
  auto out = run.poisoned<float>(1);
  auto scratch = run.zeros<float>(static_cast<size_t>(k::reduction_scratch_floats()));
  k::sum_of_squares(out->get(), scratch->get(), d_x->get(), static_cast<long long>(x.size()),
                    run.stream());
  return {{"sum_of_squares", run.get(*out, 1)}};
}

Tensors cast(int device, const Case& c) {
  Run run(device);
  const Vec& x = c.inputs.at("x");
  auto d_x = run.fp32_of(x);
  auto out = run.poisoned<bf16>(x.size());
  k::cast_to_bf16(out->get(), d_x->get(), static_cast<long long>(x.size()), run.stream());
  return {{"out", run.get(*out, x.size())}};
}

Implementation make(Family family, std::string name, std::function<Tensors(const Case&)> run) {
  Implementation impl;
  impl.family = family;
  impl.name = std::move(name);
  impl.precision = Precision::kBf16;
  impl.run = std::move(run);
  return impl;
}

}  // namespace

Registry cuda_kernel_registry(int device) {
  Registry r;
  const int d = device;
  r.add(make(Family::kEmbedding, "cuda", [d](const Case& c) { return embedding(d, c); }));
  r.add(make(Family::kLayerNorm, "cuda", [d](const Case& c) { return layernorm(d, c); }));
  for (bool fused : {true, false}) {
    const std::string name = fused ? "cublaslt-epilogue" : "separate-kernel";
    r.add(make(Family::kMatmulBias, name,
               [d, fused](const Case& c) { return matmul_forward(d, c, fused, false); }));
    r.add(make(Family::kMatmulGelu, name,
               [d, fused](const Case& c) { return matmul_forward(d, c, fused, true); }));
    r.add(make(Family::kMatmulBackward, name,
               [d, fused](const Case& c) { return matmul_backward(d, c, fused); }));
  }
  r.add(make(Family::kClassifierMatmul, "cublaslt",
             [d](const Case& c) { return classifier_matmul(d, c); }));
  Implementation flash =
      make(Family::kAttention, "flash", [d](const Case& c) { return attention(d, c, true); });
  flash.supports = [](const CheckShape& s) { return k::flash_attention_supported(s.C(), s.NH); };
  r.add(std::move(flash));
  r.add(make(Family::kAttention, "cublas", [d](const Case& c) { return attention(d, c, false); }));
  r.add(make(Family::kGelu, "cuda", [d](const Case& c) { return gelu(d, c); }));
  r.add(make(Family::kClassifier, "cuda", [d](const Case& c) { return classifier(d, c); }));
  r.add(make(Family::kAdamW, "cuda", [d](const Case& c) { return adamw(d, c); }));
  r.add(make(Family::kGlobalNorm, "cuda", [d](const Case& c) { return global_norm(d, c); }));
  r.add(make(Family::kCast, "cuda", [d](const Case& c) { return cast(d, c); }));
  return r;
}

}  // namespace longhaul::selfcheck
