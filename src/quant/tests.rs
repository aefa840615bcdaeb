//! Round trips, error bounds, dot-product consistency (SIMD == scalar reference ==
//! dequantised dot) for every supported format.

use super::*;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const TYPES: [GgmlType; 11] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

const UNSUPPORTED: [GgmlType; 4] = [GgmlType::Q8_1, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q8_K];

fn quantize(t: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; t.row_bytes(x.len()).unwrap()];
    quantize_row(t, x, &mut q).unwrap();
    q
}

fn dequantize(t: GgmlType, q: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    dequantize_row(t, q, &mut y).unwrap();
    y
}

fn quantize_act(fmt: ActFormat, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; act_row_bytes(fmt, x.len())];
    quantize_act_row(fmt, x, &mut q);
    q
}

fn dequantize_act(fmt: ActFormat, q: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    dequantize_act_row(fmt, q, &mut y).unwrap();
    y
}

/// Roughly normal data with occasional outliers, as in real weights and activations.
fn data(seed: u64, n: usize) -> Vec<f32> {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let g: f32 = (0..4).map(|_| r.gen::<f32>() - 0.5).sum::<f32>() * 1.7;
            if r.gen::<f32>() < 0.01 {
                g * 8.0
            } else {
                g
            }
        })
        .collect()
}

fn rel_rms(x: &[f32], y: &[f32]) -> f64 {
    let e: f64 = x.iter().zip(y).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
    let s: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
    (e / s.max(1e-30)).sqrt()
}

/// Relative RMS round-trip error bound per format on `data` (normal with 1% 8x outliers):
/// the worst of 400 seeds (see `print_roundtrip_errors`) plus ~40%. For pure Gaussian data
/// the means are F16 2e-4, BF16 1.7e-3, Q8_0 5e-3, Q6_K 1.8e-2, Q5_K 3.6e-2, Q4_K 7.1e-2,
/// Q4_1 7.8e-2, Q4_0 8.5e-2.
fn rms_bound(t: GgmlType) -> f64 {
    match t {
        GgmlType::F32 => 0.0,
        GgmlType::F16 => 4e-4,
        GgmlType::BF16 => 3.5e-3,
        GgmlType::Q8_0 => 0.016,
        GgmlType::Q6_K => 0.045,
        GgmlType::Q5_K => 0.077,
        GgmlType::Q4_K => 0.155,
        GgmlType::Q4_1 => 0.165,
        GgmlType::Q4_0 => 0.235,
        GgmlType::Q5_1 => 0.085,
        GgmlType::Q5_0 => 0.12,
        other => unreachable!("{other}"),
    }
}

