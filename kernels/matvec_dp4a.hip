// Decode mat-vecs on int8 activations (issue #17): y[b][n] (+)= sum_k W[n][k] * x[b][k].
//
// The input x is quantised once per launch input by civetta_quantize_q8_1 (kernels/quantize.hip)
// into blocks of 32 int8 values with a scale d and s = d * (sum of the block's q) (the q8_1
// idea of llama.cpp's mmvq). The products are 4-way int8 dot products (dp4a on NVIDIA,
// v_dot4_i32_iu8 on gfx11), so a lane reads 1 activation byte per weight value instead of 4
// and does one instruction per 4 multiply-adds.
//
// Decode rows are short (a few KB), so a mat-vec is bound by how many bytes are in flight, not
// by instruction count: every lane issues U 16-byte weight loads before it uses any, and
// G lanes share a row (G = 32: a wave per row, 4 rows per workgroup; 64 and 128: 2 waves or the
// whole workgroup per row, merged in LDS, for long rows such as the down projection's; 16:
// 8 rows per workgroup with U = 8). The host picks G per shape (src/backend/gpu/mod.rs,
// `matvec_lanes`).
//
// Same fusions as kernels/matvec.hip: up to three matrices with the same input in one launch
// (rows 0..N0 are W0's, then N1 of W1, then N2 of W2), and accumulate != 0 adds to y (the
// residual add). SwiGLU is applied by the quantiser (its `up` argument).
// Weights:
//   civetta_matvec_q8p_g*: the int8 plane [N][K] and f16 scale plane [N][K/32] that Q8_0 and
//     Q5_0 weights keep for the prefill GEMM (Q5_0's plane holds q - 16): 16-byte aligned,
//     unlike block_q8_0's 34-byte blocks. A unit is 16 values (one 16-byte load).
//   civetta_matvec_q4k_g*: raw block_q4_K { f16 d, dmin; u8 scales[12]; u8 qs[128]; } (144
//     bytes, 16-byte aligned): a unit is one 16-byte slice of qs (32 values: 16 low nibbles of
//     sub-block 2j, 16 high nibbles of sub-block 2j+1) plus the block's 16-byte header.
// Activations: xq int8 [B][K], xds f32 [B][K/32][2] = (d, s).
// Grid: (ceil((N0 + N1 + N2) / (128 / G)), ceil(B / NB)); block: 128 threads. _x4, _x8, _x16:
// NB = 4, 8, 16 activation rows per weight read (batched decode: one row per sequence; issue
// #17). The weights are read once per NB rows; the NB rows of x (a few KB each) come from the
// cache, so a 16-row launch moves about the bytes of a 1-row one.
// Names: civetta_matvec_{q8p,q4k}_g{16,32,64,128}[_x4], civetta_matvec_{q8p,q4k}_g{32,64,128}_x{8,16}.
#include "civetta_gpu.h"
#include "q4k.h"

namespace {

constexpr int kThreads = 128;

// Kernel arguments; named fields, not arrays: a dynamically indexed argument array would be
// copied to scratch.
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

#include "matvec_units.h"

// v0, v1 or v2 (m = 0, 1, 2 or more), taken by value.
template <class T> CV_DEVICE T pick(int m, T v0, T v1, T v2) { return m == 0 ? v0 : (m == 1 ? v1 : v2); }

template <class Q, int G, int U, int NB>
CV_DEVICE void matvec(const Args& a) {
  constexpr int kRows = kThreads / G;
  const int tid = (int)cv_tid_x(), t = tid % G;
  // The matrix and row of this lane group (W null past the last row). pick() selects values:
  // `c ? a.W1 : a.W0` is an lvalue, a select between two field addresses, after which LLVM 23
  // kept the whole argument struct in scratch.
  const int r0 = (int)cv_bid_x() * kRows + tid / G, N0 = a.N0, N1 = a.N1, N2 = a.N2;
  const int m = (r0 >= N0) + (r0 >= N0 + N1) + (r0 >= N0 + N1 + N2);
  const int row = r0 - (m >= 1 ? N0 : 0) - (m >= 2 ? N1 : 0);
  const int N = pick(m, N0, N1, N2);
  const cv_u8* W = m == 3 ? nullptr : pick(m, a.W0, a.W1, a.W2);
  const cv_u8* S = pick(m, a.S0, a.S1, a.S2);
  float* y = pick(m, a.y0, a.y1, a.y2);
  const bool valid = W != nullptr;
  const int K = a.K, B = a.B, b0 = (int)cv_bid_y() * NB, units = K / Q::kValues;
  // The activation row stride; for 16 rows a per-lane value on AMD, so that the rows'
  // addresses are not all held in scalar registers (cv_in_vgpr).
  const int x_stride = NB > 8 ? cv_in_vgpr(K) : K;
  float sum[NB];
  CV_UNROLL for (int r = 0; r < NB; ++r) sum[r] = 0.0f;
  if constexpr (cv_kernels_overlap) {
    // The first round's weights are loaded before waiting for the kernel that wrote x
    // (cv_wait_prior_kernels): no kernel writes weights, so these loads run during its tail.
    typename Q::Unit w[U];
    const auto load_units = [&](int u0) {
      CV_UNROLL for (int i = 0; i < U; ++i) {
        const int u = u0 + i * G;
        w[i] = Q::load(W, S, row, K, u < units ? u : u0);
      }
    };
    if (valid && t < units) load_units(t);
    cv_follow_prior_kernels();
    if (valid) {
      for (int u0 = t; u0 < units; u0 += G * U) {
        if (u0 != t) load_units(u0);
        CV_UNROLL for (int i = 0; i < U; ++i) {
          const int u = u0 + i * G;
          if (u >= units) break;
          CV_UNROLL for (int r = 0; r < NB; ++r) {
            if (NB > 1 && b0 + r >= B) break;
            const long xb = (long)(b0 + r) * x_stride;
            sum[r] += Q::dot(w[i], a.xq + xb, a.xds + xb / 16, u);
          }
        }
      }
    }
  } else {
    // Nothing overlaps (AMD): the plain loop, loads and dots per round (the peeled loop above
    // cost clang-19 SGPR spills in the 8-row Q4_K builds).
    cv_follow_prior_kernels();
    if (valid) {
      for (int u0 = t; u0 < units; u0 += G * U) {
        typename Q::Unit w[U];
        CV_UNROLL for (int i = 0; i < U; ++i) {
          const int u = u0 + i * G;
          w[i] = Q::load(W, S, row, K, u < units ? u : u0);
        }
        CV_UNROLL for (int i = 0; i < U; ++i) {
          const int u = u0 + i * G;
          if (u >= units) break;
          CV_UNROLL for (int r = 0; r < NB; ++r) {
            if (NB > 1 && b0 + r >= B) break;
            const long xb = (long)(b0 + r) * x_stride;
            sum[r] += Q::dot(w[i], a.xq + xb, a.xds + xb / 16, u);
          }
        }
      }
    }
  }
  // Sum over the G lanes of the row: shuffles within a wave, LDS across waves.
  CV_UNROLL for (int r = 0; r < NB; ++r) sum[r] = cv_group_sum(sum[r], G < CV_WAVE ? G : CV_WAVE);
  if constexpr (G > CV_WAVE) {
    constexpr int kWaves = kThreads / CV_WAVE, kPerRow = G / CV_WAVE;
    __shared__ float part[NB][kWaves];
    const int wave = tid / CV_WAVE;
    if (cv_lane() == 0) {
      CV_UNROLL for (int r = 0; r < NB; ++r) part[r][wave] = sum[r];
    }
    cv_sync();
    if (t == 0) {
      CV_UNROLL for (int r = 0; r < NB; ++r) {
        float s = 0.0f;
        CV_UNROLL for (int w = 0; w < kPerRow; ++w) s += part[r][wave + w];
        sum[r] = s;
      }
    }
  }
  if (t == 0 && valid) {
    CV_UNROLL for (int r = 0; r < NB; ++r) {
      if (b0 + r < B) {
        float* out = y + (long)(b0 + r) * N + row;
        *out = a.accumulate ? *out + sum[r] : sum[r];
      }
    }
  }
}

} // namespace

