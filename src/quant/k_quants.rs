//! The 256-element "K" super-block formats Q4_K, Q5_K, Q6_K and the Q8_K activation format
//! (ggml-common.h layouts), ggml's reference quantisers and scalar dot products.
//!
//! Layouts (little endian):
//! - Q4_K (144 B): f16 d, f16 dmin, 12 bytes of packed 6-bit (scale, min) for 8 sub-blocks of
//!   32, 128 bytes of nibbles. Chunk c (32 bytes) holds sub-block 2c in its low nibbles and
//!   sub-block 2c+1 in its high nibbles. Value = d*scale*q - dmin*min.
//! - Q5_K (176 B): as Q4_K plus 32 bytes qh between the scales and the nibbles: bit 2c of
//!   qh[l] is the fifth bit of element l of sub-block 2c, bit 2c+1 that of sub-block 2c+1.
//! - Q6_K (210 B): 128 bytes ql (low 4 bits), 64 bytes qh (high 2 bits), 16 x i8 scales (one
//!   per 16 elements), f16 d. Value = d*scale*(q - 32).
//! - Q8_K (292 B): f32 d, 256 x i8, 16 x i16 sums of each group of 16 quants.

use super::float::{f16_at, f32_at, f32_to_f16};

pub(crate) const QK_K: usize = 256;
pub(crate) const Q4_K_BYTES: usize = 144;
pub(crate) const Q5_K_BYTES: usize = 176;
pub(crate) const Q6_K_BYTES: usize = 210;
pub(crate) const Q8_K_BYTES: usize = 292;

/// ggml's nearest_int: round half to even through the 1.5*2^23 trick (valid for |x| < 2^22).
#[inline(always)]
pub(crate) fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0f32;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Q4_K/Q5_K 6-bit scale and min of sub-block j (ggml's get_scale_min_k4).
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// All 8 scales and 8 mins of a Q4_K/Q5_K scale field, as two little-endian u64 of bytes.
/// (ggml's kmask/utmp unpacking, used by the SIMD kernels.)
#[inline(always)]
pub(crate) fn unpack_scales_mins_k4(s: &[u8]) -> (u64, u64) {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    let u0 = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let u1 = u32::from_le_bytes([s[4], s[5], s[6], s[7]]);
    let u2 = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
    let scales_lo = u0 & KMASK1;
    let scales_hi = (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4);
    let mins_lo = u1 & KMASK1;
    let mins_hi = ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4);
    (scales_lo as u64 | (scales_hi as u64) << 32, mins_lo as u64 | (mins_hi as u64) << 32)
}

/// ggml's quantize_row_q8_K_ref: iscale = -127/max (max = value of largest magnitude),
/// q = min(127, nearest_int(iscale*x)), d = 1/iscale, plus the 16 group sums.
pub(crate) fn quantize_q8_k(x: &[f32], dst: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q8_K_BYTES)) {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            b.fill(0);
            continue;
        }
        let iscale = -127.0 / max;
        let mut q = [0i8; QK_K];
        for (qv, v) in q.iter_mut().zip(xb) {
            *qv = nearest_int(iscale * v).min(127) as i8;
        }
        b[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
        for (o, qv) in b[4..4 + QK_K].iter_mut().zip(&q) {
            *o = *qv as u8;
        }
        for g in 0..QK_K / 16 {
            let s: i32 = q[16 * g..16 * g + 16].iter().map(|&v| v as i32).sum();
            b[260 + 2 * g..262 + 2 * g].copy_from_slice(&(s as i16).to_le_bytes());
        }
    }
}

pub(crate) fn dequantize_q8_k(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.chunks_exact_mut(QK_K).zip(src.chunks_exact(Q8_K_BYTES)) {
        let d = f32_at(b, 0);
        for (v, q) in y.iter_mut().zip(&b[4..4 + QK_K]) {
            *v = d * (*q as i8) as f32;
        }
    }
}