fn f16_rounding(v: f32) -> f32 {
    (v - f16_to_f32(f32_to_f16(v))).abs()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn roundtrip_relative_rms_error_is_bounded(seed in any::<u64>(), blocks in 1usize..5, ti in 0usize..TYPES.len()) {
        let t = TYPES[ti];
        let x = data(seed, 256 * blocks);
        let y = dequantize(t, &quantize(t, &x), x.len());
        prop_assert!(rel_rms(&x, &y) <= rms_bound(t), "{t}: {}", rel_rms(&x, &y));
    }

    /// Q8_0: every element within d/2 of its input, plus what rounding d to f16 costs.
    #[test]
    fn q8_0_error_is_within_half_a_step(seed in any::<u64>(), scale in 1e-3f32..1e3) {
        let x: Vec<f32> = data(seed, 256).iter().map(|v| v * scale).collect();
        let y = dequantize(GgmlType::Q8_0, &quantize(GgmlType::Q8_0, &x), x.len());
        for (xb, yb) in x.chunks(32).zip(y.chunks(32)) {
            let d = xb.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
            let bound = d / 2.0 + 127.0 * f16_rounding(d) + 1e-6 * d;
            for (a, b) in xb.iter().zip(yb) {
                prop_assert!((a - b).abs() <= bound, "{a} -> {b}, d {d}");
            }
        }
    }

    /// Q4_1: within d/2 (+ f16 rounding of d and m); Q4_0: within one step |d| (the level +8
    /// is clamped to 7 on the side opposite the largest magnitude).
    #[test]
    fn q4_errors_are_within_a_step(seed in any::<u64>(), scale in 1e-3f32..1e3) {
        let x: Vec<f32> = data(seed, 256).iter().map(|v| v * scale).collect();
        let y1 = dequantize(GgmlType::Q4_1, &quantize(GgmlType::Q4_1, &x), x.len());
        let y0 = dequantize(GgmlType::Q4_0, &quantize(GgmlType::Q4_0, &x), x.len());
        for ((xb, y1b), y0b) in x.chunks(32).zip(y1.chunks(32)).zip(y0.chunks(32)) {
            let min = xb.iter().copied().fold(f32::MAX, f32::min);
            let max = xb.iter().copied().fold(f32::MIN, f32::max);
            let d1 = (max - min) / 15.0;
            let b1 = d1 / 2.0 + 15.0 * f16_rounding(d1) + f16_rounding(min) + 1e-5 * (max - min);
            let d0 = max.abs().max(min.abs()) / 8.0;
            let b0 = d0 + 8.0 * f16_rounding(d0) + 1e-5 * d0;
            for ((a, b1v), b0v) in xb.iter().zip(y1b).zip(y0b) {
                prop_assert!((a - b1v).abs() <= b1, "q4_1 {a} -> {b1v}");
                prop_assert!((a - b0v).abs() <= b0, "q4_0 {a} -> {b0v}");
            }
        }
    }

    /// vec_dot equals the f64 dot of the dequantised rows (weights via dequantize_row,
    /// activations via dequantize_act_row), at every level this CPU has.
    #[test]
    fn vec_dot_matches_dequantized_dot(seed in any::<u64>(), blocks in 1usize..5, ti in 0usize..TYPES.len()) {
        if let Err(e) = check_vec_dot_against_dequantized(seed, blocks, TYPES[ti]) {
            prop_assert!(false, "{}", e);
        }
    }

    #[test]
    fn small_round_half_even_equals_round_ties_even(y in -4_194_303.0f32..4_194_303.0, half in -300i32..300) {
        use super::legacy::round_half_even_small;
        prop_assert_eq!(round_half_even_small(y), y.round_ties_even());
        // Exact ties (k + 0.5) and the activation range, where the rounding direction matters.
        let tie = half as f32 + 0.5;
        prop_assert_eq!(round_half_even_small(tie), tie.round_ties_even());
        prop_assert_eq!(round_half_even_small(tie / 2.0), (tie / 2.0).round_ties_even());
    }

    #[test]
    fn f16_and_bf16_round_trip_representable_values_exactly(bits in any::<u16>()) {
        let h = f16_to_f32(bits);
        if !h.is_nan() {
            prop_assert_eq!(f32_to_f16(h), bits);
        }
        let b = bf16_to_f32(bits);
        if !b.is_nan() {
            prop_assert_eq!(f32_to_bf16(b), bits);
        }
    }
}

/// Random bytes in every quant field (all nibble/bit patterns, Q8_0 weights of -128, Q6_K
/// scales of -128) with finite f16 scales of either sign at the format's scale offsets.
fn random_weight_row(t: GgmlType, n: usize, r: &mut ChaCha8Rng) -> Vec<u8> {
    let mut row = vec![0u8; t.row_bytes(n).unwrap()];
    match t {
        GgmlType::F32 => {
            for c in row.chunks_exact_mut(4) {
                c.copy_from_slice(&(r.gen::<f32>() * 2.0 - 1.0).to_le_bytes());
            }
            return row;
        }
        GgmlType::F16 | GgmlType::BF16 => {
            for c in row.chunks_exact_mut(2) {
                let v = r.gen::<f32>() * 2.0 - 1.0;
                let bits = if t == GgmlType::F16 { f32_to_f16(v) } else { f32_to_bf16(v) };
                c.copy_from_slice(&bits.to_le_bytes());
            }
            return row;
        }
        _ => r.fill(&mut row[..]),
    }
    let scale_offsets: &[usize] = match t {
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        _ => unreachable!(),
    };
    for block in row.chunks_exact_mut(t.type_size()) {
        for &o in scale_offsets {
            let v = (r.gen::<f32>() * 2.0 - 1.0) * 0.01;
            block[o..o + 2].copy_from_slice(&f32_to_f16(v).to_le_bytes());
        }
    }
    row
}

