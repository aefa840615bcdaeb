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
                    isum[t] = dpwssd(isum[t], _mm512_maddubs_epi16(lv, loadu512(qa.add(64 * c))), s);
                }
            }
            let mv = _mm_cvtsi64_si128(mn as i64);
            let mins16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mv, mv));
            let dm_w = dmin_pair(bw);
            for t in 0..T {
                let ba = a[t].add(i * Q8_K_BYTES);
                let (_, _, bsums) = q8k(ba);
                let (s, s_min) = scale_pair(dm_w, ba);
                let msum = _mm256_madd_epi16(bsums, mins16);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), s, acc[r][t]);
                acc_min[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), s_min, acc_min[r][t]);
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
                    isum[t] = dpwssd(isum[t], _mm512_maddubs_epi16(lo, loadu512(qa.add(128 * h))), s_lo);
                    isum[t] = dpwssd(isum[t], _mm512_maddubs_epi16(hi, loadu512(qa.add(128 * h + 64))), s_hi);
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

/// `vpdpwssd` (acc + the i32 pair sums of a * b), kept as one instruction: LLVM's generic
/// tuning rewrites chains of `_mm512_dpwssd_epi32` into `vpmaddwd` + `vpaddd` (one more vector
/// op per 32 products in the K-quant tiles' inner loop; Q4_K 1x8 tile bench 1.03x with this).
/// The same exact integer result.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn dpwssd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    let mut acc = acc;
    // SAFETY: a register-only AVX-512 VNNI instruction, available per the target features.
    std::arch::asm!("vpdpwssd {acc}, {a}, {b}", acc = inout(zmm_reg) acc, a = in(zmm_reg) a, b = in(zmm_reg) b, options(pure, nomem, nostack, preserves_flags));
    acc
}

/// The 32 levels (0..=15) of one 4-bit block whose 16 nibble bytes start at p, in element
/// order, in both 256-bit halves: [low nibbles, high nibbles, low nibbles, high nibbles].
#[inline(always)]
unsafe fn nibbles_16_twice(p: *const u8) -> __m512i {
    let x4 = _mm512_broadcast_i32x4(_mm_loadu_si128(p as _));
    // Shift the second and fourth copies right by 4 (16-bit lanes 8..15 and 24..31).
    const S4: i64 = 0x0004_0004_0004_0004;
    let shifts = _mm512_setr_epi64(0, 0, S4, S4, 0, 0, S4, S4);
    _mm512_and_si512(_mm512_srlv_epi16(x4, shifts), _mm512_set1_epi8(0x0F))
}

/// Adds 16 to level j of both halves where bit j of the little-endian u32 at qh is set (the
/// fifth bit of Q5_0/Q5_1; the levels are < 16, so the add is the or).
#[inline(always)]
unsafe fn with_fifth_bits(q: __m512i, qh: *const u8) -> __m512i {
    let bits = (qh as *const u32).read_unaligned() as u64;
    _mm512_mask_add_epi8(q, bits | bits << 32, q, _mm512_set1_epi8(16))
}

/// The low and high 256-bit halves of an f32 register.
#[inline(always)]
unsafe fn halves(v: __m512) -> (__m256, __m256) {
    (_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))))
}

