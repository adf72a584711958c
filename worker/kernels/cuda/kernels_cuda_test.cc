// Each CUDA kernel against its CPU reference (longhaul::kernels_cpu), on fresh random non-zero
// inputs, with outputs poisoned (all bits set: NaN in bf16 and fp32) before the launch so an
// element the kernel fails to write shows up as NaN.
//
// The CPU reference is fed the same bf16-rounded inputs (as fp32), so the comparison measures
// the kernel's own arithmetic. Tolerances, as ||gpu - cpu|| / ||cpu||:
//   fp32 outputs of CUDA-core kernels (statistics, losses, reductions, AdamW):  < 1e-5
//   fp32 outputs of tensor-core GEMMs (weight gradients, bf16 operands):        < 1e-4
//     (the products are exact, but the tensor cores accumulate with truncation rather than
//     round-to-nearest, a bias that grows with the reduction length)
//   bf16 outputs (activations, activation gradients):                          <= 1e-2
// Every test reports SKIPPED with the reason on a machine without a usable GPU.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <longhaul/base/error.h>
#include <longhaul/kernels/cpu/adamw.h>
#include <longhaul/kernels/cpu/attention.h>
#include <longhaul/kernels/cpu/crossentropy.h>
#include <longhaul/kernels/cpu/encoder.h>
#include <longhaul/kernels/cpu/gelu.h>
#include <longhaul/kernels/cpu/global_norm.h>
#include <longhaul/kernels/cpu/layernorm.h>
#include <longhaul/kernels/cpu/matmul.h>
#include <longhaul/kernels/cuda/adamw.h>
#include <longhaul/kernels/cuda/attention.h>
#include <longhaul/kernels/cuda/bias_add.h>
#include <longhaul/kernels/cuda/bias_backward.h>
#include <longhaul/kernels/cuda/cast.h>
#include <longhaul/kernels/cuda/check.h>
#include <longhaul/kernels/cuda/classifier.h>
#include <longhaul/kernels/cuda/encoder.h>
#include <longhaul/kernels/cuda/gelu.h>
#include <longhaul/kernels/cuda/global_norm.h>
#include <longhaul/kernels/cuda/layernorm.h>
#include <longhaul/kernels/cuda/matmul.h>

