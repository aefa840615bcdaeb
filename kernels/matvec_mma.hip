// Batched-decode mat-vecs on the matrix units (issues #14, #17): y[b][n] (+)= sum_k W[n][k] * x[b][k]
// for 2..16 activation rows b (one per decoding sequence) per launch row.
//
// The dp4a builds (kernels/matvec_dp4a.hip, `_x8` / `_x16`) read each weight unit once but do
// every row's dot product on the vector units and re-read each activation row from the cache per
// weight unit: at 16 rows the 1.4B model's mat-vecs took 5.5 ms per step against ~1.1 ms at one
// row. Here one matrix step multiplies a tile of 16 weight rows x 32 K (the A operand) by the
// same 32 K of 16 activation rows (B): the 16 rows cost one instruction stream, so the launch
// should stay bound by the weight bytes, like the one-row mat-vec.
//
// Same contract as matvec_dp4a.hip (the host launches either with the same arguments):
//   civetta_matvec_mma_q8p: W the int8 plane [N][K] and S the f16 scale plane [N][K/32] of Q8_0 /
//   Q5_0 weights; civetta_matvec_mma_q4k: W raw block_q4_K [N][K/256] (144 bytes each), S unused;
//   xq: int8 [B][K] and xds: f32 [B][K/32][2] = (d, s) from quantize_q8_1 / rmsnorm_q8_1;
//   up to three matrices with the same input in one launch (q/k/v, gate/up), accumulate != 0
//   adds to y (the residual add).
// Per 32-value block the integer dot is scaled like the dp4a kernels: acc += float(idot) * (sw * sa)
// (Q4_K: d·sc·dx·idot - dmin·mn·sx per sub-block, as Q4K::dot there).
// Grid: (tiles(N0) + tiles(N1) + tiles(N2), ceil(B / 16)) with tiles(N) = ceil(N / 16); block:
// kWaves waves (8, or 16 in the `_w16` builds). A workgroup owns one tile of 16 output rows and
// 16 activation rows; its waves split K (wave w takes units w, w + kWaves, ... in that order,
// issuing the next round's loads before this round's matrix steps), and the partial tiles are
// summed in LDS in wave order. The matrices are narrow (1536-9000 rows: 96-560 workgroups), so K
// is split inside the workgroup rather than over more rows per workgroup; where a launch has
// fewer tiles than the device has compute units the host takes the 16-wave build.
// The sums are in a fixed order (no atomics): a replay gives the bits of an eager launch. The
// 8-wave builds sum in the order of session 11's kernel (the rounds only regroup the loads).
// Names: civetta_matvec_mma_q8p, civetta_matvec_mma_q4k, and their `_w16` builds.
#include "civetta_gpu.h"
#include "q4k.h"