#[test]
fn simd_kernels_match_the_scalar_reference_on_random_blocks() {
    let mut r = ChaCha8Rng::seed_from_u64(7);
    let levels: Vec<SimdLevel> = SimdLevel::ALL.into_iter().filter(|l| *l != SimdLevel::Scalar && l.available()).collect();
    if levels.is_empty() {
        eprintln!("no SIMD level on this CPU; only the scalar code runs");
    }
    for t in TYPES {
        let bs = t.block_size().max(act_format(t).block_size());
        // Many lengths, odd block counts included (the AVX-512 32-block kernels pair blocks).
        for blocks in [1usize, 2, 3, 5, 8, 13, 16, 31, 64] {
            let n = bs * blocks + if bs == 1 { 7 } else { 0 };
            for trial in 0..4 {
                let w = random_weight_row(t, n, &mut r);
                let a = quantize_act(act_format(t), &data(r.gen(), n));
                // Shift both rows by one byte so neither is aligned.
                let (mut w1, mut a1) = (vec![0u8; w.len() + 1], vec![0u8; a.len() + 1]);
                w1[1..].copy_from_slice(&w);
                a1[1..].copy_from_slice(&a);
                let reference = vec_dot_at(SimdLevel::Scalar, t, &w, &a, n).unwrap();
                let wd = dequantize(t, &w, n);
                let ad = dequantize_act(act_format(t), &a, n);
                let magnitude: f64 = wd.iter().zip(&ad).map(|(x, y)| (*x as f64 * *y as f64).abs()).sum();
                for &level in &levels {
                    let got = vec_dot_at(level, t, &w1[1..], &a1[1..], n).unwrap();
                    assert!(
                        ((got - reference) as f64).abs() <= 1e-5 * magnitude + 1e-30,
                        "{t} {level:?} n={n} trial {trial}: {got} vs scalar {reference} (magnitude {magnitude})"
                    );
                }
            }
        }
    }
}

#[test]
fn vec_dot_uses_the_detected_level() {
    let t = GgmlType::Q4_K;
    let wq = quantize(t, &data(1, 512));
    let aq = quantize_act(ActFormat::Q8_K, &data(2, 512));
    let level = SimdLevel::ALL.into_iter().find(|l| l.name() == simd_level()).unwrap();
    assert!(level.available());
    assert_eq!(vec_dot(t, &wq, &aq, 512), vec_dot_at(level, t, &wq, &aq, 512).unwrap());
}

#[test]
fn nearest_int_rounds_half_to_even_like_ggml() {
    use super::k_quants::nearest_int;
    assert_eq!([nearest_int(2.5), nearest_int(3.5), nearest_int(-2.5), nearest_int(-0.5)], [2, 4, -2, 0]);
    assert_eq!([nearest_int(2.4999), nearest_int(-7.6), nearest_int(126.9)], [2, -8, 127]);
}

#[test]
fn q8_k_activation_block_layout() {
    let x = data(5, 512);
    let q = quantize_act(ActFormat::Q8_K, &x);
    assert_eq!(q.len(), 2 * 292);
    for (b, xb) in q.chunks(292).zip(x.chunks(256)) {
        for g in 0..16 {
            let s: i32 = b[4 + 16 * g..4 + 16 * g + 16].iter().map(|&v| v as i8 as i32).sum();
            assert_eq!(s, i16::from_le_bytes([b[260 + 2 * g], b[261 + 2 * g]]) as i32);
        }
        // ggml's iscale = -127/max: the largest magnitude maps to -127, d = -max/127.
        let (i, max) = xb.iter().enumerate().fold((0, 0f32), |(bi, bm), (i, &v)| if v.abs() > bm.abs() { (i, v) } else { (bi, bm) });
        assert_eq!(b[4 + i] as i8, -127);
        let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        assert!((d + max / 127.0).abs() <= 1e-6 * max.abs(), "{d} vs {}", -max / 127.0);
        assert!(b[4..260].iter().all(|&v| v as i8 != -128));
    }
    // An all-zero block is all zeros (scale, quants and sums).
    assert!(quantize_act(ActFormat::Q8_K, &[0.0; 256]).iter().all(|&v| v == 0));
}

#[test]
fn q8_0_activation_matches_the_q8_0_weight_format() {
    // The activation quantiser is ggml's x86 one (127/amax, ties to even), the weight one its
    // _ref (1/d, ties away): same bytes except where x*id lands within an ulp of a half.
    let x = data(9, 1024);
    assert_eq!(quantize_act(ActFormat::Q8_0, &x), quantize(GgmlType::Q8_0, &x));
    assert_eq!(quantize_act(ActFormat::F32, &x), quantize(GgmlType::F32, &x));
}

