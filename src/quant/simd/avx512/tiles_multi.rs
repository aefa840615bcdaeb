//! AVX-512 Q4_1 tiles of several weight rows x 4G activation rows (batched decode: 2..16
//! sequences), each output bit for bit `tiles::dot_q4_1_x4_scaled` (and so the single dot).
//! Why faster: `dot_q4_1_x4_scaled` takes ONE weight row, so with R weight rows every
//! activation block (two 2x32-byte loads + insert per four rows, the f32 scale loads) is
//! loaded R times and every weight block (nibble unpack, f16 d/m) once per four activation
//! rows; here the activation registers of a block are loaded once per R weight rows and the
//! weight block unpacked once per 4G activation rows. Why exact: each (weight row, group of
//! four activation rows) keeps its own accumulators with `dot_q4_1_x4_scaled`'s lane layout,
//! the same per-block products (d_w * d_a, m_w * s_a), the same block order and the same
//! final horizontal sums; only loads and integer unpacking are shared.
#![allow(clippy::needless_range_loop)] // r/g index several parallel arrays at once.

use super::*;

/// `tiles::nibbles_16_twice` (kept private there): the 32 levels of one 4-bit block whose
/// 16 nibble bytes start at p, in both 256-bit halves.
#[inline(always)]
unsafe fn nibbles_16_twice(p: *const u8) -> __m512i {
    let x4 = _mm512_broadcast_i32x4(_mm_loadu_si128(p as _));
    const S4: i64 = 0x0004_0004_0004_0004;
    let shifts = _mm512_setr_epi64(0, 0, S4, S4, 0, 0, S4, S4);
    _mm512_and_si512(_mm512_srlv_epi16(x4, shifts), _mm512_set1_epi8(0x0F))
}

/// The low and high 256-bit halves of an f32 register.
#[inline(always)]
unsafe fn halves(v: __m512) -> (__m256, __m256) {
    (_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))))
}

/// Q4_1 weight rows `w[r]` against activation rows `a[4g + j]` (Q8_1, j = 0..3) whose f32
/// scales are block-major at d / s (`d[i * stride + 4g + j]`): out[r][4g + j] is bit for bit
/// `dot_q4_1_x4_scaled(w[r], a[4g..4g + 4], d + 4g, s + 4g, stride, nb)[j]`.
///
/// # Safety
/// avx512f/bw/vl/vnni, avx2, fma, f16c; every row holds `nb` blocks; d and s hold
/// `(nb - 1) * stride + 4G` values. `O` must be 4G (stable Rust has no const arithmetic in
/// array lengths).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(in super::super) unsafe fn dot_q4_1_rows_scaled<const R: usize, const G: usize, const O: usize>(
    w: [*const u8; R],
    a: [*const u8; O],
    d: *const f32,
    s: *const f32,
    stride: usize,
    nb: usize,
) -> [[f32; O]; R] {
    debug_assert_eq!(O, 4 * G);
    let zero = _mm512_setzero_si512();
    // acc[r][2g] holds activation rows 4g, 4g+1 (low, high half); acc[r][2g + 1] rows 4g+2, 4g+3.
    let mut acc = [[[_mm512_setzero_ps(); 2]; G]; R];
    let mut summs = [[_mm_setzero_ps(); G]; R];
    for i in 0..nb {
        let mut aq = [[_mm512_setzero_si512(); 2]; G];
        let mut d_a = [_mm_setzero_ps(); G];
        let mut s_a = [_mm_setzero_ps(); G];
        for g in 0..G {
            let act = |j: usize| a[4 * g + j].add(i * Q8_1_BYTES + 4);
            aq[g] = [load_2x32(act(0), act(1)), load_2x32(act(2), act(3))];
            d_a[g] = _mm_loadu_ps(d.add(i * stride + 4 * g));
            s_a[g] = _mm_loadu_ps(s.add(i * stride + 4 * g));
        }
        for r in 0..R {
            let bw = w[r].add(i * Q4_1_BYTES);
            let q = nibbles_16_twice(bw.add(4));
            let dm_w = _mm_cvtph_ps(_mm_cvtsi32_si128(rd32(bw) as i32)); // [d, m, 0, 0]
            let (d_w, m_w) = (_mm_permute_ps::<0>(dm_w), _mm_permute_ps::<0b01_01_01_01>(dm_w));
            for g in 0..G {
                summs[r][g] = _mm_add_ps(summs[r][g], _mm_mul_ps(m_w, s_a[g]));
                let sc = _mm_mul_ps(d_w, d_a[g]); // d_w * d_a[t]
                let dot01 = _mm512_dpbusd_epi32(zero, q, aq[g][0]);
                let dot23 = _mm512_dpbusd_epi32(zero, q, aq[g][1]);
                acc[r][g][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot01), spread_pair::<0, 1>(sc), acc[r][g][0]);
                acc[r][g][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot23), spread_pair::<2, 3>(sc), acc[r][g][1]);
            }
        }
    }
    let mut out = [[0f32; O]; R];
    for r in 0..R {
        for g in 0..G {
            let mut m = [0f32; 4];
            _mm_storeu_ps(m.as_mut_ptr(), summs[r][g]);
            let ((l0, h0), (l1, h1)) = (halves(acc[r][g][0]), halves(acc[r][g][1]));
            let v = [hsum256(l0) + m[0], hsum256(h0) + m[1], hsum256(l1) + m[2], hsum256(h1) + m[3]];
            out[r][4 * g..4 * g + 4].copy_from_slice(&v);
        }
    }
    out
}

