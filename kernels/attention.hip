// Attention over an f16 KV cache with grouped-query heads (GQA).
//
// q: f32 [T][Hq][D], k_cache, v_cache: f16 [S][Hkv][D], out: f32 [T][Hq][D];
// query head h reads KV head h / (Hq / Hkv). `scale` is usually 1/sqrt(D).
//
// civetta_attn_prefill_d{64,128,256}: causal, tiled (flash-attention style online softmax).
//   Query t sits at position q_pos0 + t and sees keys 0 ..= q_pos0 + t (keys < S); with
//   window > 0 (sliding-window layers, Gemma 3) only keys q_pos0 + t - window + 1 ..= q_pos0 + t.
//   32 queries per workgroup, D/32 threads per query up to D = 128 (4), 8 at D = 256 (so
//   each thread keeps 32 dims of q and of the output in registers), 32-key tiles in LDS.
//   Grid: (ceil(T/32), Hq); block: 128 threads (D <= 128) or 256 (D = 256).
// civetta_attn_prefill_mma_d{64,128}: the same contract on the 16x16x16 matrix step (flash
//   attention: S = Q K^T and O += P V as matrix steps on f16 operands with f32 accumulators, the
//   online softmax per query row in f32). Q is rounded to f16 after the scale and P before P V
//   (as llama.cpp's flash-attention kernels do). 64 queries per workgroup (a wave per 16),
//   32-key tiles: K as [key][d] and V transposed to [d][key] in LDS, each wave's P through LDS
//   into the A operand's layout. Grid: (ceil(T/64), Hq); block: 128 threads. (D = 256 keeps the
//   scalar kernel: its Q and O fragments would not fit the registers.)
// civetta_attn_prefill_batch{,_mma}_d*: the same kernels over the prompt rows of several sequences
//   in one launch (a multi-prompt prefill step: one launch per layer instead of one per sequence).
//   q and out hold all the batch's rows; each workgroup finds its sequence, its query tile, the
//   sequence's rows and caches in two small device tables (prefill_tile below). Each workgroup
//   does exactly what the per-sequence launch's workgroup for that tile does: the same bits.
//   Grid: (tiles of all the sequences, Hq).
// civetta_attn_decode_rows_d*: the one-row sequences of such a step (mixed prefill and decode), one
//   launch for all of them, each as civetta_attn_decode_pos_d* (below) does it alone.
// civetta_attn_decode_d{64,128,256}: one query per head against all S keys (T = 1).
//   4 waves split the keys (each loads 4 keys, 2 at D = 256, per step), each lane owns D/32
//   dims; the waves merge in LDS.
//   Grid: (Hq); block: 128 threads. A sliding window needs no kernel support here: the
//   host passes the cache from the window's first key on.
// civetta_attn_decode_pos_d{64,128,256}: the same, S = pos[0] + 1 read from device memory (decode
//   graphs; layers without a window).
// civetta_attn_decode_batch_d{64,128,256}: batched decode (issue #17), one launch for T sequences
//   of one row each: row t (q and out rows t) attends over its own cache kv[2t] (k), kv[2t + 1]
//   (v) with S = pos[t] + 1. Grid: (Hq, T); block: 128 threads.
// The _pos and _batch kernels also write the output as q8_1 blocks when out_q is not null
// (cv_quantize_q8_1_block, rows of Hq * D values): the o projection's dp4a mat-vec then needs no
// quantiser launch. With k_new / v_new (f32 rows of Hkv * D, one per sequence) they also do the
// KV store of the new row: one launch instead of two per layer and decode step.
// sinks (gpt-oss's attn_sinks; null for other models): one logit per query head that joins the
// softmax's denominator as a key with a zero value would (llama.cpp's soft_max sinks): the running
// maximum starts at it instead of -inf and exp(sink - max) is added to the sum at the end.
#include "civetta_gpu.h"