#[test]
fn q8_1_activation_is_q8_0_plus_an_f16_sum() {
    let x = data(10, 1024);
    let a = quantize_act(ActFormat::Q8_1, &x);
    let b = quantize_act(ActFormat::Q8_0, &x);
    for (a, b) in a.chunks_exact(36).zip(b.chunks_exact(34)) {
        assert_eq!(a[..2], b[..2], "d");
        assert_eq!(a[4..], b[2..], "quants");
        let amax = 127.0 * f16_to_f32(u16::from_le_bytes([a[0], a[1]]));
        let d = x.iter().fold(0f32, |m, v| m.max(v.abs())); // loose: d of the whole row bounds it
        let sum: i32 = a[4..].iter().map(|&q| q as i8 as i32).sum();
        let s = f16_to_f32(u16::from_le_bytes([a[2], a[3]]));
        // s = f16(d32 * sum) where d32 = amax/127 before its own f16 rounding.
        assert!(amax <= d * 1.001);
        let exact = amax / 127.0 * sum as f32;
        assert!((s - exact).abs() <= exact.abs() * 1e-3 + 1e-6, "s {s} vs {exact}");
    }
    // Ties go to even (ggml's _mm256_round_ps), not away from zero.
    let mut x = vec![0f32; 32];
    x[0] = 127.0;
    x[1] = 2.5;
    x[2] = -3.5;
    let q = quantize_act(ActFormat::Q8_1, &x);
    assert_eq!((q[5] as i8, q[6] as i8), (2, -4));
}

#[test]
fn act_formats_and_sizes() {
    use GgmlType::*;
    for (t, fmt) in [
        (F32, ActFormat::F32),
        (F16, ActFormat::F32),
        (BF16, ActFormat::F32),
        (Q8_0, ActFormat::Q8_0),
        (Q4_0, ActFormat::Q8_0),
        (Q4_1, ActFormat::Q8_1),
        (Q4_K, ActFormat::Q8_K),
        (Q5_K, ActFormat::Q8_K),
        (Q6_K, ActFormat::Q8_K),
    ] {
        assert_eq!(act_format(t), fmt, "{t}");
    }
    assert_eq!(act_row_bytes(ActFormat::F32, 4096), 16384);
    assert_eq!(act_row_bytes(ActFormat::Q8_0, 4096), 128 * 34);
    assert_eq!(act_row_bytes(ActFormat::Q8_1, 4096), 128 * 36);
    assert_eq!(act_row_bytes(ActFormat::Q8_K, 4096), 16 * 292);
}

#[test]
fn bf16_rounds_like_ggml() {
    // 1 + 2^-8 is halfway between 1 (0x3F80) and 1 + 2^-7 (0x3F81): ties go to even.
    assert_eq!(f32_to_bf16(1.0 + 1.0 / 256.0), 0x3F80);
    assert_eq!(f32_to_bf16(1.0 + 3.0 / 256.0), 0x3F82);
    assert_eq!(f32_to_bf16(1.0 + 1.0 / 256.0 + 1.0 / 65536.0), 0x3F81);
    // NaNs stay NaN and become quiet: 0x7F80_0001 (signalling) -> 0x7FC0.
    assert_eq!(f32_to_bf16(f32::from_bits(0x7F80_0001)), 0x7FC0);
    assert_eq!(f32_to_bf16(f32::INFINITY), 0x7F80);
}

#[test]
fn constant_and_zero_blocks_survive_every_format() {
    for t in TYPES {
        let zeros = dequantize(t, &quantize(t, &[0.0; 512]), 512);
        assert!(zeros.iter().all(|&v| v == 0.0), "{t}: zeros");
        let ones = dequantize(t, &quantize(t, &[1.5; 512]), 512);
        assert!(ones.iter().all(|&v| (v - 1.5).abs() <= 0.02), "{t}: constant 1.5 -> {:?}", &ones[..4]);
    }
}

#[test]
fn quantize_row_is_deterministic() {
    let x = data(11, 1024);
    for t in TYPES {
        assert_eq!(quantize(t, &x), quantize(t, &x), "{t}");
    }
}

#[test]
fn unsupported_types_and_bad_lengths_are_clear_errors() {
    let mut y = vec![0f32; 256];
    for t in UNSUPPORTED {
        assert!(!supports(t));
        let bytes = vec![0u8; t.row_bytes(256).unwrap()];
        let e = dequantize_row(t, &bytes, &mut y).unwrap_err().to_string();
        assert!(e.contains("unsupported tensor type"), "{t}: {e}");
        let e = quantize_row(t, &[0.0; 256], &mut vec![0u8; bytes.len()]).unwrap_err().to_string();
        assert!(e.contains("unsupported tensor type"), "{t}: {e}");
    }
    for t in TYPES {
        assert!(supports(t));
    }
    let e = dequantize_row(GgmlType::Q8_0, &[0u8; 33], &mut y[..32]).unwrap_err().to_string();
    assert!(e.contains("needs 34 bytes"), "{e}");
    let e = quantize_row(GgmlType::Q4_K, &[0f32; 32], &mut [0u8; 18]).unwrap_err().to_string();
    assert!(e.contains("multiple of the block size 256"), "{e}");
    assert!(dequantize_act_row(ActFormat::Q8_K, &[0u8; 291], &mut y).is_err());
}