namespace longhaul::kernels::cuda {
namespace {

namespace cpu = longhaul::kernels::cpu;

constexpr double kFp32Tolerance = 1e-5;
constexpr double kTensorCoreFp32Tolerance = 1e-4;
constexpr double kBf16Tolerance = 1e-2;

#define SKIP_WITHOUT_GPU()                                                   \
  do {                                                                       \
    std::string why_no_gpu;                                                  \
    if (!kernels_runnable(&why_no_gpu)) {                                    \
      GTEST_SKIP() << "no usable GPU, CUDA kernels not run: " << why_no_gpu; \
    }                                                                        \
  } while (0)

// A device array with host transfer helpers; freed on every path.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    LH_CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)));
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return p_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    ASSERT_EQ(host.size(), n_);
    LH_CUDA_CHECK(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    LH_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> host(n_);
    LH_CUDA_CHECK(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  // All bits set: NaN for bf16 and fp32, so unwritten elements are caught.
  void poison() { LH_CUDA_CHECK(cudaMemset(p_, 0xff, n_ * sizeof(T))); }

 private:
  T* p_ = nullptr;
  size_t n_;
};

// Fresh inputs every run; the seed is printed so a failure can be replayed.
class Random {
 public:
  Random() : seed_(std::random_device{}()), rng_(seed_) {}
  uint32_t seed() const { return seed_; }
  // Non-zero values: a uniform magnitude in [0.1, 1] * scale with a random sign.
  std::vector<float> floats(size_t n, float scale = 1.0f) {
    std::uniform_real_distribution<float> magnitude(0.1f, 1.0f);
    std::bernoulli_distribution sign(0.5);
    std::vector<float> out(n);
    for (float& x : out) x = scale * magnitude(rng_) * (sign(rng_) ? 1.0f : -1.0f);
    return out;
  }
  std::vector<int32_t> ints(size_t n, int32_t bound) {
    std::uniform_int_distribution<int32_t> d(0, bound - 1);
    std::vector<int32_t> out(n);
    for (int32_t& x : out) x = d(rng_);
    return out;
  }

 private:
  uint32_t seed_;
  std::mt19937 rng_;
};

std::vector<bf16> to_bf16(const std::vector<float>& x) {
  std::vector<bf16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = float_to_bf16(x[i]);
  return out;
}
std::vector<float> to_float(const std::vector<bf16>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = bf16_to_float(x[i]);
  return out;
}
// The value the GPU sees: rounded to bf16, as fp32.
std::vector<float> rounded(const std::vector<float>& x) { return to_float(to_bf16(x)); }

// ||a - b|| / ||b||; infinite when a has a NaN (an unwritten or broken element).
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}
double relative_error(const std::vector<bf16>& a, const std::vector<float>& b) {
  return relative_error(to_float(a), b);
}

#define EXPECT_CLOSE(gpu, cpu_ref, tolerance) \
  EXPECT_LT(relative_error(gpu, cpu_ref), tolerance) << "seed " << rng.seed()

// Host code: runs on every machine.
TEST(TokenBucketsTest, GroupsPositionsByTokenInAscendingOrder) {
  const std::vector<int32_t> tokens = {5, 2, 5, 0, 2, 5, 9};
  const TokenBuckets b = bucket_tokens(tokens.data(), static_cast<int>(tokens.size()));
  EXPECT_EQ(b.unique_tokens, (std::vector<int32_t>{0, 2, 5, 9}));
  EXPECT_EQ(b.offsets, (std::vector<int32_t>{0, 1, 3, 6, 7}));
  EXPECT_EQ(b.positions, (std::vector<int32_t>{3, 1, 4, 0, 2, 5, 6}));
  const TokenBuckets empty = bucket_tokens(nullptr, 0);
  EXPECT_TRUE(empty.unique_tokens.empty());
  EXPECT_EQ(empty.offsets, (std::vector<int32_t>{0}));
}

// Host code: the shape checks run before any launch, so no GPU is needed.
TEST(FlashAttentionTest, RejectsShapesItCannotLaunch) {
  // B * NH blocks along grid.y: CUDA caps it at 65535 (5461 * 12 = 65532 fits, 5462 * 12 not).
  EXPECT_THROW(flash_attention_forward(nullptr, nullptr, nullptr, 5462, 64, 768, 12, nullptr),
               InvalidArgument);
  EXPECT_THROW(flash_attention_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 5462,
                                        64, 768, 12, nullptr),
               InvalidArgument);
  // Head size 32: the kernels are written for 64.
  EXPECT_THROW(flash_attention_forward(nullptr, nullptr, nullptr, 2, 64, 128, 4, nullptr),
               InvalidArgument);
  EXPECT_THROW(flash_attention_forward(nullptr, nullptr, nullptr, 2, 0, 128, 2, nullptr),
               InvalidArgument);
}

TEST(EncoderTest, ForwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  Random rng;
  const int B = 3, T = 17, C = 64, V = 50, maxT = 32;
  const std::vector<float> wte = rounded(rng.floats(V * C)), wpe = rounded(rng.floats(maxT * C));
  const std::vector<int32_t> tokens = rng.ints(B * T, V);
  std::vector<float> expected(B * T * C);
  cpu::encoder_forward(expected.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);

  DeviceArray<bf16> d_wte(to_bf16(wte)), d_wpe(to_bf16(wpe)), out(B * T * C);
  DeviceArray<int32_t> d_tokens(tokens);
  out.poison();
  encoder_forward(out.get(), d_tokens.get(), d_wte.get(), d_wpe.get(), B, T, C, nullptr);
  EXPECT_CLOSE(out.download(), expected, kBf16Tolerance);
}

TEST(EncoderTest, BackwardMatchesCpuAndIsDeterministic) {
  SKIP_WITHOUT_GPU();
  Random rng;
  const int B = 4, T = 33, C = 96, V = 20, maxT = 40;  // few tokens: many repeats per bucket
  const std::vector<float> dout = rounded(rng.floats(B * T * C));
  const std::vector<int32_t> tokens = rng.ints(B * T, V);
  std::vector<float> dwte = rng.floats(V * C), dwpe = rng.floats(maxT * C);  // accumulated into
  std::vector<float> expected_wte = dwte, expected_wpe = dwpe;
  cpu::encoder_backward(expected_wte.data(), expected_wpe.data(), dout.data(), tokens.data(), B, T,
                        C);

  const TokenBuckets buckets = bucket_tokens(tokens.data(), B * T);
  DeviceArray<bf16> d_dout(to_bf16(dout));
  DeviceArray<int32_t> unique(buckets.unique_tokens), offsets(buckets.offsets),
      positions(buckets.positions);
  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 2; ++run) {
    DeviceArray<float> d_dwte(dwte), d_dwpe(dwpe);
    encoder_backward(d_dwte.get(), d_dwpe.get(), d_dout.get(), unique.get(), offsets.get(),
                     positions.get(), static_cast<int>(buckets.unique_tokens.size()), B, T, C,
                     nullptr);
    runs.push_back(d_dwte.download());
    EXPECT_CLOSE(runs.back(), expected_wte, kFp32Tolerance);
    EXPECT_CLOSE(d_dwpe.download(), expected_wpe, kFp32Tolerance);
  }
  EXPECT_EQ(0, std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)))
      << "two identical backward passes gave different token-embedding gradients";
}

