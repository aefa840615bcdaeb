//! AVX2 tile kernels: R weight rows against T activation rows in one pass, each result bit for
//! bit the single dot of the parent module (`dot_q8_0`, `dot_q4_0`, `dot_q5_0`, `dot_q5_1`,
//! `dot_q4_k`, `dot_q5_k`, `dot_q6_k`). A weight block is loaded and unpacked once per tile instead of
//! once per dot; every output keeps its own accumulators, block order, scale products and
//! horizontal sums (only exact integer work is shared or reordered). The Q4_1 tile lives in
//! the parent (`dot_q4_1_tile`).
#![allow(clippy::needless_range_loop)] // r/t index several parallel arrays at once.

use super::*;

/// The 32-element block formats with Q8_0 activations in the single dots' order: one block
/// per register, one FMA per block with d_w * d_a. `prep` unpacks a weight block's quants,
/// `prod` gives the i16 pair sums of (prepared weights, activation quants).
#[inline(always)]
unsafe fn q8_0_act_tile<const R: usize, const T: usize>(
    w: [*const u8; R],
    a: [*const u8; T],
    nb: usize,
    w_bytes: usize,
    prep: impl Fn(*const u8) -> __m256i,
    prod: impl Fn(__m256i, __m256i) -> __m256i,
) -> [[f32; T]; R] {
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    for i in 0..nb {
        for r in 0..R {
            let bw = w[r].add(i * w_bytes);
            let q = prep(bw);
            for t in 0..T {
                let ba = a[t].add(i * Q8_0_BYTES);
                let p = prod(q, loadu256(ba.add(2)));
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(widen(p)), scale_product(bw, ba), acc[r][t]);
            }
        }
    }
    let mut out = [[0f32; T]; R];
    for r in 0..R {
        for t in 0..T {
            out[r][t] = hsum256(acc[r][t]);
        }
    }
    out
}

/// Q8_0 x Q8_0 tile (`dot_q8_0`'s sign trick).
///
/// # Safety
/// avx2/fma/f16c; every row holds `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn dot_q8_0_tile<const R: usize, const T: usize>(
    w: [*const u8; R],
    a: [*const u8; T],
    nb: usize,
) -> [[f32; T]; R] {
    let prep = |bw: *const u8| loadu256(bw.add(2));
    let prod = |wq: __m256i, aq: __m256i| _mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(aq, wq));
    q8_0_act_tile::<R, T>(w, a, nb, Q8_0_BYTES, prep, prod)
}

/// Q4_0 x Q8_0 tile (`dot_q4_0`).
///
/// # Safety
/// As `dot_q8_0_tile`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn dot_q4_0_tile<const R: usize, const T: usize>(
    w: [*const u8; R],
    a: [*const u8; T],
    nb: usize,
) -> [[f32; T]; R] {
    let eight = _mm256_set1_epi8(8);
    let prep = |bw: *const u8| nibbles_16(bw.add(2));
    let prod = |q: __m256i, aq: __m256i| _mm256_sub_epi16(_mm256_maddubs_epi16(q, aq), _mm256_maddubs_epi16(eight, aq));
    q8_0_act_tile::<R, T>(w, a, nb, Q4_0_BYTES, prep, prod)
}

/// Q5_0 x Q8_0 tile (`dot_q5_0`; the AVX-512 level runs it too).
///
/// # Safety
/// As `dot_q8_0_tile`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn dot_q5_0_tile<const R: usize, const T: usize>(
    w: [*const u8; R],
    a: [*const u8; T],
    nb: usize,
) -> [[f32; T]; R] {
    let sixteen = _mm256_set1_epi8(16);
    let prep = |bw: *const u8| _mm256_or_si256(nibbles_16(bw.add(6)), fifth_bits_32(bw.add(2)));
    let prod = |q: __m256i, aq: __m256i| _mm256_sub_epi16(_mm256_maddubs_epi16(q, aq), _mm256_maddubs_epi16(sixteen, aq));
    q8_0_act_tile::<R, T>(w, a, nb, Q5_0_BYTES, prep, prod)
}

