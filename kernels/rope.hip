// Rotary position embedding, in place, on x: f32 [tokens][heads][head_dim].
// The first n_rot dims of each head rotate by theta = pos * freq_base^(-2i/n_rot);
// pos: int32 [tokens]. One thread per rotated pair; grid: (ceil(heads*n_rot/2/256), tokens).
//   civetta_rope_norm: pairs (2i, 2i+1)            (llama, ggml mode 0)
//   civetta_rope_neox: pairs (i, i + n_rot/2)       (neox / qwen, ggml mode 2)
#include "civetta_gpu.h"

namespace {
template <bool NEOX>
CV_DEVICE void rope(float* x, const int* pos, int heads, int head_dim, int n_rot, float freq_base) {
  const int pairs = n_rot / 2;
  const int p = (int)(cv_bid_x() * 256 + cv_tid_x());
  if (p >= heads * pairs) return;
  const int head = p / pairs, i = p % pairs;
  const long token = cv_bid_y();
  float* h = x + (token * heads + head) * head_dim;
  // freq_base^(-2i/n_rot) = 2^(-2i/n_rot * log2(freq_base))
  const float theta = (float)pos[token] * cv_exp2(-2.0f * (float)i / (float)n_rot * cv_log2(freq_base));
  float s, c;
  cv_sincos(theta, &s, &c);
  const int a = NEOX ? i : 2 * i, b = NEOX ? i + pairs : 2 * i + 1;
  const float x0 = h[a], x1 = h[b];
  h[a] = x0 * c - x1 * s;
  h[b] = x0 * s + x1 * c;
}
} // namespace

CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_rope_norm(float* x, const int* pos, int heads, int head_dim, int n_rot,
                                                         float freq_base) {
  rope<false>(x, pos, heads, head_dim, n_rot, freq_base);
}
CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_rope_neox(float* x, const int* pos, int heads, int head_dim, int n_rot,
                                                         float freq_base) {
  rope<true>(x, pos, heads, head_dim, n_rot, freq_base);
}
