// Matrix products through cuBLASLt.
//
// Layout. cuBLAS is column-major; our tensors are row-major. A row-major (R, S) matrix is the
// column-major (S, R) matrix with ld = S, i.e. its transpose. So for a Conv1D layer
// y (N, OC) = x (N, C) @ W (C, OC):
//   y^T (OC x N) = W^T (OC x C) * x^T (C x N)
// and W^T, x^T are exactly how W and x already sit in memory: no transposes, m = OC, n = N,
// k = C. The backward products follow the same way:
//   dx^T (C x N)  = op_T(W as stored, OC x C) * dy^T (OC x N)           m = C,  n = N,  k = OC
//   dW^T (OC x C) = dy^T (OC x N) * op_T(x as stored, C x N)            m = OC, n = C,  k = N
// and for the tied classifier logits (N, Vp) = x @ wte^T with wte (Vp, C):
//   logits^T (Vp x N) = op_T(wte as stored, C x Vp) * x^T (C x N)       m = Vp, n = N,  k = C
//   dx^T (C x N)      = wte as stored (C x Vp) * dlogits^T (Vp x N)     m = C,  n = N,  k = Vp
//   dwte^T (C x V)    = x^T (C x N) * op_T(dlogits[:V] as stored, ld Vp) m = C,  n = V,  k = N
// (the padded logits columns feed no gradient: dwte is kept unpadded, V rows).
//
// Precision: bf16 operands, fp32 accumulation (CUBLAS_COMPUTE_32F) and fp32 alpha/beta.
// Activation outputs are bf16; weight gradients are written to fp32 with beta = 1, so they
// accumulate across micro-batches without bf16 rounding.
//
// Epilogues: the bias add (BIAS) and bias + GELU (GELU_AUX_BIAS, which also stores the
// pre-activation in `aux` for the backward pass) ride in the forward GEMM, saving a full
// read+write of the (N, OC) output each. In the weight-gradient GEMM, op(A) = dy^T, so the bias
// gradient (a sum over N = over k of A's rows) is the BGRADA epilogue; it overwrites its vector,
// so it goes to scratch and is then added into the accumulating fp32 gradient. Where cuBLASLt
// has no algorithm for BGRADA, bias_backward's deterministic reduction runs instead. Each
// epilogue can be switched off (Matmul::set_*_epilogue, from the start-up self-check): the plain
// GEMM then runs with add_bias_rows / gelu_forward / bias_backward as separate kernels.
//
// Algorithms: the heuristic is asked once per shape/epilogue/alignment and the answer cached
// (including "none": an unsupported optional epilogue then costs one lookup, not one per call).
// Alignment preferences are computed from the actual pointers and strides, so a cached algorithm
// is never applied to less-aligned data than it was chosen for; batch strides are part of the key
// too. An algorithm cublasLtMatmul refuses with NOT_SUPPORTED is dropped like a heuristic "none".
#include "longhaul/kernels/cuda/matmul.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include <longhaul/base/error.h>

#include "longhaul/kernels/cuda/bias_add.h"
#include "longhaul/kernels/cuda/bias_backward.h"
#include "longhaul/kernels/cuda/check.h"
#include "longhaul/kernels/cuda/gelu.h"

namespace longhaul::kernels::cuda {
namespace {

// The largest power of two (<= 256) dividing the address and every byte stride.
uint32_t alignment_of(const void* pointer, long long ld_bytes, long long stride_bytes) {
  uint64_t bits = reinterpret_cast<uintptr_t>(pointer) | static_cast<uint64_t>(ld_bytes) |
                  static_cast<uint64_t>(stride_bytes) | 256u;
  return static_cast<uint32_t>(bits & (~bits + 1));
}

size_t element_size(cudaDataType_t type) { return type == CUDA_R_32F ? 4 : 2; }

cublasLtEpilogue_t to_cublas(Epilogue epilogue) {
  switch (epilogue) {
    case Epilogue::kNone:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::kBias:
      return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::kGeluAuxBias:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::kBiasGradA:
      return CUBLASLT_EPILOGUE_BGRADA;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// Owns the cuBLASLt descriptors of one call; destroys them on every path.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  ~Descriptors() {
    if (preference != nullptr) cublasLtMatmulPreferenceDestroy(preference);
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

void set_layout(cublasLtMatrixLayout_t* layout, cudaDataType_t type, int rows, int cols, int ld,
                int batch, long long stride) {
  LH_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(layout, type, rows, cols, ld));
  if (batch > 1) {
    const int32_t count = batch;
    const int64_t offset = stride;
    LH_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                     &count, sizeof(count)));
    LH_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        *layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &offset, sizeof(offset)));
  }
}