/// ggml's make_qkx2_quants: affine quantisation of one sub-block to 0..=nmax with a weighted
/// search over candidate scales. Returns (scale, -min) and writes the levels to `l`.
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(x: &[f32], weights: &[f32], nmax: i32, l: &mut [u8], rmin: f32, rdelta: f32, nstep: i32) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        min = if x[i] < min { x[i] } else { min };
        max = if x[i] > max { x[i] } else { max };
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * q as f32 + min - x[i];
        best_error += weights[i] * diff * diff;
    }
    let mut laux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let (w, q) = (weights[i], q as f32);
            sum_l += w * q;
            sum_l2 += w * q * q;
            sum_xl += w * q * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * diff * diff;
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Q4_K (nmax 15) and Q5_K (nmax 31) super-block quantisation as ggml's
/// quantize_row_q4_K_ref / quantize_row_q5_K_ref. Returns the 256 levels; writes d, dmin and
/// the scale field into `b[..16]`.
fn quantize_k_scales_and_levels(x: &[f32], nmax: i32, b: &mut [u8]) -> [u8; QK_K] {
    let (rmin, nstep) = if nmax == 15 { (-1.0, 20) } else { (-0.5, 15) };
    let mut levels = [0u8; QK_K];
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let mut weights = [0f32; 32];
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let sum_x2: f32 = xs.iter().map(|v| v * v).sum();
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (s, m) = make_qkx2_quants(xs, &weights, nmax, &mut levels[32 * j..32 * j + 32], rmin, 0.1, nstep);
        scales[j] = s;
        mins[j] = m;
        max_scale = max_scale.max(s);
        max_min = max_min.max(m);
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let sc = &mut b[4..16];
    sc.fill(0);
    for j in 0..8 {
        // ggml stores nearest_int(..) into a uint8_t before clamping; the values are >= 0.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    b[..2].copy_from_slice(&f32_to_f16(max_scale / 63.0).to_le_bytes());
    b[2..4].copy_from_slice(&f32_to_f16(max_min / 63.0).to_le_bytes());
    // Requantise against the scales the decoder will actually see.
    let (d_all, dmin_all) = (f16_at(b, 0), f16_at(b, 2));
    for j in 0..8 {
        let (s, m) = scale_min_k4(j, &b[4..16]);
        let d = d_all * s as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * m as f32;
        for i in 0..32 {
            levels[32 * j + i] = nearest_int((x[32 * j + i] + dm) / d).clamp(0, nmax) as u8;
        }
    }
    levels
}

pub(crate) fn quantize_q4_k(x: &[f32], dst: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q4_K_BYTES)) {
        let levels = quantize_k_scales_and_levels(xb, 15, b);
        let qs = &mut b[16..144];
        for c in 0..4 {
            for l in 0..32 {
                qs[32 * c + l] = levels[64 * c + l] | (levels[64 * c + 32 + l] << 4);
            }
        }
    }
}

pub(crate) fn quantize_q5_k(x: &[f32], dst: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q5_K_BYTES)) {
        let levels = quantize_k_scales_and_levels(xb, 31, b);
        let (qh, qs) = b[16..176].split_at_mut(32);
        qh.fill(0);
        for c in 0..4 {
            for l in 0..32 {
                let (lo, hi) = (levels[64 * c + l], levels[64 * c + 32 + l]);
                qs[32 * c + l] = (lo & 0xF) | ((hi & 0xF) << 4);
                qh[l] |= ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1));
            }
        }
    }
}

