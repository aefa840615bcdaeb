//! AVX-512 (F/BW/VL/VNNI) dot kernels. Layout tricks, per format:
//! - 32-blocks (Q8_0/Q4_0): two blocks per 512-bit register, `vpdpbusd` for the integer
//!   products (u8 x i8; Q8_0 weights use the abs/negate sign trick), one f32 scale per half.
//!   (Measured on Zen 4: 5-25% faster than one block per 256-bit register with VNNI.)
//!   Q4_1 keeps ggml's one-block-per-256-bit order so its sums are bit-identical to llama.cpp's,
//!   and so do Q5_0/Q5_1 (they run the AVX2 single dots); their tiles (tiles.rs) put two
//!   such 256-bit dots side by side in one 512-bit register.
//! - K-quants: one 64-element chunk per register; `vpmaddubsw` (levels are unsigned) then
//!   `vpdpwssd` with the sub-block scales broadcast per lane; mins and Q6_K's -32 offset come
//!   from the Q8_K group sums once per super-block.
//!
//! Every load is unaligned, so rows may start anywhere.
#![allow(clippy::incompatible_msrv)] // AVX-512 intrinsics are stable since Rust 1.89.

use super::super::k_quants::{unpack_scales_mins_k4, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, Q8_K_BYTES};
use super::super::legacy::{Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES, Q5_1_BYTES, Q8_0_BYTES, Q8_1_BYTES};
use super::GgmlType;
use std::arch::x86_64::*;

pub(super) mod q4_k_x8;
pub(super) mod q8_0_x8;
pub(super) mod tiles;
pub(super) mod tiles_multi;

/// # Safety
/// The CPU must support avx512f/bw/vl/vnni, avx2, fma and f16c; the rows must hold n elements.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn dot(t: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    match t {
        GgmlType::F32 => dot_f32(w, a, n),
        GgmlType::F16 => dot_f16(w, a, n),
        GgmlType::BF16 => dot_bf16(w, a, n),
        GgmlType::Q8_0 => dot_q8_0(w, a, n),
        GgmlType::Q4_0 => dot_q4_0(w, a, n),
        GgmlType::Q4_1 => dot_q4_1(w, a, n),
        // The 256-bit kernels (one block per register, as ggml's AVX2/AVX-512 builds run them).
        GgmlType::Q5_0 => super::avx2::dot_q5_0(w, a, n),
        GgmlType::Q5_1 => super::avx2::dot_q5_1(w, a, n),
        GgmlType::Q4_K => dot_q4_k(w, a, n),
        GgmlType::Q5_K => dot_q5_k(w, a, n),
        GgmlType::Q6_K => dot_q6_k(w, a, n),
        _ => super::dot_scalar(t, w, a, n),
    }
}

/// f16 to f32 with F16C, inline (half's conversion goes through a run-time dispatch call).
#[inline(always)]
unsafe fn f16c(h: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

#[inline(always)]
unsafe fn rd16(p: *const u8) -> u64 {
    (p as *const u16).read_unaligned() as u64
}

#[inline(always)]
unsafe fn loadu256(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline(always)]
unsafe fn loadu512(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p as *const _)
}

/// 32 bytes at p0 in the low half, 32 bytes at p1 in the high half.
#[inline(always)]
unsafe fn load_2x32(p0: *const u8, p1: *const u8) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(loadu256(p0)), loadu256(p1))
}

/// The 32 levels (0..=15) of two 4-bit blocks whose 16 nibble bytes start at p0 and p1, in
/// element order: [p0 low nibbles, p0 high nibbles, p1 low, p1 high].
#[inline(always)]
unsafe fn nibbles_2x16(p0: *const u8, p1: *const u8) -> __m512i {
    let pair = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(_mm_loadu_si128(p0 as _)), _mm_loadu_si128(p1 as _));
    let dup = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3), _mm512_castsi256_si512(pair));
    // Shift the second copy of each block right by 4 (16-bit lanes 8..15 and 24..31).
    const S4: i64 = 0x0004_0004_0004_0004;
    let shifts = _mm512_setr_epi64(0, 0, S4, S4, 0, 0, S4, S4);
    _mm512_and_si512(_mm512_srlv_epi16(dup, shifts), _mm512_set1_epi8(0x0F))
}