std::string describe(const GemmDesc& g) {
  return "m=" + std::to_string(g.m) + " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) +
         " ld=" + std::to_string(g.lda) + "," + std::to_string(g.ldb) + "," +
         std::to_string(g.ldd) + " ta=" + std::to_string(g.trans_a) +
         " tb=" + std::to_string(g.trans_b) + " batch=" + std::to_string(g.batch) +
         " d=" + (g.d_type == CUDA_R_32F ? "f32" : "bf16") +
         " epilogue=" + std::to_string(static_cast<int>(g.epilogue)) +
         " beta=" + std::to_string(g.beta != 0.0f) +
         (g.batch > 1 ? " strides=" + std::to_string(g.stride_a) + "," +
                            std::to_string(g.stride_b) + "," + std::to_string(g.stride_d)
                      : std::string());
}

// The operation and the three matrix layouts of one product.
void describe_call(Descriptors& desc, const GemmDesc& g, int lda, int ldb, int ldd) {
  LH_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const int32_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int32_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  LH_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  LH_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  const uint32_t epilogue = to_cublas(g.epilogue);
  LH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                 sizeof(epilogue)));
  if (g.epilogue != Epilogue::kNone) {
    LH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                   &g.bias, sizeof(g.bias)));
  }
  if (g.epilogue == Epilogue::kGeluAuxBias) {
    const int64_t aux_ld = g.m;
    LH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof(g.aux)));
    LH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                   &aux_ld, sizeof(aux_ld)));
  }
  set_layout(&desc.a, CUDA_R_16BF, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, lda, g.batch,
             g.stride_a);
  set_layout(&desc.b, CUDA_R_16BF, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, ldb, g.batch,
             g.stride_b);
  set_layout(&desc.d, g.d_type, g.m, g.n, ldd, g.batch, g.stride_d);
}

// Asks the heuristic for one algorithm under the workspace limit and the operands' alignments
// (A, B, D; C is D). Returns whether it found one; *status is the query's.
bool ask_heuristic(cublasLtHandle_t handle, size_t workspace_bytes, Descriptors& desc,
                   std::array<uint32_t, 3> align, cublasStatus_t* status,
                   cublasLtMatmulAlgo_t* algo) {
  LH_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&desc.preference));
  const uint64_t workspace = workspace_bytes;
  LH_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      desc.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
  const struct {
    cublasLtMatmulPreferenceAttributes_t attribute;
    uint32_t value;
  } alignments[] = {{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align[0]},
                    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align[1]},
                    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align[2]},
                    {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align[2]}};
  for (const auto& alignment : alignments) {
    LH_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        desc.preference, alignment.attribute, &alignment.value, sizeof(alignment.value)));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  *status = cublasLtMatmulAlgoGetHeuristic(handle, desc.op, desc.a, desc.b, desc.d, desc.d,
                                           desc.preference, 1, &result, &returned);
  if (*status != CUBLAS_STATUS_SUCCESS || returned == 0 || result.state != CUBLAS_STATUS_SUCCESS) {
    return false;
  }
  *algo = result.algo;
  return true;
}

}  // namespace

Matmul::Matmul(size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  LH_CUBLAS_CHECK(cublasLtCreate(&handle_));
  const cudaError_t status = cudaMalloc(&workspace_, workspace_bytes_);
  if (status != cudaSuccess) {
    cublasLtDestroy(handle_);
    LH_CUDA_CHECK(status);
  }
}

Matmul::~Matmul() {
  cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

void Matmul::run(const GemmDesc& desc, void* d, const bf16* a, const bf16* b, cudaStream_t stream) {
  if (!try_run(desc, d, a, b, stream)) {
    const auto it = std::find_if(cache_.begin(), cache_.end(), [&](const auto& entry) {
      return entry.first.rfind(describe(desc), 0) == 0;
    });
    const cublasStatus_t status = it != cache_.end() ? it->second.status : CUBLAS_STATUS_SUCCESS;
    throw Internal("cuBLASLt has no algorithm for the matrix product " + describe(desc) +
                   " (heuristic status " + cublasLtGetStatusName(status) +
                   "); check the model dimensions (multiples of 8 are required)");
  }
}

bool Matmul::try_run(const GemmDesc& g, void* d, const bf16* a, const bf16* b,
                     cudaStream_t stream) {
  const int lda = g.lda != 0 ? g.lda : (g.trans_a ? g.k : g.m);
  const int ldb = g.ldb != 0 ? g.ldb : (g.trans_b ? g.n : g.k);
  const int ldd = g.ldd != 0 ? g.ldd : g.m;
  const long long dsize = static_cast<long long>(element_size(g.d_type));
  const uint32_t align_a = alignment_of(a, 2LL * lda, g.batch > 1 ? 2 * g.stride_a : 0);
  const uint32_t align_b = alignment_of(b, 2LL * ldb, g.batch > 1 ? 2 * g.stride_b : 0);
  const uint32_t align_d = alignment_of(d, dsize * ldd, g.batch > 1 ? dsize * g.stride_d : 0);

  Descriptors desc;
  describe_call(desc, g, lda, ldb, ldd);

  // The heuristic also reads the bias/aux pointers' alignment: part of the key as well.
  const std::string key = describe(g) + " al=" + std::to_string(align_a) + "," +
                          std::to_string(align_b) + "," + std::to_string(align_d) + "," +
                          std::to_string(alignment_of(g.bias, 0, 0)) + "," +
                          std::to_string(alignment_of(g.aux, 0, 0));
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    CachedAlgo cached;
    cached.found = ask_heuristic(handle_, workspace_bytes_, desc, {align_a, align_b, align_d},
                                 &cached.status, &cached.algo);
    it = cache_.emplace(key, cached).first;
  }
  if (!it->second.found) return false;
  const cublasStatus_t status =
      cublasLtMatmul(handle_, desc.op, &g.alpha, a, desc.a, b, desc.b, &g.beta, d, desc.d, d,
                     desc.d, &it->second.algo, workspace_, workspace_bytes_, stream);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) {
    // The heuristic's algorithm was refused at launch (checked before any work is queued): treat
    // it like "no algorithm", so an optional epilogue falls back instead of failing the step.
    it->second.found = false;
    it->second.status = status;
    return false;
  }
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw_cublas_error(status, ("cublasLtMatmul(" + describe(g) + ")").c_str(), __FILE__, __LINE__);
  }
  return true;
}

