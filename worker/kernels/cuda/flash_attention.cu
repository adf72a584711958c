// Fused causal attention (FlashAttention-2 style) for head size 64, forward and backward, on
// bf16 tensor cores (mma.sync m16n8k16, fp32 accumulate). Same math as attention.cu:
//   S = scale Q K^T,  P = causal_softmax(S),  Y = P V
// but P never goes to device memory: per (b, h) and block of 64 queries, the kernel streams the
// 64-key blocks at or below the diagonal, keeping a running row max m and sum l (online softmax)
// and rescaling the output accumulator when the max grows. It saves only the log-sum-exp
// L = m + log l per row (fp32, in base 2), from which the backward pass recomputes P exactly.
//
// Memory traffic per layer: Q, K, V read (K, V once per query block, from L2 mostly), Y written,
// against the (B, NH, T, T) score/probability round trips of the cuBLASLt path (~4 GB per layer
// and step for GPT-2 124M at B*T = 16384). FLOPs: only the causal half of the square is
// computed (blocks above the diagonal are skipped, the diagonal block is masked).
//
// Layout: reads q, k, v straight from the fused (B, T, 3C) projection output (head h at
// channels h*64 of each third) and writes Y straight into (B, T, C): no split/merge kernels.
//
// Fragments (PTX ISA, mma.m16n8k16 .bf16): lane = 4 g + t. A (16x16, row-major): reg0 = row g,
// cols 2t..2t+1; reg1 = row g+8; reg2 = row g, cols +8; reg3 = row g+8, cols +8. B (16x8): reg0 =
// rows (k) 2t..2t+1 of col g; reg1 = k + 8. C (16x8 fp32): c0,c1 = row g, cols 2t, 2t+1; c2,c3 =
// row g+8. Two adjacent C tiles of S therefore form exactly the A fragment of P for the P V
// product, so P goes from accumulator to operand without leaving registers. A B operand needs
// its two k-elements adjacent in memory: K (keys x dims) serves Q K^T as stored; P V needs V
// transposed (dims x keys), which the tile loader writes to shared memory. Shared-memory rows are
// padded to 72 bf16 (144 bytes = 36 words), so the 8 rows x 4 columns a warp reads for one B
// fragment fall in 32 distinct banks.
//
// Backward (no atomics, so bit-identical across runs): D = rowsum(dY * Y) first; then one kernel
// per key block accumulates dK and dV over the query blocks that see it (queries >= keys), and
// one kernel per query block accumulates dQ over its key blocks, each recomputing P from L:
//   dP = dY V^T,  dS = P (dP - D),  dV = P^T dY,  dK = scale dS^T Q,  dQ = scale dS K.
// Recomputing S and dP in both kernels costs ~1.4x the FLOPs of a single fused backward with
// atomic dQ updates, in exchange for determinism.
#include <cmath>
#include <string>

#include <longhaul/base/error.h>

#include "device_util.cuh"
#include "longhaul/kernels/cuda/attention.h"
#include "longhaul/kernels/cuda/check.h"

