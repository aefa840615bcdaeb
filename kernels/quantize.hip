// Activation quantisation for the W8A8 GEMM: f32 -> int8 with one f32 scale per 32 values.
//
//   scale[b] = max|x[32b .. 32b+31]| / 127,   q[i] = round(x[i] / scale[b])
//
// x: f32 [n], q: int8 [n], scale: f32 [n/32]; n must be a multiple of 32 (rows of
// [M][K] with K % 32 == 0 are contiguous, so a whole activation matrix is one call).
// One wave per block of 32; grid: ceil(n/32/8) workgroups of 256 threads.
#include "civetta_gpu.h"

CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_quantize_act_q8(const float* x, cv_i8* q, float* scale, int n) {
  const int block = (int)(cv_bid_x() * 8 + cv_tid_x() / CV_WAVE);
  if (block * 32 >= n) return;
  const int i = block * 32 + (int)cv_lane();
  const float v = x[i];
  const float amax = cv_wave_max(__builtin_fabsf(v));
  const float d = amax / 127.0f;
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  q[i] = (cv_i8)__builtin_rintf(v * inv);
  if (cv_lane() == 0) scale[block] = d;
}

// Decode mat-vec input (kernels/matvec_dp4a.hip): x, or when up != null the gated activation
// folded into the down projection's input: act 0 silu(x) * up (SwiGLU), act 1 gpt-oss's
// swiglu_oai(x, up) (cv_swiglu_oai, as kernels/gpt_oss.hip), as int8 blocks of 32 with the scale d and
// s = d * (sum of the block's q), which Q4_K's min term needs: q: int8 [n], ds: f32 [n/32][2] = (d, s).
// Same rounding as civetta_quantize_act_q8. One wave per block; grid: ceil(n/32/8) x 256 threads.
CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_quantize_q8_1(const float* x, const float* up, cv_i8* q, float* ds, int n,
                                                           int act) {
  cv_follow_prior_kernels();
  const int block = (int)(cv_bid_x() * 8 + cv_tid_x() / CV_WAVE);
  if (block * 32 >= n) return;
  const int i = block * 32 + (int)cv_lane();
  float v = x[i];
  if (up && act == 1) {
    v = cv_swiglu_oai(v, up[i]); // the arithmetic of civetta_swiglu_oai
  } else if (up) {
    v = v * cv_rcp(1.0f + cv_exp(-v)) * up[i]; // the arithmetic of civetta_silu_mul
  }
  cv_quantize_q8_1_block(v, q + block * 32, ds + 2 * block);
}