#[test]
#[should_panic(expected = "unsupported tensor type q2_K")]
fn vec_dot_on_an_unsupported_type_panics_with_a_clear_message() {
    vec_dot(GgmlType::Q2_K, &[0u8; 84], &[0u8; 292], 256);
}

#[test]
#[should_panic(expected = "weight row 17 bytes")]
fn vec_dot_rejects_short_rows() {
    vec_dot(GgmlType::Q4_0, &[0u8; 17], &[0u8; 34], 32);
}

/// Hand-built blocks decode to the values the ggml layouts define.
#[test]
fn hand_built_q5_blocks_decode_as_ggml_defines() {
    // Q5_0: d = 0.5, qh bit 0 set and bit 16 clear, nibble byte 0x2F: element 0 = (15 + 16 - 16)
    // * 0.5, element 16 = (2 - 16) * 0.5; element 1 (nibble 0, no high bit) = -16 * 0.5.
    let mut b = vec![0u8; 22];
    b[..2].copy_from_slice(&f32_to_f16(0.5).to_le_bytes());
    b[2..6].copy_from_slice(&1u32.to_le_bytes());
    b[6] = 0x2F;
    let y = dequantize(GgmlType::Q5_0, &b, 32);
    assert_eq!((y[0], y[16], y[1]), (7.5, -7.0, -8.0));
    // Q5_1: d = 0.25, m = 1, qh bit 17 set, nibble byte 1 = 0x30: element 17 = (3 + 16) * 0.25 + 1.
    let mut b = vec![0u8; 24];
    b[..2].copy_from_slice(&f32_to_f16(0.25).to_le_bytes());
    b[2..4].copy_from_slice(&f32_to_f16(1.0).to_le_bytes());
    b[4..8].copy_from_slice(&(1u32 << 17).to_le_bytes());
    b[9] = 0x30;
    let y = dequantize(GgmlType::Q5_1, &b, 32);
    assert_eq!((y[17], y[1], y[0]), (5.75, 1.0, 1.0));
}

#[test]
fn hand_built_blocks_decode_as_ggml_defines() {
    // Q4_0: d = 0.5, nibble byte 0x2F -> element 0 = (15-8)*0.5, element 16 = (2-8)*0.5.
    let mut b = vec![0u8; 18];
    b[..2].copy_from_slice(&f32_to_f16(0.5).to_le_bytes());
    b[2] = 0x2F;
    let y = dequantize(GgmlType::Q4_0, &b, 32);
    assert_eq!((y[0], y[16], y[1]), (3.5, -3.0, -4.0));

    // Q4_K: d = 1, dmin = 0.25; sub-block 5 has scale 0b100011 = 35 and min 0b010110 = 22
    // (low 4 bits in byte 9, top 2 bits in bytes 1 and 5 of the scale field).
    let mut k = vec![0u8; 144];
    k[..2].copy_from_slice(&f32_to_f16(1.0).to_le_bytes());
    k[2..4].copy_from_slice(&f32_to_f16(0.25).to_le_bytes());
    let sc = &mut k[4..16];
    sc[9] = 0x3 | (0x6 << 4); // scale low bits 0011, min low bits 0110
    sc[1] = 0b10 << 6; // scale high bits 10
    sc[5] = 0b01 << 6; // min high bits 01
                       // Sub-block 5 = high nibbles of chunk 2: element 64*2 + 32 + l <- qs[32*2 + l] >> 4.
    k[16 + 64 + 3] = 0x90;
    let y = dequantize(GgmlType::Q4_K, &k, 256);
    assert_eq!(y[160 + 3], 35.0 * 9.0 - 0.25 * 22.0);
    assert_eq!(y[160], -0.25 * 22.0);

    // Q6_K: d = 2, scale of group 9 = -3; element 128 + 16 + 1 (group 9, q1 of the second half)
    // has low nibble ql[64 + 17] & 0xF = 5 and high bits qh[32 + 17] & 3 = 2 -> level 37 - 32 = 5.
    let mut q6 = vec![0u8; 210];
    q6[208..210].copy_from_slice(&f32_to_f16(2.0).to_le_bytes());
    q6[192 + 9] = (-3i8) as u8;
    q6[64 + 17] = 0x05;
    q6[128 + 32 + 17] = 0x02;
    let y = dequantize(GgmlType::Q6_K, &q6, 256);
    assert_eq!(y[145], 2.0 * -3.0 * 5.0);
}

