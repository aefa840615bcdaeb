//! MXFP4 (GGML type 39, the OCP microscaling FP4 format gpt-oss ships its experts in):
//! dequantisation, ggml's reference quantiser and the dot product with Q8_0 activations, as
//! ggml-quants.c / ggml-cpu (quants.c, arch/x86/quants.c) define them.
//!
//! Block of 32 elements, 17 bytes: one E8M0 scale byte `e`, then 16 bytes of E2M1 nibbles;
//! byte j holds element j in its low nibble and element j + 16 in its high nibble (as Q4_0).
//! ggml stores the E2M1 values doubled as integers (`KVALUES`, so the products with Q8_0 are
//! exact integers) and halves the scale instead: value = KVALUES[nibble] * 2^(e - 128)
//! (`e8m0_to_f32_half`, with ggml's denormal patterns for e < 2).
//!
//! ggml's activation type for MXFP4 is Q8_0. Its x86 kernel (AVX2, also what its AVX-512
//! builds run) sums pairs of blocks into two 8-lane f32 accumulators, even blocks in one and
//! odd blocks in the other, adds them, reduces, then adds a trailing odd block in scalar code.
//! Both SIMD kernels here keep that order, so they are bit for bit the scalar-order-free
//! equivalent of llama.cpp's; the scalar reference is ggml's generic one (one f32 sum, block by
//! block), which differs from the SIMD ones only by float rounding.

use super::float::f16_at;
use super::legacy::Q8_0_BYTES;

pub(crate) const QK_MXFP4: usize = 32;
pub(crate) const MXFP4_BYTES: usize = 17;

/// E2M1 values doubled (ggml's `kvalues_mxfp4`): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
pub(crate) const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// 2^(e - 128), i.e. half the E8M0 value 2^(e - 127), exactly as ggml's
/// `ggml_e8m0_to_fp32_half` (e = 0 and 1 give the f32 denormals 2^-128 and 2^-127).
#[inline(always)]
pub(crate) fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { ((e as u32) - 1) << 23 };
    f32::from_bits(bits)
}

pub(crate) fn dequantize_mxfp4(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(MXFP4_BYTES).zip(dst.chunks_exact_mut(QK_MXFP4)) {
        let d = e8m0_to_f32_half(b[0]);
        for j in 0..16 {
            y[j] = KVALUES[(b[1 + j] & 0x0F) as usize] as f32 * d;
            y[j + 16] = KVALUES[(b[1 + j] >> 4) as usize] as f32 * d;
        }
    }
}

