#include "longhaul/kernels/cpu/encoder.h"

#include <algorithm>
#include <cstddef>

#include "parallel.h"

namespace longhaul::kernels::cpu {

void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                     int T, int C) {
  const bool parallel = static_cast<size_t>(B) * T * C >= kParallelMinWork;
  parallel_for(B * T, parallel, [&](int64_t begin, int64_t end) {
    for (int bt = static_cast<int>(begin); bt < end; ++bt) {
      const int t = bt % T;
      const float* tok = wte + static_cast<size_t>(tokens[bt]) * C;
      const float* pos = wpe + static_cast<size_t>(t) * C;
      float* o = out + static_cast<size_t>(bt) * C;
      for (int c = 0; c < C; ++c) o[c] = tok[c] + pos[c];
    }
  });
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                      int T, int C) {
  // Channel blocks are owned by one thread each: no two threads touch the same dwte/dwpe entry,
  // and each entry is summed in (b, t) order.
  constexpr int kBlock = 16;
  const int blocks = (C + kBlock - 1) / kBlock;
  const bool parallel = static_cast<size_t>(B) * T * C >= kParallelMinWork;
  parallel_for(blocks, parallel, [&](int64_t begin, int64_t end) {
    for (int blk = static_cast<int>(begin); blk < end; ++blk) {
      const int c0 = blk * kBlock, c1 = std::min(C, c0 + kBlock);
      for (int b = 0; b < B; ++b) {
        for (int t = 0; t < T; ++t) {
          const size_t bt = static_cast<size_t>(b) * T + t;
          const float* d = dout + bt * C;
          float* wt = dwte + static_cast<size_t>(tokens[bt]) * C;
          float* wp = dwpe + static_cast<size_t>(t) * C;
          for (int c = c0; c < c1; ++c) {
            wt[c] += d[c];
            wp[c] += d[c];
          }
        }
      }
    }
  });
}

}  // namespace longhaul::kernels::cpu
