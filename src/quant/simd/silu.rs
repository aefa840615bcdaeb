//! SwiGLU (silu(gate) * up, the FFN activation of Llama-family models) with ggml's vectorised
//! SiLU: x / (1 + v_expf(-x)), v_expf being its AVX-512 port of the Arm optimized-routines
//! expf (range reduction by n = round(x / ln 2), degree-5 polynomial, scalef). Written here
//! from the algorithm, element by element with fused multiply-adds, so the portable, AVX2 and
//! AVX-512 paths give identical bits.

#[cfg(target_arch = "x86_64")]
use super::{level, SimdLevel};

const R: f32 = 12582912.0; // 0x1.8p23
const LOG2E: f32 = f32::from_bits(0x3fb8_aa3b); // 0x1.715476p+0
const LN2_HI: f32 = f32::from_bits(0x3f31_7200); // 0x1.62e4p-1
const LN2_LO: f32 = f32::from_bits(0x35bf_be8e); // 0x1.7f7d1cp-20
const C5: f32 = f32::from_bits(0x3c07_2010); // 0x1.0e4020p-7
const C4: f32 = f32::from_bits(0x3d2b_9f17); // 0x1.573e2ep-5
const C3: f32 = f32::from_bits(0x3e2a_af33); // 0x1.555e66p-3
const C2: f32 = f32::from_bits(0x3eff_fedb); // 0x1.fffdb6p-2
const C1: f32 = f32::from_bits(0x3f7f_fff6); // 0x1.ffffecp-1

fn v_expf(x: f32) -> f32 {
    let z = x.mul_add(LOG2E, R);
    let n = z - R;
    let b = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let u = b * b;
    let j = C5.mul_add(b, C4).mul_add(u, C3.mul_add(b, C2)).mul_add(u, C1.mul_add(b, 1.0));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    scalef(j, n)
}

/// j * 2^n for integral n in [-192, 192] (as vscalefps: one rounding).
fn scalef(j: f32, n: f32) -> f32 {
    (j as f64 * (n as f64).exp2()) as f32
}

pub fn swiglu(g: &mut [f32], u: &[f32]) {
    // The dot products' level (`level()`, capped by CIVETTA_SIMD); all three paths give the
    // same bits.
    #[cfg(target_arch = "x86_64")]
    match level() {
        // SAFETY: the level has avx512f.
        SimdLevel::Avx512Vnni => return unsafe { swiglu_avx512(g, u) },
        // SAFETY: the level has avx2 and fma.
        SimdLevel::Avx2 => return unsafe { swiglu_avx2(g, u) },
        SimdLevel::Scalar => {}
    }
    swiglu_scalar(g, u);
}

