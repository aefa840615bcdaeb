// Rotary position embedding, in place, on x: f32 [tokens][heads][head_dim].
// The first n_rot dims of each head rotate by theta = pos * freq_base^(-2i/n_rot);
// pos: int32 [tokens]. One thread per rotated pair; grid: (ceil(heads*n_rot/2/256), tokens).
//   civetta_rope_norm: pairs (2i, 2i+1)            (llama, ggml mode 0)
//   civetta_rope_neox: pairs (i, i + n_rot/2)       (neox / qwen, ggml mode 2)
// Both take ggml's rope_ext scaling (linear / YaRN): the angle freq_scale * theta, blended towards
// theta below YaRN's ramp over the pair index [corr_low, corr_high] by ext_factor, cos and sin
// times `magnitude` (attn_factor, and with YaRN 1 + 0.1 ln(1 / freq_scale): computed on the host).
// Plain RoPE passes (1, 0, 1, 0, 0): the same arithmetic as without scaling, bit for bit.
#include "civetta_gpu.h"

namespace {
// Rotates pair i of the head at h (position `pos`).
template <bool NEOX>
CV_DEVICE void rope_pair(float* h, int pos, int i, int n_rot, float freq_base, float freq_scale, float ext_factor,
                         float magnitude, float corr_low, float corr_high) {
  const int pairs = n_rot / 2;
  // freq_base^(-2i/n_rot) = 2^(-2i/n_rot * log2(freq_base))
  const float theta_extrap = (float)pos * cv_exp2(-2.0f * (float)i / (float)n_rot * cv_log2(freq_base));
  float theta = freq_scale * theta_extrap;
  if (ext_factor != 0.0f) {
    const float ramp = 1.0f - __builtin_fminf(1.0f, __builtin_fmaxf(0.0f, ((float)i - corr_low) / __builtin_fmaxf(0.001f, corr_high - corr_low)));
    const float mix = ramp * ext_factor;
    theta = theta * (1.0f - mix) + theta_extrap * mix;
  }
  float s, c;
  cv_sincos(theta, &s, &c);
  s *= magnitude;
  c *= magnitude;
  const int a = NEOX ? i : 2 * i, b = NEOX ? i + pairs : 2 * i + 1;
  const float x0 = h[a], x1 = h[b];
  h[a] = x0 * c - x1 * s;
  h[b] = x0 * s + x1 * c;
}

template <bool NEOX>
CV_DEVICE void rope(float* x, const int* pos, int heads, int head_dim, int n_rot, float freq_base, float freq_scale,
                    float ext_factor, float magnitude, float corr_low, float corr_high) {
  const int pairs = n_rot / 2;
  const int p = (int)(cv_bid_x() * 256 + cv_tid_x());
  if (p >= heads * pairs) return;
  const int head = p / pairs, i = p % pairs;
  const long token = cv_bid_y();
  rope_pair<NEOX>(x + (token * heads + head) * head_dim, pos[token], i, n_rot, freq_base, freq_scale, ext_factor,
                  magnitude, corr_low, corr_high);
}

// q (q_heads per row) and k (k_heads per row) of the same rows in one launch: pairs
// 0 .. q_heads*pairs-1 rotate q, the rest k, each exactly as `rope` would.
template <bool NEOX>
CV_DEVICE void rope_qk(float* q, float* k, const int* pos, int q_heads, int k_heads, int head_dim, int n_rot,
                       float freq_base, float freq_scale, float ext_factor, float magnitude, float corr_low,
                       float corr_high) {
  cv_follow_prior_kernels();
  const int pairs = n_rot / 2;
  const int p = (int)(cv_bid_x() * 256 + cv_tid_x());
  if (p >= (q_heads + k_heads) * pairs) return;
  const int head = p / pairs, i = p % pairs;
  const long token = cv_bid_y();
  float* h = head < q_heads ? q + (token * q_heads + head) * head_dim
                            : k + (token * k_heads + (head - q_heads)) * head_dim;
  rope_pair<NEOX>(h, pos[token], i, n_rot, freq_base, freq_scale, ext_factor, magnitude, corr_low, corr_high);
}
} // namespace

CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_rope_norm(float* x, const int* pos, int heads, int head_dim, int n_rot,
                                                         float freq_base, float freq_scale, float ext_factor,
                                                         float magnitude, float corr_low, float corr_high) {
  rope<false>(x, pos, heads, head_dim, n_rot, freq_base, freq_scale, ext_factor, magnitude, corr_low, corr_high);
}
CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_rope_neox(float* x, const int* pos, int heads, int head_dim, int n_rot,
                                                         float freq_base, float freq_scale, float ext_factor,
                                                         float magnitude, float corr_low, float corr_high) {
  rope<true>(x, pos, heads, head_dim, n_rot, freq_base, freq_scale, ext_factor, magnitude, corr_low, corr_high);
}

// RoPE of q and k in one launch (decode's launch count): grid (ceil((q_heads + k_heads) *
// n_rot/2 / 256), tokens); the same numbers as civetta_rope_{norm,neox} on each.
CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_rope_qk_norm(float* q, float* k, const int* pos, int q_heads, int k_heads,
                                                            int head_dim, int n_rot, float freq_base, float freq_scale,
                                                            float ext_factor, float magnitude, float corr_low,
                                                            float corr_high) {
  rope_qk<false>(q, k, pos, q_heads, k_heads, head_dim, n_rot, freq_base, freq_scale, ext_factor, magnitude, corr_low,
                 corr_high);
}
CV_KERNEL CV_LAUNCH_BOUNDS(256) void civetta_rope_qk_neox(float* q, float* k, const int* pos, int q_heads, int k_heads,
                                                            int head_dim, int n_rot, float freq_base, float freq_scale,
                                                            float ext_factor, float magnitude, float corr_low,
                                                            float corr_high) {
  rope_qk<true>(q, k, pos, q_heads, k_heads, head_dim, n_rot, freq_base, freq_scale, ext_factor, magnitude, corr_low,
                corr_high);
}