TEST(LayerNormTest, FusedResidualForwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  Random rng;
  const int N = 37, C = 200;  // C not a multiple of 256: partial last vector loop
  const std::vector<float> a = rounded(rng.floats(N * C, 2.0f)), b = rounded(rng.floats(N * C));
  const std::vector<float> w = rounded(rng.floats(C)), bias = rounded(rng.floats(C));
  std::vector<float> residual(N * C);
  for (int i = 0; i < N * C; ++i) residual[i] = a[i] + b[i];
  // The GPU normalises the bf16-rounded residual it stores.
  const std::vector<float> stored_residual = rounded(residual);
  std::vector<float> expected(N * C), mean(N), rstd(N);
  cpu::layernorm_forward(expected.data(), mean.data(), rstd.data(), stored_residual.data(),
                         w.data(), bias.data(), N, C);

  DeviceArray<bf16> d_a(to_bf16(a)), d_b(to_bf16(b)), d_w(to_bf16(w)), d_bias(to_bf16(bias));
  DeviceArray<bf16> d_residual(N * C), d_out(N * C);
  DeviceArray<float> d_mean(N), d_rstd(N);
  d_residual.poison();
  d_out.poison();
  d_mean.poison();
  d_rstd.poison();
  residual_layernorm_forward(d_residual.get(), d_out.get(), d_mean.get(), d_rstd.get(), d_a.get(),
                             d_b.get(), d_w.get(), d_bias.get(), N, C, nullptr);
  EXPECT_CLOSE(d_residual.download(), residual, kBf16Tolerance);
  EXPECT_CLOSE(d_out.download(), expected, kBf16Tolerance);
  EXPECT_CLOSE(d_mean.download(), mean, kFp32Tolerance);
  EXPECT_CLOSE(d_rstd.download(), rstd, kFp32Tolerance);

  // Without the residual: a plain layernorm of `a`.
  std::vector<float> expected_plain(N * C);
  cpu::layernorm_forward(expected_plain.data(), mean.data(), rstd.data(), a.data(), w.data(),
                         bias.data(), N, C);
  d_out.poison();
  residual_layernorm_forward(nullptr, d_out.get(), d_mean.get(), d_rstd.get(), d_a.get(), nullptr,
                             d_w.get(), d_bias.get(), N, C, nullptr);
  EXPECT_CLOSE(d_out.download(), expected_plain, kBf16Tolerance);
  EXPECT_CLOSE(d_rstd.download(), rstd, kFp32Tolerance);
}

TEST(LayerNormTest, BackwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  Random rng;
  const int N = 130, C = 136;
  const std::vector<float> inp = rounded(rng.floats(N * C, 3.0f)),
                           dout = rounded(rng.floats(N * C));
  const std::vector<float> w = rounded(rng.floats(C)), bias = rounded(rng.floats(C));
  std::vector<float> out(N * C), mean(N), rstd(N);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), bias.data(), N,
                         C);
  const std::vector<float> dinp0 = rounded(rng.floats(N * C));
  const std::vector<float> dw0 = rng.floats(C), db0 = rng.floats(C);
  std::vector<float> dinp = dinp0, dw = dw0, db = db0;
  cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                          mean.data(), rstd.data(), N, C);

  DeviceArray<bf16> d_inp(to_bf16(inp)), d_dout(to_bf16(dout)), d_w(to_bf16(w));
  DeviceArray<bf16> d_dinp(to_bf16(dinp0));
  DeviceArray<float> d_dw(dw0), d_db(db0), d_mean(mean), d_rstd(rstd);
  DeviceArray<float> scratch(layernorm_backward_scratch_floats(C));
  layernorm_backward(d_dinp.get(), d_dw.get(), d_db.get(), scratch.get(), d_dout.get(), d_inp.get(),
                     d_w.get(), d_mean.get(), d_rstd.get(), N, C, nullptr);
  EXPECT_CLOSE(d_dinp.download(), dinp, kBf16Tolerance);
  EXPECT_CLOSE(d_dw.download(), dw, kFp32Tolerance);
  EXPECT_CLOSE(d_db.download(), db, kFp32Tolerance);
}

