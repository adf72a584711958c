#include "longhaul/kernels/cpu/matmul.h"

#include <algorithm>
#include <cstddef>

#include <cblas.h>

#include "parallel.h"

namespace longhaul::kernels::cpu {
namespace {

// Runs fn(begin, end) on contiguous blocks of [0, n), one per thread of the team, block
// boundaries on multiples of `align`; on the calling thread alone when `flops` is small.
// OpenBLAS itself is single-threaded (see threading.h).
template <typename Fn>
void parallel_blocks(int n, int align, double flops, Fn fn) {
  const bool parallel = flops >= 64.0 * kParallelMinWork && n >= 2 * align;
  const int units = (n + align - 1) / align;
  parallel_for(units, parallel, [&](int64_t u0, int64_t u1) {
    const int begin = static_cast<int>(u0) * align;
    const int end = std::min(n, static_cast<int>(u1) * align);
    if (begin < end) fn(begin, end);
  });
}

// db[oc] += sum_rows dout[:, oc]; output-channel blocks are owned by one thread each.
void bias_backward(float* dbias, const float* dout, int N, int OC) {
  constexpr int kBlock = 64;
  const int blocks = (OC + kBlock - 1) / kBlock;
  const bool parallel = static_cast<size_t>(N) * OC >= kParallelMinWork;
  parallel_for(blocks, parallel, [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk) {
      const int o0 = static_cast<int>(blk) * kBlock, o1 = std::min(OC, o0 + kBlock);
      float acc[kBlock] = {};
      for (int i = 0; i < N; ++i) {
        const float* d = dout + static_cast<size_t>(i) * OC;
        for (int o = o0; o < o1; ++o) acc[o - o0] += d[o];
      }
      for (int o = o0; o < o1; ++o) dbias[o] += acc[o - o0];
    }
  });
}

// Too few rows to split among threads (e.g. one token at a time in KV-cache inference): split the
// output channels instead, in blocks of 64 columns.
bool split_columns(int N) { return N < 8; }
constexpr int kColumnAlign = 64;

}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC) {
  const double flops = 2.0 * N * C * OC;
  if (split_columns(N)) {
    parallel_blocks(OC, kColumnAlign, flops, [&](int o0, int o1) {
      float beta = 0.0f;
      if (bias != nullptr) {
        for (int i = 0; i < N; ++i) {
          std::copy(bias + o0, bias + o1, out + static_cast<size_t>(i) * OC + o0);
        }
        beta = 1.0f;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, o1 - o0, C, 1.0f, inp, C,
                  weight + o0, OC, beta, out + o0, OC);
    });
    return;
  }
  parallel_blocks(N, 4, flops, [&](int r0, int r1) {
    float* o = out + static_cast<size_t>(r0) * OC;
    float beta = 0.0f;
    if (bias != nullptr) {
      for (int i = r0; i < r1; ++i) std::copy(bias, bias + OC, out + static_cast<size_t>(i) * OC);
      beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, OC, C, 1.0f,
                inp + static_cast<size_t>(r0) * C, C, weight, OC, beta, o, OC);
  });
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC) {
  const double flops = 2.0 * N * C * OC;
  if (dinp != nullptr) {
    // dinp rows [r0, r1) += dout rows @ W^T
    parallel_blocks(N, 4, flops, [&](int r0, int r1) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, C, OC, 1.0f,
                  dout + static_cast<size_t>(r0) * OC, OC, weight, OC, 1.0f,
                  dinp + static_cast<size_t>(r0) * C, C);
    });
  }
  // dW = inp^T @ dout, split along its larger side so each thread packs the smaller operand
  // whole and only its share of the larger one.
  if (C > OC) {
    // dW rows [c0, c1) += inp columns^T @ dout
    parallel_blocks(C, 16, flops, [&](int c0, int c1) {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c1 - c0, OC, N, 1.0f, inp + c0, C, dout,
                  OC, 1.0f, dweight + static_cast<size_t>(c0) * OC, OC);
    });
  } else {
    // dW columns [o0, o1) += inp^T @ dout columns
    parallel_blocks(OC, 16, flops, [&](int o0, int o1) {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, o1 - o0, N, 1.0f, inp, C, dout + o0,
                  OC, 1.0f, dweight + o0, OC);
    });
  }
  if (dbias != nullptr) bias_backward(dbias, dout, N, OC);
}

void matmul_nt_forward(float* out, const float* inp, const float* weight, int N, int C, int OC) {
  if (split_columns(N)) {
    parallel_blocks(OC, kColumnAlign, 2.0 * N * C * OC, [&](int o0, int o1) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, o1 - o0, C, 1.0f, inp, C,
                  weight + static_cast<size_t>(o0) * C, C, 0.0f, out + o0, OC);
    });
    return;
  }
  parallel_blocks(N, 4, 2.0 * N * C * OC, [&](int r0, int r1) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, OC, C, 1.0f,
                inp + static_cast<size_t>(r0) * C, C, weight, C, 0.0f,
                out + static_cast<size_t>(r0) * OC, OC);
  });
}

void matmul_nt_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                        const float* weight, int N, int C, int OC) {
  const double flops = 2.0 * N * C * OC;
  if (dinp != nullptr) {
    parallel_blocks(N, 4, flops, [&](int r0, int r1) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, C, OC, 1.0f,
                  dout + static_cast<size_t>(r0) * OC, OC, weight, C, 1.0f,
                  dinp + static_cast<size_t>(r0) * C, C);
    });
  }
  // dW rows [o0, o1) += dout columns^T @ inp
  parallel_blocks(OC, 16, flops, [&](int o0, int o1) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o1 - o0, C, N, 1.0f, dout + o0, OC, inp, C,
                1.0f, dweight + static_cast<size_t>(o0) * C, C);
  });
}

}  // namespace longhaul::kernels::cpu
