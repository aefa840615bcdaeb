//! glibc's `expf`, 16 lanes at a time, bit for bit (AVX-512). The CPU attention follows
//! ggml's flash attention, which calls libm's `expf` once per attended position and head
//! (`vs = expf(s - M)`); as a scalar call that was about a seventh of a decode step at
//! depth 2,048 (SmolLM2, `perf`). glibc (2.27 on, from Arm's optimized-routines) computes
//! expf in double precision: k = round(x * 32 / ln 2), a 32-entry table of 2^(i/32), a cubic
//! for 2^(r/32), one rounding to f32 at the end. The x86-64 build CPUs with FMA run
//! (`__expf_fma`) contracts four of its steps into FMAs; this is that build, step for step,
//! on 8 doubles per register. Inputs of magnitude 88 or more, infinities and NaNs take
//! glibc's special cases, which this does not copy: those lanes are recomputed by libm.
//!
//! Whether the libm in the process really computes those bits is checked once, at first use
//! (`matches_libm`); where it does not (another libc, a future algorithm) callers keep libm.

use std::arch::x86_64::*;
use std::sync::OnceLock;

/// `tab[i] = bits(2^(i/32)) - (i << 47)` (glibc's `__exp2f_data.tab`): adding `k << 47` to
/// `tab[k % 32]` gives the bits of 2^(k/32).
const TAB: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];
/// 32 / ln 2.
const INV_LN2_N: f64 = f64::from_bits(0x40471547652b82fe);
/// 1.5 * 2^52: adding it rounds a double to an integer, kept in the low mantissa bits.
const SHIFT: f64 = f64::from_bits(0x4338000000000000);
/// The cubic's coefficients, scaled for r = x * 32 / ln 2 - k.
const C0: f64 = f64::from_bits(0x3ebc6af84b912394);
const C1: f64 = f64::from_bits(0x3f2ebfce50fac4f3);
const C2: f64 = f64::from_bits(0x3f962e42ff0c52d6);
/// |x| from here up (and infinities, NaNs) is glibc's special path (`top12(88.0f)`).
const SPECIAL_FROM: u32 = 0x42b0_0000;

/// expf of 8 lanes on glibc's main path (|x| < 88).
#[inline(always)]
unsafe fn expf_x8(x: __m256, tab: &[__m512i; 4]) -> __m256 {
    let xd = _mm512_cvtps_pd(x);
    let inv_ln2_n = _mm512_set1_pd(INV_LN2_N);
    let shift = _mm512_set1_pd(SHIFT);
    // kd = round(x * 32 / ln 2) through the shift; its low bits are the integer k.
    let kds = _mm512_fmadd_pd(inv_ln2_n, xd, shift);
    let ki = _mm512_castpd_si512(kds);
    let kd = _mm512_sub_pd(kds, shift);
    let r = _mm512_fmsub_pd(inv_ln2_n, xd, kd);
    // s = 2^(k/32): the table entry of k % 32 with k added to its exponent field.
    let lo = _mm512_permutex2var_epi64(tab[0], ki, tab[1]);
    let hi = _mm512_permutex2var_epi64(tab[2], ki, tab[3]);
    let t = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(ki, _mm512_set1_epi64(16)), lo, hi);
    let s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64::<47>(ki)));
    // 2^(r/32) ~ C0 r^3 + C1 r^2 + C2 r + 1, in glibc's grouping.
    let z = _mm512_fmadd_pd(_mm512_set1_pd(C0), r, _mm512_set1_pd(C1));
    let r2 = _mm512_mul_pd(r, r);
    let y = _mm512_fmadd_pd(_mm512_set1_pd(C2), r, _mm512_set1_pd(1.0));
    let y = _mm512_fmadd_pd(z, r2, y);
    _mm512_cvtpd_ps(_mm512_mul_pd(y, s))
}

