// W8A8 blocked GEMM with a software-pipelined K loop: while the matrix steps of one 32-wide
// scale block run, the fragments of the next scale block are already being read from LDS into
// registers. Same contract and result as gemm_w8a8.hip (whose 128x128 tile stays the GPU
// backend's default; this file exists to measure what the compilers do with the pattern):
//
//   C[m][n] = sum over K blocks b of 32:  sa[m][b] * sw[n][b] * sum_{k in b} A[m][k] * W[n][k]
//
// A  : int8 [M][K] activations, sa: f32 [M][K/32] scales
// W  : int8 [N][K] weights,     sw: f16 [N][K/32] scales
// C  : f32 [M][N]
// K must be a multiple of BK and A, W 16-byte aligned; M and N are arbitrary.
// Grid: (ceil(N/BN), ceil(M/BM)); block: (BM/WM)*(BN/WN)*32 threads.
//
// Registers: each wave holds TM*TN*8 accumulators plus the fragments of two scale blocks
// (current and prefetched, 2*(TM+TN)*2 fragments of 4 VGPRs). The K tile loop body is fully
// unrolled over BK/32 scale blocks with no barrier inside, so the machine scheduler sees all
// of them in one region; if it hoists later blocks' LDS reads above earlier blocks' matrix
// steps, live fragments grow up to BK/32 blocks' worth. With CIVETTA_SCHED_BARRIER=1 each
// scale block ends with a sched_barrier, which bounds that to the two blocks the source names.
#include "civetta_gpu.h"

#ifndef CIVETTA_SCHED_BARRIER
#define CIVETTA_SCHED_BARRIER 0
#endif