namespace {

constexpr int kQueriesPerGroup = 32;
constexpr int kKeysPerTile = 32;
constexpr int kThreads = 128;

// Threads per query of the prefill kernel, and its workgroup size.
template <int D> constexpr int prefill_tpq() { return D <= 128 ? 4 : 8; }
template <int D> constexpr int prefill_threads() { return kQueriesPerGroup * prefill_tpq<D>(); }

template <int D>
CV_DEVICE void attn_prefill(const float* q, const cv_half* k_cache, const cv_half* v_cache, float* out, int T,
                            int S, int Hq, int Hkv, int q_pos0, float scale, int window, const float* sinks,
                            int tile) {
  constexpr int kTpq = prefill_tpq<D>(), kGroupThreads = prefill_threads<D>();
  constexpr int kDims = D / kTpq; // dims per thread
  __shared__ __attribute__((aligned(16))) cv_half k_tile[kKeysPerTile * D];
  __shared__ __attribute__((aligned(16))) cv_half v_tile[kKeysPerTile * D];

  const int tid = (int)cv_tid_x();
  const int head = (int)cv_bid_y(), kv_head = head / (Hq / Hkv);
  const int t0 = tile * kQueriesPerGroup;
  const int t = t0 + tid / kTpq, d0 = (tid % kTpq) * kDims;
  const bool active = t < T;
  const int q_pos = q_pos0 + (active ? t : T - 1);

  float qv[kDims], acc[kDims];
  CV_UNROLL for (int i = 0; i < kDims; ++i) {
    qv[i] = active ? q[((long)t * Hq + head) * D + d0 + i] * scale : 0.0f;
    acc[i] = 0.0f;
  }
  const float sink = sinks ? sinks[head] : -__builtin_inff();
  float m = sink, l = 0.0f;

  const int last_t = (t0 + kQueriesPerGroup < T ? t0 + kQueriesPerGroup : T) - 1;
  const int key_end = q_pos0 + last_t + 1 < S ? q_pos0 + last_t + 1 : S; // causal bound of the group
  // First key any query of the group sees: 0, or the window start of its first query.
  const int key_begin = window > 0 && q_pos0 + t0 - window + 1 > 0 ? q_pos0 + t0 - window + 1 : 0;
  for (int k0 = key_begin; k0 < key_end; k0 += kKeysPerTile) {
    for (int c = tid; c < kKeysPerTile * D / 8; c += kGroupThreads) { // 16-byte chunks
      const int key = k0 + c / (D / 8), off = (c % (D / 8)) * 8;
      cv_v4i kc = {0, 0, 0, 0}, vc = {0, 0, 0, 0};
      if (key < S) {
        const long src = ((long)key * Hkv + kv_head) * D + off;
        kc = *(const cv_v4i*)(k_cache + src);
        vc = *(const cv_v4i*)(v_cache + src);
      }
      *(cv_v4i*)(k_tile + (c / (D / 8)) * D + off) = kc;
      *(cv_v4i*)(v_tile + (c / (D / 8)) * D + off) = vc;
    }
    cv_sync();

    float s[kKeysPerTile];
    float tile_max = -__builtin_inff();
    CV_UNROLL for (int j = 0; j < kKeysPerTile; ++j) {
      float part = 0.0f;
      CV_UNROLL for (int i = 0; i < kDims; ++i) part += qv[i] * (float)k_tile[j * D + d0 + i];
      const float dot = cv_group_sum(part, kTpq);
      const int key = k0 + j;
      const bool visible = key < S && key <= q_pos && (window <= 0 || key > q_pos - window);
      s[j] = visible ? dot : -__builtin_inff();
      tile_max = __builtin_fmaxf(tile_max, s[j]);
    }
    const float m_new = __builtin_fmaxf(m, tile_max);
    if (m_new != -__builtin_inff()) { // some key of this tile is visible to this query
      const float correction = cv_exp(m - m_new);
      l *= correction;
      CV_UNROLL for (int i = 0; i < kDims; ++i) acc[i] *= correction;
      CV_UNROLL for (int j = 0; j < kKeysPerTile; ++j) {
        const float p = cv_exp(s[j] - m_new);
        l += p;
        CV_UNROLL for (int i = 0; i < kDims; ++i) acc[i] += p * (float)v_tile[j * D + d0 + i];
      }
      m = m_new;
    }
    cv_sync();
  }

  if (sinks) l += cv_exp(sink - m);
  if (active) {
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    CV_UNROLL for (int i = 0; i < kDims; ++i) out[((long)t * Hq + head) * D + d0 + i] = acc[i] * inv;
  }
}

constexpr int kMmaQueries = 64, kMmaWaves = 4, kMmaKeys = 32, kMmaThreads = kMmaWaves * CV_WAVE;

template <int D>
CV_DEVICE void attn_prefill_mma(const float* q, const cv_half* k_cache, const cv_half* v_cache, float* out, int T,
                                int S, int Hq, int Hkv, int q_pos0, float scale, int window, const float* sinks,
                                int tile) {
  constexpr int kQs = D + 8;        // q and k tile row stride (halves): fragment reads conflict-free
  constexpr int kVs = kMmaKeys + 8; // V^T and P tile row stride (halves)
  constexpr int kDt = D / 16;       // 16-wide tiles of the head dimension
  __shared__ __attribute__((aligned(16))) cv_half q_tile[kMmaQueries * kQs];
  __shared__ __attribute__((aligned(16))) cv_half k_tile[kMmaKeys * kQs];
  __shared__ __attribute__((aligned(16))) cv_half vt_tile[D * kVs];
  __shared__ __attribute__((aligned(16))) cv_half p_tile[kMmaWaves * 16 * kVs];

  const int tid = (int)cv_tid_x(), wave = tid / CV_WAVE;
  const int head = (int)cv_bid_y(), kv_head = head / (Hq / Hkv);
  const int t0 = tile * kMmaQueries;
  const int wq0 = t0 + wave * 16; // this wave's first query
  const float neg_inf = -__builtin_inff();

  // Q times scale as f16 into LDS (zero rows past T), then this wave's fragments.
  for (int c = tid; c < kMmaQueries * D; c += kMmaThreads) {
    const int r = c / D, d = c % D, t = t0 + r;
    q_tile[r * kQs + d] = (cv_half)(t < T ? q[((long)t * Hq + head) * D + d] * scale : 0.0f);
  }
  cv_sync();
  cv_frag_f16 qf[kDt];
  CV_UNROLL for (int dt = 0; dt < kDt; ++dt) qf[dt] = cv_load_frag_f16(q_tile + wave * 16 * kQs + dt * 16, kQs);

  // Per accumulator element: the running max of its row, this lane's part of the row's sum.
  float m[8], l[8];
  cv_v8f o[kDt];
  const float sink = sinks ? sinks[head] : neg_inf;
  CV_UNROLL for (int e = 0; e < 8; ++e) { m[e] = sink; l[e] = 0.0f; }
  CV_UNROLL for (int dt = 0; dt < kDt; ++dt) o[dt] = (cv_v8f){0, 0, 0, 0, 0, 0, 0, 0};

  const int last_t = (t0 + kMmaQueries < T ? t0 + kMmaQueries : T) - 1;
  const int key_end = q_pos0 + last_t + 1 < S ? q_pos0 + last_t + 1 : S; // causal bound of the workgroup
  const int key_begin = window > 0 && q_pos0 + t0 - window + 1 > 0 ? q_pos0 + t0 - window + 1 : 0;
  for (int k0 = key_begin; k0 < key_end; k0 += kMmaKeys) {
    // K tile as [key][d], V tile transposed to [d][key] (the B operand of P V); zero past S.
    for (int c = tid; c < kMmaKeys * D / 8; c += kMmaThreads) {
      const int j = c / (D / 8), d = (c % (D / 8)) * 8, key = k0 + j;
      cv_v4i kc = {0, 0, 0, 0}, vc = {0, 0, 0, 0};
      if (key < S) {
        const long src = ((long)key * Hkv + kv_head) * D + d;
        kc = *(const cv_v4i*)(k_cache + src);
        vc = *(const cv_v4i*)(v_cache + src);
      }
      *(cv_v4i*)(k_tile + j * kQs + d) = kc;
      const cv_half* vh = (const cv_half*)&vc;
      CV_UNROLL for (int i = 0; i < 8; ++i) vt_tile[(d + i) * kVs + j] = vh[i];
    }
    cv_sync();

    // Scores of this wave's 16 queries x 32 keys, masked.
    cv_v8f s[2];
    CV_UNROLL for (int jt = 0; jt < 2; ++jt) {
      s[jt] = (cv_v8f){0, 0, 0, 0, 0, 0, 0, 0};
      CV_UNROLL for (int dt = 0; dt < kDt; ++dt)
        s[jt] = cv_mma_f16(qf[dt], cv_load_frag_f16(k_tile + jt * 16 * kQs + dt * 16, kQs), s[jt]);
      CV_UNROLL for (int e = 0; e < 8; ++e) {
        const int key = k0 + jt * 16 + cv_acc_col(e), t = wq0 + cv_acc_row(e), q_pos = q_pos0 + t;
        const bool visible = t < T && key < S && key <= q_pos && (window <= 0 || key > q_pos - window);
        if (!visible) s[jt][e] = neg_inf;
      }
    }
    // Online softmax: new row maxima, rescale the sums and outputs, P (f16) into LDS.
    float corr[8];
    CV_UNROLL for (int e = 0; e < 8; ++e) {
      float mx = neg_inf;
      CV_UNROLL for (int f = 0; f < 8; ++f)
        if (cv_acc_same_row(e, f)) mx = __builtin_fmaxf(mx, __builtin_fmaxf(s[0][f], s[1][f]));
      mx = cv_group_max(mx, CV_ACC_ROW_LANES);
      const float m_new = __builtin_fmaxf(m[e], mx);
      corr[e] = m_new == neg_inf ? 1.0f : cv_exp(m[e] - m_new);
      m[e] = m_new;
      l[e] *= corr[e];
    }
    CV_UNROLL for (int jt = 0; jt < 2; ++jt)
      CV_UNROLL for (int e = 0; e < 8; ++e) {
        const float p = s[jt][e] == neg_inf ? 0.0f : cv_exp(s[jt][e] - m[e]);
        l[e] += p;
        p_tile[(wave * 16 + cv_acc_row(e)) * kVs + jt * 16 + cv_acc_col(e)] = (cv_half)p;
      }
    CV_UNROLL for (int dt = 0; dt < kDt; ++dt)
      CV_UNROLL for (int e = 0; e < 8; ++e) o[dt][e] *= corr[e];
    cv_sync(); // P visible to the whole wave
    const cv_frag_f16 p0 = cv_load_frag_f16(p_tile + wave * 16 * kVs, kVs);
    const cv_frag_f16 p1 = cv_load_frag_f16(p_tile + wave * 16 * kVs + 16, kVs);
    CV_UNROLL for (int dt = 0; dt < kDt; ++dt) {
      o[dt] = cv_mma_f16(p0, cv_load_frag_f16(vt_tile + dt * 16 * kVs, kVs), o[dt]);
      o[dt] = cv_mma_f16(p1, cv_load_frag_f16(vt_tile + dt * 16 * kVs + 16, kVs), o[dt]);
    }
    cv_sync(); // before the next tile overwrites K, V^T and P
  }

  float inv[8];
  CV_UNROLL for (int e = 0; e < 8; ++e) {
    float sum = 0.0f;
    CV_UNROLL for (int f = 0; f < 8; ++f)
      if (cv_acc_same_row(e, f)) sum += l[f];
    sum = cv_group_sum(sum, CV_ACC_ROW_LANES);
    if (sinks) sum += cv_exp(sink - m[e]);
    inv[e] = sum > 0.0f ? 1.0f / sum : 0.0f;
  }
  CV_UNROLL for (int dt = 0; dt < kDt; ++dt)
    CV_UNROLL for (int e = 0; e < 8; ++e) {
      const int t = wq0 + cv_acc_row(e);
      if (t < T) out[((long)t * Hq + head) * D + dt * 16 + cv_acc_col(e)] = o[dt][e] * inv[e];
    }
}

template <int D>
CV_DEVICE void attn_decode(const float* q, cv_half* k_cache, cv_half* v_cache, float* out, int S, int Hq, int Hkv,
                           float scale, const float* sinks, cv_i8* out_q, float* out_ds, const float* k_new,
                           const float* v_new) {
  constexpr int kWaves = kThreads / CV_WAVE;
  constexpr int kDims = D / CV_WAVE; // dims per lane
  __shared__ float wave_acc[kWaves][D];
  __shared__ float wave_m[kWaves], wave_l[kWaves];

  const int head = (int)cv_bid_x(), kv_head = head / (Hq / Hkv);
  const int wave = (int)cv_tid_x() / CV_WAVE, lane = (int)cv_lane();
  const int d0 = lane * kDims;

  float qv[kDims], acc[kDims];
  CV_UNROLL for (int i = 0; i < kDims; ++i) {
    qv[i] = q[(long)head * D + d0 + i] * scale;
    acc[i] = 0.0f;
  }
  // With k_new / v_new (the new row's k and v, f32 [Hkv][D]): key S - 1 is that row, rounded to
  // f16 here as the KV store rounds it, and the first query head of each KV head stores it into
  // the caches (civetta_kv_store_f16's arithmetic). No workgroup reads row S - 1 from the caches,
  // so the store races with nothing, and the separate KV store launch is saved.
  if (k_new && head % (Hq / Hkv) == 0) {
    for (int d = (int)cv_tid_x(); d < D; d += kThreads) {
      const long at = ((long)(S - 1) * Hkv + kv_head) * D + d;
      k_cache[at] = (cv_half)k_new[(long)kv_head * D + d];
      v_cache[at] = (cv_half)v_new[(long)kv_head * D + d];
    }
  }
  const float sink = sinks ? sinks[head] : -__builtin_inff();
  float m = sink, l = 0.0f;
  // kKeys keys per wave and step, their K and V rows loaded before any is used: a decode step
  // is a chain of dependent cache reads, and kKeys of them in flight shorten it kKeys times.
  constexpr int kKeys = D <= 128 ? 4 : 2;
  for (int key0 = wave; key0 < S; key0 += kWaves * kKeys) {
    cv_half kh[kKeys][kDims], vh[kKeys][kDims];
    CV_UNROLL for (int j = 0; j < kKeys; ++j) {
      const int key = key0 + j * kWaves;
      const int row = key < S ? key : key0; // keys past S reload a valid row (their weight is 0)
      const long base = ((long)row * Hkv + kv_head) * D + d0;
      if (k_new && row == S - 1) {
        CV_UNROLL for (int i = 0; i < kDims; ++i) {
          kh[j][i] = (cv_half)k_new[(long)kv_head * D + d0 + i];
          vh[j][i] = (cv_half)v_new[(long)kv_head * D + d0 + i];
        }
      } else {
        CV_UNROLL for (int i = 0; i < kDims; ++i) {
          kh[j][i] = k_cache[base + i];
          vh[j][i] = v_cache[base + i];
        }
      }
    }
    float s[kKeys];
    float m_new = m;
    CV_UNROLL for (int j = 0; j < kKeys; ++j) {
      float part = 0.0f;
      CV_UNROLL for (int i = 0; i < kDims; ++i) part += qv[i] * (float)kh[j][i];
      const float dot = cv_wave_sum(part);
      s[j] = key0 + j * kWaves < S ? dot : -__builtin_inff();
      m_new = __builtin_fmaxf(m_new, s[j]);
    }
    const float correction = cv_exp(m - m_new); // key0 < S: m_new is finite (m is -inf or the sink)
    l *= correction;
    CV_UNROLL for (int i = 0; i < kDims; ++i) acc[i] *= correction;
    CV_UNROLL for (int j = 0; j < kKeys; ++j) {
      const float p = cv_exp(s[j] - m_new); // 0 for keys past S
      l += p;
      CV_UNROLL for (int i = 0; i < kDims; ++i) acc[i] += p * (float)vh[j][i];
    }
    m = m_new;
  }

  CV_UNROLL for (int i = 0; i < kDims; ++i) wave_acc[wave][d0 + i] = acc[i];
  if (lane == 0) {
    wave_m[wave] = m;
    wave_l[wave] = l;
  }
  cv_sync();
  float m_all = -__builtin_inff();
  CV_UNROLL for (int w = 0; w < kWaves; ++w) m_all = __builtin_fmaxf(m_all, wave_m[w]);
  float l_all = 0.0f, weight[kWaves];
  CV_UNROLL for (int w = 0; w < kWaves; ++w) {
    weight[w] = wave_m[w] == -__builtin_inff() ? 0.0f : cv_exp(wave_m[w] - m_all); // waves without keys
    l_all += wave_l[w] * weight[w];
  }
  if (sinks) l_all += cv_exp(sink - m_all);
  const float inv = l_all > 0.0f ? 1.0f / l_all : 0.0f;
  // Whole waves take each round (D and kThreads are multiples of 32), so with out_q each wave
  // quantises the block of 32 outputs it just wrote.
  for (int d = (int)cv_tid_x(); d < D; d += kThreads) {
    float o = 0.0f;
    CV_UNROLL for (int w = 0; w < kWaves; ++w) o += wave_acc[w][d] * weight[w];
    const float v = o * inv;
    out[(long)head * D + d] = v;
    if (out_q) {
      const long block = ((long)head * D + d) / 32;
      cv_quantize_q8_1_block(v, out_q + block * 32, out_ds + block * 2);
    }
  }
}

// Batched prefill: the workgroup's sequence and query tile. Workgroup x takes tile tiles[2x + 1]
// of sequence s = tiles[2x]; seqs[4s .. 4s + 2] = (its first row in q and out, its rows T, the
// position q_pos0 of its first row); its caches are kv[2s] (k) and kv[2s + 1] (v), holding
// positions 0 .. q_pos0 + T - 1 (its new rows stored by civetta_kv_store_prefill_batch_f16 before).
struct PrefillTile {
  const float* q;
  const cv_half* k;
  const cv_half* v;
  float* out;
  int T, q_pos0, tile;
};

CV_DEVICE PrefillTile prefill_tile(const float* q, cv_half* const* kv, float* out, const int* seqs, const int* tiles,
                                   int row_width) {
  const int* t = tiles + 2 * (long)cv_bid_x();
  const int s = t[0];
  const long row = (long)seqs[4 * s] * row_width;
  return PrefillTile{q + row, kv[2 * s], kv[2 * s + 1], out + row, seqs[4 * s + 1], seqs[4 * s + 2], t[1]};
}

} // namespace

