// f16 GEMM on the 16x16x16 matrix step (gfx11 WMMA f16 -> f32; mma.sync on NVIDIA; portable fallback elsewhere).
// gemm_f16 is the reference form (one 32-wide K block per stage); the kernels launch gemm_f16_staged.
//
//   C[m][n] = sum_k A[m][k] * B[n][k]        ("NT": B holds weights as [N][K])
//
// A: f16 [M][K], B: f16 [N][K], C: f32 [M][N]. K must be a multiple of 32 and A, B
// 16-byte aligned; M and N are arbitrary.
// Grid: (ceil(N/BN), ceil(M/BM)); block: (BM/WM)*(BN/WN)*32 threads.
//
// civetta_gemm_q4k_*: B as the raw Q4_K blocks (N rows of K/256 blocks of 144 bytes; K a multiple
// of 256), dequantised to f16 while a K stage moves into shared memory: each value as the host's
// f16 copy holds it (f16(f32(d * sc) * q - f32(dmin * mn)), no fused multiply-add), so the matrix
// steps see the same operands and the result is the f16-copy GEMM's, bit for bit, without the copy
// (half the memory of a Q4_K matrix plus its copy).
#include "civetta_gpu.h"
#include "gemm_stage.h"
#include "q4k.h"

#ifndef CIVETTA_SCHED_BARRIER
#define CIVETTA_SCHED_BARRIER 0
#endif

