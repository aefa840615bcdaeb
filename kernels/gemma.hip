// Element-wise ops of Gemma 3's forward pass (src/model: gemma3).
#include "civetta_gpu.h"

namespace {
constexpr float kGeluCoefA = 0.044715f;
constexpr float kSqrt2OverPi = 0.7978845608028654f;

// ggml's CPU GeGLU reads GELU from a table indexed by the f16 bits of x holding
// f16(gelu(x)) (GGML_GELU_FP16, src/backend/geglu.rs): x is rounded to f16 on the way in
// and the GELU to f16 on the way out; outside (-10, 10) it is 0 or x.
CV_DEVICE float gelu_f16_table(float x) {
  const float h = (float)(cv_half)x;
  const float y = kSqrt2OverPi * h * __builtin_fmaf(kGeluCoefA * h, h, 1.0f); // fused as in ggml (geglu.rs)
  const float tanh_y = 1.0f - 2.0f * cv_rcp(1.0f + cv_exp(2.0f * y)); // saturates to +-1 for large |y|
  return (float)(cv_half)(0.5f * h * (1.0f + tanh_y));
}
} // namespace

// out[i] = gelu_tanh(gate[i]) * up[i] (GeGLU), f32 [n]; 256 threads per workgroup.
CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_gelu_tanh_mul(const float* gate, const float* up, float* out, int n) {
  const long i = (long)cv_bid_x() * 256 + cv_tid_x();
  if (i >= n) return;
  const float x = gate[i];
  out[i] = x <= -10.0f ? 0.0f : x >= 10.0f ? x * up[i] : gelu_f16_table(x) * up[i];
}

// x[i] *= s over f32 [n] (the embedding scale sqrt(n_embd)).
CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_scale(float* x, int n, float s) {
  const long i = (long)cv_bid_x() * 256 + cv_tid_x();
  if (i < n) x[i] *= s;
}
