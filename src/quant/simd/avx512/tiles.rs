//! AVX-512 tile kernels: R weight rows against T activation rows in one pass, each result bit
//! for bit the single dot of the parent module (`dot_q8_0`, `dot_q4_0`, `dot_q4_k`,
//! `dot_q5_k`, `dot_q6_k`). Why they are faster: a weight block is loaded and unpacked (nibbles,
//! sign masks, sub-block scales and mins) once per tile instead of once per dot, and the
//! T accumulators are independent chains. Why they are exact: every output keeps its own
//! accumulators with the single dot's lane layout, block order, scale products and final
//! horizontal sums; only integer work (exact) is shared or reordered.
#![allow(clippy::needless_range_loop)] // r/t index several parallel arrays at once.

use super::*;

/// The 32-element block formats (Q8_0, Q4_0) in the single dots' order: two blocks per
/// 512-bit register, one FMA per pair, the odd last block in scalar after the horizontal sum.
/// `prep` unpacks a weight block pair (from its two quant pointers), `prod` gives the i32
/// lane sums of (prepared weights, activation quants).
#[inline(always)]
#[allow(clippy::too_many_arguments)] // the format's sizes and three kernel pieces
unsafe fn pairs_tile<const R: usize, const T: usize>(
    w: [*const u8; R],
    a: [*const u8; T],
    nb: usize,
    w_bytes: usize,
    quant_offset: usize,
    prep: impl Fn(*const u8, *const u8) -> __m512i,
    prod: impl Fn(__m512i, __m512i) -> __m512i,
    scalar_tail: impl Fn(&[u8], &[u8]) -> f32,
) -> [[f32; T]; R] {
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    let mut i = 0;
    while i + 2 <= nb {
        for r in 0..R {
            let w0 = w[r].add(i * w_bytes);
            let w1 = w0.add(w_bytes);
            let q = prep(w0.add(quant_offset), w1.add(quant_offset));
            for t in 0..T {
                let a0 = a[t].add(i * Q8_0_BYTES);
                let a1 = a0.add(Q8_0_BYTES);
                let dot = prod(q, load_2x32(a0.add(2), a1.add(2)));
                let s = spread_pair::<0, 1>(pair_scales(w0, w1, a0, a1));
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), s, acc[r][t]);
            }
        }
        i += 2;
    }
    let mut out = [[0f32; T]; R];
    for r in 0..R {
        for t in 0..T {
            out[r][t] = hsum512(acc[r][t]);
            if i < nb {
                let wt = std::slice::from_raw_parts(w[r].add(i * w_bytes), w_bytes);
                let at = std::slice::from_raw_parts(a[t].add(i * Q8_0_BYTES), Q8_0_BYTES);
                out[r][t] += scalar_tail(wt, at);
            }
        }
    }
    out
}

/// Q8_0 x Q8_0 tile (`dot_q8_0`'s sign trick: |w| times a with w's sign).
///
/// # Safety
/// avx512f/bw/vl/vnni, avx2, fma, f16c; every row holds `nb` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(in super::super) unsafe fn dot_q8_0_tile<const R: usize, const T: usize>(
    w: [*const u8; R],
    a: [*const u8; T],
    nb: usize,
) -> [[f32; T]; R] {
    let zero = _mm512_setzero_si512();
    let prep = |p0: *const u8, p1: *const u8| load_2x32(p0, p1);
    let prod = |wq: __m512i, aq: __m512i| {
        let neg = _mm512_movepi8_mask(wq);
        _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(wq), _mm512_mask_sub_epi8(aq, neg, zero, aq))
    };
    let tail = |wt: &[u8], at: &[u8]| super::super::super::legacy::dot_q8_0(wt, at, 32);
    pairs_tile::<R, T>(w, a, nb, Q8_0_BYTES, 2, prep, prod, tail)
}