/// f32 lanes 0..7 = s[i0], lanes 8..15 = s[i1] of a 128-bit vector s.
#[inline(always)]
unsafe fn spread_pair<const I0: i32, const I1: i32>(s: __m128) -> __m512 {
    let idx = _mm512_setr_epi32(I0, I0, I0, I0, I0, I0, I0, I0, I1, I1, I1, I1, I1, I1, I1, I1);
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(s))
}

/// [dw0*da0, dw1*da1, ..] from the f16 scales at the starts of two weight and two act blocks.
#[inline(always)]
unsafe fn pair_scales(w0: *const u8, w1: *const u8, a0: *const u8, a1: *const u8) -> __m128 {
    let h = rd16(w0) | rd16(w1) << 16 | rd16(a0) << 32 | rd16(a1) << 48;
    let f = _mm_cvtph_ps(_mm_cvtsi64_si128(h as i64));
    _mm_mul_ps(f, _mm_movehl_ps(f, f))
}

#[inline(always)]
unsafe fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[inline(always)]
unsafe fn hsum512(v: __m512) -> f32 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    hsum256(_mm256_add_ps(_mm512_castps512_ps256(v), hi))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let nb = n / 32;
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let zero = _mm512_setzero_si512();
    let mut acc = _mm512_setzero_ps();
    let mut i = 0;
    while i + 2 <= nb {
        let (w0, a0) = (wp.add(i * Q8_0_BYTES), ap.add(i * Q8_0_BYTES));
        let (w1, a1) = (w0.add(Q8_0_BYTES), a0.add(Q8_0_BYTES));
        let wq = load_2x32(w0.add(2), w1.add(2));
        let aq = load_2x32(a0.add(2), a1.add(2));
        // vpdpbusd wants u8 x i8: |w| times a with w's sign. Activations are never -128.
        let neg = _mm512_movepi8_mask(wq);
        let signed_a = _mm512_mask_sub_epi8(aq, neg, zero, aq);
        let dot = _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(wq), signed_a);
        let s = spread_pair::<0, 1>(pair_scales(w0, w1, a0, a1));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), s, acc);
        i += 2;
    }
    let mut sum = hsum512(acc);
    if i < nb {
        sum += super::super::legacy::dot_q8_0(&w[i * Q8_0_BYTES..], &a[i * Q8_0_BYTES..], 32);
    }
    sum
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q4_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let nb = n / 32;
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let zero = _mm512_setzero_si512();
    let eight = _mm512_set1_epi8(8);
    let mut acc = _mm512_setzero_ps();
    let mut i = 0;
    while i + 2 <= nb {
        let (w0, a0) = (wp.add(i * Q4_0_BYTES), ap.add(i * Q8_0_BYTES));
        let (w1, a1) = (w0.add(Q4_0_BYTES), a0.add(Q8_0_BYTES));
        let q = nibbles_2x16(w0.add(2), w1.add(2));
        let aq = load_2x32(a0.add(2), a1.add(2));
        // sum((q - 8) * a) = sum(q * a) - sum(8 * a)
        let dot = _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, q, aq), _mm512_dpbusd_epi32(zero, eight, aq));
        let s = spread_pair::<0, 1>(pair_scales(w0, w1, a0, a1));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), s, acc);
        i += 2;
    }
    let mut sum = hsum512(acc);
    if i < nb {
        sum += super::super::legacy::dot_q4_0(&w[i * Q4_0_BYTES..], &a[i * Q8_0_BYTES..], 32);
    }
    sum
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q4_1(w: &[u8], a: &[u8], n: usize) -> f32 {
    // ggml_vec_dot_q4_1_q8_1's order exactly (greedy parity with llama.cpp): one block per
    // 256-bit `vpdpbusd`, one FMA per block into 8 lanes, the m*s terms (Q8_1's f16 s) summed
    // apart in scalar and added after the horizontal sum.
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let zero = _mm256_setzero_si256();
    let mask = _mm_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    for i in 0..n / 32 {
        let (bw, ba) = (wp.add(i * Q4_1_BYTES), ap.add(i * Q8_1_BYTES));
        let t = _mm_loadu_si128(bw.add(4) as _);
        let q = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(_mm_and_si128(t, mask)), _mm_and_si128(_mm_srli_epi16(t, 4), mask));
        let dot = _mm256_dpbusd_epi32(zero, q, loadu256(ba.add(4)));
        let f = _mm_cvtph_ps(_mm_cvtsi64_si128((rd16(bw) | rd16(ba) << 16 | rd16(bw.add(2)) << 32 | rd16(ba.add(2)) << 48) as i64));
        let d = _mm_mul_ss(f, _mm_movehdup_ps(f));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_broadcastss_ps(d), acc);
        let m = _mm_movehl_ps(f, f);
        summs += _mm_cvtss_f32(_mm_mul_ss(m, _mm_movehdup_ps(m)));
    }
    hsum256(acc) + summs
}