TEST(MatmulTest, LinearForwardWithBiasAndGeluMatchesCpu) {
  SKIP_WITHOUT_GPU();
  Random rng;
  const int N = 96, C = 64, OC = 192;
  const std::vector<float> inp = rounded(rng.floats(N * C)), w = rounded(rng.floats(C * OC, 0.2f));
  const std::vector<float> bias = rounded(rng.floats(OC));
  std::vector<float> expected(N * OC), expected_gelu(N * OC);
  cpu::matmul_forward(expected.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  cpu::gelu_forward(expected_gelu.data(), expected.data(), expected.size());

  Matmul mm;
  DeviceArray<bf16> d_inp(to_bf16(inp)), d_w(to_bf16(w)), d_bias(to_bf16(bias));
  DeviceArray<bf16> out(N * OC), pre(N * OC);
  out.poison();
  linear_forward(mm, out.get(), d_inp.get(), d_w.get(), d_bias.get(), N, C, OC, nullptr);
  EXPECT_CLOSE(out.download(), expected, kBf16Tolerance);

  out.poison();
  pre.poison();
  linear_gelu_forward(mm, out.get(), pre.get(), d_inp.get(), d_w.get(), d_bias.get(), N, C, OC,
                      nullptr);
  EXPECT_CLOSE(pre.download(), expected, kBf16Tolerance);
  EXPECT_CLOSE(out.download(), expected_gelu, kBf16Tolerance);
}

// The separate-kernel fallbacks of the forward epilogues (the self-check's choice when an
// epilogue is wrong): plain GEMM + add_bias_rows, and + gelu_forward.
TEST(MatmulTest, ForwardWithoutEpiloguesMatchesCpu) {
  SKIP_WITHOUT_GPU();
  Random rng;
  const int N = 80, C = 64, OC = 256;
  const std::vector<float> inp = rounded(rng.floats(N * C)), w = rounded(rng.floats(C * OC, 0.2f));
  const std::vector<float> bias = rounded(rng.floats(OC));
  std::vector<float> expected(N * OC), expected_gelu(N * OC);
  cpu::matmul_forward(expected.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  cpu::gelu_forward(expected_gelu.data(), expected.data(), expected.size());

  Matmul mm;
  mm.set_bias_epilogue(false);
  mm.set_gelu_epilogue(false);
  DeviceArray<bf16> d_inp(to_bf16(inp)), d_w(to_bf16(w)), d_bias(to_bf16(bias));
  DeviceArray<bf16> out(N * OC), pre(N * OC);
  out.poison();
  linear_forward(mm, out.get(), d_inp.get(), d_w.get(), d_bias.get(), N, C, OC, nullptr);
  EXPECT_CLOSE(out.download(), expected, kBf16Tolerance);
  out.poison();
  pre.poison();
  linear_gelu_forward(mm, out.get(), pre.get(), d_inp.get(), d_w.get(), d_bias.get(), N, C, OC,
                      nullptr);
  EXPECT_CLOSE(pre.download(), expected, kBf16Tolerance);
  EXPECT_CLOSE(out.download(), expected_gelu, kBf16Tolerance);

  // add_bias_rows alone: out = bf16(out + bias).
  const std::vector<float> rows = rounded(rng.floats(N * OC));
  std::vector<float> with_bias(N * OC);
  for (int i = 0; i < N; ++i) {
    for (int j = 0; j < OC; ++j) with_bias[i * OC + j] = rows[i * OC + j] + bias[j];
  }
  DeviceArray<bf16> d_rows(to_bf16(rows));
  add_bias_rows(d_rows.get(), d_bias.get(), N, OC, nullptr);
  EXPECT_EQ(to_float(d_rows.download()), rounded(with_bias));
}

// Both bias-gradient paths: cuBLASLt's BGRADA epilogue and the fallback reduction kernel.
class LinearBackwardTest : public ::testing::TestWithParam<bool> {};

TEST_P(LinearBackwardTest, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  Random rng;
  const int N = 128, C = 64, OC = 96;
  const std::vector<float> inp = rounded(rng.floats(N * C)), w = rounded(rng.floats(C * OC, 0.2f));
  const std::vector<float> dout = rounded(rng.floats(N * OC));
  const std::vector<float> dw0 = rng.floats(C * OC), db0 = rng.floats(OC);
  std::vector<float> dinp(N * C, 0.0f), dw = dw0, db = db0;
  cpu::matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C,
                       OC);

  Matmul mm;
  mm.set_bias_grad_epilogue(GetParam());
  DeviceArray<bf16> d_inp(to_bf16(inp)), d_w(to_bf16(w)), d_dout(to_bf16(dout)), d_dinp(N * C);
  DeviceArray<float> d_dw(dw0), d_db(db0), scratch(linear_backward_scratch_floats(OC));
  d_dinp.poison();
  linear_backward(mm, d_dinp.get(), d_dw.get(), d_db.get(), scratch.get(), d_dout.get(),
                  d_inp.get(), d_w.get(), N, C, OC, nullptr);
  EXPECT_CLOSE(d_dinp.download(), dinp, kBf16Tolerance);
  EXPECT_CLOSE(d_dw.download(), dw, kTensorCoreFp32Tolerance);
  // The epilogue's reduction runs inside the GEMM (possibly on the tensor cores).
  EXPECT_CLOSE(d_db.download(), db, GetParam() ? kTensorCoreFp32Tolerance : kFp32Tolerance);
}

INSTANTIATE_TEST_SUITE_P(BiasGradient, LinearBackwardTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "CublasEpilogue" : "ReductionKernel";
                         });

