// Element-wise and row-wise kernels of the MLP and the logits.
#include "civetta_gpu.h"

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + e^-g). f32 [n]; 256 threads per workgroup.
CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_silu_mul(const float* gate, const float* up, float* out, int n) {
  const long i = (long)cv_bid_x() * 256 + cv_tid_x();
  if (i >= n) return;
  const float g = gate[i];
  out[i] = g * cv_rcp(1.0f + cv_exp(-g)) * up[i];
}

// In-place softmax of each row of x: f32 [rows][n], after multiplying by `scale`.
// One workgroup of 256 threads per row.
CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_softmax(float* x, int n, float scale) {
  __shared__ float partial[256 / CV_WAVE];
  float* row = x + (long)cv_bid_x() * n;
  const int tid = (int)cv_tid_x(), wave = tid / CV_WAVE;

  float m = -__builtin_inff();
  for (int i = tid; i < n; i += 256) m = __builtin_fmaxf(m, row[i] * scale);
  m = cv_wave_max(m);
  if (cv_lane() == 0) partial[wave] = m;
  cv_sync();
  m = partial[0];
  for (int k = 1; k < 256 / CV_WAVE; ++k) m = __builtin_fmaxf(m, partial[k]);
  cv_sync(); // everyone has read the maxima before the sums overwrite them

  float sum = 0.0f;
  for (int i = tid; i < n; i += 256) {
    const float e = cv_exp(row[i] * scale - m);
    row[i] = e;
    sum += e;
  }
  sum = cv_wave_sum(sum);
  if (cv_lane() == 0) partial[wave] = sum;
  cv_sync();
  sum = 0.0f;
  for (int k = 0; k < 256 / CV_WAVE; ++k) sum += partial[k];
  const float inv = 1.0f / sum;
  for (int i = tid; i < n; i += 256) row[i] *= inv;
}

// x[i] += y[i] over f32 [n] (the residual adds).
CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_add(float* x, const float* y, int n) {
  const long i = (long)cv_bid_x() * 256 + cv_tid_x();
  if (i < n) x[i] += y[i];
}

// x[i] += b[i % width] over f32 [n] (bias of each row of a [rows][width] matrix).
CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_add_bias(float* x, const float* b, int n, int width) {
  const long i = (long)cv_bid_x() * 256 + cv_tid_x();
  if (i < n) x[i] += b[i % width];
}

// y[i] = (f16)x[i] over [n]: GEMM activations and the f16 KV cache stores.
CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_f32_to_f16(const float* x, cv_half* y, int n) {
  const long i = (long)cv_bid_x() * 256 + cv_tid_x();
  if (i < n) y[i] = (cv_half)x[i];
}
