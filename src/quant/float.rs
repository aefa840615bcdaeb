//! Unquantised formats: F32, F16 and BF16 rows, their conversions and scalar dot products
//! (weights in the row's format, activations in f32).

/// IEEE half to f32 (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
}

/// f32 to IEEE half, round to nearest even (as ggml's GGML_FP32_TO_FP16).
pub fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// bfloat16 to f32 (exact).
pub fn bf16_to_f32(h: u16) -> f32 {
    half::bf16::from_bits(h).to_f32()
}

/// f32 to bfloat16 exactly as ggml's `ggml_compute_fp32_to_bf16`: round to nearest even,
/// NaNs forced quiet (keeping their sign and top payload bits).
pub fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u as u64 + (0x7fff + ((u >> 16) & 1)) as u64) >> 16) as u16
}

/// Reads the little-endian f16 at byte offset `at` as f32.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

#[inline(always)]
pub(crate) fn f32_at(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(crate) fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    }
}

pub(crate) fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f16_to_f32(u16::from_le_bytes([s[0], s[1]]));
    }
}

pub(crate) fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = bf16_to_f32(u16::from_le_bytes([s[0], s[1]]));
    }
}

pub(crate) fn quantize_f32(src: &[f32], dst: &mut [u8]) {
    for (d, v) in dst.chunks_exact_mut(4).zip(src) {
        d.copy_from_slice(&v.to_le_bytes());
    }
}

pub(crate) fn quantize_f16(src: &[f32], dst: &mut [u8]) {
    for (d, v) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&f32_to_f16(*v).to_le_bytes());
    }
}

pub(crate) fn quantize_bf16(src: &[f32], dst: &mut [u8]) {
    for (d, v) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&f32_to_bf16(*v).to_le_bytes());
    }
}

// Scalar reference dots accumulate in f64: simple and more accurate than any SIMD order,
// so the SIMD versions can be checked against them with a tight tolerance.

pub(crate) fn dot_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    (0..n).map(|i| f32_at(w, 4 * i) as f64 * f32_at(a, 4 * i) as f64).sum::<f64>() as f32
}

pub(crate) fn dot_f16(w: &[u8], a: &[u8], n: usize) -> f32 {
    (0..n).map(|i| f16_at(w, 2 * i) as f64 * f32_at(a, 4 * i) as f64).sum::<f64>() as f32
}

pub(crate) fn dot_bf16(w: &[u8], a: &[u8], n: usize) -> f32 {
    (0..n).map(|i| bf16_to_f32(u16::from_le_bytes([w[2 * i], w[2 * i + 1]])) as f64 * f32_at(a, 4 * i) as f64).sum::<f64>() as f32
}