TEST(MatmulTest, PaddedClassifierMatchesCpu) {
  SKIP_WITHOUT_GPU();
  Random rng;
  const int N = 64, C = 64, V = 300, Vp = 384;  // V not a multiple of 128: padded rows
  const std::vector<float> inp = rounded(rng.floats(N * C)), wte = rounded(rng.floats(V * C, 0.2f));
  std::vector<float> expected(N * V);
  cpu::matmul_nt_forward(expected.data(), inp.data(), wte.data(), N, C, V);

  std::vector<float> wte_padded(static_cast<size_t>(Vp) * C, 0.0f);
  std::copy(wte.begin(), wte.end(), wte_padded.begin());
  Matmul mm;
  DeviceArray<bf16> d_inp(to_bf16(inp)), d_wte(to_bf16(wte_padded)), logits(N * Vp);
  logits.poison();
  classifier_matmul_forward(mm, logits.get(), d_inp.get(), d_wte.get(), N, C, Vp, nullptr);
  const std::vector<float> got = to_float(logits.download());
  std::vector<float> got_real(N * V);
  for (int i = 0; i < N; ++i) {
    for (int j = 0; j < Vp; ++j) {
      if (j < V) {
        got_real[i * V + j] = got[i * Vp + j];
      } else {
        EXPECT_EQ(got[i * Vp + j], 0.0f) << "padding column " << j << " of row " << i;
      }
    }
  }
  EXPECT_CLOSE(got_real, expected, kBf16Tolerance);

  // Backward with dlogits zero in the padding columns (as the fused classifier leaves them).
  const std::vector<float> dlogits = rounded(rng.floats(N * V));
  std::vector<float> dlogits_padded(static_cast<size_t>(N) * Vp, 0.0f);
  for (int i = 0; i < N; ++i) {
    std::copy_n(dlogits.begin() + i * V, V, dlogits_padded.begin() + i * Vp);
  }
  const std::vector<float> dwte0 = rng.floats(V * C);
  std::vector<float> dinp(N * C, 0.0f), dwte = dwte0;
  cpu::matmul_nt_backward(dinp.data(), dwte.data(), dlogits.data(), inp.data(), wte.data(), N, C,
                          V);
  DeviceArray<bf16> d_dlogits(to_bf16(dlogits_padded)), d_dinp(N * C);
  DeviceArray<float> d_dwte(dwte0);
  d_dinp.poison();
  classifier_matmul_backward(mm, d_dinp.get(), d_dwte.get(), d_dlogits.get(), d_inp.get(),
                             d_wte.get(), N, C, V, Vp, nullptr);
  EXPECT_CLOSE(d_dinp.download(), dinp, kBf16Tolerance);
  EXPECT_CLOSE(d_dwte.download(), dwte, kTensorCoreFp32Tolerance);
}

