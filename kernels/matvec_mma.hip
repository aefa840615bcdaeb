// Batched-decode mat-vecs on the matrix units (issues #14, #17): y[b][n] (+)= sum_k W[n][k] * x[b][k]
// for 2..16 activation rows b (one per decoding sequence) per launch row.
//
// The dp4a builds (kernels/matvec_dp4a.hip, `_x8` / `_x16`) read each weight unit once but do
// every row's dot product on the vector units and re-read each activation row from the cache per
// weight unit: at 16 rows the 1.4B model's mat-vecs took 5.5 ms per step against ~1.1 ms at one
// row. Here one matrix step multiplies a tile of 16 weight rows x 32 K (the A operand) by the
// same 32 K of 16 activation rows (B): the 16 rows cost one instruction stream, so the launch
// should stay bound by the weight bytes, like the one-row mat-vec.
//
// Same contract as matvec_dp4a.hip (the host launches either with the same arguments):
//   W: the int8 plane [N][K] and S: the f16 scale plane [N][K/32] of Q8_0 / Q5_0 weights;
//   xq: int8 [B][K] and xds: f32 [B][K/32][2] = (d, s) from quantize_q8_1 / rmsnorm_q8_1;
//   up to three matrices with the same input in one launch (q/k/v, gate/up), accumulate != 0
//   adds to y (the residual add).
// Per 32-value block the integer dot is scaled like the dp4a kernels: acc += float(idot) * (sw * sa).
// Grid: (tiles(N0) + tiles(N1) + tiles(N2), ceil(B / 16)) with tiles(N) = ceil(N / 16); block:
// kThreads. A workgroup owns one tile of 16 output rows and 16 activation rows; its waves split K
// (wave w takes blocks w, w + kWaves, ...), each with kUnroll blocks of loads in flight, and the
// partial tiles are summed in LDS. The matrices are narrow (1536-9000 rows: 96-560 workgroups),
// so K is split inside the workgroup rather than over more rows per workgroup.
// Name: civetta_matvec_mma_q8p.
#include "civetta_gpu.h"