/// `f32::exp` (glibc's expf) of 16 lanes, bit for bit where `matches_libm()`.
///
/// # Safety
/// avx512f and fma.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub unsafe fn expf_x16(x: __m512) -> __m512 {
    let tab = [
        _mm512_loadu_si512(TAB.as_ptr() as *const _),
        _mm512_loadu_si512(TAB.as_ptr().add(8) as *const _),
        _mm512_loadu_si512(TAB.as_ptr().add(16) as *const _),
        _mm512_loadu_si512(TAB.as_ptr().add(24) as *const _),
    ];
    let lo = expf_x8(_mm512_castps512_ps256(x), &tab);
    let hi = expf_x8(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x))), &tab);
    let y = _mm512_insertf64x4::<1>(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi));
    let y = _mm512_castpd_ps(y);
    // Lanes of glibc's special path: libm's own answer.
    let abs = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fff_ffff));
    let special = _mm512_cmpge_epu32_mask(abs, _mm512_set1_epi32(SPECIAL_FROM as i32));
    if special == 0 {
        return y;
    }
    let (mut xs, mut ys) = ([0f32; 16], [0f32; 16]);
    _mm512_storeu_ps(xs.as_mut_ptr(), x);
    _mm512_storeu_ps(ys.as_mut_ptr(), y);
    libm_lanes(special as u32, &xs, &mut ys);
    _mm512_loadu_ps(ys.as_ptr())
}

/// expf of 4 lanes on glibc's main path (|x| < 88), AVX2: `expf_x8`'s steps, the table
/// entry by a gather.
#[inline(always)]
unsafe fn expf_x4_avx2(x: __m128) -> __m128 {
    let xd = _mm256_cvtps_pd(x);
    let inv_ln2_n = _mm256_set1_pd(INV_LN2_N);
    let shift = _mm256_set1_pd(SHIFT);
    let kds = _mm256_fmadd_pd(inv_ln2_n, xd, shift);
    let ki = _mm256_castpd_si256(kds);
    let kd = _mm256_sub_pd(kds, shift);
    let r = _mm256_fmsub_pd(inv_ln2_n, xd, kd);
    let t = _mm256_i64gather_epi64::<8>(TAB.as_ptr() as *const i64, _mm256_and_si256(ki, _mm256_set1_epi64x(31)));
    let s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64::<47>(ki)));
    let z = _mm256_fmadd_pd(_mm256_set1_pd(C0), r, _mm256_set1_pd(C1));
    let r2 = _mm256_mul_pd(r, r);
    let y = _mm256_fmadd_pd(_mm256_set1_pd(C2), r, _mm256_set1_pd(1.0));
    let y = _mm256_fmadd_pd(z, r2, y);
    _mm256_cvtpd_ps(_mm256_mul_pd(y, s))
}

/// `f32::exp` (glibc's expf) of 8 lanes with AVX2, bit for bit where `matches_libm_avx2()`.
///
/// # Safety
/// avx2 and fma.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn expf_x8_avx2(x: __m256) -> __m256 {
    let lo = expf_x4_avx2(_mm256_castps256_ps128(x));
    let hi = expf_x4_avx2(_mm256_extractf128_ps::<1>(x));
    let y = _mm256_insertf128_ps::<1>(_mm256_castps128_ps256(lo), hi);
    // Lanes of glibc's special path (|x| as a signed int is never negative): libm's answer.
    let abs = _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7fff_ffff));
    let special = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(abs, _mm256_set1_epi32(SPECIAL_FROM as i32 - 1))));
    if special == 0 {
        return y;
    }
    let (mut xs, mut ys) = ([0f32; 8], [0f32; 8]);
    _mm256_storeu_ps(xs.as_mut_ptr(), x);
    _mm256_storeu_ps(ys.as_mut_ptr(), y);
    libm_lanes(special as u32, &xs, &mut ys);
    _mm256_loadu_ps(ys.as_ptr())
}

/// libm's expf of the lanes of `xs` whose bit is set in `special`, into `ys`.
fn libm_lanes(special: u32, xs: &[f32], ys: &mut [f32]) {
    for (i, (xi, yi)) in xs.iter().zip(ys.iter_mut()).enumerate() {
        if special & (1 << i) != 0 {
            *yi = xi.exp();
        }
    }
}

/// Whether this CPU runs `expf_x16` and it gives libm's bits on a fixed set of inputs: about
/// 700 magnitudes below 88 spread evenly by bit pattern, each with both signs (the attention's
/// arguments are differences from a running maximum, so at most 0), zeros, the special
/// path's edges and non-finite values. Computed once (~1,400 libm calls).
pub fn matches_libm() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma")) {
            return false;
        }
        // Safety: the features were checked above.
        unsafe { first_mismatch(&check_inputs()).is_none() }
    })
}

/// `matches_libm` for `expf_x8_avx2` (AVX2 and FMA).
pub fn matches_libm_avx2() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            return false;
        }
        // Safety: the features were checked above.
        unsafe { first_mismatch_avx2(&check_inputs()).is_none() }
    })
}

