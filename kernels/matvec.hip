// Quantised matrix-vector products for decode, reading ggml block layouts directly.
//
//   y[b][n] = sum_k W[n][k] * x[b][k]
//
// W: [N] rows of K/QK ggml blocks, x: f32 [B][K], y: f32 [B][N].
// One wave per weight row, 4 rows per workgroup. A wave keeps kUnroll steps of weight loads
// in flight before it uses them: decode rows are short (a few KB), so the bytes each lane
// has in flight, not the number of waves, decide how close a mat-vec gets to the DRAM
// bandwidth (docs/GPU.md, "Mat-vec bandwidth"). Each wave reads its weight row once for NB
// activation rows (batched decode: one row per sequence).
//
// Fusions that save launches in decode (src/backend/gpu/mod.rs, GpuBackend::matvec):
//   - up to three matrices with the same input in one launch (q, k, v; gate, up): rows
//     0..N0 are W0's, then N1 rows of W1, then N2 of W2, each writing its own y;
//   - x_up != null: the input is silu(x) * x_up (SwiGLU fused into the down projection);
//   - accumulate != 0: y += W x (the residual add fused into the o and down projections).
// Grid: (ceil((N0 + N1 + N2) / 4), ceil(B/NB)); block: 128 threads.
//   civetta_matvec_q8_0[_x4]: block_q8_0 { f16 d; int8 qs[32]; }                     (34 bytes / 32)
//   civetta_matvec_q4_k[_x4]: block_q4_K { f16 d, dmin; u8 scales[12]; u8 qs[128]; } (144 bytes / 256)
//   civetta_matvec_q6_k[_x4]: block_q6_K { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d; } (210 bytes / 256)
// The plain names take NB = 1, the _x4 names NB = 4.
#include "civetta_gpu.h"