/// i16 lane indices selecting scale `2c` for lanes 0..15 and `2c + 1` for lanes 16..31.
#[inline(always)]
unsafe fn pair_index(lo: i16, hi: i16) -> __m512i {
    _mm512_mask_blend_epi16(0xFFFF_0000, _mm512_set1_epi16(lo), _mm512_set1_epi16(hi))
}

/// Q8_K parts of one activation super-block: (d, pointer to the 256 quants, group sums).
#[inline(always)]
unsafe fn q8k(ba: *const u8) -> (f32, *const u8, __m256i) {
    ((ba as *const f32).read_unaligned(), ba.add(4), loadu256(ba.add(260)))
}

/// Per super-block of Q4_K/Q5_K: d*da*sum_sb(scale*sum(q*a)) - dmin*da*sum_g(min*bsum).
#[inline(always)]
unsafe fn kx_superblock(bw: *const u8, ba: *const u8, mut levels: impl FnMut(usize) -> __m512i, acc: &mut __m512, acc_min: &mut __m256) {
    let (_, qa, bsums) = q8k(ba);
    let (sc, mn) = unpack_scales_mins_k4(&*(bw.add(4) as *const [u8; 12]));
    let sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
    let mut isum = _mm512_setzero_si512();
    for c in 0..4 {
        // levels(c): chunk c, sub-block 2c in bytes 0..31 and 2c+1 in bytes 32..63.
        let p = _mm512_maddubs_epi16(levels(c), loadu512(qa.add(64 * c)));
        let s = _mm512_permutexvar_epi16(pair_index(2 * c as i16, 2 * c as i16 + 1), sc16);
        isum = _mm512_dpwssd_epi32(isum, p, s);
    }
    let mv = _mm_cvtsi64_si128(mn as i64);
    let mins16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mv, mv));
    let msum = _mm256_madd_epi16(bsums, mins16);
    let (s, s_min) = scale_pair(dmin_pair(bw), ba);
    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), s, *acc);
    *acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), s_min, *acc_min);
}

/// [d_w, dmin_w, 0, 0] of the Q4_K/Q5_K super-block at bw (one f16 conversion for both).
#[inline(always)]
unsafe fn dmin_pair(bw: *const u8) -> __m128 {
    _mm_cvtph_ps(_mm_cvtsi32_si128(rd32(bw) as i32))
}

