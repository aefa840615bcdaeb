//! The 32-element block formats Q8_0, Q4_0 and Q4_1 (ggml-common.h layouts), their reference
//! quantisers (ggml's quantize_row_*_ref, bit for bit), the x86 activation quantisers (Q8_0,
//! Q8_1) and scalar dot products with Q8_0 / Q8_1 (Q4_1) activations.
//!
//! Layouts (little endian): Q8_0 = f16 d, 32 x i8; Q4_0 = f16 d, 16 bytes of nibbles;
//! Q4_1 = f16 d, f16 m, 16 bytes of nibbles. Nibble j of a 4-bit block holds element j in its
//! low half and element j + 16 in its high half. Q5_0 = f16 d, u32 qh, 16 bytes of nibbles;
//! Q5_1 = f16 d, f16 m, u32 qh, 16 bytes of nibbles: bit j of qh is the fifth (value 16) bit
//! of element j. Q5_0 values are d * (q - 16), Q5_1 values d * q + m (q in 0..=31).

use super::float::{f16_at, f32_to_f16};

pub(crate) const QK: usize = 32;
pub(crate) const Q8_0_BYTES: usize = 34;
pub(crate) const Q4_0_BYTES: usize = 18;
pub(crate) const Q4_1_BYTES: usize = 20;
pub(crate) const Q8_1_BYTES: usize = 36;
pub(crate) const Q5_0_BYTES: usize = 22;
pub(crate) const Q5_1_BYTES: usize = 24;

/// `y.round_ties_even()` for |y| < 2^22 (and NaN stays NaN): adding and removing 1.5 * 2^23
/// leaves y rounded to an integer by the FPU's round-to-nearest-even. Why not
/// `round_ties_even`: without SSE4.1 in the baseline x86-64 target it is a call to libm's
/// rintf per element (4% of a decode token's time); this compiles to vector adds.
#[inline(always)]
pub(crate) fn round_half_even_small(y: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    (y + MAGIC) - MAGIC
}

/// Activation quantisation to Q8_0 exactly as ggml's x86 `quantize_row_q8_0` (the AVX path
/// every x86-64 build with AVX runs, not the `_ref` code): d = amax/127 (stored as f16),
/// q = round-half-even(x * (127/amax)).
pub(crate) fn quantize_q8_0_act(x: &[f32], dst: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK).zip(dst.chunks_exact_mut(Q8_0_BYTES)) {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        b[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        for (q, v) in b[2..].iter_mut().zip(xb) {
            *q = round_half_even_small(v * id) as i8 as u8;
        }
    }
}

/// Activation quantisation to Q8_1 exactly as ggml's x86 `quantize_row_q8_1`: the quants and
/// d of `quantize_q8_0_act`, plus s = d * sum(q) (d in f32) rounded to f16. Layout: f16 d,
/// f16 s, 32 x i8. (ggml pairs Q4_1 and Q5_1 weights with Q8_1 activations.)
pub(crate) fn quantize_q8_1_act(x: &[f32], dst: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK).zip(dst.chunks_exact_mut(Q8_1_BYTES)) {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (q, v) in b[4..].iter_mut().zip(xb) {
            let qi = round_half_even_small(v * id) as i8;
            sum += qi as i32;
            *q = qi as u8;
        }
        b[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        b[2..4].copy_from_slice(&f32_to_f16(d * sum as f32).to_le_bytes());
    }
}

/// d * q of a Q8_1 row (s is derived data and not needed).
pub(crate) fn dequantize_q8_1(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(Q8_1_BYTES)) {
        let d = f16_at(b, 0);
        for (v, q) in y.iter_mut().zip(&b[4..]) {
            *v = (*q as i8) as f32 * d;
        }
    }
}

/// ggml's quantize_row_q8_0_ref: d = amax/127, q = round-half-away(x/d).
pub(crate) fn quantize_q8_0(x: &[f32], dst: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK).zip(dst.chunks_exact_mut(Q8_0_BYTES)) {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        for (q, v) in b[2..].iter_mut().zip(xb) {
            *q = (v * id).round() as i8 as u8;
        }
    }
}

/// ggml's quantize_row_q4_0_ref: d = max / -8 where max is the value of largest magnitude.
pub(crate) fn quantize_q4_0(x: &[f32], dst: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK).zip(dst.chunks_exact_mut(Q4_0_BYTES)) {
        let mut amax = 0f32;
        let mut max = 0f32;
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        for j in 0..QK / 2 {
            // C's (int8_t) cast truncates toward zero.
            let q0 = ((xb[j] * id + 8.5) as i32).clamp(0, 15) as u8;
            let q1 = ((xb[j + QK / 2] * id + 8.5) as i32).clamp(0, 15) as u8;
            b[2 + j] = q0 | (q1 << 4);
        }
    }
}