/// The 32-element block formats whose single dot at this level is the 256-bit one (ggml's
/// order, kept for llama.cpp parity: Q5_0 with Q8_0 activations, Q4_1 and Q5_1 with Q8_1):
/// one block per 8 f32 lanes, one FMA per block with d_w * d_a, for Q8_1 the m_w * s_a terms
/// summed apart and added after the horizontal sum. The tile runs two of those dots in one
/// 512-bit register, activation row t0 in the low half and t1 in the high half (the weight
/// block in both), so every lane does exactly the single dot's arithmetic, with `vpdpbusd`
/// for the integer sums (each i32 lane = the same four products as `vpmaddubsw` +
/// `vpmaddwd`, exact either way). `levels(bw)` unpacks a weight block into both halves;
/// `act_start(aq)` is the i32 value the lane sums start from (Q5_0: -16 * the activations'
/// sums, its level offset). `MIN`: Q8_1 activations and a weight min at bw + 2.
#[inline(always)]
unsafe fn act_pairs_tile<const R: usize, const T: usize, const MIN: bool>(
    w: [*const u8; R],
    a: [*const u8; T],
    nb: usize,
    w_bytes: usize,
    levels: impl Fn(*const u8) -> __m512i,
    act_start: impl Fn(__m512i) -> __m512i,
) -> [[f32; T]; R] {
    let (a_bytes, a_quants) = if MIN { (Q8_1_BYTES, 4) } else { (Q8_0_BYTES, 2) };
    let pairs = T.div_ceil(2);
    let pair = |p: usize| (2 * p, (2 * p + 1).min(T - 1));
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    let mut summs = [[_mm_setzero_ps(); T]; R];
    for i in 0..nb {
        let mut aq = [_mm512_setzero_si512(); T];
        let mut start = [_mm512_setzero_si512(); T];
        let mut s_a = [_mm_setzero_ps(); T];
        for p in 0..pairs {
            let (t0, t1) = pair(p);
            let (a0, a1) = (a[t0].add(i * a_bytes), a[t1].add(i * a_bytes));
            aq[p] = load_2x32(a0.add(a_quants), a1.add(a_quants));
            start[p] = act_start(aq[p]);
            // Q8_1: [d0, s0, d1, s1]; Q8_0: [d0, d1, 0, 0].
            let h = if MIN { rd32(a0) | rd32(a1) << 32 } else { rd16(a0) | rd16(a1) << 16 };
            s_a[p] = _mm_cvtph_ps(_mm_cvtsi64_si128(h as i64));
        }
        for r in 0..R {
            let bw = w[r].add(i * w_bytes);
            let q = levels(bw);
            // Q8_1: [d, m, d, m] (against [d0, s0, d1, s1]); Q8_0: d in every lane.
            let s_w =
                if MIN { _mm_cvtph_ps(_mm_cvtsi64_si128((rd32(bw) * 0x1_0000_0001) as i64)) } else { _mm_set1_ps(f16c(rd16(bw) as u16)) };
            for p in 0..pairs {
                let dot = _mm512_dpbusd_epi32(start[p], q, aq[p]);
                let prod = _mm_mul_ps(s_w, s_a[p]);
                let s = if MIN { spread_pair::<0, 2>(prod) } else { spread_pair::<0, 1>(prod) };
                acc[r][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), s, acc[r][p]);
                if MIN {
                    summs[r][p] = _mm_add_ps(summs[r][p], prod); // lanes 1 and 3: m * s of t0, t1
                }
            }
        }
    }
    let mut out = [[0f32; T]; R];
    for r in 0..R {
        for p in 0..pairs {
            let (t0, t1) = pair(p);
            let (lo, hi) = halves(acc[r][p]);
            let (mut v0, mut v1) = (hsum256(lo), hsum256(hi));
            // Only with mins: adding 0.0 would turn a -0.0 sum into +0.0.
            if MIN {
                let mut m = [0f32; 4];
                _mm_storeu_ps(m.as_mut_ptr(), summs[r][p]);
                (v0, v1) = (v0 + m[1], v1 + m[3]);
            }
            out[r][t1] = v1;
            out[r][t0] = v0;
        }
    }
    out
}

/// Q5_0 x Q8_0 tile (the 256-bit `dot_q5_0`: sum((q - 16) * a)).
///
/// # Safety
/// avx512f/bw/vl/vnni, avx2, fma, f16c; every row holds `nb` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(in super::super) unsafe fn dot_q5_0_tile<const R: usize, const T: usize>(
    w: [*const u8; R],
    a: [*const u8; T],
    nb: usize,
) -> [[f32; T]; R] {
    let (zero, sixteen) = (_mm512_setzero_si512(), _mm512_set1_epi8(16));
    let levels = |bw: *const u8| with_fifth_bits(nibbles_16_twice(bw.add(6)), bw.add(2));
    let act_start = |aq: __m512i| _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, sixteen, aq));
    act_pairs_tile::<R, T, false>(w, a, nb, Q5_0_BYTES, levels, act_start)
}

/// Q4_1 x Q8_1 tile (`dot_q4_1`).
///
/// # Safety
/// As `dot_q5_0_tile`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(in super::super) unsafe fn dot_q4_1_tile<const R: usize, const T: usize>(
    w: [*const u8; R],
    a: [*const u8; T],
    nb: usize,
) -> [[f32; T]; R] {
    let levels = |bw: *const u8| nibbles_16_twice(bw.add(4));
    act_pairs_tile::<R, T, true>(w, a, nb, Q4_1_BYTES, levels, |_| _mm512_setzero_si512())
}

/// Q5_1 x Q8_1 tile (the 256-bit `dot_q5_1`).
///
/// # Safety
/// As `dot_q5_0_tile`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(in super::super) unsafe fn dot_q5_1_tile<const R: usize, const T: usize>(
    w: [*const u8; R],
    a: [*const u8; T],
    nb: usize,
) -> [[f32; T]; R] {
    let levels = |bw: *const u8| with_fifth_bits(nibbles_16_twice(bw.add(8)), bw.add(4));
    act_pairs_tile::<R, T, true>(w, a, nb, Q5_1_BYTES, levels, |_| _mm512_setzero_si512())
}