#[inline(always)]
unsafe fn rd32(p: *const u8) -> u64 {
    (p as *const u32).read_unaligned() as u64
}

/// The eight integer dots of weight group `wl` (one 4-byte group broadcast) against the eight
/// activation rows' same group at p, as f32.
#[inline(always)]
unsafe fn group_dot(p: *const u8, wl: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), wl, _mm256_loadu_si256(p as _)))
}

/// Q4_1 weight rows `w[r]` against eight Q8_1 activation rows in the eights form
/// (`quant::Q8_1Eights`: block i at `q + Q8_1_EIGHTS_BLOCK_BYTES i`, its 4-byte group l of the
/// eight rows side by side at `+ 32 l`, then the rows' d and s as f32 at `+ 256` and `+ 288`):
/// out[r][t] is bit for bit `dot_q4_1_x4_scaled`'s value for weight row r and activation row t.
///
/// Why faster than `dot_q4_1_rows_scaled`: its registers hold one (weight row, activation
/// row) pair's eight lanes, two pairs a 512-bit register, so every block's scale products
/// d_w * d_a had to be spread across the halves (a permute per register) and two activation
/// rows assembled per register. Here a register holds ONE of those eight lanes for the eight
/// activation rows: lane t of `acc[r][l]` is lane l of pair (r, t). The scale products of a
/// block are then one multiply (d_w times the eight rows' d_a, lane t for row t) and each dot
/// is one `vpdpbusd` of weight group l (broadcast in-lane) against the eight rows' group l,
/// one load. Why the same bits: every lane still gets the same integer sum, the same product
/// d_w * d_a rounded once, the same FMA per block in the same block order; the final
/// horizontal sum's tree (lanes l and l + 4, then the pairs' sums, then the two halves, as
/// `hsum256`) becomes the same additions between registers, then + m_w * s_a's sum.
///
/// # Safety
/// avx512f/vl/vnni, avx2, fma, f16c; every weight row holds `nb` blocks, q `nb` blocks of the
/// eights form.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(in super::super) unsafe fn dot_q4_1_rows_eights<const R: usize>(w: [*const u8; R], q: *const u8, nb: usize) -> [[f32; 8]; R] {
    let low4 = _mm256_set1_epi8(0x0F);
    // acc[r][l], lane t: lane l of the (weight row r, activation row t) accumulator.
    let mut acc = [[_mm256_setzero_ps(); 8]; R];
    let mut summs = [_mm256_setzero_ps(); R];
    for i in 0..nb {
        let qa = q.add(super::super::Q8_1_EIGHTS_BLOCK_BYTES * i);
        let (d_a, s_a) = (_mm256_loadu_ps(qa.add(256) as _), _mm256_loadu_ps(qa.add(288) as _));
        for r in 0..R {
            let bw = w[r].add(i * Q4_1_BYTES);
            // The 16 nibble bytes in both 128-bit lanes: groups 0-3 are the low nibbles, 4-7 the high.
            let x = _mm256_broadcastsi128_si256(_mm_loadu_si128(bw.add(4) as _));
            let (lo, hi) = (_mm256_and_si256(x, low4), _mm256_and_si256(_mm256_srli_epi16::<4>(x), low4));
            let dm_w = _mm_cvtph_ps(_mm_cvtsi32_si128(rd32(bw) as i32)); // [d, m, 0, 0]
            let (d_w, m_w) = (_mm256_broadcastss_ps(dm_w), _mm256_broadcastss_ps(_mm_movehdup_ps(dm_w)));
            summs[r] = _mm256_add_ps(summs[r], _mm256_mul_ps(m_w, s_a));
            let sc = _mm256_mul_ps(d_w, d_a); // lane t: d_w * d_a[t]
            acc[r][0] = _mm256_fmadd_ps(group_dot(qa.add(0), _mm256_shuffle_epi32::<0x00>(lo)), sc, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(group_dot(qa.add(32), _mm256_shuffle_epi32::<0x55>(lo)), sc, acc[r][1]);
            acc[r][2] = _mm256_fmadd_ps(group_dot(qa.add(64), _mm256_shuffle_epi32::<0xAA>(lo)), sc, acc[r][2]);
            acc[r][3] = _mm256_fmadd_ps(group_dot(qa.add(96), _mm256_shuffle_epi32::<0xFF>(lo)), sc, acc[r][3]);
            acc[r][4] = _mm256_fmadd_ps(group_dot(qa.add(128), _mm256_shuffle_epi32::<0x00>(hi)), sc, acc[r][4]);
            acc[r][5] = _mm256_fmadd_ps(group_dot(qa.add(160), _mm256_shuffle_epi32::<0x55>(hi)), sc, acc[r][5]);
            acc[r][6] = _mm256_fmadd_ps(group_dot(qa.add(192), _mm256_shuffle_epi32::<0xAA>(hi)), sc, acc[r][6]);
            acc[r][7] = _mm256_fmadd_ps(group_dot(qa.add(224), _mm256_shuffle_epi32::<0xFF>(hi)), sc, acc[r][7]);
        }
    }
    let mut out = [[0f32; 8]; R];
    for r in 0..R {
        let a = &acc[r];
        // hsum256's tree, lane by lane: (l0 + l4) + (l2 + l6), (l1 + l5) + (l3 + l7), then their sum.
        let (t0, t1, t2, t3) = (_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[2], a[6]), _mm256_add_ps(a[3], a[7]));
        let v = _mm256_add_ps(_mm256_add_ps(t0, t2), _mm256_add_ps(t1, t3));
        _mm256_storeu_ps(out[r].as_mut_ptr(), _mm256_add_ps(v, summs[r]));
    }
    out
}