/// ggml's quantize_row_q4_1_ref: d = (max - min)/15, m = min.
pub(crate) fn quantize_q4_1(x: &[f32], dst: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK).zip(dst.chunks_exact_mut(Q4_1_BYTES)) {
        let mut min = f32::MAX;
        let mut max = -f32::MAX;
        for &v in xb {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        b[2..4].copy_from_slice(&f32_to_f16(min).to_le_bytes());
        for j in 0..QK / 2 {
            let q0 = (((xb[j] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
            let q1 = (((xb[j + QK / 2] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
            b[4 + j] = q0 | (q1 << 4);
        }
    }
}

pub(crate) fn dequantize_q8_0(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(Q8_0_BYTES)) {
        let d = f16_at(b, 0);
        for (v, q) in y.iter_mut().zip(&b[2..]) {
            *v = (*q as i8) as f32 * d;
        }
    }
}

pub(crate) fn dequantize_q4_0(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(Q4_0_BYTES)) {
        let d = f16_at(b, 0);
        for j in 0..QK / 2 {
            y[j] = ((b[2 + j] & 0xF) as i32 - 8) as f32 * d;
            y[j + QK / 2] = ((b[2 + j] >> 4) as i32 - 8) as f32 * d;
        }
    }
}

pub(crate) fn dequantize_q4_1(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(Q4_1_BYTES)) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        for j in 0..QK / 2 {
            y[j] = (b[4 + j] & 0xF) as f32 * d + m;
            y[j + QK / 2] = (b[4 + j] >> 4) as f32 * d + m;
        }
    }
}

// Scalar reference dots (as ggml_vec_dot_*_q8_0's generic code): exact integer sums per block,
// scaled by the product of the block scales.

pub(crate) fn dot_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w.chunks_exact(Q8_0_BYTES).zip(a.chunks_exact(Q8_0_BYTES)).take(n / QK) {
        let s: i32 = bw[2..].iter().zip(&ba[2..]).map(|(&x, &y)| x as i8 as i32 * y as i8 as i32).sum();
        sum += s as f32 * (f16_at(bw, 0) * f16_at(ba, 0));
    }
    sum
}

pub(crate) fn dot_q4_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w.chunks_exact(Q4_0_BYTES).zip(a.chunks_exact(Q8_0_BYTES)).take(n / QK) {
        let mut s = 0i32;
        for j in 0..QK / 2 {
            let q = bw[2 + j];
            s += ((q & 0xF) as i32 - 8) * (ba[2 + j] as i8 as i32);
            s += ((q >> 4) as i32 - 8) * (ba[2 + QK / 2 + j] as i8 as i32);
        }
        sum += s as f32 * (f16_at(bw, 0) * f16_at(ba, 0));
    }
    sum
}

/// Q4_1 values are d*q + m, so a block contributes d*da*sum(q*a) + m*s with s = da*sum(a),
/// which the Q8_1 activation block stores as f16 (as ggml_vec_dot_q4_1_q8_1: the m*s terms are
/// summed apart and added at the end).
pub(crate) fn dot_q4_1(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (mut sum, mut summs) = (0f32, 0f32);
    for (bw, ba) in w.chunks_exact(Q4_1_BYTES).zip(a.chunks_exact(Q8_1_BYTES)).take(n / QK) {
        let mut s = 0i32;
        for j in 0..QK / 2 {
            let q = bw[4 + j];
            let (a0, a1) = (ba[4 + j] as i8 as i32, ba[4 + QK / 2 + j] as i8 as i32);
            s += (q & 0xF) as i32 * a0 + (q >> 4) as i32 * a1;
        }
        sum += s as f32 * (f16_at(bw, 0) * f16_at(ba, 0));
        summs += f16_at(bw, 2) * f16_at(ba, 2);
    }
    sum + summs
}