/// Q4_K/Q5_K tile in `kx_superblock`'s arithmetic; `levels(bw, c)` is chunk c of the weight
/// super-block at bw as (sub-block 2c, sub-block 2c + 1).
#[inline(always)]
unsafe fn kx_tile<const R: usize, const T: usize>(
    w: [*const u8; R],
    a: [*const u8; T],
    nsb: usize,
    w_bytes: usize,
    levels: impl Fn(*const u8, usize) -> (__m256i, __m256i),
) -> [[f32; T]; R] {
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    let mut acc_min = [[_mm256_setzero_ps(); T]; R];
    for i in 0..nsb {
        for r in 0..R {
            let bw = w[r].add(i * w_bytes);
            let (sc, mn) = unpack_scales_mins_k4(&*(bw.add(4) as *const [u8; 12]));
            let mut isum = [_mm256_setzero_si256(); T];
            for c in 0..4 {
                let (lo, hi) = levels(bw, c);
                let s_lo = _mm256_set1_epi16((sc >> (16 * c)) as u8 as i16);
                let s_hi = _mm256_set1_epi16((sc >> (16 * c + 8)) as u8 as i16);
                for t in 0..T {
                    let qa = a[t].add(i * Q8_K_BYTES + 4 + 64 * c);
                    let p_lo = _mm256_maddubs_epi16(lo, loadu256(qa));
                    let p_hi = _mm256_maddubs_epi16(hi, loadu256(qa.add(32)));
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p_lo, s_lo));
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p_hi, s_hi));
                }
            }
            let mv = _mm_cvtsi64_si128(mn as i64);
            let mins16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mv, mv));
            let (d_w, dmin_w) = (f16c(rd16(bw) as u16), f16c(rd16(bw.add(2)) as u16));
            for t in 0..T {
                let (da, _, bsums) = q8k(a[t].add(i * Q8_K_BYTES));
                let msum = _mm256_madd_epi16(bsums, mins16);
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_set1_ps(d_w * da), acc[r][t]);
                acc_min[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_set1_ps(dmin_w * da), acc_min[r][t]);
            }
        }
    }
    let mut out = [[0f32; T]; R];
    for r in 0..R {
        for t in 0..T {
            out[r][t] = hsum256(acc[r][t]) - hsum256(acc_min[r][t]);
        }
    }
    out
}

/// Q4_K x Q8_K tile (`dot_q4_k`).
///
/// # Safety
/// avx2/fma/f16c; every row holds `nsb` super-blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn dot_q4_k_tile<const R: usize, const T: usize>(
    w: [*const u8; R],
    a: [*const u8; T],
    nsb: usize,
) -> [[f32; T]; R] {
    let m0f = _mm256_set1_epi8(0x0F);
    let levels = |bw: *const u8, c: usize| {
        let raw = loadu256(bw.add(16 + 32 * c));
        (_mm256_and_si256(raw, m0f), _mm256_and_si256(_mm256_srli_epi16(raw, 4), m0f))
    };
    kx_tile::<R, T>(w, a, nsb, Q4_K_BYTES, levels)
}

/// Q5_K x Q8_K tile (`dot_q5_k`).
///
/// # Safety
/// As `dot_q4_k_tile`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn dot_q5_k_tile<const R: usize, const T: usize>(
    w: [*const u8; R],
    a: [*const u8; T],
    nsb: usize,
) -> [[f32; T]; R] {
    let m0f = _mm256_set1_epi8(0x0F);
    let one = _mm256_set1_epi8(1);
    let levels = |bw: *const u8, c: usize| {
        let qh = loadu256(bw.add(16));
        let raw = loadu256(bw.add(48 + 32 * c));
        let h_lo = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32)), one);
        let h_hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32 + 1)), one);
        (
            _mm256_or_si256(_mm256_and_si256(raw, m0f), _mm256_slli_epi16(h_lo, 4)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m0f), _mm256_slli_epi16(h_hi, 4)),
        )
    };
    kx_tile::<R, T>(w, a, nsb, Q5_K_BYTES, levels)
}