#define CIVETTA_ATTN(D)                                                                                          \
  CV_KERNEL CV_LAUNCH_BOUNDS(prefill_threads<D>()) void civetta_attn_prefill_d##D(                               \
      const float* q, const cv_half* k_cache, const cv_half* v_cache, float* out, int T, int S, int Hq, int Hkv, \
      int q_pos0, float scale, int window, const float* sinks) {                                                 \
    attn_prefill<D>(q, k_cache, v_cache, out, T, S, Hq, Hkv, q_pos0, scale, window, sinks, (int)cv_bid_x());    \
  }                                                                                                              \
  CV_KERNEL CV_LAUNCH_BOUNDS(prefill_threads<D>()) void civetta_attn_prefill_batch_d##D(                         \
      const float* q, cv_half* const* kv, float* out, const int* seqs, const int* tiles, int Hq, int Hkv,       \
      float scale, int window, const float* sinks) {                                                             \
    const PrefillTile p = prefill_tile(q, kv, out, seqs, tiles, Hq * D);                                         \
    attn_prefill<D>(p.q, p.k, p.v, p.out, p.T, p.q_pos0 + p.T, Hq, Hkv, p.q_pos0, scale, window, sinks, p.tile); \
  }                                                                                                              \
  CV_KERNEL CV_LAUNCH_BOUNDS(kThreads) void civetta_attn_decode_d##D(                                            \
      const float* q, const cv_half* k_cache, const cv_half* v_cache, float* out, int S, int Hq, int Hkv,        \
      float scale, const float* sinks) {                                                                         \
    cv_follow_prior_kernels();                                                                                   \
    attn_decode<D>(q, (cv_half*)k_cache, (cv_half*)v_cache, out, S, Hq, Hkv, scale, sinks, nullptr, nullptr,     \
                   nullptr, nullptr);                                                                            \
  }                                                                                                              \
  /* The same with S = pos[0] + 1 read on the device: decode graphs replay it unchanged. out_q, out_ds */       \
  /* (or null): the output also as q8_1 blocks; k_new, v_new (or null): the new row, stored here. */            \
  CV_KERNEL CV_LAUNCH_BOUNDS(kThreads) void civetta_attn_decode_pos_d##D(                                        \
      const float* q, cv_half* k_cache, cv_half* v_cache, float* out, const int* pos, int Hq, int Hkv,           \
      float scale, const float* sinks, cv_i8* out_q, float* out_ds, const float* k_new, const float* v_new) {    \
    cv_follow_prior_kernels(); /* before pos[0] is read */                                                       \
    attn_decode<D>(q, k_cache, v_cache, out, pos[0] + 1, Hq, Hkv, scale, sinks, out_q, out_ds, k_new, v_new);    \
  }                                                                                                              \
  CV_KERNEL CV_LAUNCH_BOUNDS(kThreads) void civetta_attn_decode_batch_d##D(                                      \
      const float* q, cv_half* const* kv, float* out, const int* pos, int Hq, int Hkv, float scale,              \
      cv_i8* out_q, float* out_ds, const float* k_new, const float* v_new) {                                     \
    cv_follow_prior_kernels();                                                                                   \
    const long t = cv_bid_y();                                                                                   \
    attn_decode<D>(q + t * Hq * D, kv[2 * t], kv[2 * t + 1], out + t * Hq * D, pos[t] + 1, Hq, Hkv, scale,       \
                   nullptr, out_q ? out_q + t * Hq * D : nullptr, out_ds ? out_ds + t * Hq * D / 16 : nullptr,   \
                   k_new ? k_new + t * Hkv * D : nullptr, v_new ? v_new + t * Hkv * D : nullptr);                \
  }