namespace longhaul::kernels::cuda {
namespace {

constexpr int kD = 64;      // head size
constexpr int kBlock = 64;  // queries or keys per tile
constexpr int kWarps = 4;   // 16 rows each
constexpr int kThreads = kWarps * 32;
constexpr int kStride = kD + 8;  // padded shared-memory row, in bf16
constexpr float kLog2e = 1.4426950408889634f;
constexpr long long kMaxGridY = 65535;

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t load_pair(const bf16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// d += a * b on the tensor cores.
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The A fragments of a warp's 16 rows x 64 dims, rows [row0, row0 + 16) of a (T, *) matrix
// with row stride `stride` elements; rows >= T read as zero.
__device__ __forceinline__ void load_a_fragments(uint32_t (&f)[4][4], const bf16* base,
                                                 long long stride, int row0, int T, int lane) {
  const int g = lane >> 2, t = lane & 3;
  const int r0 = row0 + g, r1 = row0 + g + 8;
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    const int c = ks * 16 + 2 * t;
    f[ks][0] = r0 < T ? load_pair(base + r0 * stride + c) : 0u;
    f[ks][1] = r1 < T ? load_pair(base + r1 * stride + c) : 0u;
    f[ks][2] = r0 < T ? load_pair(base + r0 * stride + c + 8) : 0u;
    f[ks][3] = r1 < T ? load_pair(base + r1 * stride + c + 8) : 0u;
  }
}

// Copies rows [row0, row0 + 64) x 64 dims of a (T, *) matrix (row stride `stride`) to shared
// memory, as stored (`rows`, may be null) and/or transposed (`cols`, may be null); rows >= T
// become zeros. All threads of the block take part.
__device__ __forceinline__ void load_tile(bf16* rows, bf16* cols, const bf16* base,
                                          long long stride, int row0, int T) {
  for (int i = threadIdx.x; i < kBlock * (kD / 8); i += kThreads) {
    const int r = i / (kD / 8), chunk = (i % (kD / 8)) * 8;
    detail::Pack8 v;
    if (row0 + r < T) {
      v = detail::load8(base + (row0 + r) * stride + chunk);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) v.v[e] = __float2bfloat16_rn(0.0f);
    }
    if (rows != nullptr) detail::store8(rows + r * kStride + chunk, v);
    if (cols != nullptr) {
#pragma unroll
      for (int e = 0; e < 8; ++e) cols[(chunk + e) * kStride + r] = v.v[e];
    }
  }
}

// acc (16 rows x 64 cols, 8 tiles of 8 cols) += A (16 x 64 over k) * B, where B's column n,
// k-elements k..k+1 are at smem[n * kStride + k] (i.e. B^T stored row-major).
__device__ __forceinline__ void mma_a_regs(float (&acc)[8][4], const uint32_t (&a)[4][4],
                                           const bf16* smem, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const bf16* p = smem + (nt * 8 + g) * kStride + ks * 16 + 2 * t;
      mma(acc[nt], a[ks], load_pair(p), load_pair(p + 8));
    }
  }
}

// The A fragments (16 x 64 over k) formed from a 16 x 64 fp32 accumulator, rounded to bf16.
__device__ __forceinline__ void accumulator_to_a(uint32_t (&a)[4][4], const float (&acc)[8][4]) {
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    a[ks][0] = pack_bf16(acc[2 * ks][0], acc[2 * ks][1]);
    a[ks][1] = pack_bf16(acc[2 * ks][2], acc[2 * ks][3]);
    a[ks][2] = pack_bf16(acc[2 * ks + 1][0], acc[2 * ks + 1][1]);
    a[ks][3] = pack_bf16(acc[2 * ks + 1][2], acc[2 * ks + 1][3]);
  }
}

__device__ __forceinline__ void zero(float (&acc)[8][4]) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
  }
}

// Writes a warp's 16 x 64 accumulator * scale as bf16 to rows [row0, row0+16) of a (T, *)
// matrix with row stride `stride`, skipping rows >= T.
__device__ __forceinline__ void store_accumulator(bf16* base, long long stride, int row0, int T,
                                                  const float (&acc)[8][4], float scale, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    const int c = nt * 8 + 2 * t;
    if (row0 + g < T) {
      *reinterpret_cast<uint32_t*>(base + (row0 + g) * stride + c) =
          pack_bf16(acc[nt][0] * scale, acc[nt][1] * scale);
    }
    if (row0 + g + 8 < T) {
      *reinterpret_cast<uint32_t*>(base + (row0 + g + 8) * stride + c) =
          pack_bf16(acc[nt][2] * scale, acc[nt][3] * scale);
    }
  }
}

// One block of keys (from key0) in the forward pass's online softmax, for this thread's two rows
// (q0 + g, q0 + g + 8): masks S = Q K^T causally in base 2, raises the running maxima m, rescales
// the running sums l and the output o by the change, and turns S into P = exp2(S - m), adding it
// to l.
__device__ __forceinline__ void online_softmax_block(float (&s)[8][4], float (&o)[8][4],
                                                     float (&m)[2], float (&l)[2], int q0, int key0,
                                                     int g, int t, float scale_log2) {
  float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = q0 + g + (e >= 2 ? 8 : 0);
      const int key = key0 + nt * 8 + 2 * t + (e & 1);
      const float x = key <= row ? s[nt][e] * scale_log2 : -INFINITY;
      s[nt][e] = x;
      row_max[e >> 1] = fmaxf(row_max[e >> 1], x);
    }
  }
  float correction[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(0xffffffffu, row_max[r], 1));
    row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(0xffffffffu, row_max[r], 2));
    const float m_new = fmaxf(m[r], row_max[r]);  // finite: key key0 <= every row
    correction[r] = exp2f(m[r] - m_new);
    m[r] = m_new;
    l[r] *= correction[r];
  }
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float p = exp2f(s[nt][e] - m[e >> 1]);
      s[nt][e] = p;
      l[e >> 1] += p;
      o[nt][e] *= correction[e >> 1];
    }
  }
}