/// Q6_K x Q8_K tile (`dot_q6_k`).
///
/// # Safety
/// As `dot_q4_k_tile`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn dot_q6_k_tile<const R: usize, const T: usize>(
    w: [*const u8; R],
    a: [*const u8; T],
    nsb: usize,
) -> [[f32; T]; R] {
    let m0f = _mm256_set1_epi8(0x0F);
    let m30 = _mm256_set1_epi8(0x30);
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    for i in 0..nsb {
        for r in 0..R {
            let bw = w[r].add(i * Q6_K_BYTES);
            let sc8 = _mm_loadu_si128(bw.add(192) as _);
            let mut isum = [_mm256_setzero_si256(); T];
            for h in 0..2 {
                let ql0 = loadu256(bw.add(64 * h));
                let ql1 = loadu256(bw.add(64 * h + 32));
                let qh = loadu256(bw.add(128 + 32 * h));
                let q = [
                    _mm256_or_si256(_mm256_and_si256(ql0, m0f), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)),
                    _mm256_or_si256(_mm256_and_si256(ql1, m0f), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m0f), _mm256_and_si256(qh, m30)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m0f), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30)),
                ];
                for (k, q) in q.into_iter().enumerate() {
                    let g = (8 * h + 2 * k) as i8;
                    let pick = _mm_setr_epi8(g, g, g, g, g, g, g, g, g + 1, g + 1, g + 1, g + 1, g + 1, g + 1, g + 1, g + 1);
                    let s = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, pick));
                    for t in 0..T {
                        let qa = a[t].add(i * Q8_K_BYTES + 4 + 128 * h + 32 * k);
                        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q, loadu256(qa)), s));
                    }
                }
            }
            let sc16 = _mm256_cvtepi8_epi16(sc8);
            let d_w = f16c(rd16(bw.add(208)) as u16);
            for t in 0..T {
                let (da, _, bsums) = q8k(a[t].add(i * Q8_K_BYTES));
                let offset = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsums), 5);
                let is = _mm256_sub_epi32(isum[t], offset);
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_set1_ps(d_w * da), acc[r][t]);
            }
        }
    }
    let mut out = [[0f32; T]; R];
    for r in 0..R {
        for t in 0..T {
            out[r][t] = hsum256(acc[r][t]);
        }
    }
    out
}

/// Q5_1 x Q8_1 tile (`dot_q5_1`: the m * s terms summed apart per output, added after the
/// horizontal sum).
///
/// # Safety
/// avx2/fma/f16c; every row holds `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn dot_q5_1_tile<const R: usize, const T: usize>(
    w: [*const u8; R],
    a: [*const u8; T],
    nb: usize,
) -> [[f32; T]; R] {
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    let mut summs = [[0f32; T]; R];
    for i in 0..nb {
        for r in 0..R {
            let bw = w[r].add(i * Q5_1_BYTES);
            let q = _mm256_or_si256(nibbles_16(bw.add(8)), fifth_bits_32(bw.add(4)));
            let m_w = f16c(rd16(bw.add(2)) as u16);
            for t in 0..T {
                let ba = a[t].add(i * Q8_1_BYTES);
                let dot = widen(_mm256_maddubs_epi16(q, loadu256(ba.add(4))));
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale_product(bw, ba), acc[r][t]);
                summs[r][t] += m_w * f16c(rd16(ba.add(2)) as u16);
            }
        }
    }
    let mut out = [[0f32; T]; R];
    for r in 0..R {
        for t in 0..T {
            out[r][t] = hsum256(acc[r][t]) + summs[r][t];
        }
    }
    out
}
