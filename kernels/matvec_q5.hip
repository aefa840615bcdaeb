// Q5_0 and Q5_1 matrix-vector products for decode on the raw ggml blocks (Gemma 3 Q4_K_M
// stores the matrices whose rows are not a multiple of 256 as Q5_0).
//
//   y[b][n] = sum_k W[n][k] * x[b][k]
//
// W: [N] rows of K/32 blocks, x: f32 [B][K], y: f32 [B][N]. Same split as matvec.hip: one
// wave per output row, 4 waves per workgroup, 8 lanes per block; grid: (ceil(N/4), B).
//   block_q5_0 { f16 d;        u8 qh[4]; u8 qs[16]; }  (22 bytes)  w = d * (q - 16)
//   block_q5_1 { f16 d, m;     u8 qh[4]; u8 qs[16]; }  (24 bytes)  w = d * q + m
// with q = (qs[j] & 0xF) | bit j of qh << 4 for value j < 16, and (qs[j] >> 4) | bit j + 16
// of qh << 4 for value j + 16. Blocks are only 2-byte aligned: read 16-bit halves.
#include "civetta_gpu.h"

namespace {

constexpr int kRowsPerGroup = 4;

CV_DEVICE int wave_row(int N) {
  const int row = (int)(cv_bid_x() * kRowsPerGroup + cv_tid_x() / CV_WAVE);
  return row < N ? row : -1;
}

// One row of Q5 blocks against one activation row. HEAD is the byte size of the scale
// fields (2 for Q5_0's d, 4 for Q5_1's d and m); ASYM adds m * sum(x) per block.
template <int HEAD, bool ASYM>
CV_DEVICE void matvec_q5(const cv_u8* W, const float* x, float* y, int N, int K) {
  constexpr int kBlockBytes = HEAD + 20;
  const int row = wave_row(N);
  if (row < 0) return;
  const int blocks = K / 32;
  const cv_u8* w = W + (long)row * blocks * kBlockBytes;
  const float* xb = x + (long)cv_bid_y() * K;
  // Lane `sub` of a block owns qs bytes 2*sub, 2*sub+1: values 2sub, 2sub+1 (low nibbles)
  // and 2sub+16, 2sub+17 (high nibbles).
  const int lane = (int)cv_lane(), sub = lane & 7;
  float sum = 0.0f;
  for (int b = lane >> 3; b < blocks; b += 4) {
    const cv_u8* blk = w + (long)b * kBlockBytes;
    const cv_u32 qh = (cv_u32)*(const cv_u16*)(blk + HEAD) | ((cv_u32)*(const cv_u16*)(blk + HEAD + 2) << 16);
    const cv_u16 qs = *(const cv_u16*)(blk + HEAD + 4 + 2 * sub);
    const int j = 2 * sub;
    const int q0 = (int)((qs & 0xF) | (((qh >> j) & 1) << 4));
    const int q1 = (int)(((qs >> 8) & 0xF) | (((qh >> (j + 1)) & 1) << 4));
    const int q2 = (int)(((qs >> 4) & 0xF) | (((qh >> (j + 16)) & 1) << 4));
    const int q3 = (int)((qs >> 12) | (((qh >> (j + 17)) & 1) << 4));
    const float* xv = xb + b * 32;
    const float d = (float)*(const cv_half*)blk;
    if (ASYM) {
      const float m = (float)*(const cv_half*)(blk + 2);
      const float dot = (float)q0 * xv[j] + (float)q1 * xv[j + 1] + (float)q2 * xv[j + 16] + (float)q3 * xv[j + 17];
      const float xs = xv[j] + xv[j + 1] + xv[j + 16] + xv[j + 17];
      sum += d * dot + m * xs;
    } else {
      const float dot = (float)(q0 - 16) * xv[j] + (float)(q1 - 16) * xv[j + 1] + (float)(q2 - 16) * xv[j + 16] +
                        (float)(q3 - 16) * xv[j + 17];
      sum += d * dot;
    }
  }
  sum = cv_wave_sum(sum);
  if (lane == 0) y[(long)cv_bid_y() * N + row] = sum;
}

} // namespace

CV_KERNEL CV_LAUNCH_BOUNDS(128) void civetta_matvec_q5_0(const cv_u8* W, const float* x, float* y, int N, int K) {
  matvec_q5<2, false>(W, x, y, N, K);
}

CV_KERNEL CV_LAUNCH_BOUNDS(128) void civetta_matvec_q5_1(const cv_u8* W, const float* x, float* y, int N, int K) {
  matvec_q5<4, true>(W, x, y, N, K);
}
