// W8A8 blocked GEMM on the 16x16x16 matrix step (gfx11 WMMA iu8; mma.sync on NVIDIA; portable fallback elsewhere).
//
//   C[m][n] = sum over K blocks b of 32:  sa[m][b] * sw[n][b] * sum_{k in b} A[m][k] * W[n][k]
//
// A  : int8 [M][K] activations, sa: f32 [M][K/32] scales (civetta_quantize_act_q8 output)
// W  : int8 [N][K] weights,     sw: f16 [N][K/32] scales (Q8_0 blocks repacked into two planes)
// C  : f32 [M][N]
// K must be a multiple of 32 and A, W 16-byte aligned; M and N are arbitrary.
// Grid: (ceil(N/BN), ceil(M/BM)); block: (BM/WM)*(BN/WN)*32 threads.
#include "civetta_gpu.h"
#include "gemm_stage.h"

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


// The launched tiles: the same contract and, element for element, the same float arithmetic
// (acc += float(dot of one 32-wide block) * (sa * sw), blocks in K order), so the output is
// bit-identical to gemm_w8a8 above. What changes is how the tiles reach the matrix steps:
// - K stages of BK = 4 scale blocks per barrier pair (gemm_w8a8 stages one block of 32);
// - the next stage's global loads are issued into registers before this stage's matrix steps
//   and written to shared memory after them, so their latency hides behind the arithmetic;
// - each 32-wide block is one cv_mma_i8_k32 (one m16n8k32 per column half on NVIDIA).
// The loop over a stage's blocks is not unrolled: unrolled, the compilers hoist the later
// blocks' fragment reads and the live fragments grow with BK (gemm_w8a8_pipe's spills).
template <int ROWS, int BK, int THREADS>
struct Stage {
  static constexpr int kScales = BK / kBlockK; // scale blocks per row and stage
  static constexpr int kScaleRegs = ROWS * kScales / THREADS;
  static_assert(ROWS * kScales % THREADS == 0, "stage splits evenly over the threads");
  StageRows<cv_i8, ROWS, BK, THREADS> data;
  float s[kScaleRegs];

  // Loads rows [row0, row0+ROWS) x [k0, k0+BK) (zero past `rows` or K) and their scales.
  template <typename Scale>
  __device__ __attribute__((always_inline)) void fetch(const cv_i8* src, const Scale* src_scales, int row0, int rows, int K, int k0) {
    data.fetch(src, row0, rows, K, k0);
    const int tid = (int)cv_tid_x();
    CV_UNROLL for (int i = 0; i < kScaleRegs; ++i) {
      const int c = tid + i * THREADS, r = c / kScales, kb = k0 / kBlockK + c % kScales;
      s[i] = row0 + r < rows && kb < K / kBlockK ? (float)src_scales[(long)(row0 + r) * (K / kBlockK) + kb] : 0.0f;
    }
  }
  __device__ __attribute__((always_inline)) void store(cv_i8* tile, float* scales, int stride) const {
    data.store(tile, stride);
    const int tid = (int)cv_tid_x();
    CV_UNROLL for (int i = 0; i < kScaleRegs; ++i) scales[tid + i * THREADS] = s[i]; // [row][block]
  }
};