/// d_w * d_a broadcast to 16 lanes and dmin_w * d_a to 8, d_a the f32 at ba (the Q8_K block):
/// both products in one multiply, each the same f32 product as a scalar multiply, and
/// broadcasts from registers where two scalar multiplies and their broadcasts were (one
/// instruction less per super-block and output; Q4_K 1 x 8 tile bench ~1% faster).
#[inline(always)]
unsafe fn scale_pair(dm_w: __m128, ba: *const u8) -> (__m512, __m256) {
    // The Q8_K block's f32 d may be unaligned (rows of any offset): read it unaligned.
    let s = _mm_mul_ps(dm_w, _mm_set1_ps((ba as *const f32).read_unaligned()));
    (_mm512_broadcastss_ps(s), _mm256_broadcastss_ps(_mm_movehdup_ps(s)))
}

#[inline(always)]
unsafe fn rd32(p: *const u8) -> u64 {
    (p as *const u32).read_unaligned() as u64
}

/// 16-bit lane shifts: 0 for the low 256 bits, 4 for the high 256 bits.
#[inline(always)]
unsafe fn shift_high_half_by4() -> __m512i {
    _mm512_mask_blend_epi16(0xFFFF_0000, _mm512_setzero_si512(), _mm512_set1_epi16(4))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q4_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let m0f = _mm512_set1_epi8(0x0F);
    let sh = shift_high_half_by4();
    let (mut acc, mut acc_min) = (_mm512_setzero_ps(), _mm256_setzero_ps());
    for i in 0..n / 256 {
        let bw = wp.add(i * Q4_K_BYTES);
        let levels = |c: usize| {
            let raw = _mm512_broadcast_i64x4(loadu256(bw.add(16 + 32 * c)));
            _mm512_and_si512(_mm512_srlv_epi16(raw, sh), m0f)
        };
        kx_superblock(bw, ap.add(i * Q8_K_BYTES), levels, &mut acc, &mut acc_min);
    }
    hsum512(acc) - hsum256(acc_min)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q5_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let m0f = _mm512_set1_epi8(0x0F);
    let sixteen = _mm512_set1_epi8(16);
    let sh = shift_high_half_by4();
    // Bit 2c of qh for the low half (sub-block 2c), bit 2c+1 for the high half.
    let bit0 = _mm512_mask_blend_epi8(0xFFFF_FFFF_0000_0000, _mm512_set1_epi8(1), _mm512_set1_epi8(2));
    let (mut acc, mut acc_min) = (_mm512_setzero_ps(), _mm256_setzero_ps());
    for i in 0..n / 256 {
        let bw = wp.add(i * Q5_K_BYTES);
        let qh = _mm512_broadcast_i64x4(loadu256(bw.add(16)));
        let levels = |c: usize| {
            let raw = _mm512_broadcast_i64x4(loadu256(bw.add(48 + 32 * c)));
            let q = _mm512_and_si512(_mm512_srlv_epi16(raw, sh), m0f);
            let bit = _mm512_sll_epi16(bit0, _mm_cvtsi32_si128(2 * c as i32));
            _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(qh, bit), q, sixteen)
        };
        kx_superblock(bw, ap.add(i * Q8_K_BYTES), levels, &mut acc, &mut acc_min);
    }
    hsum512(acc) - hsum256(acc_min)
}