namespace {

constexpr int kTile = 16;   // output rows and activation rows per workgroup
constexpr int kBlock = 32;  // K values per scale

// Kernel arguments, as matvec_dp4a.hip's (named fields: a dynamically indexed argument array
// would be copied to scratch).
struct Args {
  const cv_u8 *W0, *S0;
  float* y0;
  int N0;
  const cv_u8 *W1, *S1;
  float* y1;
  int N1;
  const cv_u8 *W2, *S2;
  float* y2;
  int N2;
  const cv_i8* xq;
  const float* xds;
  int K, B, accumulate;
};

// v0, v1 or v2 (m = 0, 1 or more), taken by value (see matvec_dp4a.hip: a select between field
// addresses kept the argument struct in scratch with LLVM 23).
template <class T> CV_DEVICE T pick(int m, T v0, T v1, T v2) { return m == 0 ? v0 : (m == 1 ? v1 : v2); }

CV_DEVICE int min_int(int a, int b) { return a < b ? a : b; }

// This workgroup's tile: the matrix (tiles do not straddle matrices), its first output row n0,
// and the valid rows of the weight and activation tiles (1..16): loads clamp to them, the store
// skips the rest.
struct Tile {
  const cv_u8 *W, *S;
  float* y;
  int N, n0, w_rows, b0, x_rows;
};

CV_DEVICE Tile tile_of(const Args& a) {
  const int N0 = a.N0, N1 = a.N1, t0 = (N0 + kTile - 1) / kTile, t1 = (N1 + kTile - 1) / kTile;
  const int tile = (int)cv_bid_x();
  const int m = (tile >= t0) + (tile >= t0 + t1);
  Tile t;
  t.n0 = (tile - (m >= 1 ? t0 : 0) - (m >= 2 ? t1 : 0)) * kTile;
  t.N = pick(m, N0, N1, a.N2);
  t.W = pick(m, a.W0, a.W1, a.W2);
  t.S = pick(m, a.S0, a.S1, a.S2);
  t.y = pick(m, a.y0, a.y1, a.y2);
  t.w_rows = min_int(t.N - t.n0, kTile);
  t.b0 = (int)cv_bid_y() * kTile;
  t.x_rows = min_int(a.B - t.b0, kTile);
  return t;
}

// Sums the waves' partial tiles in LDS (part[wave][output row][activation row]) and stores the
// valid elements, adding to y when accumulating.
template <int kWaves> CV_DEVICE void store_tile(const Tile& t, const cv_v8f& acc, int accumulate) {
  __shared__ float part[kWaves][kTile][kTile];
  const int wave = (int)cv_tid_x() / CV_WAVE;
  CV_UNROLL for (int e = 0; e < 8; ++e) part[wave][cv_acc_row(e)][cv_acc_col(e)] = acc[e];
  cv_sync();
  for (int c = (int)cv_tid_x(); c < kTile * kTile; c += kWaves * CV_WAVE) {
    const int r = c / kTile, b = c % kTile;
    float s = 0.0f;
    CV_UNROLL for (int w = 0; w < kWaves; ++w) s += part[w][r][b];
    if (r < t.w_rows && b < t.x_rows) {
      float* out = t.y + (long)(t.b0 + b) * t.N + t.n0 + r;
      *out = accumulate ? *out + s : s;
    }
  }
}

// Q8_0 / Q5_0 planes: one matrix step per 32-value block.
// One round's loads: kUnroll blocks of this wave (fragments and the scales each element needs).
template <int kUnroll> struct Q8Round {
  cv_frag_i8 w_lo[kUnroll], w_hi[kUnroll], x_lo[kUnroll], x_hi[kUnroll];
  float sw[kUnroll][8], sa[kUnroll][8];
};

template <int kWaves, int kUnroll>
CV_DEVICE void q8_load(Q8Round<kUnroll>& r, int kb0, int blocks, const cv_i8* w_tile, const cv_i8* x_tile, int K, const Tile& t,
                       const cv_half* S, const float* xds, const int* w_scale, const int* x_scale) {
  // The last partial round re-reads block kb0 (memory that exists); its results are dropped.
  CV_UNROLL for (int i = 0; i < kUnroll; ++i) {
    const int kb = kb0 + i * kWaves < blocks ? kb0 + i * kWaves : kb0;
    cv_load_frags_k32(w_tile + kb * kBlock, K, t.w_rows, &r.w_lo[i], &r.w_hi[i]);
    cv_load_frags_k32(x_tile + kb * kBlock, K, t.x_rows, &r.x_lo[i], &r.x_hi[i]);
    CV_UNROLL for (int e = 0; e < 8; ++e) {
      r.sw[i][e] = (float)S[w_scale[e] + kb];
      r.sa[i][e] = xds[x_scale[e] + 2 * kb];
    }
  }
}

template <int kWaves, int kUnroll> CV_DEVICE void q8_step(cv_v8f& acc, const Q8Round<kUnroll>& r, int kb0, int blocks) {
  CV_UNROLL for (int i = 0; i < kUnroll; ++i) {
    if (kb0 + i * kWaves >= blocks) break;
    const cv_v8i dot = cv_mma_i8_k32(r.w_lo[i], r.w_hi[i], r.x_lo[i], r.x_hi[i], (cv_v8i){0, 0, 0, 0, 0, 0, 0, 0});
    CV_UNROLL for (int e = 0; e < 8; ++e) acc[e] += (float)dot[e] * (r.sw[i][e] * r.sa[i][e]);
  }
}

template <int kWaves> CV_DEVICE void matvec_mma_q8p(const Args& a) {
  // 32-value blocks per wave and round. Two, with the next round's loads issued before this
  // round's matrix steps (so four in flight), measured best on an H100 (docs/GPU.md, session 20:
  // 16-row 1.4B Q8_0 step 2.62 -> 2.29 ms with the 16-wave builds; one round of four loads and
  // then four steps, the session 11 kernel, left the loads idle during the steps).
  constexpr int kUnroll = 2;
  constexpr int kStep = kWaves * kUnroll;
  const Tile t = tile_of(a);
  const cv_half* S = (const cv_half*)t.S;
  const int K = a.K, blocks = K / kBlock;
  const cv_i8* w_tile = (const cv_i8*)t.W + (long)t.n0 * K;
  const cv_i8* x_tile = a.xq + (long)t.b0 * K;
  const int wave = (int)cv_tid_x() / CV_WAVE;

  // Offsets of this lane's scales per accumulator element: the weight row's f16 scales and the
  // activation row's (d, s) pairs, clamped like the loads.
  int w_scale[8], x_scale[8];
  CV_UNROLL for (int e = 0; e < 8; ++e) {
    w_scale[e] = (t.n0 + min_int(cv_acc_row(e), t.w_rows - 1)) * blocks;
    x_scale[e] = (t.b0 + min_int(cv_acc_col(e), t.x_rows - 1)) * blocks * 2;
  }

  cv_v8f acc = {0, 0, 0, 0, 0, 0, 0, 0};
  // The next round's loads are issued before this round's matrix steps.
  Q8Round<kUnroll> cur, next;
  if (wave < blocks) q8_load<kWaves>(cur, wave, blocks, w_tile, x_tile, K, t, S, a.xds, w_scale, x_scale);
  for (int kb0 = wave; kb0 < blocks; kb0 += kStep) {
    if (kb0 + kStep < blocks) q8_load<kWaves>(next, kb0 + kStep, blocks, w_tile, x_tile, K, t, S, a.xds, w_scale, x_scale);
    q8_step<kWaves>(acc, cur, kb0, blocks);
    // On the last round this copies a round that was not loaded; it is never read. (Guarding it
    // with the load's condition compiles to other code: Q4_K's kernel then takes 124 registers
    // instead of 128 on sm_90. Not measured yet, so the measured form stays.)
    cur = next;
  }
  store_tile<kWaves>(t, acc, a.accumulate);
}

// Raw Q4_K blocks: a unit is one 32-byte slice of a super-block's qs (sub-blocks 2j and 2j+1 in
// the low and high nibbles) = two matrix steps, the nibbles (0..15) as the A operand. Per row and
// sub-block s the dot is d·sc[s]·dx·idot - dmin·mn[s]·sx with the activation block's (dx, sx =
// dx·Σq), as matvec_dp4a.hip's Q4K::dot sums it. With 8 waves (a multiple of 4) a wave always
// has the same j and steps over super-blocks.
// One round's loads: kUnroll units of this wave (the qs slice, both activation blocks, the
// headers of each element's weight row).
template <int kUnroll> struct Q4KRound {
  cv_frag_i8 q_lo[kUnroll], q_hi[kUnroll], xa_lo[kUnroll], xa_hi[kUnroll], xb_lo[kUnroll], xb_hi[kUnroll];
  cv_v4i head[kUnroll][8];
};

template <int kWaves, int kUnroll>
CV_DEVICE void q4k_load(Q4KRound<kUnroll>& r, int u0, int units, const cv_u8* w_tile, long row_bytes, const cv_i8* x_tile, int K,
                        const Tile& t, const long* w_row) {
  CV_UNROLL for (int i = 0; i < kUnroll; ++i) {
    const int u = u0 + i * kWaves < units ? u0 + i * kWaves : u0, sb = u / 4, j = u % 4;
    cv_load_frags_k32((const cv_i8*)w_tile + sb * 144 + 16 + 32 * j, row_bytes, t.w_rows, &r.q_lo[i], &r.q_hi[i]);
    cv_load_frags_k32(x_tile + sb * 256 + 64 * j, K, t.x_rows, &r.xa_lo[i], &r.xa_hi[i]);
    cv_load_frags_k32(x_tile + sb * 256 + 64 * j + 32, K, t.x_rows, &r.xb_lo[i], &r.xb_hi[i]);
    CV_UNROLL for (int e = 0; e < 8; ++e) r.head[i][e] = *(const cv_v4i*)(t.W + w_row[e] + sb * 144);
  }
}

template <int kWaves, int kUnroll>
CV_DEVICE void q4k_step(cv_v8f& acc, const Q4KRound<kUnroll>& r, int u0, int units, const float* xds, const int* x_scale) {
  CV_UNROLL for (int i = 0; i < kUnroll; ++i) {
    const int u = u0 + i * kWaves, sb = u / 4, j = u % 4;
    if (u >= units) break;
    const cv_v8i zero = {0, 0, 0, 0, 0, 0, 0, 0};
    const cv_v8i dot_lo = cv_mma_i8_k32(cv_frag_nibbles(r.q_lo[i], 0), cv_frag_nibbles(r.q_hi[i], 0), r.xa_lo[i], r.xa_hi[i], zero);
    const cv_v8i dot_hi = cv_mma_i8_k32(cv_frag_nibbles(r.q_lo[i], 4), cv_frag_nibbles(r.q_hi[i], 4), r.xb_lo[i], r.xb_hi[i], zero);
    CV_UNROLL for (int e = 0; e < 8; ++e) {
      const cv_v4i h = r.head[i][e];
      const float d = (float)__builtin_bit_cast(cv_half, (cv_u16)(h.x & 0xFFFF));
      const float dmin = (float)__builtin_bit_cast(cv_half, (cv_u16)((cv_u32)h.x >> 16));
      float sc_lo, mn_lo, sc_hi, mn_hi;
      q4k_scale_min(h, 2 * j, &sc_lo, &mn_lo);
      q4k_scale_min(h, 2 * j + 1, &sc_hi, &mn_hi);
      const float* ds = xds + x_scale[e] + (sb * 8 + 2 * j) * 2; // (d, s) of blocks 2j, 2j+1
      acc[e] += d * (sc_lo * ds[0] * (float)dot_lo[e] + sc_hi * ds[2] * (float)dot_hi[e]) -
                dmin * (mn_lo * ds[1] + mn_hi * ds[3]);
    }
  }
}

template <int kWaves> CV_DEVICE void matvec_mma_q4k(const Args& a) {
  // Units per wave and round, the next round's loads issued before this round's steps (each
  // unit: 8 headers per lane on AMD). One measured best on an H100 (session 20; two or more
  // per round cost occupancy: 192 registers at two).
  constexpr int kUnroll = 1;
  constexpr int kStep = kWaves * kUnroll;
  const Tile t = tile_of(a);
  const int K = a.K, supers = K / 256, units = supers * 4, blocks = K / kBlock;
  const long row_bytes = (long)supers * 144;
  const cv_u8* w_tile = t.W + (long)t.n0 * row_bytes;
  const cv_i8* x_tile = a.xq + (long)t.b0 * K;
  const int wave = (int)cv_tid_x() / CV_WAVE;

  // Offsets of this lane's weight rows (block headers) and activation rows' (d, s) pairs per
  // accumulator element, clamped like the loads.
  long w_row[8];
  int x_scale[8];
  CV_UNROLL for (int e = 0; e < 8; ++e) {
    w_row[e] = (long)(t.n0 + min_int(cv_acc_row(e), t.w_rows - 1)) * row_bytes;
    x_scale[e] = (t.b0 + min_int(cv_acc_col(e), t.x_rows - 1)) * blocks * 2;
  }

  cv_v8f acc = {0, 0, 0, 0, 0, 0, 0, 0};
  Q4KRound<kUnroll> cur, next;
  if (wave < units) q4k_load<kWaves>(cur, wave, units, w_tile, row_bytes, x_tile, K, t, w_row);
  for (int u0 = wave; u0 < units; u0 += kStep) {
    if (u0 + kStep < units) q4k_load<kWaves>(next, u0 + kStep, units, w_tile, row_bytes, x_tile, K, t, w_row);
    q4k_step<kWaves>(acc, cur, u0, units, a.xds, x_scale);
    cur = next;
  }
  store_tile<kWaves>(t, acc, a.accumulate);
}

} // namespace

