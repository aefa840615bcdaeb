// W8A8 blocked GEMM on the 16x16x16 matrix step (gfx11 WMMA iu8; portable fallback elsewhere).
//
//   C[m][n] = sum over K blocks b of 32:  sa[m][b] * sw[n][b] * sum_{k in b} A[m][k] * W[n][k]
//
// A  : int8 [M][K] activations, sa: f32 [M][K/32] scales (civetta_quantize_act_q8 output)
// W  : int8 [N][K] weights,     sw: f16 [N][K/32] scales (Q8_0 blocks repacked into two planes)
// C  : f32 [M][N]
// K must be a multiple of 32 and A, W 16-byte aligned; M and N are arbitrary.
// Grid: (ceil(N/BN), ceil(M/BM)); block: (BM/WM)*(BN/WN)*32 threads.
#include "civetta_gpu.h"

#ifndef CIVETTA_SCHED_BARRIER
#define CIVETTA_SCHED_BARRIER 0
#endif

namespace {

constexpr int kBlockK = 32;            // one scale block per K step
constexpr int kTileStride = kBlockK + 16; // padded LDS row stride (bytes), keeps 16-byte alignment

// Copies rows [row0, row0+ROWS) x [k0, k0+32) of an int8 [rows][K] matrix into shared
// memory, zero-filling rows past `rows`, plus the matching per-block scales.
template <int ROWS, int THREADS, typename Scale>
CV_DEVICE void load_block(cv_i8* tile, float* scales, const cv_i8* src, const Scale* src_scales,
                          int row0, int rows, int K, int kb) {
  const int tid = (int)cv_tid_x();
  for (int c = tid; c < ROWS * 2; c += THREADS) {
    const int r = c >> 1, half = c & 1;
    cv_v4i v = {0, 0, 0, 0};
    if (row0 + r < rows) v = *(const cv_v4i*)(src + (long)(row0 + r) * K + kb * kBlockK + half * 16);
    *(cv_v4i*)(tile + r * kTileStride + half * 16) = v;
  }
  for (int r = tid; r < ROWS; r += THREADS)
    scales[r] = row0 + r < rows ? (float)src_scales[(long)(row0 + r) * (K / kBlockK) + kb] : 0.0f;
}

// BM x BN output tile per workgroup; each wave owns a WM x WN sub-tile of 16x16 steps.
template <int BM, int BN, int WM, int WN>
CV_DEVICE void gemm_w8a8(const cv_i8* A, const float* sa, const cv_i8* W, const cv_half* sw,
                         float* C, int M, int N, int K) {
  constexpr int kWavesN = BN / WN;
  constexpr int kThreads = (BM / WM) * kWavesN * CV_WAVE;
  constexpr int TM = WM / 16, TN = WN / 16;
  __shared__ __attribute__((aligned(16))) cv_i8 a_tile[BM * kTileStride];
  __shared__ __attribute__((aligned(16))) cv_i8 w_tile[BN * kTileStride];
  __shared__ float a_scale[BM];
  __shared__ float w_scale[BN];

  const int m0 = (int)cv_bid_y() * BM, n0 = (int)cv_bid_x() * BN;
  const int wave = (int)cv_tid_x() / CV_WAVE;
  const int wm = (wave / kWavesN) * WM, wn = (wave % kWavesN) * WN;

  cv_v8f acc[TM][TN];
  CV_UNROLL for (int i = 0; i < TM; ++i)
    CV_UNROLL for (int j = 0; j < TN; ++j) acc[i][j] = (cv_v8f){0, 0, 0, 0, 0, 0, 0, 0};

  for (int kb = 0; kb < K / kBlockK; ++kb) {
    load_block<BM, kThreads>(a_tile, a_scale, A, sa, m0, M, K, kb);
    load_block<BN, kThreads>(w_tile, w_scale, W, sw, n0, N, K, kb);
    cv_sync();
    CV_UNROLL for (int i = 0; i < TM; ++i) {
      const cv_i8* a_sub = a_tile + (wm + i * 16) * kTileStride;
      const cv_frag_i8 a_lo = cv_load_frag_i8(a_sub, kTileStride);
      const cv_frag_i8 a_hi = cv_load_frag_i8(a_sub + 16, kTileStride);
      CV_UNROLL for (int j = 0; j < TN; ++j) {
        const cv_i8* w_sub = w_tile + (wn + j * 16) * kTileStride;
        cv_v8i dot = {0, 0, 0, 0, 0, 0, 0, 0};
        dot = cv_mma_i8(a_lo, cv_load_frag_i8(w_sub, kTileStride), dot);
        dot = cv_mma_i8(a_hi, cv_load_frag_i8(w_sub + 16, kTileStride), dot);
        CV_UNROLL for (int e = 0; e < 8; ++e)
          acc[i][j][e] += (float)dot[e] * (a_scale[wm + i * 16 + cv_acc_row(e)] * w_scale[wn + j * 16 + cv_acc_col(e)]);
      }
    }
    cv_sync();
#if CIVETTA_SCHED_BARRIER
    // One scheduling region per K block: keeps the next block's loads from being
    // hoisted over this block's matrix steps, which bounds live registers.
    CV_SCHED_BARRIER();
#endif
  }

  CV_UNROLL for (int i = 0; i < TM; ++i)
    CV_UNROLL for (int j = 0; j < TN; ++j)
      CV_UNROLL for (int e = 0; e < 8; ++e) {
        const int m = m0 + wm + i * 16 + cv_acc_row(e), n = n0 + wn + j * 16 + cv_acc_col(e);
        if (m < M && n < N) C[(long)m * N + n] = acc[i][j][e];
      }
}

} // namespace

#define CIVETTA_GEMM_W8A8(NAME, BM, BN, WM, WN)                                                  \
  CV_KERNEL CV_LAUNCH_BOUNDS((BM / WM) * (BN / WN) * CV_WAVE) void civetta_gemm_w8a8_##NAME(          \
      const cv_i8* A, const float* sa, const cv_i8* W, const cv_half* sw, float* C, int M, int N,  \
      int K) {                                                                                     \
    gemm_w8a8<BM, BN, WM, WN>(A, sa, W, sw, C, M, N, K);                                           \
  }

CIVETTA_GEMM_W8A8(64x64, 64, 64, 32, 32)       // 4 waves, 2x2 steps each
CIVETTA_GEMM_W8A8(128x64, 128, 64, 32, 32)     // 8 waves, 2x2 steps each
CIVETTA_GEMM_W8A8(64x128, 64, 128, 32, 32)     // 8 waves, 2x2 steps each
CIVETTA_GEMM_W8A8(128x128, 128, 128, 64, 32)   // 8 waves, 4x2 steps each
// Register-tight: 4 waves with 4x4 steps each (128 accumulator VGPRs per lane); the
// instantiation where compiler differences in register allocation show first.
CIVETTA_GEMM_W8A8(128x128_w4, 128, 128, 64, 64)