/// Q4_0 x Q8_0 tile (`dot_q4_0`: sum(q * a) - sum(8 * a)).
///
/// # Safety
/// As `dot_q8_0_tile`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(in super::super) unsafe fn dot_q4_0_tile<const R: usize, const T: usize>(
    w: [*const u8; R],
    a: [*const u8; T],
    nb: usize,
) -> [[f32; T]; R] {
    let zero = _mm512_setzero_si512();
    let eight = _mm512_set1_epi8(8);
    let prep = |p0: *const u8, p1: *const u8| nibbles_2x16(p0, p1);
    let prod = |q: __m512i, aq: __m512i| _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, q, aq), _mm512_dpbusd_epi32(zero, eight, aq));
    let tail = |wt: &[u8], at: &[u8]| super::super::super::legacy::dot_q4_0(wt, at, 32);
    pairs_tile::<R, T>(w, a, nb, Q4_0_BYTES, 2, prep, prod, tail)
}

/// Q4_K/Q5_K tile in `kx_superblock`'s arithmetic; `levels(bw, c)` is chunk c of the weight
/// super-block at bw (sub-block 2c in bytes 0..31, 2c+1 in bytes 32..63).
#[inline(always)]
unsafe fn kx_tile<const R: usize, const T: usize>(
    w: [*const u8; R],
    a: [*const u8; T],
    nsb: usize,
    w_bytes: usize,
    levels: impl Fn(*const u8, usize) -> __m512i,
) -> [[f32; T]; R] {
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    let mut acc_min = [[_mm256_setzero_ps(); T]; R];
    for i in 0..nsb {
        for r in 0..R {
            let bw = w[r].add(i * w_bytes);
            let (sc, mn) = unpack_scales_mins_k4(&*(bw.add(4) as *const [u8; 12]));
            let sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
            let mut isum = [_mm512_setzero_si512(); T];
            for c in 0..4 {
                let lv = levels(bw, c);
                let s = _mm512_permutexvar_epi16(pair_index(2 * c as i16, 2 * c as i16 + 1), sc16);
                for t in 0..T {
                    let qa = a[t].add(i * Q8_K_BYTES + 4);
                    isum[t] = _mm512_dpwssd_epi32(isum[t], _mm512_maddubs_epi16(lv, loadu512(qa.add(64 * c))), s);
                }
            }
            let mv = _mm_cvtsi64_si128(mn as i64);
            let mins16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mv, mv));
            let (d_w, dmin_w) = (f16c(rd16(bw) as u16), f16c(rd16(bw.add(2)) as u16));
            for t in 0..T {
                let (da, _, bsums) = q8k(a[t].add(i * Q8_K_BYTES));
                let msum = _mm256_madd_epi16(bsums, mins16);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_set1_ps(d_w * da), acc[r][t]);
                acc_min[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_set1_ps(dmin_w * da), acc_min[r][t]);
            }
        }
    }
    let mut out = [[0f32; T]; R];
    for r in 0..R {
        for t in 0..T {
            out[r][t] = hsum512(acc[r][t]) - hsum256(acc_min[r][t]);
        }
    }
    out
}

/// Q4_K x Q8_K tile (`dot_q4_k`).
///
/// # Safety
/// avx512f/bw/vl/vnni, avx2, fma, f16c; every row holds `nsb` super-blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(in super::super) unsafe fn dot_q4_k_tile<const R: usize, const T: usize>(
    w: [*const u8; R],
    a: [*const u8; T],
    nsb: usize,
) -> [[f32; T]; R] {
    let m0f = _mm512_set1_epi8(0x0F);
    let sh = shift_high_half_by4();
    let levels = |bw: *const u8, c: usize| {
        let raw = _mm512_broadcast_i64x4(loadu256(bw.add(16 + 32 * c)));
        _mm512_and_si512(_mm512_srlv_epi16(raw, sh), m0f)
    };
    kx_tile::<R, T>(w, a, nsb, Q4_K_BYTES, levels)
}