const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's make_qx_quants with rmse_type 1 (weights x^2): symmetric quantisation of a group to
/// -nmax..nmax-1 with a search over 19 candidate scales. Writes levels + nmax to `l`.
fn make_qx_quants(x: &[f32], nmax: i32, l: &mut [u8]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let fit = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for &v in x {
            let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1) as f32;
            let w = v * v;
            sumlx += w * v * q;
            suml2 += w * q * q;
        }
        (sumlx, suml2)
    };
    let write = |iscale: f32, l: &mut [u8]| {
        for (o, &v) in l.iter_mut().zip(x) {
            *o = (nmax + nearest_int(iscale * v).clamp(-nmax, nmax - 1)) as u8;
        }
    };
    let iscale = -(nmax as f32) / max;
    let (sumlx, suml2) = fit(iscale);
    write(iscale, l);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = fit(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            write(iscale, l);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's quantize_row_q6_K_ref.
pub(crate) fn quantize_q6_k(x: &[f32], dst: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q6_K_BYTES)) {
        let mut levels = [0u8; QK_K];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
        for g in 0..16 {
            let s = make_qx_quants(&xb[16 * g..16 * g + 16], 32, &mut levels[16 * g..16 * g + 16]);
            scales[g] = s;
            if s.abs() > max_abs_scale {
                max_abs_scale = s.abs();
                max_scale = s;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            b.fill(0);
            continue;
        }
        let iscale = -128.0 / max_scale;
        b[208..210].copy_from_slice(&f32_to_f16(1.0 / iscale).to_le_bytes());
        for g in 0..16 {
            b[192 + g] = nearest_int(iscale * scales[g]).min(127) as i8 as u8;
        }
        let d_all = f16_at(b, 208);
        for g in 0..16 {
            let d = d_all * (b[192 + g] as i8) as f32;
            if d == 0.0 {
                continue;
            }
            for i in 0..16 {
                levels[16 * g + i] = (nearest_int(xb[16 * g + i] / d).clamp(-32, 31) + 32) as u8;
            }
        }
        for half in 0..2 {
            let q = &levels[128 * half..128 * half + 128];
            for l in 0..32 {
                let (q1, q2, q3, q4) = (q[l], q[l + 32], q[l + 64], q[l + 96]);
                b[64 * half + l] = (q1 & 0xF) | ((q3 & 0xF) << 4);
                b[64 * half + l + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4);
                b[128 + 32 * half + l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
            }
        }
    }
}

pub(crate) fn dequantize_q4_k(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.chunks_exact_mut(QK_K).zip(src.chunks_exact(Q4_K_BYTES)) {
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        let scales = &b[4..16];
        let qs = &b[16..144];
        for c in 0..4 {
            let (sc1, m1) = scale_min_k4(2 * c, scales);
            let (sc2, m2) = scale_min_k4(2 * c + 1, scales);
            let (d1, mm1, d2, mm2) = (d * sc1 as f32, dmin * m1 as f32, d * sc2 as f32, dmin * m2 as f32);
            let q = &qs[32 * c..32 * c + 32];
            for l in 0..32 {
                y[64 * c + l] = d1 * (q[l] & 0xF) as f32 - mm1;
                y[64 * c + 32 + l] = d2 * (q[l] >> 4) as f32 - mm2;
            }
        }
    }
}

pub(crate) fn dequantize_q5_k(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.chunks_exact_mut(QK_K).zip(src.chunks_exact(Q5_K_BYTES)) {
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        let scales = &b[4..16];
        let qh = &b[16..48];
        let qs = &b[48..176];
        for c in 0..4 {
            let (sc1, m1) = scale_min_k4(2 * c, scales);
            let (sc2, m2) = scale_min_k4(2 * c + 1, scales);
            let (d1, mm1, d2, mm2) = (d * sc1 as f32, dmin * m1 as f32, d * sc2 as f32, dmin * m2 as f32);
            let q = &qs[32 * c..32 * c + 32];
            for l in 0..32 {
                let lo = (q[l] & 0xF) | (((qh[l] >> (2 * c)) & 1) << 4);
                let hi = (q[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
                y[64 * c + l] = d1 * lo as f32 - mm1;
                y[64 * c + 32 + l] = d2 * hi as f32 - mm2;
            }
        }
    }
}

/// The 256 six-bit levels (0..=63) of a Q6_K block in element order.
fn q6_k_levels(b: &[u8]) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for half in 0..2 {
        let ql = &b[64 * half..64 * half + 64];
        let qh = &b[128 + 32 * half..128 + 32 * half + 32];
        let q = &mut q[128 * half..128 * half + 128];
        for l in 0..32 {
            q[l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
            q[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
            q[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            q[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    q
}

pub(crate) fn dequantize_q6_k(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.chunks_exact_mut(QK_K).zip(src.chunks_exact(Q6_K_BYTES)) {
        let d = f16_at(b, 208);
        let q = q6_k_levels(b);
        for (i, v) in y.iter_mut().enumerate() {
            // (d * scale) * q, the evaluation order of ggml and gguf-py.
            *v = d * (b[192 + i / 16] as i8) as f32 * (q[i] as i32 - 32) as f32;
        }
    }
}

fn q8_k_bsums(ba: &[u8]) -> [i32; 16] {
    std::array::from_fn(|g| i16::from_le_bytes([ba[260 + 2 * g], ba[261 + 2 * g]]) as i32)
}

// Scalar reference dots (ggml's generic ggml_vec_dot_q*_K_q8_K): per super-block an exact
// integer sum of scale * sum(q*a), and for Q4_K/Q5_K the min term from the Q8_K group sums.

/// Shared by Q4_K and Q5_K once the levels are unpacked.
fn dot_kx_block(levels: &[u8; QK_K], bw: &[u8], ba: &[u8]) -> f32 {
    let qa = &ba[4..4 + QK_K];
    let bsums = q8_k_bsums(ba);
    let (mut sumi, mut summ) = (0i32, 0i32);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &bw[4..16]);
        let s: i32 = (0..32).map(|l| levels[32 * j + l] as i32 * qa[32 * j + l] as i8 as i32).sum();
        sumi += sc as i32 * s;
        summ += m as i32 * (bsums[2 * j] + bsums[2 * j + 1]);
    }
    let da = f32_at(ba, 0);
    f16_at(bw, 0) * da * sumi as f32 - f16_at(bw, 2) * da * summ as f32
}

pub(crate) fn dot_q4_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w.chunks_exact(Q4_K_BYTES).zip(a.chunks_exact(Q8_K_BYTES)).take(n / QK_K) {
        let mut levels = [0u8; QK_K];
        for c in 0..4 {
            for l in 0..32 {
                let q = bw[16 + 32 * c + l];
                levels[64 * c + l] = q & 0xF;
                levels[64 * c + 32 + l] = q >> 4;
            }
        }
        sum += dot_kx_block(&levels, bw, ba);
    }
    sum
}

pub(crate) fn dot_q5_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w.chunks_exact(Q5_K_BYTES).zip(a.chunks_exact(Q8_K_BYTES)).take(n / QK_K) {
        let mut levels = [0u8; QK_K];
        for c in 0..4 {
            for l in 0..32 {
                let (q, h) = (bw[48 + 32 * c + l], bw[16 + l]);
                levels[64 * c + l] = (q & 0xF) | (((h >> (2 * c)) & 1) << 4);
                levels[64 * c + 32 + l] = (q >> 4) | (((h >> (2 * c + 1)) & 1) << 4);
            }
        }
        sum += dot_kx_block(&levels, bw, ba);
    }
    sum
}

pub(crate) fn dot_q6_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w.chunks_exact(Q6_K_BYTES).zip(a.chunks_exact(Q8_K_BYTES)).take(n / QK_K) {
        let q = q6_k_levels(bw);
        let qa = &ba[4..4 + QK_K];
        let mut sumi = 0i32;
        for g in 0..16 {
            let s: i32 = (16 * g..16 * g + 16).map(|i| (q[i] as i32 - 32) * qa[i] as i8 as i32).sum();
            sumi += (bw[192 + g] as i8) as i32 * s;
        }
        sum += f16_at(bw, 208) * f32_at(ba, 0) * sumi as f32;
    }
    sum
}
