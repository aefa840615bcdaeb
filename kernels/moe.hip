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

// Router top-k on the device (decode; src/model/moe.rs `route` is the host form it follows):
// per token, the probabilities (gating 0: softmax over all n experts, exp(x - max) times the
// reciprocal of their sum; gating 1: the logits themselves), the k largest in descending order
// (ties: lower expert id first), their probabilities as weights (gating 1: softmax over the k
// selected logits), renormalised to sum 1 when `norm` (the sum clamped to f16's smallest
// normal), times `scale` unless it is 0 or 1. Writes ids[t * k + s], weights[t * k + s], and
// the ids again to ids_log when it is not null (the host reads those after the step for the
// expert-load metric). `bias` (gpt-oss's ffn_gate_inp.bias; null for none) is added to each
// logit first, as the host does before `route`. The host sums in f64 and uses the exact exp; here exp is the fast one
// and sums are f32 wave sums, so weights match the host's to a few ulp and the choice is the
// same except on ties closer than that.
// One wave per token: lane l holds experts l, l + 32, ...; n <= 32 * kTopkPerLane, k <= 32.
// Grid: (tokens); block: CV_WAVE threads.
namespace {
constexpr int kTopkPerLane = 16;

CV_DEVICE int shfl_xor_int(int v, unsigned mask) { return __builtin_bit_cast(int, cv_shfl_xor(__builtin_bit_cast(float, v), mask)); }
} // namespace

CV_KERNEL CV_LAUNCH_BOUNDS(CV_WAVE) void civetta_moe_topk(const float* logits, int* ids, float* weights, int* ids_log,
                                                          int n, int k, int gating, int norm, float scale,
                                                          const float* bias) {
  const int t = (int)cv_bid_x(), lane = (int)cv_lane();
  const float* row = logits + (long)t * n;
  const float kNegInf = -__builtin_inff();
  float p[kTopkPerLane];
  float mx = kNegInf;
  CV_UNROLL for (int j = 0; j < kTopkPerLane; ++j) {
    const int e = lane + CV_WAVE * j;
    p[j] = e < n ? (bias ? row[e] + bias[e] : row[e]) : kNegInf;
    mx = __builtin_fmaxf(mx, p[j]);
  }
  if (gating == 0) {
    mx = cv_wave_max(mx);
    float sum = 0.0f;
    CV_UNROLL for (int j = 0; j < kTopkPerLane; ++j) {
      const int e = lane + CV_WAVE * j;
      p[j] = e < n ? cv_exp(p[j] - mx) : 0.0f;
      sum += p[j];
    }
    const float inv = 1.0f / cv_wave_sum(sum);
    CV_UNROLL for (int j = 0; j < kTopkPerLane; ++j) p[j] = (lane + CV_WAVE * j) < n ? p[j] * inv : kNegInf;
  }
  // k rounds of a wave-wide argmax over (value desc, id asc); lane s keeps round s's winner.
  unsigned taken = 0;
  float mine = 0.0f;
  int mine_id = 0;
  for (int s = 0; s < k; ++s) {
    float v = kNegInf;
    int id = 0x7fffffff;
    CV_UNROLL for (int j = 0; j < kTopkPerLane; ++j) {
      const int e = lane + CV_WAVE * j;
      if (e < n && !(taken >> j & 1u) && (p[j] > v || id == 0x7fffffff)) {
        v = p[j];
        id = e;
      }
    }
    for (unsigned m = CV_WAVE / 2; m > 0; m >>= 1) {
      const float ov = cv_shfl_xor(v, m);
      const int oid = shfl_xor_int(id, m);
      if (ov > v || (ov == v && oid < id)) {
        v = ov;
        id = oid;
      }
    }
    if (id % CV_WAVE == lane) taken |= 1u << (id / CV_WAVE);
    if (lane == s) {
      mine = v;
      mine_id = id;
    }
  }
  const bool active = lane < k;
  if (gating == 1) {
    const float m2 = cv_wave_max(active ? mine : kNegInf);
    const float e = active ? cv_exp(mine - m2) : 0.0f;
    mine = e * (1.0f / cv_wave_sum(e));
  }
  if (norm) mine = mine / __builtin_fmaxf(cv_wave_sum(active ? mine : 0.0f), 6.103515625e-5f);
  if (scale != 0.0f && scale != 1.0f) mine *= scale;
  if (active) {
    ids[t * k + lane] = mine_id;
    weights[t * k + lane] = mine;
    if (ids_log) ids_log[t * k + lane] = mine_id;
  }
}