// grid (ceil(T / 64), B * NH), kThreads threads.
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(bf16* __restrict__ out,        // (B, T, C)
                         float* __restrict__ lse,       // (B, NH, T) base-2 log-sum-exp
                         const bf16* __restrict__ qkv,  // (B, T, 3C)
                         int T, int C, int NH, float scale_log2) {
  __shared__ alignas(16) bf16 k_rows[kBlock * kStride];
  __shared__ alignas(16) bf16 v_cols[kD * kStride];
  // The last query blocks carry the most key blocks: schedule them first (shorter tail).
  const int qb = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const long long stride = 3LL * C;
  const bf16* q = qkv + static_cast<long long>(b) * T * stride + h * kD;
  const bf16* k = q + C;
  const bf16* v = q + 2 * C;
  const int q0 = qb * kBlock + warp * 16;

  uint32_t qf[4][4];
  load_a_fragments(qf, q, stride, q0, T, lane);
  float o[8][4];
  zero(o);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int kb = 0; kb <= qb; ++kb) {
    __syncthreads();  // the previous tiles are consumed
    load_tile(k_rows, nullptr, k, stride, kb * kBlock, T);
    load_tile(nullptr, v_cols, v, stride, kb * kBlock, T);
    __syncthreads();

    float s[8][4];
    zero(s);
    mma_a_regs(s, qf, k_rows, lane);  // S = Q K^T (k_rows holds K: keys x dims)
    online_softmax_block(s, o, m, l, q0, kb * kBlock, g, t, scale_log2);
    uint32_t pf[4][4];
    accumulator_to_a(pf, s);
    mma_a_regs(o, pf, v_cols, lane);  // O += P V (v_cols holds V^T: dims x keys)
  }

  float inv_l[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    inv_l[r] = 1.0f / l[r];
  }
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[nt][e] *= inv_l[e >> 1];
  }
  store_accumulator(out + static_cast<long long>(b) * T * C + h * kD, C, q0, T, o, 1.0f, lane);
  if (t == 0) {
    float* row_lse = lse + static_cast<long long>(bh) * T;
    if (q0 + g < T) row_lse[q0 + g] = m[0] + log2f(l[0]);
    if (q0 + g + 8 < T) row_lse[q0 + g + 8] = m[1] + log2f(l[1]);
  }
}

// D[b,h,t] = sum_d dY[b,t,h,d] * Y[b,t,h,d]; one thread per (b, t, h).
__global__ void flash_backward_dot_kernel(float* __restrict__ d_out,      // (B, NH, T)
                                          const bf16* __restrict__ dout,  // (B, T, C)
                                          const bf16* __restrict__ out,   // (B, T, C)
                                          int B, int T, int C, int NH) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<long long>(B) * T * NH) return;
  const int h = static_cast<int>(i % NH);
  const long long bt = i / NH;
  const int t = static_cast<int>(bt % T), b = static_cast<int>(bt / T);
  const long long base = bt * C + h * kD;
  float sum = 0.0f;
#pragma unroll
  for (int c = 0; c < kD; c += 8) {
    const detail::Pack8 x = detail::load8(dout + base + c), y = detail::load8(out + base + c);
#pragma unroll
    for (int e = 0; e < 8; ++e) sum += __bfloat162float(x.v[e]) * __bfloat162float(y.v[e]);
  }
  d_out[(static_cast<long long>(b) * NH + h) * T + t] = sum;
}