/// Prints the worst relative RMS round-trip error per format over many seeds (used to pick
/// `rms_bound`): `cargo test --lib quant::tests::print_roundtrip_errors -- --ignored --nocapture`.
#[test]
#[ignore]
fn print_roundtrip_errors() {
    for t in TYPES {
        let worst = (0..400u64).map(|s| {
            let x = data(s, 768);
            rel_rms(&x, &dequantize(t, &quantize(t, &x), x.len()))
        });
        println!("{t}: worst relative RMS {:.5}", worst.fold(0f64, f64::max));
    }
}

/// Asserts that every entry of an R x T tile is bit for bit the single dot of its row and
/// activation at `level`.
fn assert_tile_is_single_dots<const R: usize, const T: usize>(level: SimdLevel, t: GgmlType, w: &[&[u8]], a: &[&[u8]], n: usize) -> bool {
    let Some(tile) = super::vec_dot_tile_at::<R, T>(level, t, std::array::from_fn(|r| w[r]), std::array::from_fn(|j| a[j]), n) else {
        return false;
    };
    for r in 0..R {
        for j in 0..T {
            let want = vec_dot_at(level, t, w[r], a[j], n).unwrap();
            assert_eq!(tile[r][j].to_bits(), want.to_bits(), "{t} {level:?} n={n} {R}x{T} tile [{r}][{j}]: {} vs {want}", tile[r][j]);
        }
    }
    true
}