/// `dot_q4_1_tile::<1, 4>` with the activation scales given as f32, block-major (d[i *
/// stride + t], s likewise, t = 0..3), as the AVX2 `dot_q4_1_x4_scaled`: the same products
/// (d_w * d_a per block, m_w * s_a summed in one vector), bit for bit.
///
/// # Safety
/// As `dot_q5_0_tile`; d and s hold `(nb - 1) * stride + 4` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(in super::super) unsafe fn dot_q4_1_x4_scaled(
    w: *const u8,
    a: [*const u8; 4],
    d: *const f32,
    s: *const f32,
    stride: usize,
    nb: usize,
) -> [f32; 4] {
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); 2];
    let mut summs = _mm_setzero_ps();
    for i in 0..nb {
        let bw = w.add(i * Q4_1_BYTES);
        let q = nibbles_16_twice(bw.add(4));
        let dm_w = _mm_cvtph_ps(_mm_cvtsi32_si128(rd32(bw) as i32)); // [d, m, 0, 0]
        summs = _mm_add_ps(summs, _mm_mul_ps(_mm_permute_ps::<0b01_01_01_01>(dm_w), _mm_loadu_ps(s.add(i * stride))));
        let sc = _mm_mul_ps(_mm_permute_ps::<0>(dm_w), _mm_loadu_ps(d.add(i * stride))); // d_w * d_a[t]
        let act = |t: usize| a[t].add(i * Q8_1_BYTES + 4);
        let dot01 = _mm512_dpbusd_epi32(zero, q, load_2x32(act(0), act(1)));
        let dot23 = _mm512_dpbusd_epi32(zero, q, load_2x32(act(2), act(3)));
        acc[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot01), spread_pair::<0, 1>(sc), acc[0]);
        acc[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot23), spread_pair::<2, 3>(sc), acc[1]);
    }
    let mut m = [0f32; 4];
    _mm_storeu_ps(m.as_mut_ptr(), summs);
    let ((l0, h0), (l1, h1)) = (halves(acc[0]), halves(acc[1]));
    [hsum256(l0) + m[0], hsum256(h0) + m[1], hsum256(l1) + m[2], hsum256(h1) + m[3]]
}

/// Q8_0 x Q8_0 for prefill, 1 weight row x T activation rows given in the offset form
/// (`quant::Q8_0Offset`: each activation quant + 128 as u8, 32 per block, back to back, and the
/// block scales as f32). Bit for bit `dot_q8_0_tile` (the AVX-512 single dot's arithmetic):
/// the same block pairs per register, the same f32 scale products dw * da, the same FMA order,
/// horizontal sum and scalar odd last block (on the original rows `a_rows`). Only the exact
/// integer lane sums are formed differently: sum((a + 128) * w) - 128 * sum(w) = sum(a * w),
/// one `vpdpbusd` per (row, pair) whose start value -128 * sum(w) is shared by the T rows,
/// where the single dot needs a sign mask, an absolute value and a masked negation per dot,
/// and the activation side is one 64-byte load with no per-dot f16 conversion.
///
/// # Safety
/// avx512f/bw/vl/vnni, avx2, fma, f16c; the weight row holds `nb` blocks, every offset row
/// `32 * nb` bytes, every scale row and original row `nb` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(in super::super) unsafe fn dot_q8_0_offset_tile<const T: usize>(
    w: *const u8,
    a_u8: [*const u8; T],
    a_d: [*const f32; T],
    a_rows: [*const u8; T],
    nb: usize,
) -> [f32; T] {
    let zero = _mm512_setzero_si512();
    let bias = _mm512_set1_epi8(-128); // 128 as the unsigned operand
    let spread = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let mut acc = [_mm512_setzero_ps(); T];
    let mut i = 0;
    while i + 2 <= nb {
        let w0 = w.add(i * Q8_0_BYTES);
        let w1 = w0.add(Q8_0_BYTES);
        let wq = load_2x32(w0.add(2), w1.add(2));
        let start = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, wq));
        let dw = _mm_cvtph_ps(_mm_cvtsi32_si128((rd16(w0) | rd16(w1) << 16) as i32));
        let dw = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(dw));
        for t in 0..T {
            let dot = _mm512_dpbusd_epi32(start, loadu512(a_u8[t].add(32 * i)), wq);
            let da = _mm_castpd_ps(_mm_load_sd(a_d[t].add(i) as *const f64));
            let s = _mm512_mul_ps(dw, _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(da)));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), s, acc[t]);
        }
        i += 2;
    }
    let mut out = [0f32; T];
    for t in 0..T {
        out[t] = hsum512(acc[t]);
        if i < nb {
            let wt = std::slice::from_raw_parts(w.add(i * Q8_0_BYTES), Q8_0_BYTES);
            let at = std::slice::from_raw_parts(a_rows[t].add(i * Q8_0_BYTES), Q8_0_BYTES);
            out[t] += super::super::super::legacy::dot_q8_0(wt, at, 32);
        }
    }
    out
}
