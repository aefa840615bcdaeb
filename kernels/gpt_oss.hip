// Element-wise ops of gpt-oss's forward pass (src/model: gpt-oss experts).
#include "civetta_gpu.h"

// out[i] = swiglu_oai(gate[i], up[i]) as ggml's CPU swiglu_oai (src/backend: swiglu_oai_host):
// x = min(gate, 7), y = clamp(up, -7, 7), out = x / (1 + e^(-1.702 x)) * (y + 1). f32 [n]; 256
// threads per workgroup.
CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_swiglu_oai(const float* gate, const float* up, float* out, int n) {
  const long i = (long)cv_bid_x() * 256 + cv_tid_x();
  if (i >= n) return;
  const float x = __builtin_fminf(gate[i], 7.0f);
  const float y = __builtin_fminf(__builtin_fmaxf(up[i], -7.0f), 7.0f);
  out[i] = x / (1.0f + cv_exp(-1.702f * x)) * (y + 1.0f);
}