TEST(AttentionTest, ForwardAndBackwardMatchCpu) {
  SKIP_WITHOUT_GPU();
  Random rng;
  const int B = 2, T = 40, C = 128, NH = 4;  // HS = 32
  const std::vector<float> qkv = rounded(rng.floats(B * T * 3 * C));
  std::vector<float> out(B * T * C), att(static_cast<size_t>(B) * NH * T * T);
  cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  const std::vector<float> dout = rounded(rng.floats(B * T * C));
  std::vector<float> dqkv(B * T * 3 * C, 0.0f), datt(att.size());
  cpu::attention_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), B, T, C,
                          NH);

  Matmul mm;
  DeviceArray<bf16> d_qkv(to_bf16(qkv)), d_out(B * T * C), qkvr(3 * B * T * C), d_att(att.size());
  DeviceArray<bf16> scratch_y(B * T * C);
  d_out.poison();
  d_att.poison();
  attention_forward(mm, d_out.get(), qkvr.get(), d_att.get(), scratch_y.get(), d_qkv.get(), B, T, C,
                    NH, nullptr);
  EXPECT_CLOSE(d_out.download(), out, kBf16Tolerance);
  EXPECT_CLOSE(d_att.download(), att, kBf16Tolerance);  // includes the exact zeros above t

  DeviceArray<bf16> d_dout(to_bf16(dout)), d_dqkv(dqkv.size());
  DeviceArray<bf16> heads(attention_backward_scratch_heads(B, T, C)), d_datt(att.size());
  d_dqkv.poison();
  attention_backward(mm, d_dqkv.get(), heads.get(), d_datt.get(), d_dout.get(), qkvr.get(),
                     d_att.get(), B, T, C, NH, nullptr);
  EXPECT_CLOSE(d_dqkv.download(), dqkv, kBf16Tolerance);
}

TEST(FlashAttentionTest, ForwardAndBackwardMatchCpuAndAreDeterministic) {
  SKIP_WITHOUT_GPU();
  Random rng;
  const int B = 2, T = 100, C = 128, NH = 2;  // head size 64; T not a multiple of the 64 tile
  ASSERT_TRUE(flash_attention_supported(C, NH));
  EXPECT_FALSE(flash_attention_supported(C, 4));
  const std::vector<float> qkv = rounded(rng.floats(B * T * 3 * C));
  std::vector<float> out(B * T * C), att(static_cast<size_t>(B) * NH * T * T);
  cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  const std::vector<float> dout = rounded(rng.floats(B * T * C));
  std::vector<float> dqkv(B * T * 3 * C, 0.0f), datt(att.size());
  cpu::attention_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), B, T, C,
                          NH);

  DeviceArray<bf16> d_qkv(to_bf16(qkv)), d_out(B * T * C);
  DeviceArray<float> lse(static_cast<size_t>(B) * NH * T), dot(static_cast<size_t>(B) * NH * T);
  d_out.poison();
  lse.poison();
  flash_attention_forward(d_out.get(), lse.get(), d_qkv.get(), B, T, C, NH, nullptr);
  EXPECT_CLOSE(d_out.download(), out, kBf16Tolerance);
  for (float x : lse.download()) ASSERT_TRUE(std::isfinite(x)) << "unwritten log-sum-exp";

  DeviceArray<bf16> d_dout(to_bf16(dout)), d_dqkv(dqkv.size());
  std::vector<bf16> first;
  for (int run = 0; run < 2; ++run) {
    d_dqkv.poison();
    flash_attention_backward(d_dqkv.get(), dot.get(), d_dout.get(), d_out.get(), d_qkv.get(),
                             lse.get(), B, T, C, NH, nullptr);
    const std::vector<bf16> got = d_dqkv.download();
    EXPECT_CLOSE(got, dqkv, kBf16Tolerance);
    if (run == 0) {
      first = got;
    } else {
      EXPECT_EQ(0, std::memcmp(first.data(), got.data(), got.size() * sizeof(bf16)))
          << "two identical backward passes differ";
    }
  }
}

TEST(GeluTest, ForwardAndBackwardMatchCpu) {
  SKIP_WITHOUT_GPU();
  Random rng;
  const size_t N = 4096 + 8;
  const std::vector<float> inp = rounded(rng.floats(N, 4.0f)), dout = rounded(rng.floats(N));
  std::vector<float> expected(N), dinp(N, 0.0f);
  cpu::gelu_forward(expected.data(), inp.data(), N);
  cpu::gelu_backward(dinp.data(), inp.data(), dout.data(), N);

  DeviceArray<bf16> d_inp(to_bf16(inp)), out(N), d_grad(to_bf16(dout));
  out.poison();
  gelu_forward(out.get(), d_inp.get(), static_cast<long long>(N), nullptr);
  EXPECT_CLOSE(out.download(), expected, kBf16Tolerance);
  gelu_backward_inplace(d_grad.get(), d_inp.get(), static_cast<long long>(N), nullptr);
  EXPECT_CLOSE(d_grad.download(), dinp, kBf16Tolerance);
}