namespace {

constexpr int kBlockK = 32;
constexpr int kTileStride = kBlockK + 8; // halves; 80-byte rows keep 16-byte alignment

// Copies rows [row0, row0+ROWS) x [k0, k0+32) into shared memory, zero-filling past `rows`.
template <int ROWS, int THREADS>
CV_DEVICE void load_block(cv_half* tile, const cv_half* src, int row0, int rows, int K, int k0) {
  for (int c = (int)cv_tid_x(); c < ROWS * 4; c += THREADS) {
    const int r = c >> 2, quarter = c & 3;
    cv_v4i v = {0, 0, 0, 0};
    if (row0 + r < rows) v = *(const cv_v4i*)(src + (long)(row0 + r) * K + k0 + quarter * 8);
    *(cv_v4i*)(tile + r * kTileStride + quarter * 8) = v;
  }
}

template <int BM, int BN, int WM, int WN>
CV_DEVICE void gemm_f16(const cv_half* A, const cv_half* B, float* C, int M, int N, int K) {
  constexpr int kWavesN = BN / WN;
  constexpr int kThreads = (BM / WM) * kWavesN * CV_WAVE;
  constexpr int TM = WM / 16, TN = WN / 16;
  __shared__ __attribute__((aligned(16))) cv_half a_tile[BM * kTileStride];
  __shared__ __attribute__((aligned(16))) cv_half b_tile[BN * kTileStride];

  const int m0 = (int)cv_bid_y() * BM, n0 = (int)cv_bid_x() * BN;
  const int wave = (int)cv_tid_x() / CV_WAVE;
  const int wm = (wave / kWavesN) * WM, wn = (wave % kWavesN) * WN;

  cv_v8f acc[TM][TN];
  CV_UNROLL for (int i = 0; i < TM; ++i)
    CV_UNROLL for (int j = 0; j < TN; ++j) acc[i][j] = (cv_v8f){0, 0, 0, 0, 0, 0, 0, 0};

  for (int k0 = 0; k0 < K; k0 += kBlockK) {
    load_block<BM, kThreads>(a_tile, A, m0, M, K, k0);
    load_block<BN, kThreads>(b_tile, B, n0, N, K, k0);
    cv_sync();
    CV_UNROLL for (int kk = 0; kk < kBlockK; kk += 16)
      CV_UNROLL for (int i = 0; i < TM; ++i) {
        const cv_frag_f16 a = cv_load_frag_f16(a_tile + (wm + i * 16) * kTileStride + kk, kTileStride);
        CV_UNROLL for (int j = 0; j < TN; ++j)
          acc[i][j] = cv_mma_f16(a, cv_load_frag_f16(b_tile + (wn + j * 16) * kTileStride + kk, kTileStride),
                                 acc[i][j]);
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


// The launched tiles: gemm_f16's matrix steps in the same K order (so the same result, bit for
// bit), fed differently: K stages of BK halves per barrier pair instead of 32, and the next
// stage's global loads issued into registers before this stage's matrix steps and written to
// shared memory after them (gemm_stage.h), so their latency hides behind the arithmetic.
// Rows m0 .. m0 + BM of A (those below M) against columns bid_x * BN .. of B.
// One K stage of rows [row0, row0 + ROWS) of a raw Q4_K matrix: a 64-wide stage is one pair of
// 32-value sub-blocks (2c, 2c + 1) of one super-block, whose nibbles are the low and high halves of
// the block's bytes qs[32c .. 32c + 32). Each item is (row, half h): the block header and
// qs[32c + 16h .. + 16) in registers (fetch), 16 values of each sub-block as f16 in LDS (store).
template <int ROWS, int BK, int THREADS>
struct StageQ4K {
  static_assert(BK == 64, "a Q4_K stage is one pair of sub-blocks");
  static constexpr int kItems = ROWS * 2 / THREADS;
  static_assert(ROWS * 2 % THREADS == 0, "stage splits evenly over the threads");
  cv_v4i head[kItems], qs[kItems];
  int pair = 0;

  __device__ __attribute__((always_inline)) void fetch(const unsigned char* src, int row0, int rows, int K, int k0) {
    const int tid = (int)cv_tid_x();
    pair = (k0 % 256) / 64;
    CV_UNROLL for (int i = 0; i < kItems; ++i) {
      const int c = tid + i * THREADS, r = c / 2, h = c % 2;
      head[i] = qs[i] = (cv_v4i){0, 0, 0, 0};
      if (row0 + r < rows) {
        const unsigned char* blk = src + ((long)(row0 + r) * (K / 256) + k0 / 256) * 144;
        head[i] = *(const cv_v4i*)blk;
        qs[i] = *(const cv_v4i*)(blk + 16 + 32 * pair + 16 * h);
      }
    }
  }
  __device__ __attribute__((always_inline)) void store(cv_half* tile, int stride) const {
    const int tid = (int)cv_tid_x();
    CV_UNROLL for (int i = 0; i < kItems; ++i) {
      const int c = tid + i * THREADS, r = c / 2, h = c % 2;
      const float d = (float)__builtin_bit_cast(cv_half, (cv_u16)(head[i].x & 0xFFFF));
      const float dmin = (float)__builtin_bit_cast(cv_half, (cv_u16)((cv_u32)head[i].x >> 16));
      float sc_lo, mn_lo, sc_hi, mn_hi;
      q4k_scale_min(head[i], 2 * pair, &sc_lo, &mn_lo);
      q4k_scale_min(head[i], 2 * pair + 1, &sc_hi, &mn_hi);
      const float d_lo = d * sc_lo, m_lo = dmin * mn_lo, d_hi = d * sc_hi, m_hi = dmin * mn_hi;
      const unsigned char* q = (const unsigned char*)&qs[i];
      cv_half lo[16], hi[16];
      CV_UNROLL for (int l = 0; l < 16; ++l) {
        lo[l] = (cv_half)(cv_mul_nofma(d_lo, (float)(q[l] & 0xF)) - m_lo);
        hi[l] = (cv_half)(cv_mul_nofma(d_hi, (float)(q[l] >> 4)) - m_hi);
      }
      cv_half* row = tile + r * stride + 16 * h;
      *(cv_v4i*)row = *(const cv_v4i*)lo;
      *(cv_v4i*)(row + 8) = *(const cv_v4i*)(lo + 8);
      *(cv_v4i*)(row + 32) = *(const cv_v4i*)hi;
      *(cv_v4i*)(row + 40) = *(const cv_v4i*)(hi + 8);
    }
  }
};

// B's stage in registers: f16 rows, or raw Q4_K blocks dequantised on the way to LDS.
template <typename TB, int BN, int BK, int THREADS> struct StageB;
template <int BN, int BK, int THREADS> struct StageB<cv_half, BN, BK, THREADS> {
  using type = StageRows<cv_half, BN, BK, THREADS>;
};
template <int BN, int BK, int THREADS> struct StageB<unsigned char, BN, BK, THREADS> {
  using type = StageQ4K<BN, BK, THREADS>;
};

template <int BM, int BN, int WM, int WN, int BK, typename TB = cv_half>
CV_DEVICE void gemm_f16_staged(const cv_half* A, const TB* B, float* C, int M, int N, int K, int m0) {
  constexpr int kStride = BK + 8; // halves: 16-byte aligned rows, fragment reads conflict-free
  constexpr int kWavesN = BN / WN;
  constexpr int kThreads = (BM / WM) * kWavesN * CV_WAVE;
  constexpr int TM = WM / 16, TN = WN / 16;
  __shared__ __attribute__((aligned(16))) cv_half a_tile[BM * kStride];
  __shared__ __attribute__((aligned(16))) cv_half b_tile[BN * kStride];

  const int n0 = (int)cv_bid_x() * BN;
  const int wave = (int)cv_tid_x() / CV_WAVE;
  const int wm = (wave / kWavesN) * WM, wn = (wave % kWavesN) * WN;

  cv_v8f acc[TM][TN];
  CV_UNROLL for (int i = 0; i < TM; ++i)
    CV_UNROLL for (int j = 0; j < TN; ++j) acc[i][j] = (cv_v8f){0, 0, 0, 0, 0, 0, 0, 0};

  StageRows<cv_half, BM, BK, kThreads> a_next;
  typename StageB<TB, BN, BK, kThreads>::type b_next;
  a_next.fetch(A, m0, M, K, 0);
  b_next.fetch(B, n0, N, K, 0);
  for (int k0 = 0; k0 < K; k0 += BK) {
    a_next.store(a_tile, kStride);
    b_next.store(b_tile, kStride);
    cv_sync();
    if (k0 + BK < K) { // in flight while the matrix steps below run
      a_next.fetch(A, m0, M, K, k0 + BK);
      b_next.fetch(B, n0, N, K, k0 + BK);
    }
    const int steps = (K - k0 < BK ? K - k0 : BK) / 16;
#pragma unroll 1
    for (int s = 0; s < steps; ++s)
      CV_UNROLL for (int i = 0; i < TM; ++i) {
        const cv_frag_f16 a = cv_load_frag_f16(a_tile + (wm + i * 16) * kStride + s * 16, kStride);
        CV_UNROLL for (int j = 0; j < TN; ++j)
          acc[i][j] = cv_mma_f16(a, cv_load_frag_f16(b_tile + (wn + j * 16) * kStride + s * 16, kStride), acc[i][j]);
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

#define CIVETTA_GEMM_F16(BM, BN, WM, WN)                                                          \
  CV_KERNEL CV_LAUNCH_BOUNDS((BM / WM) * (BN / WN) * CV_WAVE) void civetta_gemm_f16_##BM##x##BN( \
      const cv_half* A, const cv_half* B, float* C, int M, int N, int K) {                        \
    gemm_f16_staged<BM, BN, WM, WN, 64>(A, B, C, M, N, K, (int)cv_bid_y() * BM);                          \
  }

CIVETTA_GEMM_F16(64, 64, 32, 32)   // 4 waves, 2x2 steps each
CIVETTA_GEMM_F16(128, 128, 64, 32) // 8 waves, 4x2 steps each

#define CIVETTA_GEMM_Q4K(BM, BN, WM, WN)                                                          \
  CV_KERNEL CV_LAUNCH_BOUNDS((BM / WM) * (BN / WN) * CV_WAVE) void civetta_gemm_q4k_##BM##x##BN( \
      const cv_half* A, const unsigned char* B, float* C, int M, int N, int K) {                  \
    gemm_f16_staged<BM, BN, WM, WN, 64>(A, B, C, M, N, K, (int)cv_bid_y() * BM);                  \
  }

CIVETTA_GEMM_Q4K(64, 64, 32, 32)
CIVETTA_GEMM_Q4K(128, 128, 64, 32)

// Grouped form for mixture-of-experts prefill (issue #15; src/backend/gpu/moe.rs): A holds the
// routed (token, slot) rows sorted by expert, each expert's rows one segment; B[e] is expert e's
// f16 weight copy. Each grid row y is one BM-row tile of one segment: tiles[3y .. 3y + 2] =
// (expert, first row, end of the segment); C rows are A's. Same arithmetic per output element
// as civetta_gemm_f16_64x64. Grid: (ceil(N/64), tiles); block: 128 threads.
CV_KERNEL CV_LAUNCH_BOUNDS(128) void civetta_moe_gemm_f16_64x64(const cv_half* A, const cv_half* const* B, float* C,
                                                                const int* tiles, int N, int K) {
  const int* t = tiles + 3 * (int)cv_bid_y();
  gemm_f16_staged<64, 64, 32, 32, 64>(A, B[t[0]], C, t[2], N, K, t[1]);
}

// The same over raw Q4_K expert blocks (B[e]: expert e's blocks), as civetta_gemm_q4k_64x64.
CV_KERNEL CV_LAUNCH_BOUNDS(128) void civetta_moe_gemm_q4k_64x64(const cv_half* A, const unsigned char* const* B,
                                                                float* C, const int* tiles, int N, int K) {
  const int* t = tiles + 3 * (int)cv_bid_y();
  gemm_f16_staged<64, 64, 32, 32, 64>(A, B[t[0]], C, t[2], N, K, t[1]);
}