namespace {

constexpr int kWaves = 8;
constexpr int kThreads = kWaves * CV_WAVE;
constexpr int kTile = 16;   // output rows and activation rows per workgroup
constexpr int kBlock = 32;  // K values per scale
constexpr int kUnroll = 4;  // 32-value blocks per wave whose loads are in flight together

// Kernel arguments, as matvec_dp4a.hip's (named fields: a dynamically indexed argument array
// would be copied to scratch).
struct Args {
  const cv_u8 *W0, *S0;
  float* y0;
  int N0;
  const cv_u8 *W1, *S1;
  float* y1;
  int N1;
  const cv_u8 *W2, *S2;
  float* y2;
  int N2;
  const cv_i8* xq;
  const float* xds;
  int K, B, accumulate;
};

// v0, v1 or v2 (m = 0, 1 or more), taken by value (see matvec_dp4a.hip: a select between field
// addresses kept the argument struct in scratch with LLVM 23).
template <class T> CV_DEVICE T pick(int m, T v0, T v1, T v2) { return m == 0 ? v0 : (m == 1 ? v1 : v2); }

CV_DEVICE int min_int(int a, int b) { return a < b ? a : b; }

CV_DEVICE void matvec_mma_q8p(const Args& a) {
  // The matrix and the first row of this workgroup's tile; tiles do not straddle matrices.
  const int N0 = a.N0, N1 = a.N1, t0 = (N0 + kTile - 1) / kTile, t1 = (N1 + kTile - 1) / kTile;
  const int tile = (int)cv_bid_x();
  const int m = (tile >= t0) + (tile >= t0 + t1);
  const int n0 = (tile - (m >= 1 ? t0 : 0) - (m >= 2 ? t1 : 0)) * kTile;
  const int N = pick(m, N0, N1, a.N2);
  const cv_i8* W = (const cv_i8*)pick(m, a.W0, a.W1, a.W2);
  const cv_half* S = (const cv_half*)pick(m, a.S0, a.S1, a.S2);
  float* y = pick(m, a.y0, a.y1, a.y2);
  const int K = a.K, blocks = K / kBlock, b0 = (int)cv_bid_y() * kTile;
  // Valid rows of the two tiles (1..16): the loads clamp to them, the store skips the rest.
  const int w_rows = min_int(N - n0, kTile), x_rows = min_int(a.B - b0, kTile);
  const cv_i8* w_tile = W + (long)n0 * K;
  const cv_i8* x_tile = a.xq + (long)b0 * K;
  const int wave = (int)cv_tid_x() / CV_WAVE;

  // Offsets of this lane's scales per accumulator element: the weight row's f16 scales and the
  // activation row's (d, s) pairs, clamped like the loads.
  int w_scale[8], x_scale[8];
  CV_UNROLL for (int e = 0; e < 8; ++e) {
    w_scale[e] = (n0 + min_int(cv_acc_row(e), w_rows - 1)) * blocks;
    x_scale[e] = (b0 + min_int(cv_acc_col(e), x_rows - 1)) * blocks * 2;
  }

  cv_v8f acc = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int kb0 = wave; kb0 < blocks; kb0 += kWaves * kUnroll) {
    // Every load of kUnroll blocks first (the last partial round re-reads block kb0), then the
    // matrix steps.
    cv_frag_i8 w_lo[kUnroll], w_hi[kUnroll], x_lo[kUnroll], x_hi[kUnroll];
    float sw[kUnroll][8], sa[kUnroll][8];
    CV_UNROLL for (int i = 0; i < kUnroll; ++i) {
      const int kb = kb0 + i * kWaves < blocks ? kb0 + i * kWaves : kb0;
      cv_load_frags_k32(w_tile + kb * kBlock, K, w_rows, &w_lo[i], &w_hi[i]);
      cv_load_frags_k32(x_tile + kb * kBlock, K, x_rows, &x_lo[i], &x_hi[i]);
      CV_UNROLL for (int e = 0; e < 8; ++e) {
        sw[i][e] = (float)S[w_scale[e] + kb];
        sa[i][e] = a.xds[x_scale[e] + 2 * kb];
      }
    }
    CV_UNROLL for (int i = 0; i < kUnroll; ++i) {
      if (kb0 + i * kWaves >= blocks) break;
      const cv_v8i dot = cv_mma_i8_k32(w_lo[i], w_hi[i], x_lo[i], x_hi[i], (cv_v8i){0, 0, 0, 0, 0, 0, 0, 0});
      CV_UNROLL for (int e = 0; e < 8; ++e) acc[e] += (float)dot[e] * (sw[i][e] * sa[i][e]);
    }
  }

  // Sum the waves' partial tiles: part[wave][output row][activation row].
  __shared__ float part[kWaves][kTile][kTile];
  CV_UNROLL for (int e = 0; e < 8; ++e) part[wave][cv_acc_row(e)][cv_acc_col(e)] = acc[e];
  cv_sync();
  for (int c = (int)cv_tid_x(); c < kTile * kTile; c += kThreads) {
    const int r = c / kTile, b = c % kTile;
    float s = 0.0f;
    CV_UNROLL for (int w = 0; w < kWaves; ++w) s += part[w][r][b];
    if (r < w_rows && b < x_rows) {
      float* out = y + (long)(b0 + b) * N + n0 + r;
      *out = a.accumulate ? *out + s : s;
    }
  }
}

} // namespace

CV_KERNEL CV_LAUNCH_BOUNDS(kThreads) void civetta_matvec_mma_q8p(
    const cv_u8* W0, const cv_u8* S0, float* y0, int N0, const cv_u8* W1, const cv_u8* S1, float* y1, int N1,
    const cv_u8* W2, const cv_u8* S2, float* y2, int N2, const cv_i8* xq, const float* xds, int K, int B,
    int accumulate) {
  matvec_mma_q8p(Args{W0, S0, y0, N0, W1, S1, y1, N1, W2, S2, y2, N2, xq, xds, K, B, accumulate});
}