// Every kernel in two sizes: 8 waves per workgroup, and 16 (`_w16`) for matrices with fewer
// tiles than the device has compute units, where one workgroup per unit is all there is and
// twice the waves keep twice the loads in flight.
#define CV_MMA_KERNEL(name, body, waves)                                                                          \
  CV_KERNEL CV_LAUNCH_BOUNDS(waves * CV_WAVE) void name(                                                          \
      const cv_u8* W0, const cv_u8* S0, float* y0, int N0, const cv_u8* W1, const cv_u8* S1, float* y1, int N1, \
      const cv_u8* W2, const cv_u8* S2, float* y2, int N2, const cv_i8* xq, const float* xds, int K, int B,    \
      int accumulate) {                                                                                         \
    body<waves>(Args{W0, S0, y0, N0, W1, S1, y1, N1, W2, S2, y2, N2, xq, xds, K, B, accumulate});              \
  }
CV_MMA_KERNEL(civetta_matvec_mma_q8p, matvec_mma_q8p, 8)
CV_MMA_KERNEL(civetta_matvec_mma_q8p_w16, matvec_mma_q8p, 16)
CV_MMA_KERNEL(civetta_matvec_mma_q4k, matvec_mma_q4k, 8)
CV_MMA_KERNEL(civetta_matvec_mma_q4k_w16, matvec_mma_q4k, 16)