// Batched decode rows of a mixed step (issue #14): the one-row sequences of a step that also
// prefills (so their rows are not rows 0 .. T - 1 and their positions are not read from the
// positions buffer). Grid row j is sequence s = dec[j] of the batch descriptor table (see
// prefill_tile): its row seqs[4s] of q, out, k_new and v_new, S = seqs[4s + 2] + 1 keys; the new
// row stored by the kernel, as civetta_attn_decode_pos_d* does for one sequence (the same bits).
#define CIVETTA_ATTN_ROWS(D)                                                                                     \
  CV_KERNEL CV_LAUNCH_BOUNDS(kThreads) void civetta_attn_decode_rows_d##D(                                       \
      const float* q, cv_half* const* kv, float* out, const int* seqs, const int* dec, int Hq, int Hkv,         \
      float scale, const float* sinks, const float* k_new, const float* v_new) {                                 \
    const int s = dec[cv_bid_y()];                                                                               \
    const long row = seqs[4 * s];                                                                                \
    attn_decode<D>(q + row * Hq * D, kv[2 * s], kv[2 * s + 1], out + row * Hq * D, seqs[4 * s + 2] + 1, Hq, Hkv,  \
                   scale, sinks, nullptr, nullptr, k_new + row * Hkv * D, v_new + row * Hkv * D);                \
  }