TEST(ClassifierTest, FusedSoftmaxCrossEntropyMatchesCpu) {
  SKIP_WITHOUT_GPU();
  Random rng;
  const int N = 50, V = 1000, Vp = 1024;
  const std::vector<float> logits = rounded(rng.floats(N * V, 4.0f));
  const std::vector<int32_t> targets = rng.ints(N, V);
  const float dloss = 1.0f / N;
  std::vector<float> losses(N), dlogits = logits;
  cpu::crossentropy_forward_backward(losses.data(), dlogits.data(), targets.data(), dloss, N, V);

  std::vector<float> padded(static_cast<size_t>(N) * Vp);
  for (int i = 0; i < N; ++i) {
    std::copy_n(logits.begin() + i * V, V, padded.begin() + i * Vp);
    for (int j = V; j < Vp; ++j) padded[i * Vp + j] = 100.0f;  // must not enter the softmax
  }
  DeviceArray<bf16> d_logits(to_bf16(padded));
  DeviceArray<int32_t> d_targets(targets);
  DeviceArray<float> d_losses(N);

  // Loss only: logits untouched.
  d_losses.poison();
  fused_classifier(d_logits.get(), d_losses.get(), d_targets.get(), dloss, N, V, Vp, false,
                   nullptr);
  EXPECT_CLOSE(d_losses.download(), losses, kFp32Tolerance);
  EXPECT_EQ(to_float(d_logits.download()), rounded(padded));

  d_losses.poison();
  fused_classifier(d_logits.get(), d_losses.get(), d_targets.get(), dloss, N, V, Vp, true, nullptr);
  EXPECT_CLOSE(d_losses.download(), losses, kFp32Tolerance);
  const std::vector<float> got = to_float(d_logits.download());
  std::vector<float> got_real(N * V);
  for (int i = 0; i < N; ++i) {
    for (int j = 0; j < Vp; ++j) {
      if (j < V) {
        got_real[i * V + j] = got[i * Vp + j];
      } else {
        EXPECT_EQ(got[i * Vp + j], 0.0f) << "padding column " << j << " of row " << i;
      }
    }
  }
  EXPECT_CLOSE(got_real, dlogits, kBf16Tolerance);
}

TEST(AdamWTest, MatchesCpuAndRoundsStochastically) {
  SKIP_WITHOUT_GPU();
  Random rng;
  const size_t n = 100000;
  const std::vector<float> params0 = rng.floats(n, 0.05f), grads = rng.floats(n, 0.01f);
  const std::vector<float> m0 = rng.floats(n, 0.001f);
  std::vector<float> v0 = rng.floats(n, 1e-5f);
  for (float& x : v0) x = std::fabs(x);
  cpu::AdamWHyper cpu_hyper;
  cpu_hyper.lr = 1e-3f;
  cpu_hyper.weight_decay = 0.1f;
  cpu_hyper.grad_scale = 0.7f;
  cpu_hyper.t = 3;
  std::vector<float> params = params0, m = m0, v = v0;
  cpu::adamw_update(params.data(), grads.data(), m.data(), v.data(), n, cpu_hyper);

  AdamWHyper hyper = cpu_hyper;  // one type: the CPU update ignores the rounding seed
  hyper.seed = 1234;
  DeviceArray<float> d_master(params0), d_grads(grads), d_m(m0), d_v(v0);
  DeviceArray<bf16> d_params(n);
  d_params.poison();
  adamw_update(d_params.get(), d_master.get(), d_grads.get(), d_m.get(), d_v.get(),
               static_cast<long long>(n), hyper, nullptr);
  const std::vector<float> master = d_master.download();
  EXPECT_CLOSE(master, params, kFp32Tolerance);
  EXPECT_CLOSE(d_m.download(), m, kFp32Tolerance);
  EXPECT_CLOSE(d_v.download(), v, kFp32Tolerance);
  // The bf16 copy brackets the master weight: one of its two bf16 neighbours.
  const std::vector<float> working = to_float(d_params.download());
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &master[i], 4);
    uint32_t down_bits = bits & 0xffff0000u, up_bits = down_bits + 0x10000u;
    float down, up;
    std::memcpy(&down, &down_bits, 4);
    std::memcpy(&up, &up_bits, 4);
    ASSERT_TRUE(working[i] == down || working[i] == up)
        << "element " << i << ": master " << master[i] << " bf16 " << working[i];
  }

  // The multi-tensor (chunked) launch computes the same thing, bit for bit.
  std::vector<AdamWChunk> chunks;
  for (size_t start = 0; start < n; start += kAdamWChunk) {
    chunks.push_back(AdamWChunk{static_cast<long long>(start), static_cast<long long>(start),
                                static_cast<int>(std::min<size_t>(kAdamWChunk, n - start)), 1});
  }
  DeviceArray<float> c_master(params0), c_m(m0), c_v(v0);
  DeviceArray<bf16> c_params(n);
  DeviceArray<AdamWChunk> d_chunks(chunks);
  c_params.poison();
  adamw_update_chunks(c_params.get(), c_master.get(), d_grads.get(), c_m.get(), c_v.get(),
                      d_chunks.get(), static_cast<int>(chunks.size()), hyper, nullptr);
  EXPECT_EQ(c_master.download(), master);
  EXPECT_EQ(to_float(c_params.download()), working);
}