template <int BM, int BN, int WM, int WN, int BK>
CV_DEVICE void gemm_w8a8_staged(const cv_i8* A, const float* sa, const cv_i8* W, const cv_half* sw,
                                float* C, int M, int N, int K) {
  constexpr int kStride = BK + 16; // padded LDS row (bytes): 16-byte aligned, fragment reads conflict-free
  constexpr int kScales = BK / kBlockK;
  constexpr int kWavesN = BN / WN;
  constexpr int kThreads = (BM / WM) * kWavesN * CV_WAVE;
  constexpr int TM = WM / 16, TN = WN / 16;
  __shared__ __attribute__((aligned(16))) cv_i8 a_tile[BM * kStride];
  __shared__ __attribute__((aligned(16))) cv_i8 w_tile[BN * kStride];
  __shared__ float a_scale[BM * kScales];
  __shared__ float w_scale[BN * kScales];

  const int m0 = (int)cv_bid_y() * BM, n0 = (int)cv_bid_x() * BN;
  const int wave = (int)cv_tid_x() / CV_WAVE;
  const int wm = (wave / kWavesN) * WM, wn = (wave % kWavesN) * WN;
  const int blocks = K / kBlockK;

  cv_v8f acc[TM][TN];
  CV_UNROLL for (int i = 0; i < TM; ++i)
    CV_UNROLL for (int j = 0; j < TN; ++j) acc[i][j] = (cv_v8f){0, 0, 0, 0, 0, 0, 0, 0};

  Stage<BM, BK, kThreads> a_next;
  Stage<BN, BK, kThreads> w_next;
  a_next.fetch(A, sa, m0, M, K, 0);
  w_next.fetch(W, sw, n0, N, K, 0);
  for (int k0 = 0; k0 < K; k0 += BK) {
    a_next.store(a_tile, a_scale, kStride);
    w_next.store(w_tile, w_scale, kStride);
    cv_sync();
    if (k0 + BK < K) { // in flight while the matrix steps below run
      a_next.fetch(A, sa, m0, M, K, k0 + BK);
      w_next.fetch(W, sw, n0, N, K, k0 + BK);
    }
    const int stage_blocks = blocks - k0 / kBlockK < kScales ? blocks - k0 / kBlockK : kScales;
#pragma unroll 1
    for (int b = 0; b < stage_blocks; ++b) {
      CV_UNROLL for (int i = 0; i < TM; ++i) {
        const cv_i8* a_sub = a_tile + (wm + i * 16) * kStride + b * kBlockK;
        const cv_frag_i8 a_lo = cv_load_frag_i8(a_sub, kStride);
        const cv_frag_i8 a_hi = cv_load_frag_i8(a_sub + 16, kStride);
        CV_UNROLL for (int j = 0; j < TN; ++j) {
          const cv_i8* w_sub = w_tile + (wn + j * 16) * kStride + b * kBlockK;
          const cv_v8i dot = cv_mma_i8_k32(a_lo, a_hi, cv_load_frag_i8(w_sub, kStride), cv_load_frag_i8(w_sub + 16, kStride),
                                           (cv_v8i){0, 0, 0, 0, 0, 0, 0, 0});
          CV_UNROLL for (int e = 0; e < 8; ++e)
            acc[i][j][e] += (float)dot[e] * (a_scale[(wm + i * 16 + cv_acc_row(e)) * kScales + b] *
                                             w_scale[(wn + j * 16 + cv_acc_col(e)) * kScales + b]);
        }
      }
    }
    cv_sync();
#if CIVETTA_SCHED_BARRIER
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

#define CIVETTA_GEMM_W8A8_KERNEL(NAME, BODY, THREADS)                                                 \
  CV_KERNEL CV_LAUNCH_BOUNDS(THREADS) void civetta_gemm_w8a8_##NAME(const cv_i8* A, const float* sa, const cv_i8* W,  \
                                                                    const cv_half* sw, float* C, int M, int N, int K) { \
    BODY(A, sa, W, sw, C, M, N, K);                                                                   \
  }
#define CIVETTA_GEMM_W8A8(NAME, BM, BN, WM, WN) \
  CIVETTA_GEMM_W8A8_KERNEL(NAME, (gemm_w8a8_staged<BM, BN, WM, WN, 128>), (BM / WM) * (BN / WN) * CV_WAVE)

CIVETTA_GEMM_W8A8(64x64, 64, 64, 32, 32)       // 4 waves, 2x2 steps each
CIVETTA_GEMM_W8A8(128x64, 128, 64, 32, 32)     // 8 waves, 2x2 steps each
CIVETTA_GEMM_W8A8(64x128, 64, 128, 32, 32)     // 8 waves, 2x2 steps each
CIVETTA_GEMM_W8A8(128x128, 128, 128, 64, 32)   // 8 waves, 4x2 steps each
// Register-tight: 4 waves with 4x4 steps each (128 accumulator VGPRs per lane), one block of 32
// per stage and no register staging: the instantiation where compiler differences in register
// allocation show first (docs/KERNELS.md). Not launched by the GPU backend.
CIVETTA_GEMM_W8A8_KERNEL(128x128_w4, (gemm_w8a8<128, 128, 64, 64>), 128)