/// The inputs `matches_libm` checks.
fn check_inputs() -> Vec<f32> {
    let mut xs: Vec<f32> = (0..0x42b0_0000u32).step_by(97 * 16_383).flat_map(|b| [f32::from_bits(b), -f32::from_bits(b)]).collect();
    xs.extend([
        0.0,
        -0.0,
        88.0,
        -88.0,
        88.72,
        89.0,
        -103.0,
        -103.5,
        -104.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
    ]);
    xs
}

/// The first of `xs` (padded to 16 with zeros) whose `expf_x16` bits differ from libm's.
///
/// # Safety
/// avx512f and fma.
pub unsafe fn first_mismatch(xs: &[f32]) -> Option<(f32, f32, f32)> {
    first_mismatch_by::<16>(xs, |x, y| _mm512_storeu_ps(y.as_mut_ptr(), expf_x16(_mm512_loadu_ps(x.as_ptr()))))
}

/// `first_mismatch` for `expf_x8_avx2`.
///
/// # Safety
/// avx2 and fma.
pub unsafe fn first_mismatch_avx2(xs: &[f32]) -> Option<(f32, f32, f32)> {
    first_mismatch_by::<8>(xs, |x, y| _mm256_storeu_ps(y.as_mut_ptr(), expf_x8_avx2(_mm256_loadu_ps(x.as_ptr()))))
}

/// The first of `xs`, in chunks of N padded with zeros, where `exp` (x -> y) differs from
/// libm: (x, exp's y, libm's).
fn first_mismatch_by<const N: usize>(xs: &[f32], exp: impl Fn(&[f32; N], &mut [f32; N])) -> Option<(f32, f32, f32)> {
    for chunk in xs.chunks(N) {
        let mut x = [0f32; N];
        x[..chunk.len()].copy_from_slice(chunk);
        let mut y = [0f32; N];
        exp(&x, &mut y);
        for (xi, yi) in x.iter().zip(y) {
            let want = xi.exp();
            if want.to_bits() != yi.to_bits() {
                return Some((*xi, yi, want));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runnable() -> bool {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma")
    }

    /// A million f32 bit patterns spread over the whole range (a stride prime to every
    /// binade's size), both signs, against `f32::exp`: every bit equal.
    #[test]
    fn expf_x16_is_libm_on_a_spread_of_inputs() {
        if !runnable() {
            eprintln!("skipped: no AVX-512");
            return;
        }
        let xs: Vec<f32> = (0..u32::MAX).step_by(4_093).map(f32::from_bits).collect();
        assert!(xs.len() > 1_000_000);
        // Safety: checked above.
        let bad = unsafe { first_mismatch(&xs) };
        assert!(bad.is_none(), "expf_x16({:e}) = {:e}, libm {:e}", bad.unwrap().0, bad.unwrap().1, bad.unwrap().2);
        assert!(matches_libm());
        // Safety: AVX-512F CPUs have AVX2 (and FMA, checked).
        let bad = unsafe { first_mismatch_avx2(&xs) };
        assert!(bad.is_none(), "expf_x8_avx2({:e}) = {:e}, libm {:e}", bad.unwrap().0, bad.unwrap().1, bad.unwrap().2);
        assert!(matches_libm_avx2());
    }

    /// Every f32 (4.3e9 inputs, about a minute in release): `cargo test --release -- --ignored
    /// expf_x16_is_libm_on_every_f32`.
    #[test]
    #[ignore]
    fn expf_x16_is_libm_on_every_f32() {
        if !runnable() {
            return;
        }
        let mut xs = Vec::with_capacity(1 << 20);
        for hi in 0..4096u32 {
            xs.clear();
            xs.extend((0..1u32 << 20).map(|lo| f32::from_bits(hi << 20 | lo)));
            // Safety: checked above.
            let bad = unsafe { first_mismatch(&xs) };
            assert!(bad.is_none(), "expf_x16({:e}) = {:e}, libm {:e}", bad.unwrap().0, bad.unwrap().1, bad.unwrap().2);
            // Safety: AVX-512F CPUs have AVX2 (and FMA, checked).
            let bad = unsafe { first_mismatch_avx2(&xs) };
            assert!(bad.is_none(), "expf_x8_avx2({:e}) = {:e}, libm {:e}", bad.unwrap().0, bad.unwrap().1, bad.unwrap().2);
        }
    }
}