TEST(AdamWTest, StochasticRoundingIsUnbiased) {
  SKIP_WITHOUT_GPU();
  // lr = 0 leaves the master weights unchanged, so params = stochastic_round(master). A value a
  // quarter of the way from one bf16 to the next must round up about a quarter of the time.
  const size_t n = 1 << 18;
  const float down = 1.0f, up = 1.0f + 1.0f / 128.0f;  // neighbouring bf16 values
  const float value = down + 0.25f * (up - down);
  DeviceArray<float> master(std::vector<float>(n, value)), zeros(std::vector<float>(n, 0.0f));
  DeviceArray<float> m(std::vector<float>(n, 0.0f)), v(std::vector<float>(n, 0.0f));
  DeviceArray<bf16> params(n);
  AdamWHyper hyper;
  hyper.lr = 0.0f;
  hyper.seed = 7;
  adamw_update(params.get(), master.get(), zeros.get(), m.get(), v.get(), static_cast<long long>(n),
               hyper, nullptr);
  const std::vector<float> got = to_float(params.download());
  size_t ups = 0;
  for (float x : got) {
    ASSERT_TRUE(x == down || x == up) << x;
    ups += x == up;
  }
  const double fraction = static_cast<double>(ups) / n;
  EXPECT_NEAR(fraction, 0.25, 0.01);  // ~10 standard deviations of a fair binomial
}

TEST(GlobalNormTest, SumsMatchCpuAndAreDeterministic) {
  SKIP_WITHOUT_GPU();
  Random rng;
  const size_t n = 1234567;  // not a multiple of 4: the scalar tail
  const std::vector<float> x = rng.floats(n);
  const double expected_squares = cpu::sum_of_squares(x.data(), n);
  double expected_sum = 0.0;
  for (float value : x) expected_sum += value;

  DeviceArray<float> d_x(x), out(2), scratch(reduction_scratch_floats());
  std::vector<float> first;
  for (int run = 0; run < 2; ++run) {
    out.poison();
    sum_of_squares(out.get(), scratch.get(), d_x.get(), static_cast<long long>(n), nullptr);
    sum(out.get() + 1, scratch.get(), d_x.get(), static_cast<long long>(n), nullptr);
    const std::vector<float> got = out.download();
    EXPECT_LT(std::fabs(got[0] - expected_squares) / expected_squares, kFp32Tolerance);
    // A sum of random signs cancels: compare against the sum of magnitudes' scale.
    EXPECT_LT(std::fabs(got[1] - expected_sum) / std::sqrt(expected_squares * n), kFp32Tolerance);
    if (run == 0) {
      first = got;
    } else {
      EXPECT_EQ(got, first) << "two identical reductions differ";
    }
  }
}

TEST(CastTest, RoundsToNearestEven) {
  SKIP_WITHOUT_GPU();
  Random rng;
  const std::vector<float> x = rng.floats(10007, 3.0f);
  DeviceArray<float> d_x(x);
  DeviceArray<bf16> out(x.size());
  out.poison();
  cast_to_bf16(out.get(), d_x.get(), static_cast<long long>(x.size()), nullptr);
  EXPECT_EQ(to_float(out.download()), rounded(x));
}

TEST(CheckTest, FailingCallThrowsWithFileAndLine) {
  SKIP_WITHOUT_GPU();
  void* p = nullptr;
  try {
    LH_CUDA_CHECK(cudaMalloc(&p, ~size_t{0} >> 1));  // far more than any GPU has
    FAIL() << "an impossible allocation succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kernels_cuda_test.cc:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cudaMalloc"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace longhaul::kernels::cuda
