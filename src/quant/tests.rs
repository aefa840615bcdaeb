//! Round trips and dot-product consistency for every supported format.

use super::*;
use proptest::prelude::*;

const TYPES: [GgmlType; 9] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

fn roundtrip(t: GgmlType, x: &[f32]) -> Vec<f32> {
    let mut q = vec![0u8; t.row_bytes(x.len()).unwrap()];
    quantize_row(t, x, &mut q).unwrap();
    let mut y = vec![0f32; x.len()];
    dequantize_row(t, &q, &mut y).unwrap();
    y
}

/// Relative RMS error bound each format really meets on N(0,1)-like data.
fn rms_bound(t: GgmlType) -> f64 {
    match t {
        GgmlType::F32 => 0.0,
        GgmlType::F16 | GgmlType::BF16 => 0.005,
        GgmlType::Q8_0 => 0.01,
        GgmlType::Q6_K => 0.05,
        GgmlType::Q5_K => 0.08,
        _ => 0.16,
    }
}

fn rel_rms(x: &[f32], y: &[f32]) -> f64 {
    let e: f64 = x.iter().zip(y).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
    let s: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
    (e / s.max(1e-30)).sqrt()
}

fn data(seed: u64, n: usize) -> Vec<f32> {
    use rand::{Rng, SeedableRng};
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| r.gen::<f32>() * 2.0 - 1.0 + if r.gen::<f32>() < 0.05 { 3.0 } else { 0.0 }).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn roundtrip_error_is_bounded(seed in any::<u64>(), blocks in 1usize..4, ti in 0usize..9) {
        let t = TYPES[ti];
        let x = data(seed, 256 * blocks);
        let y = roundtrip(t, &x);
        prop_assert!(rel_rms(&x, &y) <= rms_bound(t), "{t}: {}", rel_rms(&x, &y));
    }

    #[test]
    fn vec_dot_matches_dequantized_dot(seed in any::<u64>(), blocks in 1usize..4, ti in 0usize..9) {
        let t = TYPES[ti];
        let n = 256 * blocks;
        let w = data(seed, n);
        let x = data(seed ^ 0xABCD, n);
        let mut wq = vec![0u8; t.row_bytes(n).unwrap()];
        quantize_row(t, &w, &mut wq).unwrap();
        let fmt = act_format(t);
        let mut aq = vec![0u8; act_row_bytes(fmt, n)];
        quantize_act_row(fmt, &x, &mut aq);
        // The reference: dequantised weight · dequantised activation, in f64.
        let mut wd = vec![0f32; n];
        dequantize_row(t, &wq, &mut wd).unwrap();
        let xd: Vec<f32> = match fmt {
            ActFormat::F32 => x.clone(),
            ActFormat::Q8_0 => { let mut v = vec![0f32; n]; dequantize_row(GgmlType::Q8_0, &aq, &mut v).unwrap(); v }
            ActFormat::Q8_K => aq.chunks_exact(292).flat_map(|b| {
                let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                b[4..260].iter().map(move |&q| q as i8 as f32 * d).collect::<Vec<_>>()
            }).collect(),
        };
        let reference: f64 = wd.iter().zip(&xd).map(|(a, b)| *a as f64 * *b as f64).sum();
        let scale: f64 = wd.iter().zip(&xd).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
        let got = vec_dot(t, &wq, &aq, n) as f64;
        prop_assert!((got - reference).abs() <= 1e-4 * scale + 1e-6, "{t}: {got} vs {reference}");
    }
}

#[test]
fn q8_k_block_sums_and_scale() {
    let x = data(5, 256);
    let mut q = vec![0u8; act_row_bytes(ActFormat::Q8_K, 256)];
    quantize_act_row(ActFormat::Q8_K, &x, &mut q);
    for g in 0..16 {
        let s: i32 = q[4 + 16 * g..4 + 16 * g + 16].iter().map(|&v| v as i8 as i32).sum();
        assert_eq!(s, i16::from_le_bytes([q[260 + 2 * g], q[261 + 2 * g]]) as i32);
    }
    // The largest-magnitude value maps to -127 or 127 (ggml's iscale = -127/max).
    assert!(q[4..260].iter().any(|&v| (v as i8).abs() == 127));
}

#[test]
fn f16_bf16_exact_on_representable_values() {
    let x: Vec<f32> = (-64..64).map(|i| i as f32 * 0.25).collect();
    assert_eq!(roundtrip(GgmlType::F16, &x), x);
    assert_eq!(roundtrip(GgmlType::BF16, &x), x);
}

#[test]
fn unsupported_types_and_bad_lengths_are_errors() {
    let mut y = vec![0f32; 32];
    assert!(dequantize_row(GgmlType::Q5_0, &[0u8; 22], &mut y).unwrap_err().to_string().contains("unsupported"));
    assert!(dequantize_row(GgmlType::Q8_0, &[0u8; 33], &mut y).is_err());
    assert!(quantize_row(GgmlType::Q4_K, &[0f32; 32], &mut [0u8; 18]).is_err());
}

#[test]
fn simd_levels_agree_with_scalar_code() {
    // vec_dot dispatches to the best level; the scalar build of the same code must agree.
    for t in TYPES {
        let n = 512;
        let (w, x) = (data(1, n), data(2, n));
        let mut wq = vec![0u8; t.row_bytes(n).unwrap()];
        quantize_row(t, &w, &mut wq).unwrap();
        let fmt = act_format(t);
        let mut aq = vec![0u8; act_row_bytes(fmt, n)];
        quantize_act_row(fmt, &x, &mut aq);
        let best = vec_dot(t, &wq, &aq, n);
        let scalar = dot::dot_generic_for_tests(t, &wq, &aq, n);
        assert!((best - scalar).abs() <= 1e-5 * scalar.abs().max(1.0), "{t}: {best} vs {scalar}");
    }
}
