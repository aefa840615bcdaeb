// KV cache store with the cache row read from device memory, so that a captured decode
// graph stays valid from token to token (docs/GPU.md, "Decode graphs").
//
//   k_cache[pos[t]][i] = (f16)k[t][i],  v_cache[pos[t]][i] = (f16)v[t][i]   for i < kv_dim
//
// k, v: f32 [T][kv_dim] (a sequence's rows of the batch), caches: f16 [S][kv_dim],
// pos: int32 [T] (the rows' positions, the same buffer RoPE reads).
// One thread per element; grid: (ceil(kv_dim/256), T, 2): z = 0 stores k, z = 1 stores v.
//
// civetta_kv_store_prefill_batch_f16: the same for the new rows of several sequences (a batched
// prefill, kernels/attention.hip's civetta_attn_prefill_batch*): grid row r is row t = rows[2r +
// 1] of sequence s = rows[2r], which is row seqs[4s] + t of k and v and goes to position
// seqs[4s + 2] + t of the caches kv[2s] (k) and kv[2s + 1] (v). The same conversion as the
// per-sequence store.
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

CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_kv_store_prefill_batch_f16(const float* k, const float* v, cv_half* const* kv,
                                                                  const int* seqs, const int* rows, int kv_dim) {
  const int i = (int)(cv_bid_x() * 256 + cv_tid_x());
  if (i >= kv_dim) return;
  const long r = cv_bid_y();
  const int s = rows[2 * r], t = rows[2 * r + 1];
  const bool is_v = cv_bid_z() != 0;
  const float* src = is_v ? v : k;
  cv_half* dst = kv[2 * s + (is_v ? 1 : 0)];
  dst[(long)(seqs[4 * s + 2] + t) * kv_dim + i] = (cv_half)src[(long)(seqs[4 * s] + t) * kv_dim + i];
}