namespace {

constexpr int kThreads = 128;
constexpr int kRowsPerGroup = kThreads / CV_WAVE;
constexpr int kUnroll = 4;

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

struct MatvecArgs {
  const cv_u8* W0; float* y0; int N0;
  const cv_u8* W1; float* y1; int N1;
  const cv_u8* W2; float* y2; int N2;
  const float* x; const float* x_up; int K; int B; int accumulate;
};
// The matrix and row of this wave; W is null past the last row.
struct RowOf {
  const cv_u8* W;
  float* y;
  int row, N;
};
CV_DEVICE RowOf row_of(const MatvecArgs& a) {
  int r = (int)(cv_bid_x() * kRowsPerGroup + cv_tid_x() / CV_WAVE);
  if (r < a.N0) return RowOf{a.W0, a.y0, r, a.N0};
  r -= a.N0;
  if (r < a.N1) return RowOf{a.W1, a.y1, r, a.N1};
  r -= a.N1;
  if (r < a.N2) return RowOf{a.W2, a.y2, r, a.N2};
  return RowOf{nullptr, nullptr, 0, 0};
}

// Input value i: x, or silu(x) * up (the same arithmetic as civetta_silu_mul).
CV_DEVICE float act(const float* x, const float* up, long i) {
  if (!up) return x[i];
  const float g = x[i];
  return g * cv_rcp(1.0f + cv_exp(-g)) * up[i];
}

// Sums each of the NB per-lane partials over the wave and writes (or adds to) y[b][row].
template <int NB>
CV_DEVICE void reduce_store(float (&sum)[NB], const RowOf& m, int b0, int B, int accumulate) {
  CV_UNROLL for (int r = 0; r < NB; ++r) {
    const float s = cv_wave_sum(sum[r]);
    if (cv_lane() == 0 && b0 + r < B) {
      float* out = m.y + (long)(b0 + r) * m.N + m.row;
      *out = accumulate ? *out + s : s;
    }
  }
}

// Q8_0: a lane takes a quarter block (8 values: 4 two-byte loads, blocks are only 2-byte
// aligned) per step; the wave covers 8 blocks per step and loads kUnroll steps at once.
template <int NB>
CV_DEVICE void matvec_q8_0(const MatvecArgs& a) {
  const RowOf m = row_of(a);
  if (!m.W) return;
  const int K = a.K, B = a.B, b0 = (int)cv_bid_y() * NB, lane = (int)cv_lane();
  const int quarters = K / 8;
  const cv_u8* w = m.W + (long)m.row * (K / 32) * 34;
  float sum[NB];
  CV_UNROLL for (int r = 0; r < NB; ++r) sum[r] = 0.0f;
  for (int q0 = lane; q0 < quarters; q0 += CV_WAVE * kUnroll) {
    cv_u16 wq[kUnroll][4];
    float d[kUnroll];
    CV_UNROLL for (int u = 0; u < kUnroll; ++u) {
      const int q = q0 + u * CV_WAVE;
      const bool ok = q < quarters;
      const cv_u8* blk = w + (ok ? q : 0) / 4 * 34;
      const cv_u16* qs = (const cv_u16*)(blk + 2 + (q & 3) * 8);
      CV_UNROLL for (int i = 0; i < 4; ++i) wq[u][i] = ok ? qs[i] : (cv_u16)0;
      d[u] = ok ? load_half(blk) : 0.0f;
    }
    CV_UNROLL for (int u = 0; u < kUnroll; ++u) {
      const int q = q0 + u * CV_WAVE;
      if (q >= quarters) break;
      float wv[8];
      CV_UNROLL for (int i = 0; i < 4; ++i) {
        wv[2 * i] = (float)(cv_i8)(wq[u][i] & 0xFF);
        wv[2 * i + 1] = (float)(cv_i8)(wq[u][i] >> 8);
      }
      CV_UNROLL for (int r = 0; r < NB; ++r) {
        if (NB > 1 && b0 + r >= B) break;
        const long xi = (long)(b0 + r) * K + q * 8;
        float dot = 0.0f;
        CV_UNROLL for (int i = 0; i < 8; ++i) dot += wv[i] * act(a.x, a.x_up, xi + i);
        sum[r] += d[u] * dot;
      }
    }
  }
  reduce_store<NB>(sum, m, b0, B, a.accumulate);
}

// Q4_K: the wave takes a super-block per step, lane t reads 4 bytes of chunk j = t/8: low
// nibbles are values 64j+l, high nibbles 64j+32+l; kUnroll super-blocks are loaded at once.
template <int NB>
CV_DEVICE void matvec_q4_k(const MatvecArgs& a) {
  const RowOf m = row_of(a);
  if (!m.W) return;
  const int K = a.K, B = a.B, b0 = (int)cv_bid_y() * NB, lane = (int)cv_lane();
  const int blocks = K / 256;
  const cv_u8* w = m.W + (long)m.row * blocks * 144;
  const int chunk = lane >> 3, l0 = (lane & 7) * 4;
  float sum[NB];
  CV_UNROLL for (int r = 0; r < NB; ++r) sum[r] = 0.0f;
  for (int bb = 0; bb < blocks; bb += kUnroll) {
    cv_u32 qv[kUnroll], dd[kUnroll];
    CV_UNROLL for (int u = 0; u < kUnroll; ++u) {
      const bool ok = bb + u < blocks;
      const cv_u8* blk = w + (ok ? bb + u : 0) * 144;
      qv[u] = ok ? *(const cv_u32*)(blk + 16 + chunk * 32 + l0) : 0u;
      dd[u] = ok ? *(const cv_u32*)blk : 0u; // d and dmin
    }
    CV_UNROLL for (int u = 0; u < kUnroll; ++u) {
      if (bb + u >= blocks) break;
      const int b = bb + u;
      const float d = (float)__builtin_bit_cast(cv_half, (cv_u16)(dd[u] & 0xFFFF));
      const float dmin = (float)__builtin_bit_cast(cv_half, (cv_u16)(dd[u] >> 16));
      float sc_lo, mn_lo, sc_hi, mn_hi;
      q4k_scale_min(2 * chunk, w + b * 144 + 4, &sc_lo, &mn_lo);
      q4k_scale_min(2 * chunk + 1, w + b * 144 + 4, &sc_hi, &mn_hi);
      CV_UNROLL for (int r = 0; r < NB; ++r) {
        if (NB > 1 && b0 + r >= B) break;
        const long i_lo = (long)(b0 + r) * K + b * 256 + chunk * 64 + l0, i_hi = i_lo + 32;
        float dot_lo = 0.0f, dot_hi = 0.0f, xs_lo = 0.0f, xs_hi = 0.0f;
        CV_UNROLL for (int i = 0; i < 4; ++i) {
          const cv_u32 byte = (qv[u] >> (8 * i)) & 0xFF;
          const float x_lo = act(a.x, a.x_up, i_lo + i), x_hi = act(a.x, a.x_up, i_hi + i);
          dot_lo += (float)(byte & 0xF) * x_lo;
          dot_hi += (float)(byte >> 4) * x_hi;
          xs_lo += x_lo;
          xs_hi += x_hi;
        }
        sum[r] += d * (sc_lo * dot_lo + sc_hi * dot_hi) - dmin * (mn_lo * xs_lo + mn_hi * xs_hi);
      }
    }
  }
  reduce_store<NB>(sum, m, b0, B, a.accumulate);
}

// Q6_K: the wave takes a super-block per step, lane l position l of each 128-value half
// (4 values per half); kUnroll super-blocks are loaded at once.
template <int NB>
CV_DEVICE void matvec_q6_k(const MatvecArgs& a) {
  const RowOf m = row_of(a);
  if (!m.W) return;
  const int K = a.K, B = a.B, b0 = (int)cv_bid_y() * NB, l = (int)cv_lane();
  const int blocks = K / 256;
  const cv_u8* w = m.W + (long)m.row * blocks * 210;
  float sum[NB];
  CV_UNROLL for (int r = 0; r < NB; ++r) sum[r] = 0.0f;
  for (int bb = 0; bb < blocks; bb += kUnroll) {
    cv_u8 ql[kUnroll][4], qh[kUnroll][2];
    CV_UNROLL for (int u = 0; u < kUnroll; ++u) {
      const bool ok = bb + u < blocks;
      const cv_u8* blk = w + (ok ? bb + u : 0) * 210;
      CV_UNROLL for (int half = 0; half < 2; ++half) {
        ql[u][2 * half] = blk[half * 64 + l];
        ql[u][2 * half + 1] = blk[half * 64 + l + 32];
        qh[u][half] = blk[128 + half * 32 + l];
      }
    }
    CV_UNROLL for (int u = 0; u < kUnroll; ++u) {
      if (bb + u >= blocks) break;
      const int b = bb + u;
      const cv_u8* blk = w + b * 210;
      const cv_i8* scales = (const cv_i8*)(blk + 192);
      const float d = load_half(blk + 208);
      CV_UNROLL for (int half = 0; half < 2; ++half) {
        const cv_u8 l_lo = ql[u][2 * half], l_hi = ql[u][2 * half + 1], h = qh[u][half];
        const cv_i8* sc = scales + half * 8 + l / 16;
        const float w1 = d * (float)(sc[0] * ((int)((l_lo & 0xF) | (((h >> 0) & 3) << 4)) - 32));
        const float w2 = d * (float)(sc[2] * ((int)((l_hi & 0xF) | (((h >> 2) & 3) << 4)) - 32));
        const float w3 = d * (float)(sc[4] * ((int)((l_lo >> 4) | (((h >> 4) & 3) << 4)) - 32));
        const float w4 = d * (float)(sc[6] * ((int)((l_hi >> 4) | (((h >> 6) & 3) << 4)) - 32));
        CV_UNROLL for (int r = 0; r < NB; ++r) {
          if (NB > 1 && b0 + r >= B) break;
          const long xi = (long)(b0 + r) * K + b * 256 + half * 128 + l;
          sum[r] += w1 * act(a.x, a.x_up, xi) + w2 * act(a.x, a.x_up, xi + 32) + w3 * act(a.x, a.x_up, xi + 64) +
                    w4 * act(a.x, a.x_up, xi + 96);
        }
      }
    }
  }
  reduce_store<NB>(sum, m, b0, B, a.accumulate);
}

} // namespace

#define CIVETTA_MATVEC_ENTRY(T, NAME, NB)                                                                         \
  CV_KERNEL CV_LAUNCH_BOUNDS(kThreads) void NAME(const cv_u8* W0, float* y0, int N0, const cv_u8* W1, float* y1,  \
                                                 int N1, const cv_u8* W2, float* y2, int N2, const float* x,       \
                                                 const float* x_up, int K, int B, int accumulate) {               \
    matvec_##T<NB>(MatvecArgs{W0, y0, N0, W1, y1, N1, W2, y2, N2, x, x_up, K, B, accumulate});                   \
  }
#define CIVETTA_MATVEC(T)                                                                                         \
  CIVETTA_MATVEC_ENTRY(T, civetta_matvec_##T, 1)                                                                  \
  CIVETTA_MATVEC_ENTRY(T, civetta_matvec_##T##_x4, 4)

CIVETTA_MATVEC(q8_0)
CIVETTA_MATVEC(q4_k)
CIVETTA_MATVEC(q6_k)