/// silu(g) * u element by element (the portable path, and the SIMD paths' tails).
fn swiglu_scalar(g: &mut [f32], u: &[f32]) {
    for (a, b) in g.iter_mut().zip(u) {
        *a = *a / (1.0 + v_expf(-*a)) * b;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn swiglu_avx512(g: &mut [f32], u: &[f32]) {
    use std::arch::x86_64::*;
    let n = g.len().min(u.len());
    let n16 = n & !15;
    let set = _mm512_set1_ps;
    for i in (0..n16).step_by(16) {
        let x = _mm512_loadu_ps(g.as_ptr().add(i));
        let nx = _mm512_sub_ps(_mm512_setzero_ps(), x);
        let z = _mm512_fmadd_ps(nx, set(LOG2E), set(R));
        let nn = _mm512_sub_ps(z, set(R));
        let b = _mm512_fnmadd_ps(nn, set(LN2_LO), _mm512_fnmadd_ps(nn, set(LN2_HI), nx));
        let d = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(nn), set(192.0));
        let uu = _mm512_mul_ps(b, b);
        let j = _mm512_fmadd_ps(
            _mm512_fmadd_ps(_mm512_fmadd_ps(set(C5), b, set(C4)), uu, _mm512_fmadd_ps(set(C3), b, set(C2))),
            uu,
            _mm512_fmadd_ps(set(C1), b, set(1.0)),
        );
        let mut e = _mm512_scalef_ps(j, nn);
        if d != 0 {
            let le = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(nn, _mm512_setzero_ps());
            let alt = _mm512_mask_blend_ps(le, set(f32::INFINITY), _mm512_setzero_ps());
            e = _mm512_mask_blend_ps(d, e, alt);
        }
        let silu = _mm512_div_ps(x, _mm512_add_ps(set(1.0), e));
        _mm512_storeu_ps(g.as_mut_ptr().add(i), _mm512_mul_ps(silu, _mm512_loadu_ps(u.as_ptr().add(i))));
    }
    swiglu_scalar(&mut g[n16..n], &u[n16..n]);
}

/// The AVX-512 arithmetic on 8 lanes: vscalefps(j, n) is j * 2^n with one rounding, which
/// for |n| <= 126 is one multiply by the exact power of two built from n's bits. Chunks with
/// a lane outside that range (|x| > ~87, rare) take the scalar path, which handles them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn swiglu_avx2(g: &mut [f32], u: &[f32]) {
    use std::arch::x86_64::*;
    let n = g.len().min(u.len());
    let n8 = n & !7;
    let set = _mm256_set1_ps;
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut i = 0;
    while i < n8 {
        let x = _mm256_loadu_ps(g.as_ptr().add(i));
        let nx = _mm256_sub_ps(_mm256_setzero_ps(), x);
        let z = _mm256_fmadd_ps(nx, set(LOG2E), set(R));
        let nn = _mm256_sub_ps(z, set(R));
        let out_of_range = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(_mm256_and_ps(nn, abs_mask), set(126.0)));
        if out_of_range != 0 {
            swiglu_scalar(&mut g[i..i + 8], &u[i..i + 8]);
            i += 8;
            continue;
        }
        let b = _mm256_fnmadd_ps(nn, set(LN2_LO), _mm256_fnmadd_ps(nn, set(LN2_HI), nx));
        let uu = _mm256_mul_ps(b, b);
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(_mm256_fmadd_ps(set(C5), b, set(C4)), uu, _mm256_fmadd_ps(set(C3), b, set(C2))),
            uu,
            _mm256_fmadd_ps(set(C1), b, set(1.0)),
        );
        let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(nn), _mm256_set1_epi32(127))));
        let e = _mm256_mul_ps(j, pow2);
        let silu = _mm256_div_ps(x, _mm256_add_ps(set(1.0), e));
        _mm256_storeu_ps(g.as_mut_ptr().add(i), _mm256_mul_ps(silu, _mm256_loadu_ps(u.as_ptr().add(i))));
        i += 8;
    }
    swiglu_scalar(&mut g[n8..n], &u[n8..n]);
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "x86_64")]
    use crate::quant::SimdLevel;

    /// Inputs across the whole range: the polynomial's domain, subnormal exp(-x), the
    /// out-of-range chunks (|x| > 87) and the infinities.
    fn inputs() -> (Vec<f32>, Vec<f32>) {
        let mut x: Vec<f32> = (0..4096).map(|i| (i as f32 - 2048.0) * 0.013 + (i % 7) as f32 * 1e-3).collect();
        x.extend((0..400).map(|i| (i as f32 - 200.0) * 0.55));
        x.extend([87.3, -87.3, 88.7, -88.7, 103.0, -103.0, 150.0, -150.0, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1e-30, -1e-30]);
        let u = (0..x.len()).map(|i| 1.0 + (i % 5) as f32 * 0.25).collect();
        (x, u)
    }

    fn assert_matches_portable(x: &[f32], u: &[f32], got: &[f32]) {
        for i in 0..x.len() {
            let want = x[i] / (1.0 + super::v_expf(-x[i])) * u[i];
            assert_eq!(got[i].to_bits(), want.to_bits(), "x = {}: {} vs {want}", x[i], got[i]);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_and_portable_agree_bit_for_bit() {
        if !SimdLevel::Avx2.available() {
            return;
        }
        let (x, u) = inputs();
        let mut a = x.clone();
        // SAFETY: the Avx2 level has avx2 and fma.
        unsafe { super::swiglu_avx2(&mut a, &u) };
        assert_matches_portable(&x, &u, &a);
    }

    #[test]
    fn constants_are_the_hex_floats() {
        assert_eq!(super::LN2_HI, f32::from_bits(0x3f31_7200));
        assert!((super::v_expf(1.0) - std::f32::consts::E).abs() < 1e-6);
        assert!((super::v_expf(-3.5) - (-3.5f32).exp()).abs() < 1e-7);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_and_portable_agree_bit_for_bit() {
        if !SimdLevel::Avx512Vnni.available() {
            return;
        }
        let (x, u) = inputs();
        let mut a = x.clone();
        // SAFETY: the Avx512Vnni level has avx512f.
        unsafe { super::swiglu_avx512(&mut a, &u) };
        assert_matches_portable(&x, &u, &a);
    }
}
