//! Dot products of a weight row with a quantised activation row.
//!
//! Each kernel is written once as portable code with exact integer block sums and compiled
//! for three instruction sets through `#[target_feature]`; `vec_dot` picks one at run time.

use super::blocks::{rd_f16, scale_min_k4, Q8K_BYTES};
use super::GgmlType;
use once_cell::sync::Lazy;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Level {
    Avx512,
    Avx2,
    Scalar,
}

static LEVEL: Lazy<Level> = Lazy::new(|| {
    #[cfg(target_arch = "x86_64")]
    {
        if std::env::var("CIVETTA_SIMD").as_deref() == Ok("scalar") {
            return Level::Scalar;
        }
        if std::env::var("CIVETTA_SIMD").as_deref() != Ok("avx2")
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
        {
            return Level::Avx512;
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
            return Level::Avx2;
        }
    }
    Level::Scalar
});

/// The instruction set `vec_dot` uses on this machine (override with CIVETTA_SIMD=avx2|scalar).
pub fn simd_level() -> &'static str {
    match *LEVEL {
        Level::Avx512 => "avx512",
        Level::Avx2 => "avx2",
        Level::Scalar => "scalar",
    }
}

/// dot(weight row, activation row) over n elements.
#[inline]
pub fn vec_dot(weight: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        match *LEVEL {
            // SAFETY: the features were detected at run time.
            Level::Avx512 => return unsafe { dot_avx512(weight, w, a, n) },
            Level::Avx2 => return unsafe { dot_avx2(weight, w, a, n) },
            Level::Scalar => {}
        }
    }
    dot_generic(weight, w, a, n)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn dot_avx512(t: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    dot_generic(t, w, a, n)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2(t: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    dot_generic(t, w, a, n)
}

#[inline(always)]
fn dot_generic(t: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    match t {
        GgmlType::F32 => dot_f32(w, a, n),
        GgmlType::F16 => dot_f16(w, a, n),
        GgmlType::BF16 => dot_bf16(w, a, n),
        GgmlType::Q8_0 => dot_q8_0(w, a, n),
        GgmlType::Q4_0 => dot_q4_0(w, a, n),
        GgmlType::Q4_1 => dot_q4_1(w, a, n),
        GgmlType::Q4_K => dot_q4_k(w, a, n),
        GgmlType::Q5_K => dot_q5_k(w, a, n),
        GgmlType::Q6_K => dot_q6_k(w, a, n),
        other => panic!("vec_dot: unsupported type {other} (checked at model load)"),
    }
}

#[inline(always)]
fn f32_at(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

/// Sum of products with 16 independent lanes so the compiler can vectorise without reassociation.
#[inline(always)]
fn lanes16(n: usize, mut f: impl FnMut(usize) -> f32) -> f32 {
    let mut acc = [0f32; 16];
    let full = n / 16 * 16;
    let mut i = 0;
    while i < full {
        for l in 0..16 {
            acc[l] += f(i + l);
        }
        i += 16;
    }
    let mut s = 0f32;
    for l in 0..16 {
        s += acc[l];
    }
    for j in full..n {
        s += f(j);
    }
    s
}

#[inline(always)]
fn dot_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    lanes16(n, |i| f32_at(w, i) * f32_at(a, i))
}

#[inline(always)]
fn dot_f16(w: &[u8], a: &[u8], n: usize) -> f32 {
    lanes16(n, |i| half::f16::from_bits(u16::from_le_bytes([w[2 * i], w[2 * i + 1]])).to_f32() * f32_at(a, i))
}

#[inline(always)]
fn dot_bf16(w: &[u8], a: &[u8], n: usize) -> f32 {
    lanes16(n, |i| f32::from_bits((u16::from_le_bytes([w[2 * i], w[2 * i + 1]]) as u32) << 16) * f32_at(a, i))
}

#[inline(always)]
fn dot_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w.chunks_exact(34).zip(a.chunks_exact(34)).take(n / 32) {
        let mut s = 0i32;
        for j in 0..32 {
            s += (bw[2 + j] as i8 as i32) * (ba[2 + j] as i8 as i32);
        }
        sum += s as f32 * (rd_f16(bw, 0) * rd_f16(ba, 0));
    }
    sum
}

#[inline(always)]
fn dot_q4_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w.chunks_exact(18).zip(a.chunks_exact(34)).take(n / 32) {
        let mut s = 0i32;
        for j in 0..16 {
            let q = bw[2 + j];
            s += ((q & 0xF) as i32 - 8) * (ba[2 + j] as i8 as i32);
            s += ((q >> 4) as i32 - 8) * (ba[18 + j] as i8 as i32);
        }
        sum += s as f32 * (rd_f16(bw, 0) * rd_f16(ba, 0));
    }
    sum
}

