// KV cache store with the cache row read from device memory, so that a captured decode
// graph stays valid from token to token (docs/GPU.md, "Decode graphs").
//
//   k_cache[pos[t]][i] = (f16)k[t][i],  v_cache[pos[t]][i] = (f16)v[t][i]   for i < kv_dim
//
// k, v: f32 [T][kv_dim] (a sequence's rows of the batch), caches: f16 [S][kv_dim],
// pos: int32 [T] (the rows' positions, the same buffer RoPE reads).
// One thread per element; grid: (ceil(kv_dim/256), T, 2): z = 0 stores k, z = 1 stores v.
#include "civetta_gpu.h"

CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_kv_store_f16(const float* k, const float* v, cv_half* k_cache,
                                                            cv_half* v_cache, const int* pos, int kv_dim) {
  const int i = (int)(cv_bid_x() * 256 + cv_tid_x());
  if (i >= kv_dim) return;
  const long t = cv_bid_y();
  const bool is_v = cv_bid_z() != 0;
  const float* src = is_v ? v : k;
  cv_half* dst = is_v ? v_cache : k_cache;
  dst[(long)pos[t] * kv_dim + i] = (cv_half)src[t * kv_dim + i];
}
