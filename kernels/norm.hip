// RMSNorm: y[r][i] = x[r][i] / sqrt(mean_i(x[r]^2) + eps) * w[i]
// x, y: f32 [rows][n] (y may alias x), w: f32 [n]. One workgroup per row: 256 threads, 1024 for
// the q8_1 variant. That one runs in decode, where one row is the whole launch and its time a
// chain of dependent steps: with 8 waves it quantised 1536 values in 6 rounds of two wave
// reductions each, with 32 waves in 2. (The plain kernel keeps 256: it also normalises Qwen3's
// 128-wide q/k heads, thousands of rows in a prefill.)
#include "civetta_gpu.h"

namespace {
// 1 / sqrt(mean(x^2) + eps) of the row at xr, the same value in every thread of the kThreads.
template <int kThreads>
CV_DEVICE float rms_inv(const float* xr, int n, float eps) {
  __shared__ float partial[kThreads / CV_WAVE];
  const int tid = (int)cv_tid_x();
  float ss = 0.0f;
  for (int i = tid; i < n; i += kThreads) ss += xr[i] * xr[i];
  ss = cv_wave_sum(ss);
  if (cv_lane() == 0) partial[tid / CV_WAVE] = ss;
  cv_sync();
  float total = 0.0f;
  for (int k = 0; k < kThreads / CV_WAVE; ++k) total += partial[k];
  return cv_rsqrt(total / (float)n + eps);
}
} // namespace

CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_rmsnorm(const float* x, const float* w, float* y, int n, float eps) {
  cv_follow_prior_kernels();
  const long row = cv_bid_x();
  const float* xr = x + row * n;
  float* yr = y + row * n;
  const float inv = rms_inv<256>(xr, n, eps);
  for (int i = (int)cv_tid_x(); i < n; i += 256) yr[i] = xr[i] * inv * w[i];
}

// The same RMSNorm, also writing its output as the q8_1 blocks of the next decode mat-vec
// (cv_quantize_q8_1_block: q int8 [rows][n], ds f32 [rows][n/32][2] = (d, d * sum q)), which
// saves that mat-vec its quantiser launch. n % 32 == 0.
CV_KERNEL CV_LAUNCH_BOUNDS(1024) void civetta_rmsnorm_q8_1(const float* x, const float* w, float* y, int n, float eps,
                                                               cv_i8* q, float* ds) {
  cv_follow_prior_kernels();
  const long row = cv_bid_x();
  const float* xr = x + row * n;
  float* yr = y + row * n;
  const float inv = rms_inv<1024>(xr, n, eps);
  // One wave per block of 32 outputs.
  for (int b = (int)cv_tid_x() / CV_WAVE; b < n / 32; b += 1024 / CV_WAVE) {
    const int i = b * 32 + (int)cv_lane();
    const float v = xr[i] * inv * w[i];
    yr[i] = v;
    cv_quantize_q8_1_block(v, q + row * n + b * 32, ds + (row * (n / 32) + b) * 2);
  }
}
