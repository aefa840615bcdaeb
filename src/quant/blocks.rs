//! Block layouts (ggml-common.h) and their reference (de)quantisation.

use super::GgmlType;
use anyhow::bail;

pub const Q8K_BYTES: usize = 4 + 256 + 32;

pub fn f16_to_f32(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
}
pub fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}
/// Round-to-nearest-even, NaN kept quiet (as ggml's GGML_FP32_TO_BF16).
pub fn f32_to_bf16(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

#[inline(always)]
pub(crate) fn rd_f16(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
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

fn check_len(t: GgmlType, n: usize, bytes: usize) -> anyhow::Result<()> {
    match t.row_bytes(n) {
        Some(b) if b == bytes => Ok(()),
        Some(b) => bail!("{t}: {n} elements need {b} bytes, got {bytes}"),
        None => bail!("{t}: {n} elements is not a multiple of the block size {}", t.block_size()),
    }
}

/// Dequantises a row of `dst.len()` elements.
pub fn dequantize_row(t: GgmlType, src: &[u8], dst: &mut [f32]) -> anyhow::Result<()> {
    if !super::supports(t) {
        bail!("unsupported tensor type {t}");
    }
    check_len(t, dst.len(), src.len())?;
    match t {
        GgmlType::F32 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes(s.try_into().unwrap());
            }
        }
        GgmlType::F16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f16_to_f32(u16::from_le_bytes([s[0], s[1]]));
            }
        }
        GgmlType::BF16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = bf16_to_f32(u16::from_le_bytes([s[0], s[1]]));
            }
        }
        GgmlType::Q8_0 => {
            for (y, b) in dst.chunks_exact_mut(32).zip(src.chunks_exact(34)) {
                let d = rd_f16(b, 0);
                for j in 0..32 {
                    y[j] = (b[2 + j] as i8) as f32 * d;
                }
            }
        }
        GgmlType::Q4_0 => {
            for (y, b) in dst.chunks_exact_mut(32).zip(src.chunks_exact(18)) {
                let d = rd_f16(b, 0);
                for j in 0..16 {
                    y[j] = ((b[2 + j] & 0xF) as i32 - 8) as f32 * d;
                    y[j + 16] = ((b[2 + j] >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
        GgmlType::Q4_1 => {
            for (y, b) in dst.chunks_exact_mut(32).zip(src.chunks_exact(20)) {
                let (d, m) = (rd_f16(b, 0), rd_f16(b, 2));
                for j in 0..16 {
                    y[j] = (b[4 + j] & 0xF) as f32 * d + m;
                    y[j + 16] = (b[4 + j] >> 4) as f32 * d + m;
                }
            }
        }
        GgmlType::Q4_K => {
            for (y, b) in dst.chunks_exact_mut(256).zip(src.chunks_exact(144)) {
                let (d, dmin) = (rd_f16(b, 0), rd_f16(b, 2));
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
        GgmlType::Q5_K => {
            for (y, b) in dst.chunks_exact_mut(256).zip(src.chunks_exact(176)) {
                let (d, dmin) = (rd_f16(b, 0), rd_f16(b, 2));
                let scales = &b[4..16];
                let qh = &b[16..48];
                let qs = &b[48..176];
                for c in 0..4 {
                    let (sc1, m1) = scale_min_k4(2 * c, scales);
                    let (sc2, m2) = scale_min_k4(2 * c + 1, scales);
                    let (d1, mm1, d2, mm2) = (d * sc1 as f32, dmin * m1 as f32, d * sc2 as f32, dmin * m2 as f32);
                    let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
                    let q = &qs[32 * c..32 * c + 32];
                    for l in 0..32 {
                        let hi1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                        let hi2 = if qh[l] & u2 != 0 { 16 } else { 0 };
                        y[64 * c + l] = d1 * ((q[l] & 0xF) + hi1) as f32 - mm1;
                        y[64 * c + 32 + l] = d2 * ((q[l] >> 4) + hi2) as f32 - mm2;
                    }
                }
            }
        }
        GgmlType::Q6_K => {
            for (y, b) in dst.chunks_exact_mut(256).zip(src.chunks_exact(210)) {
                let d = rd_f16(b, 208);
                for half in 0..2 {
                    let ql = &b[64 * half..64 * half + 64];
                    let qh = &b[128 + 32 * half..128 + 32 * half + 32];
                    let sc = &b[192 + 8 * half..192 + 8 * half + 8];
                    let y = &mut y[128 * half..128 * half + 128];
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                        let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                        let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                        let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                        y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                        y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                        y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                        y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
                    }
                }
            }
        }
        _ => unreachable!("checked by supports()"),
    }
    Ok(())
}

/// ggml's quantize_row_q8_0_ref.
pub fn quantize_q8_0(x: &[f32], dst: &mut [u8]) {
    for (xb, b) in x.chunks_exact(32).zip(dst.chunks_exact_mut(34)) {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        for j in 0..32 {
            b[2 + j] = ((xb[j] * id).round() as i32) as i8 as u8;
        }
    }
}

/// ggml's quantize_row_q8_K_ref: f32 d, 256 i8, 16 i16 block sums.
pub fn quantize_q8_k(x: &[f32], dst: &mut [u8]) {
    for (xb, b) in x.chunks_exact(256).zip(dst.chunks_exact_mut(Q8K_BYTES)) {
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
        let mut q = [0i8; 256];
        for j in 0..256 {
            q[j] = nearest_int(iscale * xb[j]).min(127) as i8;
        }
        b[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
        for j in 0..256 {
            b[4 + j] = q[j] as u8;
        }
        for g in 0..16 {
            let s: i32 = q[16 * g..16 * g + 16].iter().map(|&v| v as i32).sum();
            b[260 + 2 * g..262 + 2 * g].copy_from_slice(&(s as i16).to_le_bytes());
        }
    }
}

/// Round half away from zero, like C's roundf used through ggml's nearest_int for |x| < 2^22.
fn nearest_int(x: f32) -> i32 {
    x.round() as i32
}

/// Quantises a row of f32 into weight type t (used to write test models).
pub fn quantize_row(t: GgmlType, src: &[f32], dst: &mut [u8]) -> anyhow::Result<()> {
    if !super::supports(t) {
        bail!("unsupported tensor type {t}");
    }
    check_len(t, src.len(), dst.len())?;
    match t {
        GgmlType::F32 => {
            for (d, v) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (d, v) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&f32_to_f16(*v).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for (d, v) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&f32_to_bf16(*v).to_le_bytes());
            }
        }
        GgmlType::Q8_0 => quantize_q8_0(src, dst),
        GgmlType::Q4_0 => {
            // ggml's quantize_row_q4_0_ref: d = max / -8 (max = the value of largest magnitude).
            for (xb, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(18)) {
                let max = signed_absmax(xb);
                let d = max / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                b[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
                for j in 0..16 {
                    let q0 = ((xb[j] * id + 8.5) as i32).clamp(0, 15) as u8;
                    let q1 = ((xb[j + 16] * id + 8.5) as i32).clamp(0, 15) as u8;
                    b[2 + j] = q0 | (q1 << 4);
                }
            }
        }
        GgmlType::Q4_1 => {
            for (xb, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(20)) {
                let min = xb.iter().copied().fold(f32::INFINITY, f32::min);
                let max = xb.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                b[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
                b[2..4].copy_from_slice(&f32_to_f16(min).to_le_bytes());
                for j in 0..16 {
                    let q0 = (((xb[j] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
                    let q1 = (((xb[j + 16] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
                    b[4 + j] = q0 | (q1 << 4);
                }
            }
        }
        GgmlType::Q4_K => {
            for (xb, b) in src.chunks_exact(256).zip(dst.chunks_exact_mut(144)) {
                quantize_k_block(xb, 15, b);
            }
        }
        GgmlType::Q5_K => {
            for (xb, b) in src.chunks_exact(256).zip(dst.chunks_exact_mut(176)) {
                quantize_k_block(xb, 31, b);
            }
        }
        GgmlType::Q6_K => {
            for (xb, b) in src.chunks_exact(256).zip(dst.chunks_exact_mut(210)) {
                quantize_q6_k_block(xb, b);
            }
        }
        _ => unreachable!(),
    }
    Ok(())
}

fn signed_absmax(x: &[f32]) -> f32 {
    let mut m = 0f32;
    for &v in x {
        if v.abs() > m.abs() {
            m = v;
        }
    }
    m
}

/// Q4_K (nmax 15) / Q5_K (nmax 31): per 32-sub-block affine quantisation with 6-bit scales
/// and mins (a simple min/max fit, not ggml's iterative search; any valid encoding works).
fn quantize_k_block(x: &[f32], nmax: i32, b: &mut [u8]) {
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    for j in 0..8 {
        let s = &x[32 * j..32 * j + 32];
        let min = s.iter().copied().fold(f32::INFINITY, f32::min).min(0.0);
        let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        scales[j] = (max - min) / nmax as f32;
        mins[j] = -min;
    }
    let max_scale = scales.iter().copied().fold(0f32, f32::max);
    let max_min = mins.iter().copied().fold(0f32, f32::max);
    let d = max_scale / 63.0;
    let dmin = max_min / 63.0;
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..8 {
        ls[j] = if d > 0.0 { (scales[j] / d).round().clamp(0.0, 63.0) as u8 } else { 0 };
        lm[j] = if dmin > 0.0 { (mins[j] / dmin).round().clamp(0.0, 63.0) as u8 } else { 0 };
    }
    b[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    b[2..4].copy_from_slice(&f32_to_f16(dmin).to_le_bytes());
    let sc = &mut b[4..16];
    sc.fill(0);
    for j in 0..8 {
        if j < 4 {
            sc[j] = ls[j];
            sc[j + 4] = lm[j];
        } else {
            sc[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            sc[j - 4] |= (ls[j] >> 4) << 6;
            sc[j] |= (lm[j] >> 4) << 6;
        }
    }
    // Quantise with the f16-rounded super-block scales, as the decoder will see them.
    let (d, dmin) = (rd_f16(b, 0), rd_f16(b, 2));
    let mut q = [0u8; 256];
    for j in 0..8 {
        let (s, m) = scale_min_k4(j, &b[4..16]);
        let ds = d * s as f32;
        let dm = dmin * m as f32;
        for l in 0..32 {
            let v = if ds > 0.0 { ((x[32 * j + l] + dm) / ds).round() as i32 } else { 0 };
            q[32 * j + l] = v.clamp(0, nmax) as u8;
        }
    }
    if nmax == 15 {
        let qs = &mut b[16..144];
        for c in 0..4 {
            for l in 0..32 {
                qs[32 * c + l] = q[64 * c + l] | (q[64 * c + 32 + l] << 4);
            }
        }
    } else {
        let (qh, qs) = b[16..176].split_at_mut(32);
        qh.fill(0);
        for c in 0..4 {
            for l in 0..32 {
                let (a, bb) = (q[64 * c + l], q[64 * c + 32 + l]);
                qs[32 * c + l] = (a & 0xF) | ((bb & 0xF) << 4);
                if a & 16 != 0 {
                    qh[l] |= 1 << (2 * c);
                }
                if bb & 16 != 0 {
                    qh[l] |= 2 << (2 * c);
                }
            }
        }
    }
}

/// Q6_K: 16 sub-blocks of 16 with int8 scales, 6-bit values offset by 32.
fn quantize_q6_k_block(x: &[f32], b: &mut [u8]) {
    let mut scales = [0f32; 16];
    for i in 0..16 {
        scales[i] = signed_absmax(&x[16 * i..16 * i + 16]) / -32.0;
    }
    let max_abs = scales.iter().fold(0f32, |a, s| a.max(s.abs()));
    let d = max_abs / 127.0;
    b[208..210].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    let d = rd_f16(b, 208);
    let mut ls = [0i8; 16];
    for i in 0..16 {
        ls[i] = if d > 0.0 { (scales[i] / d).round().clamp(-128.0, 127.0) as i8 } else { 0 };
        b[192 + i] = ls[i] as u8;
    }
    let mut q = [0u8; 256];
    for i in 0..16 {
        let ds = d * ls[i] as f32;
        for l in 0..16 {
            let v = if ds != 0.0 { (x[16 * i + l] / ds).round() as i32 } else { 0 };
            q[16 * i + l] = (v.clamp(-32, 31) + 32) as u8;
        }
    }
    b[..192].fill(0);
    for half in 0..2 {
        let q = &q[128 * half..128 * half + 128];
        for l in 0..32 {
            let (q1, q2, q3, q4) = (q[l], q[l + 32], q[l + 64], q[l + 96]);
            b[64 * half + l] = (q1 & 0xF) | ((q3 & 0xF) << 4);
            b[64 * half + l + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4);
            b[128 + 32 * half + l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
}
