// Decode mat-vecs of mixture-of-experts layers over device-side expert ids (issue #15; the idea
// of llama.cpp's mul_mat_vec_id): y[i][n] = sum_k W_e[n][k] * x[i][k] for every (token, slot)
// row i, where e = ids[i] is the expert civetta_moe_topk (kernels/moe.hip) chose for it.
//
// The experts' matrices are reached through tables of device addresses, one entry per expert
// (W[e], and S[e] for the scale plane), built once when the model loads from the per-expert
// weights the dense kernels already use (src/backend/gpu/moe.rs): no weight is copied or
// re-laid out, and the expert choice never goes back to the host, so a decode step queues the
// same launches whatever the routing (and replays as one graph).
//
// Arithmetic per row as kernels/matvec_dp4a.hip's one-row build (same units, same order of
// additions within a lane group), on the q8_1 activations of civetta_quantize_q8_1.
// Up to two matrices with the same input in one launch (gate and up: rows 0..N0 are W0's,
// then N1 of W1); the input row of slot i is x[i / k] (gate/up: one input per token) or x[i]
// (x_per_slot: the down projection's SwiGLU output per slot).
// B0 / B1 (gpt-oss's expert biases; null for none): tables of each expert's f32 bias row, added
// to the output as the host path's add_bias does.
// Weights: civetta_moe_matvec_q8p_g*: int8 and f16 scale planes (Q8_0, Q5_0, MXFP4);
//          civetta_moe_matvec_q4k_g*: raw Q4_K blocks (S tables unused).
// Grid: (ceil((N0 + N1) / (128 / G)), tokens * k); block: 128 threads.
// Names: civetta_moe_matvec_{q8p,q4k}_g{32,64,128}.
#include "civetta_gpu.h"
#include "q4k.h"

namespace {

constexpr int kThreads = 128;

#include "matvec_units.h"

// Named fields, not arrays (a dynamically indexed argument array would go to scratch).
struct IdArgs {
  const cv_u8* const* W0;
  const cv_u8* const* S0;
  const float* const* B0;
  float* y0;
  int N0;
  const cv_u8* const* W1;
  const cv_u8* const* S1;
  const float* const* B1;
  float* y1;
  int N1;
  const int* ids;
  const cv_i8* xq;
  const float* xds;
  int K, k, x_per_slot;
};

template <class Q, int G, int U>
CV_DEVICE void moe_matvec(const IdArgs& a) {
  constexpr int kRows = kThreads / G;
  const int tid = (int)cv_tid_x(), t = tid % G;
  const int r0 = (int)cv_bid_x() * kRows + tid / G, N0 = a.N0, N1 = a.N1;
  const int m = (r0 >= N0) + (r0 >= N0 + N1);
  const int row = r0 - (m >= 1 ? N0 : 0);
  const int N = m == 0 ? N0 : N1;
  const int slot = (int)cv_bid_y(), e = a.ids[slot];
  // Values, not a select between two field addresses (see matvec_dp4a.hip's pick()).
  const cv_u8* const* Wt = m == 0 ? a.W0 : a.W1;
  const cv_u8* const* St = m == 0 ? a.S0 : a.S1;
  const float* const* Bt = m == 0 ? a.B0 : a.B1;
  const bool valid = m < 2;
  const cv_u8* W = valid ? Wt[e] : nullptr;
  const cv_u8* S = valid && St ? St[e] : nullptr;
  float* y = m == 0 ? a.y0 : a.y1;
  const int K = a.K, units = K / Q::kValues;
  const long xb = (long)(a.x_per_slot ? slot : slot / a.k) * K;
  const cv_i8* xq = a.xq + xb;
  const float* xds = a.xds + xb / 16;
  float sum = 0.0f;
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
        sum += Q::dot(w[i], xq, xds, u);
      }
    }
  }
  sum = cv_group_sum(sum, G < CV_WAVE ? G : CV_WAVE);
  if constexpr (G > CV_WAVE) {
    constexpr int kWaves = kThreads / CV_WAVE, kPerRow = G / CV_WAVE;
    __shared__ float part[kWaves];
    const int wave = tid / CV_WAVE;
    if (cv_lane() == 0) part[wave] = sum;
    cv_sync();
    if (t == 0) {
      float s = 0.0f;
      CV_UNROLL for (int w = 0; w < kPerRow; ++w) s += part[wave + w];
      sum = s;
    }
  }
  if (t == 0 && valid) y[(long)slot * N + row] = Bt ? sum + Bt[e][row] : sum;
}

} // namespace

#define CIVETTA_MOE_MATVEC(Q, T, G)                                                                                    \
  CV_KERNEL CV_LAUNCH_BOUNDS(kThreads) void civetta_moe_matvec_##T##_g##G(                                             \
      const cv_u8* const* W0, const cv_u8* const* S0, const float* const* B0, float* y0, int N0,                       \
      const cv_u8* const* W1, const cv_u8* const* S1, const float* const* B1, float* y1, int N1, const int* ids,       \
      const cv_i8* xq, const float* xds, int K, int k, int x_per_slot) {                                               \
    moe_matvec<Q, G, 4>(IdArgs{W0, S0, B0, y0, N0, W1, S1, B1, y1, N1, ids, xq, xds, K, k, x_per_slot});              \
  }

CIVETTA_MOE_MATVEC(Q8Planes, q8p, 32)
CIVETTA_MOE_MATVEC(Q8Planes, q8p, 64)
CIVETTA_MOE_MATVEC(Q8Planes, q8p, 128)
CIVETTA_MOE_MATVEC(Q4K, q4k, 32)
CIVETTA_MOE_MATVEC(Q4K, q4k, 64)
CIVETTA_MOE_MATVEC(Q4K, q4k, 128)