/// The 32 five-bit levels (0..=31) of a Q5_0/Q5_1 block: `qh` is the little-endian u32 of
/// high bits, `qs` the 16 nibble bytes.
#[inline(always)]
fn levels_5bit(qh: &[u8], qs: &[u8]) -> [u8; QK] {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut q = [0u8; QK];
    for j in 0..QK / 2 {
        q[j] = (qs[j] & 0xF) | ((((h >> j) & 1) as u8) << 4);
        q[j + QK / 2] = (qs[j] >> 4) | ((((h >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

/// Packs 32 five-bit levels into qh (4 bytes) and qs (16 bytes).
fn pack_5bit(q: &[u8; QK], qh: &mut [u8], qs: &mut [u8]) {
    let mut h = 0u32;
    for j in 0..QK / 2 {
        qs[j] = (q[j] & 0xF) | ((q[j + QK / 2] & 0xF) << 4);
        h |= (((q[j] & 0x10) >> 4) as u32) << j;
        h |= (((q[j + QK / 2] & 0x10) >> 4) as u32) << (j + 16);
    }
    qh.copy_from_slice(&h.to_le_bytes());
}

/// ggml's quantize_row_q5_0_ref: d = max / -16 where max is the value of largest magnitude,
/// q = min(31, trunc(x/d + 16.5)).
pub(crate) fn quantize_q5_0(x: &[f32], dst: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK).zip(dst.chunks_exact_mut(Q5_0_BYTES)) {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        let mut q = [0u8; QK];
        for (qi, &v) in q.iter_mut().zip(xb) {
            // C: MIN(31, (int8_t)(x0 + 16.5f)); the cast truncates toward zero.
            *qi = ((v * id + 16.5) as i8).min(31) as u8;
        }
        let (qh, qs) = b[2..].split_at_mut(4);
        pack_5bit(&q, qh, qs);
    }
}

/// ggml's quantize_row_q5_1_ref: d = (max - min)/31, m = min, q = trunc((x - min)/d + 0.5).
pub(crate) fn quantize_q5_1(x: &[f32], dst: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK).zip(dst.chunks_exact_mut(Q5_1_BYTES)) {
        let (mut min, mut max) = (xb[0], xb[0]);
        for &v in &xb[1..] {
            min = min.min(v);
            max = max.max(v);
        }
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        b[2..4].copy_from_slice(&f32_to_f16(min).to_le_bytes());
        let mut q = [0u8; QK];
        for (qi, &v) in q.iter_mut().zip(xb) {
            // C: (uint8_t)(x0 + 0.5f); x0 >= 0, and at most 31.5 so the result stays 5-bit.
            *qi = (((v - min) * id + 0.5) as u8).min(31);
        }
        let (qh, qs) = b[4..].split_at_mut(4);
        pack_5bit(&q, qh, qs);
    }
}

pub(crate) fn dequantize_q5_0(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(Q5_0_BYTES)) {
        let d = f16_at(b, 0);
        for (v, q) in y.iter_mut().zip(levels_5bit(&b[2..6], &b[6..])) {
            *v = (q as i32 - 16) as f32 * d;
        }
    }
}

pub(crate) fn dequantize_q5_1(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(Q5_1_BYTES)) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        for (v, q) in y.iter_mut().zip(levels_5bit(&b[4..8], &b[8..])) {
            *v = q as f32 * d + m;
        }
    }
}

/// As ggml_vec_dot_q5_0_q8_0's generic code: exact integer sum per block, scaled by d_w * d_a.
pub(crate) fn dot_q5_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w.chunks_exact(Q5_0_BYTES).zip(a.chunks_exact(Q8_0_BYTES)).take(n / QK) {
        let q = levels_5bit(&bw[2..6], &bw[6..]);
        let s: i32 = q.iter().zip(&ba[2..]).map(|(&x, &y)| (x as i32 - 16) * (y as i8 as i32)).sum();
        sum += s as f32 * (f16_at(bw, 0) * f16_at(ba, 0));
    }
    sum
}

/// As ggml_vec_dot_q5_1_q8_1: d_w*d_a*sum(q*a) per block, plus m*s (s = d_a * sum(a) from the
/// Q8_1 block), the m*s terms summed apart and added at the end like `dot_q4_1`.
pub(crate) fn dot_q5_1(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (mut sum, mut summs) = (0f32, 0f32);
    for (bw, ba) in w.chunks_exact(Q5_1_BYTES).zip(a.chunks_exact(Q8_1_BYTES)).take(n / QK) {
        let q = levels_5bit(&bw[4..8], &bw[8..]);
        let s: i32 = q.iter().zip(&ba[4..]).map(|(&x, &y)| x as i32 * (y as i8 as i32)).sum();
        sum += s as f32 * (f16_at(bw, 0) * f16_at(ba, 0));
        summs += f16_at(bw, 2) * f16_at(ba, 2);
    }
    sum + summs
}
