// Quantised matrix-vector products for decode, reading ggml block layouts directly.
//
//   y[b][n] = sum_k W[n][k] * x[b][k]
//
// W: [N] rows of K/QK ggml blocks, x: f32 [B][K], y: f32 [B][N].
// One workgroup of 128 threads (4 waves) per weight row: the 4 waves split the row's blocks
// (several waves per row keep enough loads in flight for the long rows of the down
// projection) and merge their partial sums in LDS. Each workgroup reads its weight row once
// for NB activation rows (batched decode: one row per sequence).
// Grid: (N, ceil(B/NB)); block: 128 threads.
//   civetta_matvec_q8_0[_x4]: block_q8_0 { f16 d; int8 qs[32]; }                     (34 bytes / 32)
//   civetta_matvec_q4_k[_x4]: block_q4_K { f16 d, dmin; u8 scales[12]; u8 qs[128]; } (144 bytes / 256)
//   civetta_matvec_q6_k[_x4]: block_q6_K { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d; } (210 bytes / 256)
// The plain names take NB = 1, the _x4 names NB = 4.
#include "civetta_gpu.h"

namespace {

constexpr int kThreads = 128;
constexpr int kWaves = kThreads / CV_WAVE;

CV_DEVICE float load_half(const cv_u8* p) { return (float)*(const cv_half*)p; }

// 6-bit scale and min of sub-block j of a Q4_K super-block (ggml get_scale_min_k4).
CV_DEVICE void q4k_scale_min(int j, const cv_u8* q, float* sc, float* mn) {
  if (j < 4) {
    *sc = (float)(q[j] & 63);
    *mn = (float)(q[j + 4] & 63);
  } else {
    *sc = (float)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *mn = (float)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Sums each of the NB per-thread partials over the workgroup and writes y[b][row].
template <int NB>
CV_DEVICE void reduce_store(float (&sum)[NB], float* y, int row, int N, int b0, int B) {
  __shared__ float partial[NB][kWaves];
  const int tid = (int)cv_tid_x(), wave = tid / CV_WAVE;
  CV_UNROLL for (int r = 0; r < NB; ++r) {
    const float s = cv_wave_sum(sum[r]);
    if (cv_lane() == 0) partial[r][wave] = s;
  }
  cv_sync();
  if (tid < NB && b0 + tid < B) {
    float s = 0.0f;
    CV_UNROLL for (int w = 0; w < kWaves; ++w) s += partial[tid][w];
    y[(long)(b0 + tid) * N + row] = s;
  }
}

// Q8_0: a thread takes a quarter block (8 values: 4 two-byte loads, blocks are only 2-byte
// aligned) per step; the workgroup covers 32 blocks per step.
template <int NB>
CV_DEVICE void matvec_q8_0(const cv_u8* W, const float* x, float* y, int N, int K, int B) {
  const int row = (int)cv_bid_x(), b0 = (int)cv_bid_y() * NB;
  const int blocks = K / 32, quarters = blocks * 4;
  const cv_u8* w = W + (long)row * blocks * 34;
  float sum[NB];
  CV_UNROLL for (int r = 0; r < NB; ++r) sum[r] = 0.0f;
  for (int q = (int)cv_tid_x(); q < quarters; q += kThreads) {
    const int b = q >> 2, s = q & 3;
    const cv_u8* blk = w + b * 34;
    const cv_u16* qs = (const cv_u16*)(blk + 2 + s * 8);
    const cv_u16 w0 = qs[0], w1 = qs[1], w2 = qs[2], w3 = qs[3];
    const float d = load_half(blk);
    float wv[8] = {(float)(cv_i8)(w0 & 0xFF), (float)(cv_i8)(w0 >> 8), (float)(cv_i8)(w1 & 0xFF),
                   (float)(cv_i8)(w1 >> 8),   (float)(cv_i8)(w2 & 0xFF), (float)(cv_i8)(w2 >> 8),
                   (float)(cv_i8)(w3 & 0xFF), (float)(cv_i8)(w3 >> 8)};
    CV_UNROLL for (int r = 0; r < NB; ++r) {
      if (NB > 1 && b0 + r >= B) break;
      const float* xv = x + (long)(b0 + r) * K + b * 32 + s * 8;
      float dot = 0.0f;
      CV_UNROLL for (int i = 0; i < 8; ++i) dot += wv[i] * xv[i];
      sum[r] += d * dot;
    }
  }
  reduce_store<NB>(sum, y, row, N, b0, B);
}

// Q4_K: 32 threads per super-block, thread t reads 4 bytes of chunk j = t/8: low nibbles are
// values 64j+l, high nibbles 64j+32+l. The workgroup covers 4 super-blocks per step.
template <int NB>
CV_DEVICE void matvec_q4_k(const cv_u8* W, const float* x, float* y, int N, int K, int B) {
  const int row = (int)cv_bid_x(), b0 = (int)cv_bid_y() * NB;
  const int blocks = K / 256;
  const cv_u8* w = W + (long)row * blocks * 144;
  const int tid = (int)cv_tid_x(), lane = tid & 31;
  const int chunk = lane >> 3, l0 = (lane & 7) * 4;
  float sum[NB];
  CV_UNROLL for (int r = 0; r < NB; ++r) sum[r] = 0.0f;
  for (int b = tid >> 5; b < blocks; b += kThreads / 32) {
    const cv_u8* blk = w + b * 144;
    const float d = load_half(blk), dmin = load_half(blk + 2);
    float sc_lo, mn_lo, sc_hi, mn_hi;
    q4k_scale_min(2 * chunk, blk + 4, &sc_lo, &mn_lo);
    q4k_scale_min(2 * chunk + 1, blk + 4, &sc_hi, &mn_hi);
    const cv_u32 q = *(const cv_u32*)(blk + 16 + chunk * 32 + l0);
    CV_UNROLL for (int r = 0; r < NB; ++r) {
      if (NB > 1 && b0 + r >= B) break;
      const float* x_lo = x + (long)(b0 + r) * K + b * 256 + chunk * 64 + l0;
      const float* x_hi = x_lo + 32;
      float dot_lo = 0.0f, dot_hi = 0.0f, xs_lo = 0.0f, xs_hi = 0.0f;
      CV_UNROLL for (int i = 0; i < 4; ++i) {
        const cv_u32 byte = (q >> (8 * i)) & 0xFF;
        dot_lo += (float)(byte & 0xF) * x_lo[i];
        dot_hi += (float)(byte >> 4) * x_hi[i];
        xs_lo += x_lo[i];
        xs_hi += x_hi[i];
      }
      sum[r] += d * (sc_lo * dot_lo + sc_hi * dot_hi) - dmin * (mn_lo * xs_lo + mn_hi * xs_hi);
    }
  }
  reduce_store<NB>(sum, y, row, N, b0, B);
}

// Q6_K: one wave per super-block, lane l takes position l of each 128-value half (4 values
// per half). The workgroup covers 4 super-blocks per step.
template <int NB>
CV_DEVICE void matvec_q6_k(const cv_u8* W, const float* x, float* y, int N, int K, int B) {
  const int row = (int)cv_bid_x(), b0 = (int)cv_bid_y() * NB;
  const int blocks = K / 256;
  const cv_u8* w = W + (long)row * blocks * 210;
  const int tid = (int)cv_tid_x(), l = tid & 31;
  float sum[NB];
  CV_UNROLL for (int r = 0; r < NB; ++r) sum[r] = 0.0f;
  for (int b = tid >> 5; b < blocks; b += kWaves) {
    const cv_u8* blk = w + b * 210;
    const cv_i8* scales = (const cv_i8*)(blk + 192);
    const float d = load_half(blk + 208);
    CV_UNROLL for (int half = 0; half < 2; ++half) {
      const cv_u8* ql = blk + half * 64;
      const cv_u8 qh = blk[128 + half * 32 + l];
      const cv_i8* sc = scales + half * 8 + l / 16;
      const float w1 = d * (float)(sc[0] * ((int)((ql[l] & 0xF) | (((qh >> 0) & 3) << 4)) - 32));
      const float w2 = d * (float)(sc[2] * ((int)((ql[l + 32] & 0xF) | (((qh >> 2) & 3) << 4)) - 32));
      const float w3 = d * (float)(sc[4] * ((int)((ql[l] >> 4) | (((qh >> 4) & 3) << 4)) - 32));
      const float w4 = d * (float)(sc[6] * ((int)((ql[l + 32] >> 4) | (((qh >> 6) & 3) << 4)) - 32));
      CV_UNROLL for (int r = 0; r < NB; ++r) {
        if (NB > 1 && b0 + r >= B) break;
        const float* xv = x + (long)(b0 + r) * K + b * 256 + half * 128 + l;
        sum[r] += w1 * xv[0] + w2 * xv[32] + w3 * xv[64] + w4 * xv[96];
      }
    }
  }
  reduce_store<NB>(sum, y, row, N, b0, B);
}

} // namespace

#define CIVETTA_MATVEC(T)                                                                                         \
  CV_KERNEL CV_LAUNCH_BOUNDS(kThreads) void civetta_matvec_##T(const cv_u8* W, const float* x, float* y, int N,  \
                                                               int K, int B) {                                  \
    matvec_##T<1>(W, x, y, N, K, B);                                                                              \
  }                                                                                                               \
  CV_KERNEL CV_LAUNCH_BOUNDS(kThreads) void civetta_matvec_##T##_x4(const cv_u8* W, const float* x, float* y,    \
                                                                    int N, int K, int B) {                       \
    matvec_##T<4>(W, x, y, N, K, B);                                                                              \
  }

CIVETTA_MATVEC(q8_0)
CIVETTA_MATVEC(q4_k)
CIVETTA_MATVEC(q6_k)
