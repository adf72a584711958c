// Matrix products through cuBLASLt, with the bias / GELU / bias-gradient epilogues fused into
// the GEMM (see matmul.cc for the layout derivation).
//
// Thread-safety: a Matmul is used by one thread (the training thread) at a time; its algorithm
// cache is not locked. Work is issued on the stream passed to each call.
#pragma once

#include <cstddef>
#include <map>
#include <string>

#include <cublasLt.h>

#include "longhaul/kernels/cuda/types.h"

namespace longhaul::kernels::cuda {

enum class Epilogue {
  kNone,
  kBias,         // D = A*B + bias (bias: (m) bf16, broadcast along n)
  kGeluAuxBias,  // aux = A*B + bias, D = gelu_tanh(aux) (aux: (n, m) bf16, ld m)
  kBiasGradA,    // D = A*B, bias = sum over k of op(A) rows: (m) in D's type (overwritten)
};

// One column-major GEMM  D(m x n) = alpha * op(A)(m x k) * op(B)(k x n) + beta * D, packed by
// default: lda = trans_a ? k : m, ldb = trans_b ? n : k, ldd = m (a non-zero ld overrides);
// `batch` strided copies.
struct GemmDesc {
  int m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  int lda = 0, ldb = 0, ldd = 0;
  int batch = 1;
  long long stride_a = 0, stride_b = 0, stride_d = 0;  // elements, used when batch > 1
  cudaDataType_t d_type = CUDA_R_16BF;                 // CUDA_R_16BF or CUDA_R_32F
  float alpha = 1.0f, beta = 0.0f;
  Epilogue epilogue = Epilogue::kNone;
  void* bias = nullptr;  // see Epilogue
  void* aux = nullptr;   // kGeluAuxBias only
};

// A cuBLASLt handle, its workspace and a cache of the algorithm chosen per problem shape.
class Matmul {
 public:
  static constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;
  explicit Matmul(size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~Matmul();
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;

  // Runs the GEMM; throws Internal naming the shape when cuBLASLt has no algorithm for it.
  void run(const GemmDesc& desc, void* d, const bf16* a, const bf16* b, cudaStream_t stream);
  // As run(), but returns false (and does nothing) when no algorithm supports the request
  // (used to fall back from an optional epilogue).
  bool try_run(const GemmDesc& desc, void* d, const bf16* a, const bf16* b, cudaStream_t stream);

  // Forces the kernels' own bias-gradient reduction instead of the BGRADA epilogue (tests use
  // it to check both paths).
  void set_bias_grad_epilogue(bool enabled) { bias_grad_epilogue_ = enabled; }
  bool bias_grad_epilogue() const { return bias_grad_epilogue_; }
  // Likewise for the forward epilogues: false runs the plain GEMM, then add_bias_rows (bias_add.h)
  // and, for the GELU layer, gelu_forward as separate kernels. The CUDA model sets these from
  // the start-up self-check's choices (a fused epilogue that computes wrong numbers on this GPU
  // or cuBLASLt version is replaced, never trusted).
  void set_bias_epilogue(bool enabled) { bias_epilogue_ = enabled; }
  bool bias_epilogue() const { return bias_epilogue_; }
  void set_gelu_epilogue(bool enabled) { gelu_epilogue_ = enabled; }
  bool gelu_epilogue() const { return gelu_epilogue_; }

 private:
  struct CachedAlgo {
    bool found = false;
    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;  // of the heuristic query
    cublasLtMatmulAlgo_t algo{};
  };
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  bool bias_grad_epilogue_ = true;
  bool bias_epilogue_ = true;
  bool gelu_epilogue_ = true;
  std::map<std::string, CachedAlgo> cache_;
};

// ---- Dense layers in Hugging Face Conv1D layout: y = x @ W + b, W (C, OC) row-major ----

// out = inp @ weight + bias (bias may be nullptr).
void linear_forward(Matmul& mm, bf16* out,  // (N, OC)
                    const bf16* inp,        // (N, C)
                    const bf16* weight,     // (C, OC)
                    const bf16* bias,       // (OC) or nullptr
                    int N, int C, int OC, cudaStream_t stream);

// pre = inp @ weight + bias, out = gelu_tanh(pre), both written (pre is kept for the backward).
void linear_gelu_forward(Matmul& mm, bf16* out,  // (N, OC)
                         bf16* pre,              // (N, OC)
                         const bf16* inp,        // (N, C)
                         const bf16* weight,     // (C, OC)
                         const bf16* bias,       // (OC)
                         int N, int C, int OC, cudaStream_t stream);

// Floats of scratch linear_backward needs for output width OC.
long long linear_backward_scratch_floats(int OC);

// dinp = dout @ weight^T (overwritten; skipped when nullptr); dweight += inp^T @ dout (fp32);
// dbias += sum_rows dout (fp32; skipped when nullptr).
void linear_backward(Matmul& mm, bf16* dinp,  // (N, C) or nullptr
                     float* dweight,          // (C, OC)
                     float* dbias,            // (OC) or nullptr
                     float* scratch,          // linear_backward_scratch_floats(OC)
                     const bf16* dout,        // (N, OC)
                     const bf16* inp,         // (N, C)
                     const bf16* weight,      // (C, OC)
                     int N, int C, int OC, cudaStream_t stream);

// ---- The tied classifier: logits = x @ wte^T, wte (V, C) row-major ----

void classifier_matmul_forward(Matmul& mm, bf16* logits,  // (N, Vp)
                               const bf16* inp,           // (N, C)
                               const bf16* wte,           // (Vp, C)
                               int N, int C, int Vp, cudaStream_t stream);

// dinp = dlogits @ wte (overwritten); dwte += dlogits[:, :V]^T @ inp (fp32; only the V real
// rows: the gradient buffer is unpadded).
void classifier_matmul_backward(Matmul& mm, bf16* dinp,  // (N, C)
                                float* dwte,             // (V, C)
                                const bf16* dlogits,     // (N, Vp)
                                const bf16* inp,         // (N, C)
                                const bf16* wte,         // (Vp, C)
                                int N, int C, int V, int Vp, cudaStream_t stream);

}  // namespace longhaul::kernels::cuda