CIVETTA_ATTN(64)
CIVETTA_ATTN(128)
CIVETTA_ATTN(256) // Gemma 3
CIVETTA_ATTN_ROWS(64)
CIVETTA_ATTN_ROWS(128)
CIVETTA_ATTN_ROWS(256)

#define CIVETTA_ATTN_MMA(D)                                                                                      \
  CV_KERNEL CV_LAUNCH_BOUNDS(kMmaThreads) void civetta_attn_prefill_mma_d##D(                                    \
      const float* q, const cv_half* k_cache, const cv_half* v_cache, float* out, int T, int S, int Hq, int Hkv, \
      int q_pos0, float scale, int window, const float* sinks) {                                                 \
    attn_prefill_mma<D>(q, k_cache, v_cache, out, T, S, Hq, Hkv, q_pos0, scale, window, sinks, (int)cv_bid_x()); \
  }                                                                                                              \
  CV_KERNEL CV_LAUNCH_BOUNDS(kMmaThreads) void civetta_attn_prefill_batch_mma_d##D(                              \
      const float* q, cv_half* const* kv, float* out, const int* seqs, const int* tiles, int Hq, int Hkv,       \
      float scale, int window, const float* sinks) {                                                             \
    const PrefillTile p = prefill_tile(q, kv, out, seqs, tiles, Hq * D);                                         \
    attn_prefill_mma<D>(p.q, p.k, p.v, p.out, p.T, p.q_pos0 + p.T, Hq, Hkv, p.q_pos0, scale, window, sinks,      \
                        p.tile);                                                                                 \
  }

CIVETTA_ATTN_MMA(64)
CIVETTA_ATTN_MMA(128)