#[test]
fn dot_tiles_equal_single_dots_bit_for_bit() {
    // The GEMM's tile kernels (1 x T in prefill and batched decode, 4 x 1 in decode) must give
    // exactly what single vec_dot calls give at every SIMD level (greedy parity with llama.cpp
    // and bit-exact bench hashes depend on it). Odd block counts cover the AVX-512 kernels'
    // unpaired last block; unaligned rows come from the 1-byte shifted copies.
    let mut r = ChaCha8Rng::seed_from_u64(11);
    let mut tiled = std::collections::BTreeSet::new();
    for t in TYPES {
        for level in SimdLevel::ALL.into_iter().filter(|l| *l != SimdLevel::Scalar && l.available()) {
            for blocks in [1usize, 2, 3, 7, 18, 48] {
                let n = t.block_size().max(act_format(t).block_size()) * blocks;
                let shifted = |row: Vec<u8>| {
                    let mut v = vec![0u8; row.len() + 1];
                    v[1..].copy_from_slice(&row);
                    v
                };
                let w1: Vec<Vec<u8>> = (0..4).map(|_| shifted(random_weight_row(t, n, &mut r))).collect();
                let a1: Vec<Vec<u8>> = (0..4).map(|_| shifted(quantize_act(act_format(t), &data(r.gen(), n)))).collect();
                let w_owned: Vec<Vec<u8>> = w1.iter().map(|v| v[1..].to_vec()).collect();
                let a_owned: Vec<Vec<u8>> = a1.iter().map(|v| v[1..].to_vec()).collect();
                let (w, a): (Vec<&[u8]>, Vec<&[u8]>) = (w_owned.iter().map(|v| &v[..]).collect(), a_owned.iter().map(|v| &v[..]).collect());
                if !assert_tile_is_single_dots::<1, 4>(level, t, &w, &a, n) {
                    continue;
                }
                assert_tile_is_single_dots::<4, 1>(level, t, &w, &a, n);
                assert_tile_is_single_dots::<1, 3>(level, t, &w, &a, n);
                assert_tile_is_single_dots::<1, 2>(level, t, &w, &a, n);
                assert_tile_is_single_dots::<2, 3>(level, t, &w, &a, n);
                // Rows at odd addresses.
                let (w_odd, a_odd): (Vec<&[u8]>, Vec<&[u8]>) = (w1.iter().map(|v| &v[1..]).collect(), a1.iter().map(|v| &v[1..]).collect());
                assert_tile_is_single_dots::<3, 2>(level, t, &w_odd, &a_odd, n);
                // The 1 x 8 prefill tile (and 2 x 8), aligned and odd rows mixed.
                let a8: Vec<&[u8]> = (0..8).map(|j| if j % 2 == 0 { a[j / 2] } else { a_odd[3 - j / 2] }).collect();
                assert_tile_is_single_dots::<1, 8>(level, t, &w, &a8, n);
                assert_tile_is_single_dots::<2, 8>(level, t, &w_odd, &a8, n);
                // The prefill form with block-major f32 scales, on rows 1..5 of a 6-row matrix.
                if t == GgmlType::Q4_1 && level == simd::level() {
                    let matrix: Vec<u8> = [3, 0, 1, 2, 3, 1].iter().flat_map(|&i| a[i].iter().copied()).collect();
                    let scales = super::Q8_1Scales::new(&matrix, 6, n);
                    let scaled = super::vec_dot_q4_1_x4(w[0], [a[0], a[1], a[2], a[3]], &scales, 1, n);
                    for i in 0..4 {
                        let want = vec_dot_at(level, t, w[0], a[i], n).unwrap();
                        assert_eq!(scaled[i].to_bits(), want.to_bits(), "{t} n={n} scaled 1x4 act {i}: {} vs {want}", scaled[i]);
                    }
                    // The batched-decode form: 9 consecutive weight rows (two 4-row tiles and
                    // one left over) against 4 and 8 rows of an 11-row matrix, from row 2.
                    let order = [3, 1, 0, 2, 2, 0, 1, 3, 1, 2, 0];
                    let matrix: Vec<u8> = order.iter().flat_map(|&i| a[i].iter().copied()).collect();
                    let scales = super::Q8_1Scales::new(&matrix, order.len(), n);
                    let w_order = [0, 1, 2, 3, 3, 2, 1, 0, 2];
                    let w_rows: Vec<u8> = w_order.iter().flat_map(|&i| w[i].iter().copied()).collect();
                    let act8: [&[u8]; 8] = std::array::from_fn(|j| a[order[2 + j]]);
                    let mut out8 = [[0f32; 8]; 9];
                    super::vec_dot_q4_1_rows::<2, 8>(&w_rows, act8, &scales, 2, n, &mut out8);
                    let mut out4 = [[0f32; 4]; 9];
                    super::vec_dot_q4_1_rows::<1, 4>(&w_rows, [act8[0], act8[1], act8[2], act8[3]], &scales, 2, n, &mut out4);
                    for (r, &wi) in w_order.iter().enumerate() {
                        for j in 0..8 {
                            let want = vec_dot_at(level, t, w[wi], act8[j], n).unwrap();
                            assert_eq!(out8[r][j].to_bits(), want.to_bits(), "{t} n={n} q4_1 rows 8: weight row {r} act {j}");
                            if j < 4 {
                                assert_eq!(out4[r][j].to_bits(), want.to_bits(), "{t} n={n} q4_1 rows 4: weight row {r} act {j}");
                            }
                        }
                    }
                    // The eights form (AVX-512): the same 9 weight rows against both groups of
                    // eight of a 19-row matrix (the last 3 rows are in no group).
                    if super::has_q4_1_eights_tile() {
                        let order = [3, 1, 0, 2, 2, 0, 1, 3, 1, 2, 0, 3, 3, 0, 0, 1, 2, 1, 3];
                        let matrix: Vec<u8> = order.iter().flat_map(|&i| a[i].iter().copied()).collect();
                        let eights = super::Q8_1Eights::new(&matrix, order.len(), n);
                        assert_eq!(eights.rows(), 16);
                        for first in [0, 8] {
                            let mut out = [[0f32; 8]; 9];
                            super::vec_dot_rows_q4_1_eights(&w_rows, &eights, first, &mut out);
                            for (r, &wi) in w_order.iter().enumerate() {
                                for j in 0..8 {
                                    let want = vec_dot_at(level, t, w[wi], a[order[first + j]], n).unwrap();
                                    assert_eq!(
                                        out[r][j].to_bits(),
                                        want.to_bits(),
                                        "{t} n={n} q4_1 eights {first}: weight row {r} act {j}"
                                    );
                                }
                            }
                        }
                        tiled.insert("Q4_1 eights".to_string());
                    }
                }
                // The Q8_0 prefill form (offset activations) through its matmul entry: 5 weight
                // rows (odd addresses) against activation rows 1..9 and 0..4 of a 9-row matrix.
                if t == GgmlType::Q8_0 && level == SimdLevel::Avx512Vnni && super::has_q8_0_offset_tile() {
                    let order = [2, 0, 1, 3, 3, 2, 1, 0, 2];
                    let matrix: Vec<u8> = order.iter().flat_map(|&i| a[i].iter().copied()).collect();
                    let off = super::Q8_0Offset::new(&matrix, order.len(), n);
                    let rows: Vec<u8> = [0, 1, 2, 3, 1].iter().flat_map(|&i| w_odd[i].iter().copied()).collect();
                    let (mut out8, mut out4) = ([[0f32; 8]; 5], [[0f32; 4]; 5]);
                    super::vec_dot_rows_q8_0_offset(&rows, &matrix, &off, 1, &mut out8);
                    super::vec_dot_rows_q8_0_offset(&rows, &matrix, &off, 0, &mut out4);
                    for (r, &i) in [0, 1, 2, 3, 1].iter().enumerate() {
                        for j in 0..8 {
                            let want = vec_dot(t, w[i], a[order[1 + j]], n);
                            assert_eq!(out8[r][j].to_bits(), want.to_bits(), "Q8_0 offset n={n} row {r} act {}", 1 + j);
                        }
                        for j in 0..4 {
                            let want = vec_dot(t, w[i], a[order[j]], n);
                            assert_eq!(out4[r][j].to_bits(), want.to_bits(), "Q8_0 offset n={n} row {r} act {j}");
                        }
                    }
                    tiled.insert("Q8_0 offset".to_string());
                }
                // The matmul's entry: consecutive weight rows (an odd count) against 3 rows.
                if level == simd::level() {
                    let rows: Vec<u8> = [0, 1, 2, 3, 1].iter().flat_map(|&i| w[i].iter().copied()).collect();
                    let mut out = [[0f32; 3]; 5];
                    super::vec_dot_rows_tile(t, &rows, [&a1[0][1..], &a1[1][1..], &a1[2][1..]], n, &mut out);
                    for (o, &i) in out.iter().zip(&[0, 1, 2, 3, 1]) {
                        for j in 0..3 {
                            let want = vec_dot(t, w[i], a[j], n);
                            assert_eq!(o[j].to_bits(), want.to_bits(), "{t} n={n} vec_dot_rows_tile row {i} act {j}");
                        }
                    }
                }
                tiled.insert(format!("{t}@{}", level.name()));
            }
        }
    }
    eprintln!("tile kernels checked: {tiled:?}");
    if SimdLevel::Avx2.available() {
        for t in
            [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K]
        {
            assert!(tiled.contains(&format!("{t}@avx2")), "an AVX2 CPU has the {t} tile kernel");
        }
    }
    if SimdLevel::Avx512Vnni.available() {
        for t in
            [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K]
        {
            assert!(tiled.contains(&format!("{t}@avx512vnni")), "an AVX-512 VNNI CPU has the {t} tile kernel");
        }
        if simd::level() == SimdLevel::Avx512Vnni {
            assert!(tiled.contains("Q8_0 offset"), "the Q8_0 offset tile was checked");
            assert!(tiled.contains("Q4_1 eights"), "the Q4_1 eights tile was checked");
        }
    }
}

