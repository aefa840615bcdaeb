// Mixture-of-experts helpers of the GPU backends (qwen3moe, qwen2moe): the router in f32, and
// the row movement src/model/moe.rs drives through the Backend trait (gather a routed expert's
// tokens, scatter its outputs to their (token, slot) rows, the weighted sum over the slots).
// The expert matrices themselves run through the dense mat-vec / GEMM kernels unchanged.
#include "civetta_gpu.h"

// out[t][r] = dot(x[t], w[r]) over k, all f32: x [rows][k], w [n][k], out [rows][n]. The MoE
// routers (n = expert count, or 1 for qwen2moe's shared-expert gate) stay f32 so that the
// top-k choice sees the same logits as on the CPU as closely as possible. One workgroup of 256
// threads per output value: grid (n, rows).
CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_moe_router_f32(const float* x, const float* w, float* out, int n, int k) {
  __shared__ float partial[256 / CV_WAVE];
  const int r = (int)cv_bid_x(), t = (int)cv_bid_y(), tid = (int)cv_tid_x();
  const float* xr = x + (long)t * k;
  const float* wr = w + (long)r * k;
  float acc = 0.0f;
  for (int i = tid; i < k; i += 256) acc += xr[i] * wr[i];
  acc = cv_wave_sum(acc);
  if (cv_lane() == 0) partial[tid / CV_WAVE] = acc;
  cv_sync();
  if (tid == 0) {
    float s = 0.0f;
    for (int i = 0; i < 256 / CV_WAVE; ++i) s += partial[i];
    out[(long)t * n + r] = s;
  }
}

// dst[i] = src[idx[i]], rows of `dim` f32. Grid (ceil(dim / 256), number of rows).
CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_moe_gather_rows(const float* src, const int* idx, float* dst, int dim) {
  const int c = (int)(cv_bid_x() * 256 + cv_tid_x());
  const long i = cv_bid_y();
  if (c < dim) dst[i * dim + c] = src[(long)idx[i] * dim + c];
}

// dst[idx[i]] = src[i], rows of `dim` f32 (no index twice). Grid (ceil(dim / 256), rows).
CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_moe_scatter_rows(const float* src, const int* idx, float* dst, int dim) {
  const int c = (int)(cv_bid_x() * 256 + cv_tid_x());
  const long i = cv_bid_y();
  if (c < dim) dst[(long)idx[i] * dim + c] = src[i * dim + c];
}

// out[t] = sum over s < k of w[t * k + s] * src[t * k + s], rows of `dim` f32, as ggml adds the
// expert outputs (and as the CPU backend does): each product rounded to f32, then added in slot
// order starting from slot 0's product (no fused multiply-add). Grid (ceil(dim / 256), tokens).
CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_moe_weighted_sum(const float* src, const float* w, float* out, int k, int dim) {
  const int c = (int)(cv_bid_x() * 256 + cv_tid_x());
  const long t = cv_bid_y();
  if (c >= dim) return;
  float acc = cv_mul_nofma(src[(t * k) * dim + c], w[t * k]);
  for (int s = 1; s < k; ++s) acc += cv_mul_nofma(src[(t * k + s) * dim + c], w[t * k + s]);
  out[t * dim + c] = acc;
}

// x[r] *= s[r], rows of `dim` f32 (qwen2moe's shared-expert gate). Grid (ceil(dim / 256), rows).
CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_moe_scale_rows(float* x, const float* s, int dim) {
  const int c = (int)(cv_bid_x() * 256 + cv_tid_x());
  const long r = cv_bid_y();
  if (c < dim) x[r * dim + c] *= s[r];
}
