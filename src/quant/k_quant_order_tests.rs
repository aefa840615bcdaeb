//! The float order of the AVX-512 K-quant dots (Q4_K, Q5_K, Q6_K x Q8_K), written out in
//! scalar code, and tests that the kernels (one-row dots and every tile shape) follow it bit
//! for bit. Why a model: the AVX-512 sums are not the scalar reference's (16 f32 lanes per
//! super-block, a separate 8-lane min accumulator, a fixed horizontal-sum tree), greedy outputs
//! and fixtures depend on them, and a kernel rewrite may only reorganise the exact integer
//! work. The model pins down which integers land in which lane and every float operation
//! after that, so any change of the float order fails here.
//!
//! Per super-block, 16 i32 lanes L = 0..15, each an exact integer:
//! - Q4_K/Q5_K: lane L = sum over 64-element chunks c of scale[2c + L/8] * (the products of
//!   elements 64c + 4L .. 64c + 4L + 3); min lane j = 0..7: min[j] * (bsum[2j] + bsum[2j+1]).
//! - Q6_K: lane L = sum over chunks k of scale[4k + L/4] * (the products of elements
//!   64k + 4L .. +3, levels stored +32), lanes 0..7 less 32 * (scale[2L] * bsum[2L] +
//!   scale[2L+1] * bsum[2L+1]).
//!
//! Then acc[L] = fma(f32(lane L), d_w * d_a, acc[L]) (and acc_min[j] likewise with
//! dmin_w * d_a), and at the end the 16- and 8-lane trees of `hsum512`/`hsum256`:
//! result = hsum16(acc) - hsum8(acc_min).

use super::k_quants::{scale_min_k4, Q8_K_BYTES, QK_K};
use super::simd::{self, SimdLevel};
use super::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// `hsum256`'s tree: (l0+l4, l1+l5, l2+l6, l3+l7), then (s0+s2, s1+s3), then the two.
fn hsum8(v: [f32; 8]) -> f32 {
    let s: [f32; 4] = std::array::from_fn(|i| v[i] + v[i + 4]);
    (s[0] + s[2]) + (s[1] + s[3])
}

/// `hsum512`'s tree: the two 256-bit halves added lane by lane, then `hsum8`.
fn hsum16(v: [f32; 16]) -> f32 {
    hsum8(std::array::from_fn(|i| v[i] + v[i + 8]))
}

fn f16_at(b: &[u8], o: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[o], b[o + 1]]))
}

/// The 256 levels of a Q4_K (no qh) or Q5_K block in element order.
fn kx_levels(qh: Option<&[u8]>, qs: &[u8]) -> [i32; QK_K] {
    let mut lv = [0i32; QK_K];
    for c in 0..4 {
        for l in 0..32 {
            let (mut lo, mut hi) = ((qs[32 * c + l] & 0xF) as i32, (qs[32 * c + l] >> 4) as i32);
            if let Some(qh) = qh {
                lo |= (((qh[l] >> (2 * c)) & 1) as i32) << 4;
                hi |= (((qh[l] >> (2 * c + 1)) & 1) as i32) << 4;
            }
            lv[64 * c + l] = lo;
            lv[64 * c + 32 + l] = hi;
        }
    }
    lv
}

