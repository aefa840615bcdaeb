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