// dK and dV for one block of 64 keys: grid (ceil(T / 64), B * NH). Warps own 16 keys each.
__global__ void __launch_bounds__(kThreads)
    flash_backward_dkv_kernel(bf16* __restrict__ dqkv,        // (B, T, 3C): k, v parts
                              const bf16* __restrict__ dout,  // (B, T, C)
                              const bf16* __restrict__ qkv,   // (B, T, 3C)
                              const float* __restrict__ lse,  // (B, NH, T)
                              const float* __restrict__ dot,  // (B, NH, T)
                              int T, int C, int NH, float scale, float scale_log2) {
  __shared__ alignas(16) bf16 q_rows[kBlock * kStride];
  __shared__ alignas(16) bf16 q_cols[kD * kStride];
  __shared__ alignas(16) bf16 do_rows[kBlock * kStride];
  __shared__ alignas(16) bf16 do_cols[kD * kStride];
  __shared__ float tile_lse[kBlock], tile_dot[kBlock];
  const int kb = blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const long long stride = 3LL * C;
  const bf16* q = qkv + static_cast<long long>(b) * T * stride + h * kD;
  const bf16* k = q + C;
  const bf16* v = q + 2 * C;
  const bf16* dy = dout + static_cast<long long>(b) * T * C + h * kD;
  const int k0 = kb * kBlock + warp * 16;
  const int num_blocks = (T + kBlock - 1) / kBlock;

  uint32_t kf[4][4], vf[4][4];
  load_a_fragments(kf, k, stride, k0, T, lane);
  load_a_fragments(vf, v, stride, k0, T, lane);
  float dk[8][4], dv[8][4];
  zero(dk);
  zero(dv);

  for (int qb = kb; qb < num_blocks; ++qb) {
    __syncthreads();
    load_tile(q_rows, q_cols, q, stride, qb * kBlock, T);
    load_tile(do_rows, do_cols, dy, C, qb * kBlock, T);
    for (int i = threadIdx.x; i < kBlock; i += kThreads) {
      const int row = qb * kBlock + i;
      // Rows past T: P = exp2(-inf) = 0, so they contribute nothing.
      tile_lse[i] = row < T ? lse[static_cast<long long>(bh) * T + row] : INFINITY;
      tile_dot[i] = row < T ? dot[static_cast<long long>(bh) * T + row] : 0.0f;
    }
    __syncthreads();

    // P^T (keys x queries) = exp2(scale_log2 K Q^T - L[query]), zero where query < key.
    float p[8][4];
    zero(p);
    mma_a_regs(p, kf, q_rows, lane);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + g + (e >= 2 ? 8 : 0);
        const int col = nt * 8 + 2 * t + (e & 1);
        const int query = qb * kBlock + col;
        p[nt][e] = query >= key ? exp2f(p[nt][e] * scale_log2 - tile_lse[col]) : 0.0f;
      }
    }
    uint32_t pf[4][4];
    accumulator_to_a(pf, p);
    mma_a_regs(dv, pf, do_cols, lane);  // dV += P^T dY  (do_cols: dims x queries)

    float ds[8][4];
    zero(ds);
    mma_a_regs(ds, vf, do_rows, lane);  // dP^T = V dY^T  (do_rows: queries x dims)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = nt * 8 + 2 * t + (e & 1);
        ds[nt][e] = p[nt][e] * (ds[nt][e] - tile_dot[col]);
      }
    }
    uint32_t dsf[4][4];
    accumulator_to_a(dsf, ds);
    mma_a_regs(dk, dsf, q_cols, lane);  // dK += dS^T Q  (q_cols: dims x queries)
  }
  bf16* dk_out = dqkv + static_cast<long long>(b) * T * stride + C + h * kD;
  store_accumulator(dk_out, stride, k0, T, dk, scale, lane);
  store_accumulator(dk_out + C, stride, k0, T, dv, 1.0f, lane);
}