#define CIVETTA_MATVEC_DP4A_ENTRY(Q, NAME, G, U, NB)                                                                    \
  CV_KERNEL CV_LAUNCH_BOUNDS(kThreads) void NAME(                                                                    \
      const cv_u8* W0, const cv_u8* S0, float* y0, int N0, const cv_u8* W1, const cv_u8* S1, float* y1, int N1,      \
      const cv_u8* W2, const cv_u8* S2, float* y2, int N2, const cv_i8* xq, const float* xds, int K, int B,          \
      int accumulate) {                                                                                              \
    matvec<Q, G, U, NB>(Args{W0, S0, y0, N0, W1, S1, y1, N1, W2, S2, y2, N2, xq, xds, K, B, accumulate});               \
  }
#define CIVETTA_MATVEC_DP4A(Q, T, G, U)                                                                              \
  CIVETTA_MATVEC_DP4A_ENTRY(Q, civetta_matvec_##T##_g##G, G, U, 1)                                                   \
  CIVETTA_MATVEC_DP4A_ENTRY(Q, civetta_matvec_##T##_g##G##_x4, G, U, 4)
// The batched-decode builds (5..16 rows per launch; more rows take more grid rows).
#define CIVETTA_MATVEC_DP4A_BATCH(Q, T, G, U)                                                                        \
  CIVETTA_MATVEC_DP4A_ENTRY(Q, civetta_matvec_##T##_g##G##_x8, G, U, 8)                                              \
  CIVETTA_MATVEC_DP4A_ENTRY(Q, civetta_matvec_##T##_g##G##_x16, G, U, 16)

CIVETTA_MATVEC_DP4A(Q8Planes, q8p, 16, 8)
CIVETTA_MATVEC_DP4A(Q8Planes, q8p, 32, 4)
CIVETTA_MATVEC_DP4A(Q8Planes, q8p, 64, 4)
// U = 6 at G = 128: the 1.4B model's down projection (K = 8960, 560 units) in one round of loads
// instead of two (4 + 0.4): tg128 +2.9% on an H100, the same bits (docs/GPU.md, session 20; U = 5
// and 8 gained less).
CIVETTA_MATVEC_DP4A(Q8Planes, q8p, 128, 6)
CIVETTA_MATVEC_DP4A(Q4K, q4k, 16, 8)
CIVETTA_MATVEC_DP4A(Q4K, q4k, 32, 4)
CIVETTA_MATVEC_DP4A(Q4K, q4k, 64, 4)
CIVETTA_MATVEC_DP4A(Q4K, q4k, 128, 4)
CIVETTA_MATVEC_DP4A_BATCH(Q8Planes, q8p, 32, 4)
CIVETTA_MATVEC_DP4A_BATCH(Q8Planes, q8p, 64, 4)
CIVETTA_MATVEC_DP4A_BATCH(Q8Planes, q8p, 128, 4)
CIVETTA_MATVEC_DP4A_BATCH(Q4K, q4k, 32, 4)
CIVETTA_MATVEC_DP4A_BATCH(Q4K, q4k, 64, 4)
CIVETTA_MATVEC_DP4A_BATCH(Q4K, q4k, 128, 4)