namespace {

constexpr int kScaleBlock = 32; // K values per scale

// The fragments one wave needs for one scale block: TM row tiles of A, TN of W, two K halves.
template <int TM, int TN>
struct Frags {
  cv_frag_i8 a[TM][2];
  cv_frag_i8 w[TN][2];
};

template <int TM, int TN, int STRIDE>
CV_DEVICE Frags<TM, TN> load_frags(const cv_i8* a_tile, const cv_i8* w_tile, int wm, int wn, int sb) {
  Frags<TM, TN> f;
  CV_UNROLL for (int i = 0; i < TM; ++i)
    CV_UNROLL for (int h = 0; h < 2; ++h)
      f.a[i][h] = cv_load_frag_i8(a_tile + (wm + i * 16) * STRIDE + sb * kScaleBlock + h * 16, STRIDE);
  CV_UNROLL for (int j = 0; j < TN; ++j)
    CV_UNROLL for (int h = 0; h < 2; ++h)
      f.w[j][h] = cv_load_frag_i8(w_tile + (wn + j * 16) * STRIDE + sb * kScaleBlock + h * 16, STRIDE);
  return f;
}

// Copies rows [row0, row0+ROWS) x [k0, k0+BK) of an int8 [rows][K] matrix into shared memory
// (zero rows past `rows`) and the BK/32 scales of each row.
template <int ROWS, int BK, int STRIDE, int THREADS, typename Scale>
CV_DEVICE void load_tile(cv_i8* tile, float* scales, const cv_i8* src, const Scale* src_scales, int row0,
                         int rows, int K, int k0) {
  constexpr int kChunks = BK / 16, kScales = BK / kScaleBlock;
  const int tid = (int)cv_tid_x();
  for (int c = tid; c < ROWS * kChunks; c += THREADS) {
    const int r = c / kChunks, part = c % kChunks;
    cv_v4i v = {0, 0, 0, 0};
    if (row0 + r < rows) v = *(const cv_v4i*)(src + (long)(row0 + r) * K + k0 + part * 16);
    *(cv_v4i*)(tile + r * STRIDE + part * 16) = v;
  }
  for (int c = tid; c < ROWS * kScales; c += THREADS) {
    const int r = c / kScales, s = c % kScales;
    scales[c] = row0 + r < rows ? (float)src_scales[(long)(row0 + r) * (K / kScaleBlock) + k0 / kScaleBlock + s] : 0.0f;
  }
}

template <int BM, int BN, int WM, int WN, int BK>
CV_DEVICE void gemm_w8a8_pipe(const cv_i8* A, const float* sa, const cv_i8* W, const cv_half* sw, float* C,
                              int M, int N, int K) {
  static_assert(BK % kScaleBlock == 0, "BK is a whole number of scale blocks");
  constexpr int kStride = BK + 16; // padded LDS row (bytes), keeps 16-byte alignment
  constexpr int kBlocks = BK / kScaleBlock;
  constexpr int kWavesN = BN / WN;
  constexpr int kThreads = (BM / WM) * kWavesN * CV_WAVE;
  constexpr int TM = WM / 16, TN = WN / 16;
  __shared__ __attribute__((aligned(16))) cv_i8 a_tile[BM * kStride];
  __shared__ __attribute__((aligned(16))) cv_i8 w_tile[BN * kStride];
  __shared__ float a_scale[BM * kBlocks];
  __shared__ float w_scale[BN * kBlocks];

  const int m0 = (int)cv_bid_y() * BM, n0 = (int)cv_bid_x() * BN;
  const int wave = (int)cv_tid_x() / CV_WAVE;
  const int wm = (wave / kWavesN) * WM, wn = (wave % kWavesN) * WN;

  cv_v8f acc[TM][TN];
  CV_UNROLL for (int i = 0; i < TM; ++i)
    CV_UNROLL for (int j = 0; j < TN; ++j) acc[i][j] = (cv_v8f){0, 0, 0, 0, 0, 0, 0, 0};

  for (int k0 = 0; k0 < K; k0 += BK) {
    load_tile<BM, BK, kStride, kThreads>(a_tile, a_scale, A, sa, m0, M, K, k0);
    load_tile<BN, BK, kStride, kThreads>(w_tile, w_scale, W, sw, n0, N, K, k0);
    cv_sync();
    Frags<TM, TN> cur = load_frags<TM, TN, kStride>(a_tile, w_tile, wm, wn, 0);
    CV_UNROLL for (int sb = 0; sb < kBlocks; ++sb) {
      // Prefetch: the next scale block's fragments are requested before this block's
      // matrix steps, so their LDS latency hides behind them.
      Frags<TM, TN> next = cur;
      if (sb + 1 < kBlocks) next = load_frags<TM, TN, kStride>(a_tile, w_tile, wm, wn, sb + 1);
      CV_UNROLL for (int i = 0; i < TM; ++i)
        CV_UNROLL for (int j = 0; j < TN; ++j) {
          cv_v8i dot = {0, 0, 0, 0, 0, 0, 0, 0};
          dot = cv_mma_i8(cur.a[i][0], cur.w[j][0], dot);
          dot = cv_mma_i8(cur.a[i][1], cur.w[j][1], dot);
          CV_UNROLL for (int e = 0; e < 8; ++e)
            acc[i][j][e] += (float)dot[e] * (a_scale[(wm + i * 16 + cv_acc_row(e)) * kBlocks + sb] *
                                             w_scale[(wn + j * 16 + cv_acc_col(e)) * kBlocks + sb]);
        }
      cur = next;
#if CIVETTA_SCHED_BARRIER
      // One scheduling region per scale block: the reads of block sb+2 and later cannot be
      // hoisted above block sb's matrix steps, so at most two blocks of fragments are live.
      CV_SCHED_BARRIER();
#endif
    }
    cv_sync();
  }

  CV_UNROLL for (int i = 0; i < TM; ++i)
    CV_UNROLL for (int j = 0; j < TN; ++j)
      CV_UNROLL for (int e = 0; e < 8; ++e) {
        const int m = m0 + wm + i * 16 + cv_acc_row(e), n = n0 + wn + j * 16 + cv_acc_col(e);
        if (m < M && n < N) C[(long)m * N + n] = acc[i][j][e];
      }
}

} // namespace

#define CIVETTA_GEMM_W8A8_PIPE(NAME, BM, BN, WM, WN, BK)                                                \
  CV_KERNEL CV_LAUNCH_BOUNDS((BM / WM) * (BN / WN) * CV_WAVE) void civetta_gemm_w8a8_pipe_##NAME(          \
      const cv_i8* A, const float* sa, const cv_i8* W, const cv_half* sw, float* C, int M, int N,        \
      int K) {                                                                                           \
    gemm_w8a8_pipe<BM, BN, WM, WN, BK>(A, sa, W, sw, C, M, N, K);                                        \
  }

// 8 waves with 4x2 steps each (64 accumulator VGPRs per lane, 48 per scale block of fragments).
// Measured (docs/KERNELS.md): BK=64 fits in 256 VGPRs with clang-22 and LLVM 23; BK=128 spills
// with all three compilers, and its sched_barrier build is clean with clang-22 only. (BK=192
// behaved like BK=128; 4 waves of 4x4 steps spilled with every compiler and variant.)
CIVETTA_GEMM_W8A8_PIPE(128x128_bk64, 128, 128, 64, 32, 64)
CIVETTA_GEMM_W8A8_PIPE(128x128_bk128, 128, 128, 64, 32, 128)