#[inline(always)]
fn dot_q4_1(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w.chunks_exact(20).zip(a.chunks_exact(34)).take(n / 32) {
        let (mut s, mut sa) = (0i32, 0i32);
        for j in 0..16 {
            let q = bw[4 + j];
            let (a0, a1) = (ba[2 + j] as i8 as i32, ba[18 + j] as i8 as i32);
            s += (q & 0xF) as i32 * a0 + (q >> 4) as i32 * a1;
            sa += a0 + a1;
        }
        let da = rd_f16(ba, 0);
        // ggml's q8_1 carries s = d*sum(q) for the min term.
        sum += s as f32 * (rd_f16(bw, 0) * da) + rd_f16(bw, 2) * (da * sa as f32);
    }
    sum
}

#[inline(always)]
fn q8k_parts(ba: &[u8]) -> (f32, &[u8], [i32; 16]) {
    let d = f32::from_le_bytes([ba[0], ba[1], ba[2], ba[3]]);
    let mut bs = [0i32; 16];
    for g in 0..16 {
        bs[g] = i16::from_le_bytes([ba[260 + 2 * g], ba[261 + 2 * g]]) as i32;
    }
    (d, &ba[4..260], bs)
}

#[inline(always)]
fn dot_q4_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w.chunks_exact(144).zip(a.chunks_exact(Q8K_BYTES)).take(n / 256) {
        let (da, qa, bsums) = q8k_parts(ba);
        let scales = &bw[4..16];
        let qs = &bw[16..144];
        let (mut sumi, mut summ) = (0i32, 0i32);
        for c in 0..4 {
            let (sc1, m1) = scale_min_k4(2 * c, scales);
            let (sc2, m2) = scale_min_k4(2 * c + 1, scales);
            let q = &qs[32 * c..32 * c + 32];
            let (mut s1, mut s2) = (0i32, 0i32);
            for l in 0..32 {
                s1 += (q[l] & 0xF) as i32 * (qa[64 * c + l] as i8 as i32);
                s2 += (q[l] >> 4) as i32 * (qa[64 * c + 32 + l] as i8 as i32);
            }
            sumi += sc1 as i32 * s1 + sc2 as i32 * s2;
            summ += m1 as i32 * (bsums[4 * c] + bsums[4 * c + 1]) + m2 as i32 * (bsums[4 * c + 2] + bsums[4 * c + 3]);
        }
        sum += da * rd_f16(bw, 0) * sumi as f32 - da * rd_f16(bw, 2) * summ as f32;
    }
    sum
}

#[inline(always)]
fn dot_q5_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w.chunks_exact(176).zip(a.chunks_exact(Q8K_BYTES)).take(n / 256) {
        let (da, qa, bsums) = q8k_parts(ba);
        let scales = &bw[4..16];
        let qh = &bw[16..48];
        let qs = &bw[48..176];
        let (mut sumi, mut summ) = (0i32, 0i32);
        for c in 0..4 {
            let (sc1, m1) = scale_min_k4(2 * c, scales);
            let (sc2, m2) = scale_min_k4(2 * c + 1, scales);
            let q = &qs[32 * c..32 * c + 32];
            let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
            let (mut s1, mut s2) = (0i32, 0i32);
            for l in 0..32 {
                let lo = (q[l] & 0xF) as i32 + if qh[l] & u1 != 0 { 16 } else { 0 };
                let hi = (q[l] >> 4) as i32 + if qh[l] & u2 != 0 { 16 } else { 0 };
                s1 += lo * (qa[64 * c + l] as i8 as i32);
                s2 += hi * (qa[64 * c + 32 + l] as i8 as i32);
            }
            sumi += sc1 as i32 * s1 + sc2 as i32 * s2;
            summ += m1 as i32 * (bsums[4 * c] + bsums[4 * c + 1]) + m2 as i32 * (bsums[4 * c + 2] + bsums[4 * c + 3]);
        }
        sum += da * rd_f16(bw, 0) * sumi as f32 - da * rd_f16(bw, 2) * summ as f32;
    }
    sum
}

#[inline(always)]
fn dot_q6_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w.chunks_exact(210).zip(a.chunks_exact(Q8K_BYTES)).take(n / 256) {
        let (da, qa, _) = q8k_parts(ba);
        let mut sumi = 0i32;
        for half in 0..2 {
            let ql = &bw[64 * half..64 * half + 64];
            let qh = &bw[128 + 32 * half..128 + 32 * half + 32];
            let sc = &bw[192 + 8 * half..192 + 8 * half + 8];
            let qa = &qa[128 * half..128 * half + 128];
            let mut s = [0i32; 8];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                s[is] += q1 * (qa[l] as i8 as i32);
                s[is + 2] += q2 * (qa[l + 32] as i8 as i32);
                s[is + 4] += q3 * (qa[l + 64] as i8 as i32);
                s[is + 6] += q4 * (qa[l + 96] as i8 as i32);
            }
            for k in 0..8 {
                sumi += (sc[k] as i8 as i32) * s[k];
            }
        }
        sum += da * rd_f16(bw, 208) * sumi as f32;
    }
    sum
}

#[cfg(test)]
pub(crate) fn dot_generic_for_tests(t: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    dot_generic(t, w, a, n)
}