/// Every SIMD level's `vec_dot` of `data(seed)` weights and `data(seed ^ 0xABCD)` activations
/// equals the f64 dot of their dequantised values within the format's rounding.
fn check_vec_dot_against_dequantized(seed: u64, blocks: usize, t: GgmlType) -> Result<(), String> {
    let n = 256 * blocks;
    let wq = quantize(t, &data(seed, n));
    let fmt = act_format(t);
    let aq = quantize_act(fmt, &data(seed ^ 0xABCD, n));
    let (wd, ad) = (dequantize(t, &wq, n), dequantize_act(fmt, &aq, n));
    let reference: f64 = wd.iter().zip(&ad).map(|(a, b)| *a as f64 * *b as f64).sum();
    let magnitude: f64 = wd.iter().zip(&ad).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
    // Q8_1 (Q4_1's and Q5_1's activations) carries s = d*sum(q) for the m*s terms, as ggml's
    // quantize_row_q8_1 does: d is the f32 scale and the product is rounded to f16, while the
    // dequantised reference uses d rounded to f16. Each rounding is at most half an f16 ulp
    // (2^-11 relative), so allow 2^-10 of each |m*s|.
    let s_rounding: f64 = if fmt == ActFormat::Q8_1 {
        wq.chunks_exact(t.type_size())
            .zip(aq.chunks_exact(36))
            .map(|(w, a)| {
                let m = f16_to_f32(u16::from_le_bytes([w[2], w[3]])) as f64;
                let s = f16_to_f32(u16::from_le_bytes([a[2], a[3]])) as f64;
                (m * s).abs() / 1024.0
            })
            .sum()
    } else {
        0.0
    };
    for level in SimdLevel::ALL.into_iter().filter(|l| l.available()) {
        let got = vec_dot_at(level, t, &wq, &aq, n).ok_or(format!("{t} {level:?}: no dot product"))? as f64;
        if (got - reference).abs() > 1e-5 * magnitude + s_rounding + 1e-30 {
            return Err(format!("{t} {level:?}: {got} vs {reference}"));
        }
    }
    Ok(())
}

/// The case proptest found (CI, 2026-12-06): in block 5 of this row m = -16.25 and s = 11.0156
/// where the f16-d dequantised activations sum to 11.0074, a 0.133 difference in m*s from the
/// two f16 roundings together, which the earlier half-ulp allowance (0.087) did not cover.
#[test]
fn vec_dot_q4_1_allows_both_roundings_of_the_q8_1_sum() {
    check_vec_dot_against_dequantized(11505691874117394782, 1, GgmlType::Q4_1).unwrap();
}