// dQ for one block of 64 queries: grid (ceil(T / 64), B * NH). Warps own 16 queries each.
__global__ void __launch_bounds__(kThreads)
    flash_backward_dq_kernel(bf16* __restrict__ dqkv,        // (B, T, 3C): q part
                             const bf16* __restrict__ dout,  // (B, T, C)
                             const bf16* __restrict__ qkv,   // (B, T, 3C)
                             const float* __restrict__ lse,  // (B, NH, T)
                             const float* __restrict__ dot,  // (B, NH, T)
                             int T, int C, int NH, float scale, float scale_log2) {
  __shared__ alignas(16) bf16 k_rows[kBlock * kStride];
  __shared__ alignas(16) bf16 k_cols[kD * kStride];
  __shared__ alignas(16) bf16 v_rows[kBlock * kStride];
  const int qb = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const long long stride = 3LL * C;
  const bf16* q = qkv + static_cast<long long>(b) * T * stride + h * kD;
  const bf16* k = q + C;
  const bf16* v = q + 2 * C;
  const bf16* dy = dout + static_cast<long long>(b) * T * C + h * kD;
  const int q0 = qb * kBlock + warp * 16;

  uint32_t qf[4][4], dyf[4][4];
  load_a_fragments(qf, q, stride, q0, T, lane);
  load_a_fragments(dyf, dy, C, q0, T, lane);
  float row_lse[2], row_dot[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = q0 + g + 8 * r;
    row_lse[r] = row < T ? lse[static_cast<long long>(bh) * T + row] : INFINITY;
    row_dot[r] = row < T ? dot[static_cast<long long>(bh) * T + row] : 0.0f;
  }
  float dq[8][4];
  zero(dq);

  for (int kb = 0; kb <= qb; ++kb) {
    __syncthreads();
    load_tile(k_rows, k_cols, k, stride, kb * kBlock, T);
    load_tile(v_rows, nullptr, v, stride, kb * kBlock, T);
    __syncthreads();

    float p[8][4];
    zero(p);
    mma_a_regs(p, qf, k_rows, lane);  // S = Q K^T
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = q0 + g + (e >= 2 ? 8 : 0);
        const int key = kb * kBlock + nt * 8 + 2 * t + (e & 1);
        p[nt][e] = key <= row ? exp2f(p[nt][e] * scale_log2 - row_lse[e >> 1]) : 0.0f;
      }
    }
    float ds[8][4];
    zero(ds);
    mma_a_regs(ds, dyf, v_rows, lane);  // dP = dY V^T  (v_rows: keys x dims)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) ds[nt][e] = p[nt][e] * (ds[nt][e] - row_dot[e >> 1]);
    }
    uint32_t dsf[4][4];
    accumulator_to_a(dsf, ds);
    mma_a_regs(dq, dsf, k_cols, lane);  // dQ += dS K  (k_cols: dims x keys)
  }
  store_accumulator(dqkv + static_cast<long long>(b) * T * stride + h * kD, stride, q0, T, dq,
                    scale, lane);
}

}  // namespace

bool flash_attention_supported(int C, int NH) { return NH > 0 && C % NH == 0 && C / NH == kD; }

namespace {

// The launch shapes' limits, checked before any launch: head size 64, and B * NH blocks along
// grid.y, which CUDA caps at 65535 (B <= 5461 for GPT-2's 12 heads).
void check_shape(int B, int T, int C, int NH, const char* what) {
  if (!flash_attention_supported(C, NH) || B < 1 || T < 1 ||
      static_cast<long long>(B) * NH > kMaxGridY) {
    throw InvalidArgument(
        std::string(what) + ": unsupported shape B=" + std::to_string(B) +
        " T=" + std::to_string(T) + " C=" + std::to_string(C) + " NH=" + std::to_string(NH) +
        " (needs head size C / NH = 64, B, T >= 1 and B * NH <= " + std::to_string(kMaxGridY) +
        "); use the cuBLASLt attention path");
  }
}

}  // namespace

void flash_attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH,
                             cudaStream_t stream) {
  check_shape(B, T, C, NH, "flash_attention_forward");
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(kD));
  const dim3 grid(detail::ceil_div(T, kBlock), B * NH);
  flash_forward_kernel<<<grid, kThreads, 0, stream>>>(out, lse, qkv, T, C, NH, scale_log2);
  LH_CUDA_CHECK_LAUNCH();
}

void flash_attention_backward(bf16* dqkv, float* scratch_dot, const bf16* dout, const bf16* out,
                              const bf16* qkv, const float* lse, int B, int T, int C, int NH,
                              cudaStream_t stream) {
  check_shape(B, T, C, NH, "flash_attention_backward");
  const float scale = 1.0f / std::sqrt(static_cast<float>(kD));
  const float scale_log2 = kLog2e * scale;
  const long long rows = static_cast<long long>(B) * T * NH;
  flash_backward_dot_kernel<<<detail::ceil_div(rows, 256), 256, 0, stream>>>(scratch_dot, dout, out,
                                                                             B, T, C, NH);
  LH_CUDA_CHECK_LAUNCH();
  const dim3 grid(detail::ceil_div(T, kBlock), B * NH);
  flash_backward_dkv_kernel<<<grid, kThreads, 0, stream>>>(dqkv, dout, qkv, lse, scratch_dot, T, C,
                                                           NH, scale, scale_log2);
  LH_CUDA_CHECK_LAUNCH();
  flash_backward_dq_kernel<<<grid, kThreads, 0, stream>>>(dqkv, dout, qkv, lse, scratch_dot, T, C,
                                                          NH, scale, scale_log2);
  LH_CUDA_CHECK_LAUNCH();
}

}  // namespace longhaul::kernels::cuda
