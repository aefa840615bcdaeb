// Element-wise ops of gpt-oss's forward pass (src/model: gpt-oss experts).
#include "civetta_gpu.h"

// out[i] = swiglu_oai(gate[i], up[i]) (cv_swiglu_oai, civetta_gpu.h). f32 [n]; 256 threads per
// workgroup.
CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_swiglu_oai(const float* gate, const float* up, float* out, int n) {
  const long i = (long)cv_bid_x() * 256 + cv_tid_x();
  if (i >= n) return;
  out[i] = cv_swiglu_oai(gate[i], up[i]);
}