/// i16 lane l of Q6_K chunk k takes the scale of group 4k + l/8.
#[inline(always)]
unsafe fn q6_k_scale_index(k: i16) -> __m512i {
    let base = _mm512_set1_epi16(4 * k);
    let step = _mm512_srli_epi16(
        _mm512_setr_epi32(
            0x0001_0000,
            0x0003_0002,
            0x0005_0004,
            0x0007_0006,
            0x0009_0008,
            0x000b_000a,
            0x000d_000c,
            0x000f_000e,
            0x0011_0010,
            0x0013_0012,
            0x0015_0014,
            0x0017_0016,
            0x0019_0018,
            0x001b_001a,
            0x001d_001c,
            0x001f_001e,
        ),
        3,
    );
    _mm512_add_epi16(base, step)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q6_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let m0f = _mm512_set1_epi8(0x0F);
    let m30 = _mm512_set1_epi8(0x30);
    // Shifts bringing qh's 2-bit fields to bits 4..5: elements 0..31 <<4, 32..63 <<2,
    // 64..95 as is, 96..127 >>2 (16-bit lanes; the 0x30 mask drops what crosses bytes).
    let sh_lo = _mm512_mask_blend_epi16(0xFFFF_0000, _mm512_set1_epi16(4), _mm512_set1_epi16(2));
    let sh_hi = _mm512_mask_blend_epi16(0xFFFF_0000, _mm512_setzero_si512(), _mm512_set1_epi16(2));
    let idxs = [q6_k_scale_index(0), q6_k_scale_index(1), q6_k_scale_index(2), q6_k_scale_index(3)];
    let mut acc = _mm512_setzero_ps();
    for i in 0..n / 256 {
        let bw = wp.add(i * Q6_K_BYTES);
        let (da, qa, bsums) = q8k(ap.add(i * Q8_K_BYTES));
        let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(bw.add(192) as _));
        let sc16 = _mm512_castsi256_si512(sc);
        let mut isum = _mm512_setzero_si512();
        for h in 0..2 {
            let ql = loadu512(bw.add(64 * h));
            let qh = _mm512_broadcast_i64x4(loadu256(bw.add(128 + 32 * h)));
            let lo = _mm512_or_si512(_mm512_and_si512(ql, m0f), _mm512_and_si512(_mm512_sllv_epi16(qh, sh_lo), m30));
            let hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m0f), _mm512_and_si512(_mm512_srlv_epi16(qh, sh_hi), m30));
            let p_lo = _mm512_maddubs_epi16(lo, loadu512(qa.add(128 * h)));
            let p_hi = _mm512_maddubs_epi16(hi, loadu512(qa.add(128 * h + 64)));
            isum = _mm512_dpwssd_epi32(isum, p_lo, _mm512_permutexvar_epi16(idxs[2 * h], sc16));
            isum = _mm512_dpwssd_epi32(isum, p_hi, _mm512_permutexvar_epi16(idxs[2 * h + 1], sc16));
        }
        // The levels are stored +32: subtract 32 * sum_g(scale_g * bsum_g).
        let offset = _mm256_slli_epi32(_mm256_madd_epi16(sc, bsums), 5);
        isum = _mm512_sub_epi32(isum, _mm512_zextsi256_si512(offset));
        let d = f16c(rd16(bw.add(208)) as u16) * da;
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(d), acc);
    }
    hsum512(acc)
}

#[inline(always)]
unsafe fn dot_floats(t: GgmlType, w: &[u8], a: &[u8], n: usize, load: impl Fn(*const u8) -> __m512) -> f32 {
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let elem = t.type_size();
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    while i + 64 <= n {
        for (k, acc) in acc.iter_mut().enumerate() {
            let j = i + 16 * k;
            *acc = _mm512_fmadd_ps(load(wp.add(j * elem)), _mm512_loadu_ps(ap.add(4 * j) as _), *acc);
        }
        i += 64;
    }
    while i + 16 <= n {
        acc[0] = _mm512_fmadd_ps(load(wp.add(i * elem)), _mm512_loadu_ps(ap.add(4 * i) as _), acc[0]);
        i += 16;
    }
    let s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    hsum512(s) + super::dot_float_tail(t, w, a, n, i)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    dot_floats(GgmlType::F32, w, a, n, |p| _mm512_loadu_ps(p as _))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_f16(w: &[u8], a: &[u8], n: usize) -> f32 {
    dot_floats(GgmlType::F16, w, a, n, |p| _mm512_cvtph_ps(loadu256(p)))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_bf16(w: &[u8], a: &[u8], n: usize) -> f32 {
    dot_floats(GgmlType::BF16, w, a, n, |p| _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(loadu256(p)), 16)))
}