/// Q5_K x Q8_K tile (`dot_q5_k`).
///
/// # Safety
/// As `dot_q4_k_tile`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(in super::super) unsafe fn dot_q5_k_tile<const R: usize, const T: usize>(
    w: [*const u8; R],
    a: [*const u8; T],
    nsb: usize,
) -> [[f32; T]; R] {
    let m0f = _mm512_set1_epi8(0x0F);
    let sixteen = _mm512_set1_epi8(16);
    let sh = shift_high_half_by4();
    let bit0 = _mm512_mask_blend_epi8(0xFFFF_FFFF_0000_0000, _mm512_set1_epi8(1), _mm512_set1_epi8(2));
    let levels = |bw: *const u8, c: usize| {
        let qh = _mm512_broadcast_i64x4(loadu256(bw.add(16)));
        let raw = _mm512_broadcast_i64x4(loadu256(bw.add(48 + 32 * c)));
        let q = _mm512_and_si512(_mm512_srlv_epi16(raw, sh), m0f);
        let bit = _mm512_sll_epi16(bit0, _mm_cvtsi32_si128(2 * c as i32));
        _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(qh, bit), q, sixteen)
    };
    kx_tile::<R, T>(w, a, nsb, Q5_K_BYTES, levels)
}

/// Q6_K x Q8_K tile (`dot_q6_k`).
///
/// # Safety
/// As `dot_q4_k_tile`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(in super::super) unsafe fn dot_q6_k_tile<const R: usize, const T: usize>(
    w: [*const u8; R],
    a: [*const u8; T],
    nsb: usize,
) -> [[f32; T]; R] {
    let m0f = _mm512_set1_epi8(0x0F);
    let m30 = _mm512_set1_epi8(0x30);
    let sh_lo = _mm512_mask_blend_epi16(0xFFFF_0000, _mm512_set1_epi16(4), _mm512_set1_epi16(2));
    let sh_hi = _mm512_mask_blend_epi16(0xFFFF_0000, _mm512_setzero_si512(), _mm512_set1_epi16(2));
    let idxs = [q6_k_scale_index(0), q6_k_scale_index(1), q6_k_scale_index(2), q6_k_scale_index(3)];
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    for i in 0..nsb {
        for r in 0..R {
            let bw = w[r].add(i * Q6_K_BYTES);
            let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(bw.add(192) as _));
            let sc16 = _mm512_castsi256_si512(sc);
            let mut isum = [_mm512_setzero_si512(); T];
            for h in 0..2 {
                let ql = loadu512(bw.add(64 * h));
                let qh = _mm512_broadcast_i64x4(loadu256(bw.add(128 + 32 * h)));
                let lo = _mm512_or_si512(_mm512_and_si512(ql, m0f), _mm512_and_si512(_mm512_sllv_epi16(qh, sh_lo), m30));
                let hi =
                    _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m0f), _mm512_and_si512(_mm512_srlv_epi16(qh, sh_hi), m30));
                let (s_lo, s_hi) = (_mm512_permutexvar_epi16(idxs[2 * h], sc16), _mm512_permutexvar_epi16(idxs[2 * h + 1], sc16));
                for t in 0..T {
                    let qa = a[t].add(i * Q8_K_BYTES + 4);
                    isum[t] = _mm512_dpwssd_epi32(isum[t], _mm512_maddubs_epi16(lo, loadu512(qa.add(128 * h))), s_lo);
                    isum[t] = _mm512_dpwssd_epi32(isum[t], _mm512_maddubs_epi16(hi, loadu512(qa.add(128 * h + 64))), s_hi);
                }
            }
            let d_w = f16c(rd16(bw.add(208)) as u16);
            for t in 0..T {
                let (da, _, bsums) = q8k(a[t].add(i * Q8_K_BYTES));
                let offset = _mm256_slli_epi32(_mm256_madd_epi16(sc, bsums), 5);
                let is = _mm512_sub_epi32(isum[t], _mm512_zextsi256_si512(offset));
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_set1_ps(d_w * da), acc[r][t]);
            }
        }
    }
    let mut out = [[0f32; T]; R];
    for r in 0..R {
        for t in 0..T {
            out[r][t] = hsum512(acc[r][t]);
        }
    }
    out
}