void linear_forward(Matmul& mm, bf16* out, const bf16* inp, const bf16* weight, const bf16* bias,
                    int N, int C, int OC, cudaStream_t stream) {
  GemmDesc g;
  g.m = OC;
  g.n = N;
  g.k = C;
  if (bias != nullptr && mm.bias_epilogue()) {
    g.epilogue = Epilogue::kBias;
    g.bias = const_cast<bf16*>(bias);
  }
  mm.run(g, out, weight, inp, stream);
  if (bias != nullptr && !mm.bias_epilogue()) add_bias_rows(out, bias, N, OC, stream);
}

void linear_gelu_forward(Matmul& mm, bf16* out, bf16* pre, const bf16* inp, const bf16* weight,
                         const bf16* bias, int N, int C, int OC, cudaStream_t stream) {
  if (!mm.gelu_epilogue()) {
    // Separate kernels: pre = inp @ weight + bias, then out = gelu(pre).
    linear_forward(mm, pre, inp, weight, bias, N, C, OC, stream);
    gelu_forward(out, pre, static_cast<long long>(N) * OC, stream);
    return;
  }
  GemmDesc g;
  g.m = OC;
  g.n = N;
  g.k = C;
  g.epilogue = Epilogue::kGeluAuxBias;
  g.bias = const_cast<bf16*>(bias);
  g.aux = pre;
  mm.run(g, out, weight, inp, stream);
}

long long linear_backward_scratch_floats(int OC) { return bias_backward_scratch_floats(OC); }

void linear_backward(Matmul& mm, bf16* dinp, float* dweight, float* dbias, float* scratch,
                     const bf16* dout, const bf16* inp, const bf16* weight, int N, int C, int OC,
                     cudaStream_t stream) {
  if (dinp != nullptr) {
    GemmDesc g;
    g.m = C;
    g.n = N;
    g.k = OC;
    g.trans_a = true;
    mm.run(g, dinp, weight, dout, stream);
  }
  GemmDesc g;
  g.m = OC;
  g.n = C;
  g.k = N;
  g.trans_b = true;
  g.d_type = CUDA_R_32F;
  g.beta = 1.0f;
  bool bias_done = false;
  if (dbias != nullptr && mm.bias_grad_epilogue()) {
    g.epilogue = Epilogue::kBiasGradA;
    g.bias = scratch;
    if (mm.try_run(g, dweight, dout, inp, stream)) {
      add_inplace(dbias, scratch, OC, stream);
      bias_done = true;
    } else {
      g.epilogue = Epilogue::kNone;
      g.bias = nullptr;
    }
  }
  if (!bias_done) {
    mm.run(g, dweight, dout, inp, stream);
    if (dbias != nullptr) bias_backward(dbias, scratch, dout, N, OC, stream);
  }
}

void classifier_matmul_forward(Matmul& mm, bf16* logits, const bf16* inp, const bf16* wte, int N,
                               int C, int Vp, cudaStream_t stream) {
  GemmDesc g;
  g.m = Vp;
  g.n = N;
  g.k = C;
  g.trans_a = true;
  mm.run(g, logits, wte, inp, stream);
}

void classifier_matmul_backward(Matmul& mm, bf16* dinp, float* dwte, const bf16* dlogits,
                                const bf16* inp, const bf16* wte, int N, int C, int V, int Vp,
                                cudaStream_t stream) {
  GemmDesc gx;
  gx.m = C;
  gx.n = N;
  gx.k = Vp;
  mm.run(gx, dinp, wte, dlogits, stream);
  GemmDesc gw;
  gw.m = C;
  gw.n = V;
  gw.k = N;
  gw.trans_b = true;
  gw.ldb = Vp;  // the first V of each dlogits row
  gw.d_type = CUDA_R_32F;
  gw.beta = 1.0f;
  mm.run(gw, dwte, inp, dlogits, stream);
}

}  // namespace longhaul::kernels::cuda
