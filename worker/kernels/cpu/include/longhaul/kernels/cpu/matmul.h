// Dense layers through OpenBLAS cblas_sgemm (row-major, fp32).
//
// matmul_*: Hugging Face GPT-2's Conv1D layout, weight (C, OC), y = x @ W + b, so HF checkpoints
// load without transposes.
//   forward:  out  = inp @ W + b
//   backward: dinp += dout @ W^T      (N,OC)x(OC,C)
//             dW   += inp^T @ dout    (C,N)x(N,OC)
//             db   += sum_rows dout
//
// matmul_nt_*: weight stored (OC, C) (torch nn.Linear layout), y = x @ W^T, no bias. This is the
// tied GPT-2 classifier: logits = x @ wte^T with wte (V, C).
//   forward:  out  = inp @ W^T
//   backward: dinp += dout @ W        (N,OC)x(OC,C)
//             dW   += dout^T @ inp    (OC,N)x(N,C)
//
// Memory: no scratch; sgemm's beta = 1 does the accumulation in place. The bias reduction
// partitions output channels among threads (deterministic for any thread count).
// Threads: each product is split into contiguous row (or, for weight gradients and forward calls
// with fewer than 8 rows, such as KV-cache decoding, output-column) blocks,
// one per OpenMP thread, each a single-threaded sgemm (see threading.h).
#pragma once

namespace longhaul::kernels::cpu {

void matmul_forward(float* out,           // (N, OC)
                    const float* inp,     // (N, C)
                    const float* weight,  // (C, OC)
                    const float* bias,    // (OC) or nullptr
                    int N, int C, int OC);

// Accumulates. dinp may be nullptr (input needs no gradient); dbias may be nullptr (no bias).
void matmul_backward(float* dinp,          // (N, C) or nullptr
                     float* dweight,       // (C, OC)
                     float* dbias,         // (OC) or nullptr
                     const float* dout,    // (N, OC)
                     const float* inp,     // (N, C)
                     const float* weight,  // (C, OC)
                     int N, int C, int OC);

void matmul_nt_forward(float* out,           // (N, OC)
                       const float* inp,     // (N, C)
                       const float* weight,  // (OC, C)
                       int N, int C, int OC);

// Accumulates. dinp may be nullptr.
void matmul_nt_backward(float* dinp,          // (N, C) or nullptr
                        float* dweight,       // (OC, C)
                        const float* dout,    // (N, OC)
                        const float* inp,     // (N, C)
                        const float* weight,  // (OC, C)
                        int N, int C, int OC);

}  // namespace longhaul::kernels::cpu
