// RMSNorm: y[r][i] = x[r][i] / sqrt(mean_i(x[r]^2) + eps) * w[i]
// x, y: f32 [rows][n] (y may alias x), w: f32 [n]. One workgroup of 256 threads per row.
#include "civetta_gpu.h"

CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_rmsnorm(const float* x, const float* w, float* y, int n, float eps) {
  __shared__ float partial[256 / CV_WAVE];
  const long row = cv_bid_x();
  const float* xr = x + row * n;
  float* yr = y + row * n;
  const int tid = (int)cv_tid_x();

  float ss = 0.0f;
  for (int i = tid; i < n; i += 256) ss += xr[i] * xr[i];
  ss = cv_wave_sum(ss);
  if (cv_lane() == 0) partial[tid / CV_WAVE] = ss;
  cv_sync();
  float total = 0.0f;
  for (int k = 0; k < 256 / CV_WAVE; ++k) total += partial[k];
  const float inv = cv_rsqrt(total / (float)n + eps);
  for (int i = tid; i < n; i += 256) yr[i] = xr[i] * inv * w[i];
}

// The same RMSNorm, also writing its output as the q8_1 blocks of the next decode mat-vec
// (civetta_quantize_q8_1's format and arithmetic: q int8 [rows][n], ds f32 [rows][n/32][2] =
// (d, d * sum q)), which saves that mat-vec its quantiser launch. n % 32 == 0.
CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_rmsnorm_q8_1(const float* x, const float* w, float* y, int n, float eps,
                                                          cv_i8* q, float* ds) {
  __shared__ float partial[256 / CV_WAVE];
  const long row = cv_bid_x();
  const float* xr = x + row * n;
  float* yr = y + row * n;
  const int tid = (int)cv_tid_x();

  float ss = 0.0f;
  for (int i = tid; i < n; i += 256) ss += xr[i] * xr[i];
  ss = cv_wave_sum(ss);
  if (cv_lane() == 0) partial[tid / CV_WAVE] = ss;
  cv_sync();
  float total = 0.0f;
  for (int k = 0; k < 256 / CV_WAVE; ++k) total += partial[k];
  const float inv = cv_rsqrt(total / (float)n + eps);
  // One wave per block of 32 outputs.
  for (int b = tid / CV_WAVE; b < n / 32; b += 256 / CV_WAVE) {
    const int i = b * 32 + (int)cv_lane();
    const float v = xr[i] * inv * w[i];
    yr[i] = v;
    const float amax = cv_wave_max(__builtin_fabsf(v));
    const float qv = __builtin_rintf(v * (amax > 0.0f ? 127.0f / amax : 0.0f));
    const float sum = cv_wave_sum(qv);
    q[row * n + i] = (cv_i8)qv;
    if (cv_lane() == 0) {
      ds[(row * (n / 32) + b) * 2] = amax / 127.0f;
      ds[(row * (n / 32) + b) * 2 + 1] = amax / 127.0f * sum;
    }
  }
}