/// The nibble whose value times d is nearest to x; the first such in table order on ties
/// (ggml's `best_index_mxfp4`).
fn best_index(x: f32, d: f32) -> u8 {
    let mut best = 0;
    let mut best_err = (KVALUES[0] as f32 * d - x).abs();
    for (i, &k) in KVALUES.iter().enumerate().skip(1) {
        let err = (k as f32 * d - x).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

/// ggml's `quantize_row_mxfp4_ref`: e = floor(log2(amax)) - 2 + 127 (0 for an all-zero block),
/// then each element to its nearest doubled E2M1 level times 2^(e - 128).
pub(crate) fn quantize_mxfp4(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK_MXFP4).zip(dst.chunks_exact_mut(MXFP4_BYTES)) {
        let amax = x.iter().fold(0f32, |a, v| if a < v.abs() { v.abs() } else { a });
        // C's (uint8_t) of the float; clamped where C would be undefined (amax < 2^-125).
        let e = if amax > 0.0 { (amax.log2().floor() - 2.0 + 127.0).clamp(0.0, 255.0) as u8 } else { 0 };
        let d = e8m0_to_f32_half(e);
        b[0] = e;
        for j in 0..16 {
            b[1 + j] = best_index(x[j], d) | best_index(x[j + 16], d) << 4;
        }
    }
}

/// Scalar reference dot with Q8_0 activations (ggml's `ggml_vec_dot_mxfp4_q8_0_generic`).
pub(crate) fn dot_mxfp4(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w.chunks_exact(MXFP4_BYTES).zip(a.chunks_exact(Q8_0_BYTES)).take(n / QK_MXFP4) {
        sum += block_dot(bw, ba);
    }
    sum
}

/// d_a * d_w * (integer dot) of one block, the scalar step ggml's kernels use for a tail block.
#[inline(always)]
fn block_dot(bw: &[u8], ba: &[u8]) -> f32 {
    let d = f16_at(ba, 0) * e8m0_to_f32_half(bw[0]);
    let (mut s1, mut s2) = (0i32, 0i32);
    for j in 0..16 {
        s1 += ba[2 + j] as i8 as i32 * KVALUES[(bw[1 + j] & 0x0F) as usize] as i32;
        s2 += ba[2 + 16 + j] as i8 as i32 * KVALUES[(bw[1 + j] >> 4) as usize] as i32;
    }
    d * (s1 + s2) as f32
}

/// The x86 kernels; `simd::dot_at` calls them for MXFP4 at its level.
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    #![allow(clippy::incompatible_msrv)] // AVX-512 intrinsics are stable since Rust 1.89.
    use super::{block_dot, e8m0_to_f32_half, KVALUES, MXFP4_BYTES, QK_MXFP4};
    use crate::quant::legacy::Q8_0_BYTES;
    use crate::quant::simd::hsum256;
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn f16c(p: *const u8) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128((p as *const u16).read_unaligned() as i32)))
    }

    /// The block's f32 scale d_a * d_w, as ggml computes it.
    #[inline(always)]
    unsafe fn scale(bw: *const u8, ba: *const u8) -> f32 {
        f16c(ba) * e8m0_to_f32_half(*bw)
    }

    /// The 32 doubled E2M1 values (i8) of the block whose nibbles start at p, in element order.
    #[inline(always)]
    unsafe fn values_32(p: *const u8) -> __m256i {
        let table = _mm_loadu_si128(KVALUES.as_ptr() as _);
        let m4 = _mm_set1_epi8(0x0F);
        let q = _mm_loadu_si128(p as _);
        let lo = _mm_shuffle_epi8(table, _mm_and_si128(q, m4));
        let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
        _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi)
    }

    /// Sum of the products of i8 lanes, four adjacent products per i32 lane (ggml's
    /// mul_add_epi8 then madd with ones; exact: |w| <= 12, |a| <= 127).
    #[inline(always)]
    unsafe fn dot_i8_avx2(w: __m256i, a: __m256i) -> __m256i {
        let p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
        _mm256_madd_epi16(p, _mm256_set1_epi16(1))
    }

    /// # Safety
    /// The CPU must support avx2, fma and f16c; the rows must hold n elements.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn dot_avx2(w: &[u8], a: &[u8], n: usize) -> f32 {
        let nb = n / QK_MXFP4;
        let (wp, ap) = (w.as_ptr(), a.as_ptr());
        let (mut acc1, mut acc2) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i + 1 < nb {
            let (w0, a0) = (wp.add(i * MXFP4_BYTES), ap.add(i * Q8_0_BYTES));
            let (w1, a1) = (w0.add(MXFP4_BYTES), a0.add(Q8_0_BYTES));
            let p0 = dot_i8_avx2(values_32(w0.add(1)), _mm256_loadu_si256(a0.add(2) as _));
            let p1 = dot_i8_avx2(values_32(w1.add(1)), _mm256_loadu_si256(a1.add(2) as _));
            acc1 = _mm256_fmadd_ps(_mm256_set1_ps(scale(w0, a0)), _mm256_cvtepi32_ps(p0), acc1);
            acc2 = _mm256_fmadd_ps(_mm256_set1_ps(scale(w1, a1)), _mm256_cvtepi32_ps(p1), acc2);
            i += 2;
        }
        let mut sum = hsum256(_mm256_add_ps(acc1, acc2));
        if i < nb {
            sum += block_dot(&w[i * MXFP4_BYTES..], &a[i * Q8_0_BYTES..]);
        }
        sum
    }

    /// Two blocks per 512-bit register: lanes 0..7 hold the even block's i32 sums (ggml's
    /// first accumulator), lanes 8..15 the odd block's (its second), each lane the same four
    /// products as the AVX2 kernel's; `vpdpbusd` takes |w| (u8, by table) and a with w's sign.
    /// So the result equals `dot_avx2` bit for bit.
    ///
    /// # Safety
    /// The CPU must support avx512f/bw/vl/vnni, avx2, fma and f16c; the rows must hold n elements.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(crate) unsafe fn dot_avx512(w: &[u8], a: &[u8], n: usize) -> f32 {
        let nb = n / QK_MXFP4;
        let (wp, ap) = (w.as_ptr(), a.as_ptr());
        let abs_table = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, 1, 2, 3, 4, 6, 8, 12));
        let (m4, sign_bit, zero) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x08), _mm512_setzero_si512());
        let mut acc = _mm512_setzero_ps();
        let mut i = 0;
        while i + 1 < nb {
            let (w0, a0) = (wp.add(i * MXFP4_BYTES), ap.add(i * Q8_0_BYTES));
            let (w1, a1) = (w0.add(MXFP4_BYTES), a0.add(Q8_0_BYTES));
            // [w0 nibbles, w0 nibbles >> 4, w1 nibbles, w1 nibbles >> 4], 16 bytes each.
            let (q0, q1) = (_mm_loadu_si128(w0.add(1) as _), _mm_loadu_si128(w1.add(1) as _));
            let b0 = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(q0), _mm_srli_epi16(q0, 4));
            let b1 = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(q1), _mm_srli_epi16(q1, 4));
            let nib = _mm512_and_si512(_mm512_inserti64x4::<1>(_mm512_castsi256_si512(b0), b1), m4);
            let aq =
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(_mm256_loadu_si256(a0.add(2) as _)), _mm256_loadu_si256(a1.add(2) as _));
            let negative = _mm512_test_epi8_mask(nib, sign_bit);
            let signed_a = _mm512_mask_sub_epi8(aq, negative, zero, aq);
            let dot = _mm512_dpbusd_epi32(zero, _mm512_shuffle_epi8(abs_table, nib), signed_a);
            let (s0, s1) = (_mm256_set1_ps(scale(w0, a0)), _mm256_set1_ps(scale(w1, a1)));
            let s = _mm512_insertf32x8::<1>(_mm512_castps256_ps512(s0), s1);
            acc = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(dot), acc);
            i += 2;
        }
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
        let mut sum = hsum256(_mm256_add_ps(_mm512_castps512_ps256(acc), hi));
        if i < nb {
            sum += block_dot(&w[i * MXFP4_BYTES..], &a[i * Q8_0_BYTES..]);
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{act_format, quantize_act_row, vec_dot_at, ActFormat, GgmlType, SimdLevel};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn e8m0_half_is_two_to_the_e_minus_128() {
        for e in 0..=254u8 {
            assert_eq!(e8m0_to_f32_half(e) as f64, 2f64.powi(e as i32 - 128), "e = {e}");
        }
    }

    #[test]
    fn block_layout_and_round_trip_of_representable_values() {
        // Values on the grid of scale 2^-1 (e = 126 - 2 + 2 ... chosen by amax = 3): exact.
        let mut x = [0f32; 32];
        let levels = [0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0];
        for (j, v) in x.iter_mut().enumerate() {
            *v = levels[j % 8] * if j >= 16 { -1.0 } else { 1.0 };
        }
        let mut q = [0u8; MXFP4_BYTES];
        quantize_mxfp4(&x, &mut q);
        // amax 3: floor(log2 3) = 1, e = 1 - 2 + 127 = 126, half-scale 2^-2.
        assert_eq!(q[0], 126);
        // Element 1 (0.25 = 1 * 2^-2) in byte 1's low nibble, element 17 (-0.25) in its high one.
        assert_eq!(q[2], 1 | 9 << 4);
        let mut y = [0f32; 32];
        dequantize_mxfp4(&q, &mut y);
        assert_eq!(x, y);
        assert_eq!(GgmlType::MXFP4.row_bytes(64), Some(34));
        assert_eq!(act_format(GgmlType::MXFP4), ActFormat::Q8_0);
    }

    #[test]
    fn simd_kernels_equal_each_other_and_match_the_scalar_reference() {
        let mut r = ChaCha8Rng::seed_from_u64(39);
        for blocks in [1usize, 2, 3, 5, 8, 31, 90] {
            let n = blocks * 32;
            for _ in 0..4 {
                let mut w = vec![0u8; blocks * MXFP4_BYTES];
                r.fill(&mut w[..]);
                for b in w.chunks_exact_mut(MXFP4_BYTES) {
                    b[0] = r.gen_range(100..140);
                }
                let x: Vec<f32> = (0..n).map(|_| r.gen::<f32>() * 2.0 - 1.0).collect();
                let mut a = vec![0u8; n / 32 * Q8_0_BYTES];
                quantize_act_row(ActFormat::Q8_0, &x, &mut a);
                let reference = vec_dot_at(SimdLevel::Scalar, GgmlType::MXFP4, &w, &a, n).unwrap();
                let mut wd = vec![0f32; n];
                dequantize_mxfp4(&w, &mut wd);
                let mut ad = vec![0f32; n];
                crate::quant::dequantize_act_row(ActFormat::Q8_0, &a, &mut ad).unwrap();
                let exact: f64 = wd.iter().zip(&ad).map(|(p, q)| *p as f64 * *q as f64).sum();
                let magnitude: f64 = wd.iter().zip(&ad).map(|(p, q)| (*p as f64 * *q as f64).abs()).sum();
                assert!((reference as f64 - exact).abs() <= 1e-5 * magnitude + 1e-30, "scalar {reference} vs {exact}");
                let avx2 = vec_dot_at(SimdLevel::Avx2, GgmlType::MXFP4, &w, &a, n);
                if let Some(v) = avx2 {
                    assert!((v as f64 - exact).abs() <= 1e-5 * magnitude + 1e-30, "avx2 {v} vs {exact}");
                }
                if let Some(v) = vec_dot_at(SimdLevel::Avx512Vnni, GgmlType::MXFP4, &w, &a, n) {
                    assert_eq!(v.to_bits(), avx2.unwrap().to_bits(), "avx512 {v} vs avx2 {avx2:?} at n={n}");
                }
            }
        }
    }

    /// The `gguf` package's MXFP4 quantiser/dequantiser (gguf 0.19.0, a port of ggml's
    /// reference code) on the rows of scripts/mxfp4_gguf_reference.py: same bytes, same floats.
    #[test]
    fn quantiser_and_dequantiser_match_the_gguf_package() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/mxfp4/gguf_py.json")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let cases = v["cases"].as_array().unwrap();
        assert!(cases.len() >= 9);
        let bits = |c: &serde_json::Value, k: &str| -> Vec<f32> {
            c[k].as_array().unwrap().iter().map(|b| f32::from_bits(b.as_u64().unwrap() as u32)).collect()
        };
        for (i, c) in cases.iter().enumerate() {
            let x = bits(c, "x_bits");
            let hex = c["q"].as_str().unwrap();
            let want: Vec<u8> = (0..hex.len()).step_by(2).map(|j| u8::from_str_radix(&hex[j..j + 2], 16).unwrap()).collect();
            let mut q = vec![0u8; GgmlType::MXFP4.row_bytes(x.len()).unwrap()];
            crate::quant::quantize_row(GgmlType::MXFP4, &x, &mut q).unwrap();
            assert_eq!(q, want, "row {i}: quantised bytes differ from gguf-py's");
            let mut y = vec![0f32; x.len()];
            crate::quant::dequantize_row(GgmlType::MXFP4, &want, &mut y).unwrap();
            let y_bits: Vec<u32> = y.iter().map(|f| f.to_bits()).collect();
            let want_y: Vec<u32> = bits(c, "y_bits").iter().map(|f| f.to_bits()).collect();
            assert_eq!(y_bits, want_y, "row {i}: dequantised values differ from gguf-py's");
        }
    }
}