/// The 256 Q6_K levels (0..=63, stored +32) in element order.
fn q6_levels(b: &[u8]) -> [i32; QK_K] {
    let mut q = [0i32; QK_K];
    for half in 0..2 {
        let (ql, qh) = (&b[64 * half..64 * half + 64], &b[128 + 32 * half..128 + 32 * half + 32]);
        for l in 0..32 {
            let e = 128 * half + l;
            q[e] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32;
            q[e + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32;
            q[e + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32;
            q[e + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32;
        }
    }
    q
}

/// The AVX-512 float order of a K-quant dot (see the module comment).
fn avx512_order_dot(t: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    let bytes = t.type_size();
    let mut acc = [0f32; 16];
    let mut acc_min = [0f32; 8];
    for (bw, ba) in w.chunks_exact(bytes).zip(a.chunks_exact(Q8_K_BYTES)).take(n / QK_K) {
        let da = f32::from_le_bytes([ba[0], ba[1], ba[2], ba[3]]);
        let qa: Vec<i32> = ba[4..4 + QK_K].iter().map(|&v| v as i8 as i32).collect();
        let bsum: [i32; 16] = std::array::from_fn(|g| i16::from_le_bytes([ba[260 + 2 * g], ba[261 + 2 * g]]) as i32);
        let prods =
            |lv: &[i32; QK_K], base: usize, lane: usize| -> i32 { (0..4).map(|e| lv[base + 4 * lane + e] * qa[base + 4 * lane + e]).sum() };
        let mut lanes = [0i32; 16];
        let (d, dmin);
        if t == GgmlType::Q6_K {
            let lv = q6_levels(bw);
            let sc = |g: usize| bw[192 + g] as i8 as i32;
            for (l, lane) in lanes.iter_mut().enumerate() {
                *lane = (0..4).map(|k| sc(4 * k + l / 4) * prods(&lv, 64 * k, l)).sum();
                if l < 8 {
                    *lane -= 32 * (sc(2 * l) * bsum[2 * l] + sc(2 * l + 1) * bsum[2 * l + 1]);
                }
            }
            (d, dmin) = (f16_at(bw, 208) * da, None);
        } else {
            let (qh, qs) = if t == GgmlType::Q5_K { (Some(&bw[16..48]), &bw[48..176]) } else { (None, &bw[16..144]) };
            let lv = kx_levels(qh, qs);
            for (l, lane) in lanes.iter_mut().enumerate() {
                *lane = (0..4).map(|c| scale_min_k4(2 * c + l / 8, &bw[4..16]).0 as i32 * prods(&lv, 64 * c, l)).sum();
            }
            let msum: [i32; 8] = std::array::from_fn(|j| scale_min_k4(j, &bw[4..16]).1 as i32 * (bsum[2 * j] + bsum[2 * j + 1]));
            (d, dmin) = (f16_at(bw, 0) * da, Some((f16_at(bw, 2) * da, msum)));
        }
        for (acc, lane) in acc.iter_mut().zip(lanes) {
            *acc = (lane as f32).mul_add(d, *acc);
        }
        if let Some((dmin, msum)) = dmin {
            for (acc, m) in acc_min.iter_mut().zip(msum) {
                *acc = (m as f32).mul_add(dmin, *acc);
            }
        }
    }
    let sum = hsum16(acc);
    if t == GgmlType::Q6_K {
        sum
    } else {
        sum - hsum8(acc_min)
    }
}

/// A random finite f16 over the whole exponent range (subnormals, zeros, 65504 included).
pub(super) fn any_finite_f16(r: &mut ChaCha8Rng) -> [u8; 2] {
    loop {
        let bits: u16 = r.gen();
        if (bits >> 10) & 0x1F != 0x1F {
            return bits.to_le_bytes();
        }
    }
}

/// Weight rows that stress the integer paths and the float rounding: random bytes in every
/// field with d/dmin of any finite f16 (kind 0), with small d (kind 1), every quant and scale
/// byte 0xFF (largest levels, scales and mins; Q6_K scales -1), every byte 0x7F/0x80 patterns.
pub(super) fn stress_weight_row(t: GgmlType, n: usize, kind: usize, r: &mut ChaCha8Rng) -> Vec<u8> {
    let mut row = vec![0u8; t.row_bytes(n).unwrap()];
    match kind {
        2 => row.fill(0xFF),
        3 => row.iter_mut().enumerate().for_each(|(i, b)| *b = if i % 3 == 0 { 0x80 } else { 0x7F }),
        _ => r.fill(&mut row[..]),
    }
    let scale_offsets: &[usize] = if t == GgmlType::Q6_K { &[208] } else { &[0, 2] };
    for block in row.chunks_exact_mut(t.type_size()) {
        for &o in scale_offsets {
            let v = match kind {
                1 => f32_to_f16((r.gen::<f32>() * 2.0 - 1.0) * 0.01).to_le_bytes(),
                _ => any_finite_f16(r),
            };
            block[o..o + 2].copy_from_slice(&v);
        }
    }
    row
}

/// Activation rows: quantised data (kind 0), and all quants at +-127 with matching group sums
/// and a random d (kind 1: the largest integer sums).
pub(super) fn stress_act_row(n: usize, kind: usize, r: &mut ChaCha8Rng) -> Vec<u8> {
    let mut x: Vec<f32> = (0..n).map(|_| r.gen::<f32>() * 2.0 - 1.0).collect();
    if kind == 1 {
        let sign = if r.gen::<bool>() { 1.0 } else { -1.0 };
        x.iter_mut().for_each(|v| *v = sign * (1.0 + 0.001 * v.abs()));
    }
    let mut q = vec![0u8; act_row_bytes(ActFormat::Q8_K, n)];
    quantize_act_row(ActFormat::Q8_K, &x, &mut q);
    q
}

const K_TYPES: [GgmlType; 3] = [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];

#[test]
fn the_order_model_is_close_to_the_scalar_reference() {
    // A sanity check of the model itself: the same sum up to float rounding.
    let mut r = ChaCha8Rng::seed_from_u64(21);
    for t in K_TYPES {
        for blocks in [1, 3, 8] {
            let n = QK_K * blocks;
            let w = stress_weight_row(t, n, 1, &mut r);
            let a = stress_act_row(n, 0, &mut r);
            let (got, want) = (avx512_order_dot(t, &w, &a, n), simd::dot_scalar(t, &w, &a, n));
            assert!((got - want).abs() <= 1e-4 * want.abs().max(1e-3), "{t} n={n}: model {got} vs scalar {want}");
        }
    }
}

pub(super) fn bits_equal(got: f32, want: f32) -> bool {
    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan())
}

#[test]
fn avx512_k_quant_dots_follow_the_order_model_bit_for_bit() {
    if !SimdLevel::Avx512Vnni.available() {
        eprintln!("no AVX-512 VNNI on this CPU: nothing to check");
        return;
    }
    let mut r = ChaCha8Rng::seed_from_u64(19);
    for t in K_TYPES {
        for blocks in [1usize, 2, 5, 16] {
            let n = QK_K * blocks;
            for wk in 0..4 {
                for ak in 0..2 {
                    for trial in 0..3 {
                        let w = stress_weight_row(t, n, wk, &mut r);
                        let a = stress_act_row(n, ak, &mut r);
                        let want = avx512_order_dot(t, &w, &a, n);
                        // Unaligned copies too.
                        let (mut w1, mut a1) = (vec![0u8; w.len() + 1], vec![0u8; a.len() + 3]);
                        w1[1..].copy_from_slice(&w);
                        a1[3..].copy_from_slice(&a);
                        for (wr, ar) in [(&w[..], &a[..]), (&w1[1..], &a1[3..])] {
                            let got = vec_dot_at(SimdLevel::Avx512Vnni, t, wr, ar, n).unwrap();
                            assert!(
                                bits_equal(got, want),
                                "{t} n={n} weights {wk} acts {ak} trial {trial}: kernel {got:e} vs model {want:e}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn avx512_k_quant_tiles_follow_the_order_model_bit_for_bit() {
    if !SimdLevel::Avx512Vnni.available() {
        eprintln!("no AVX-512 VNNI on this CPU: nothing to check");
        return;
    }
    let mut r = ChaCha8Rng::seed_from_u64(23);
    for t in K_TYPES {
        for blocks in [1usize, 3, 8] {
            let n = QK_K * blocks;
            let w: Vec<Vec<u8>> = (0..4).map(|i| stress_weight_row(t, n, i, &mut r)).collect();
            let a: Vec<Vec<u8>> = (0..8).map(|i| stress_act_row(n, i % 2, &mut r)).collect();
            let want: Vec<Vec<f32>> = w.iter().map(|w| a.iter().map(|a| avx512_order_dot(t, w, a, n)).collect()).collect();
            let check = |name: &str, got: &[f32], wi: usize, a0: usize| {
                for (j, g) in got.iter().enumerate() {
                    assert!(
                        bits_equal(*g, want[wi][a0 + j]),
                        "{t} n={n} {name} weight {wi} act {}: {g:e} vs model {:e}",
                        a0 + j,
                        want[wi][a0 + j]
                    );
                }
            };
            macro_rules! tile {
                ($r:literal, $t:literal) => {{
                    let ws: [&[u8]; $r] = std::array::from_fn(|i| &w[i][..]);
                    let as_: [&[u8]; $t] = std::array::from_fn(|j| &a[j][..]);
                    let out = simd::dot_tile_at::<$r, $t>(SimdLevel::Avx512Vnni, t, ws, as_, n);
                    for (i, o) in out.iter().enumerate() {
                        check(concat!($r, "x", $t), o, i, 0);
                    }
                }};
            }
            tile!(1, 1);
            tile!(1, 2);
            tile!(1, 3);
            tile!(1, 4);
            tile!(1, 8);
            tile!(2, 3);
            tile!(2, 4);
            tile!(2, 8);
            tile!(3, 2);
            tile!(4, 1);
            // The matmul's entry (the level in use), consecutive rows: the prefill tile width.
            if simd::level() == SimdLevel::Avx512Vnni {
                let rows: Vec<u8> = w.iter().flatten().copied().collect();
                let mut out8 = [[0f32; 8]; 4];
                let act8: [&[u8]; 8] = std::array::from_fn(|j| &a[j][..]);
                vec_dot_rows_tile(t, &rows, act8, n, &mut out8);
                let mut out1 = [0f32; 4];
                vec_dot_rows(t, &rows, &a[5], n, &mut out1);
                for i in 0..4 {
                    check("vec_dot_rows_tile 1x8", &out8[i], i, 0);
                    check("vec_dot_rows", &out1[i..i + 1], i, 5);
                }
            }
        }
    }
}
