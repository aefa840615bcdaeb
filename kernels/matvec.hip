// Quantised matrix-vector products for decode, reading ggml block layouts directly.
//
//   y[b][n] = sum_k W[n][k] * x[b][k]
//
// W: [N] rows of K/QK ggml blocks, x: f32 [B][K], y: f32 [B][N].
// One wave per output row, 4 waves per workgroup; grid: (ceil(N/4), B).
//   civetta_matvec_q8_0: block_q8_0 { f16 d; int8 qs[32]; }                     (34 bytes / 32)
//   civetta_matvec_q4_k: block_q4_K { f16 d, dmin; u8 scales[12]; u8 qs[128]; } (144 bytes / 256)
//   civetta_matvec_q6_k: block_q6_K { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d; } (210 bytes / 256)
#include "civetta_gpu.h"

namespace {

constexpr int kRowsPerGroup = 4;

CV_DEVICE float load_half(const cv_u8* p) { return (float)*(const cv_half*)p; }

// Row index of this wave, or -1 past the end.
CV_DEVICE int wave_row(int N) {
  const int row = (int)(cv_bid_x() * kRowsPerGroup + cv_tid_x() / CV_WAVE);
  return row < N ? row : -1;
}

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

} // namespace

CV_KERNEL CV_LAUNCH_BOUNDS(128) void civetta_matvec_q8_0(const cv_u8* W, const float* x, float* y, int N, int K) {
  const int row = wave_row(N);
  if (row < 0) return;
  const int blocks = K / 32;
  const cv_u8* w = W + (long)row * blocks * 34;
  const float* xb = x + (long)cv_bid_y() * K;
  const int lane = (int)cv_lane(), sub = lane & 7; // 8 lanes per block, 4 values each
  float sum = 0.0f;
  for (int b = lane >> 3; b < blocks; b += 4) {
    const cv_u8* blk = w + b * 34;
    const cv_u16 lo = *(const cv_u16*)(blk + 2 + sub * 4), hi = *(const cv_u16*)(blk + 4 + sub * 4);
    const float* xv = xb + b * 32 + sub * 4;
    const float dot = (float)(cv_i8)(lo & 0xFF) * xv[0] + (float)(cv_i8)(lo >> 8) * xv[1] +
                      (float)(cv_i8)(hi & 0xFF) * xv[2] + (float)(cv_i8)(hi >> 8) * xv[3];
    sum += load_half(blk) * dot;
  }
  sum = cv_wave_sum(sum);
  if (lane == 0) y[(long)cv_bid_y() * N + row] = sum;
}

CV_KERNEL CV_LAUNCH_BOUNDS(128) void civetta_matvec_q4_k(const cv_u8* W, const float* x, float* y, int N, int K) {
  const int row = wave_row(N);
  if (row < 0) return;
  const int blocks = K / 256;
  const cv_u8* w = W + (long)row * blocks * 144;
  const float* xr = x + (long)cv_bid_y() * K;
  const int lane = (int)cv_lane();
  // Lane t reads 4 bytes of chunk j = t/8: low nibbles are values 64j+l, high nibbles 64j+32+l.
  const int chunk = lane >> 3, l0 = (lane & 7) * 4;
  float sum = 0.0f;
  for (int b = 0; b < blocks; ++b) {
    const cv_u8* blk = w + b * 144;
    const float d = load_half(blk), dmin = load_half(blk + 2);
    float sc_lo, mn_lo, sc_hi, mn_hi;
    q4k_scale_min(2 * chunk, blk + 4, &sc_lo, &mn_lo);
    q4k_scale_min(2 * chunk + 1, blk + 4, &sc_hi, &mn_hi);
    const cv_u32 q = *(const cv_u32*)(blk + 16 + chunk * 32 + l0);
    const float* x_lo = xr + b * 256 + chunk * 64 + l0;
    const float* x_hi = x_lo + 32;
    float dot_lo = 0.0f, dot_hi = 0.0f, xs_lo = 0.0f, xs_hi = 0.0f;
    for (int i = 0; i < 4; ++i) {
      const cv_u32 byte = (q >> (8 * i)) & 0xFF;
      dot_lo += (float)(byte & 0xF) * x_lo[i];
      dot_hi += (float)(byte >> 4) * x_hi[i];
      xs_lo += x_lo[i];
      xs_hi += x_hi[i];
    }
    sum += d * (sc_lo * dot_lo + sc_hi * dot_hi) - dmin * (mn_lo * xs_lo + mn_hi * xs_hi);
  }
  sum = cv_wave_sum(sum);
  if (lane == 0) y[(long)cv_bid_y() * N + row] = sum;
}

CV_KERNEL CV_LAUNCH_BOUNDS(128) void civetta_matvec_q6_k(const cv_u8* W, const float* x, float* y, int N, int K) {
  const int row = wave_row(N);
  if (row < 0) return;
  const int blocks = K / 256;
  const cv_u8* w = W + (long)row * blocks * 210;
  const float* xr = x + (long)cv_bid_y() * K;
  const int l = (int)cv_lane(); // position within each 128-value half
  float sum = 0.0f;
  for (int b = 0; b < blocks; ++b) {
    const cv_u8* blk = w + b * 210;
    const cv_i8* scales = (const cv_i8*)(blk + 192);
    const float d = load_half(blk + 208);
    for (int half = 0; half < 2; ++half) {
      const cv_u8* ql = blk + half * 64;
      const cv_u8 qh = blk[128 + half * 32 + l];
      const cv_i8* sc = scales + half * 8 + l / 16;
      const float* xv = xr + b * 256 + half * 128 + l;
      const int q1 = (int)((ql[l] & 0xF) | (((qh >> 0) & 3) << 4)) - 32;
      const int q2 = (int)((ql[l + 32] & 0xF) | (((qh >> 2) & 3) << 4)) - 32;
      const int q3 = (int)((ql[l] >> 4) | (((qh >> 4) & 3) << 4)) - 32;
      const int q4 = (int)((ql[l + 32] >> 4) | (((qh >> 6) & 3) << 4)) - 32;
      sum += d * ((float)(sc[0] * q1) * xv[0] + (float)(sc[2] * q2) * xv[32] + (float)(sc[4] * q3) * xv[64] +
                  (float)(sc[6] * q4) * xv[96]);
    }
  }
  sum = cv_wave_sum(sum);
  if (l == 0) y[(long)cv_bid_y() * N + row] = sum;
}
