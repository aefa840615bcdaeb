//! The repacked Q8_0 kernels (`q8_0_x8`) against their float order, written out on the
//! row-major rows (`q8_0_x8::dot_model`): the scalar group code and the AVX-512 kernel, every
//! tile width the matmul uses, bit for bit, on random and stress rows (any finite f16 scales,
//! zero scales, weights and activations all at -128 or 127, odd block counts).

use super::float::f32_to_f16;
use super::k_quant_order_tests::{any_finite_f16, bits_equal};
use super::legacy::{Q8_0_BYTES, QK};
use super::q8_0_x8::{self, GROUP_ROWS};
use super::{act_row_bytes, quantize_act_row, simd, ActFormat, GgmlType};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A Q8_0 weight row: kind 0 random quants and scales of any finite f16; 1 random quants, small
/// scales; 2 all -128; 3 all 127; 4 -128/127 alternating; 5 random quants, zero scales.
fn weight_row(n: usize, kind: usize, r: &mut ChaCha8Rng) -> Vec<u8> {
    let mut row = vec![0u8; n / QK * Q8_0_BYTES];
    for blk in row.chunks_exact_mut(Q8_0_BYTES) {
        match kind {
            2 => blk[2..].fill(0x80),
            3 => blk[2..].fill(0x7F),
            4 => blk[2..].iter_mut().enumerate().for_each(|(i, b)| *b = if i % 2 == 0 { 0x80 } else { 0x7F }),
            _ => r.fill(&mut blk[2..]),
        }
        let d = match kind {
            0 | 2 | 3 => any_finite_f16(r),
            5 => [0, 0],
            _ => f32_to_f16((r.gen::<f32>() * 2.0 - 1.0) * 0.01).to_le_bytes(),
        };
        blk[..2].copy_from_slice(&d);
    }
    row
}

/// A Q8_0 activation row: kind 0 quantised data; 1 all quants at -128 or 127 (per block) with a
/// random scale; 2 random bytes with some zero scales.
fn act_row(n: usize, kind: usize, r: &mut ChaCha8Rng) -> Vec<u8> {
    let mut q = vec![0u8; act_row_bytes(ActFormat::Q8_0, n)];
    let x: Vec<f32> = (0..n).map(|_| r.gen::<f32>() * 2.0 - 1.0).collect();
    quantize_act_row(ActFormat::Q8_0, &x, &mut q);
    for blk in q.chunks_exact_mut(Q8_0_BYTES) {
        match kind {
            1 => {
                blk[2..].fill(if r.gen::<bool>() { 0x80 } else { 0x7F });
                blk[..2].copy_from_slice(&f32_to_f16(r.gen::<f32>()).to_le_bytes());
            }
            2 => {
                r.fill(&mut blk[2..]);
                let d = if r.gen::<u8>() < 64 { 0f32 } else { r.gen::<f32>() * 0.02 };
                blk[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
            }
            _ => {}
        }
    }
    q
}

/// Eight weight rows of n elements (kinds cycling per row), their repacked group, activation
/// rows and the same rows prepared.
#[allow(clippy::type_complexity)]
fn group_case(n: usize, seed: u64, acts: usize) -> (Vec<Vec<u8>>, Vec<u8>, Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    let rows: Vec<Vec<u8>> = (0..GROUP_ROWS).map(|i| weight_row(n, (i + seed as usize) % 6, &mut r)).collect();
    let mut packed = vec![0u8; q8_0_x8::repacked_bytes(GROUP_ROWS, n)];
    q8_0_x8::repack_group(&rows.concat(), n, &mut packed);
    let a: Vec<Vec<u8>> = (0..acts).map(|i| act_row(n, i % 3, &mut r)).collect();
    let prepared = a
        .iter()
        .map(|a| {
            let mut p = vec![0u8; q8_0_x8::act_bytes(n)];
            q8_0_x8::prepare_act_row(a, n, &mut p);
            p
        })
        .collect();
    (rows, packed, a, prepared)
}

#[test]
fn the_x8_order_model_is_close_to_the_scalar_reference() {
    for (seed, blocks) in [(1u64, 1usize), (2, 3), (3, 8), (4, 64)] {
        let n = QK * blocks;
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        let w = weight_row(n, 1, &mut r);
        let a = act_row(n, 0, &mut r);
        let (got, want) = (q8_0_x8::dot_model(&w, &a, n), simd::dot_scalar(GgmlType::Q8_0, &w, &a, n));
        assert!((got - want).abs() <= 1e-4 * want.abs().max(1e-3), "n={n}: x8 model {got} vs scalar {want}");
    }
}

fn check_group<const T: usize>(rows: &[Vec<u8>], packed: &[u8], acts: &[Vec<u8>], prepared: &[Vec<u8>], n: usize, avx512: bool) {
    for first in 0..=acts.len() - T {
        let p: [&[u8]; T] = std::array::from_fn(|t| prepared[first + t].as_slice());
        let mut out = [[0f32; T]; GROUP_ROWS];
        if avx512 {
            q8_0_x8::dot_group(packed, p, n, &mut out);
        } else {
            q8_0_x8::dot_group_scalar(packed, p, n, &mut out);
        }
        for (r, row) in rows.iter().enumerate() {
            for t in 0..T {
                let want = q8_0_x8::dot_model(row, &acts[first + t], n);
                assert!(bits_equal(out[r][t], want), "n={n} T={T} row {r} act {}: {} vs model {want}", first + t, out[r][t]);
            }
        }
    }
}

#[test]
fn the_scalar_x8_group_code_follows_the_model_bit_for_bit() {
    for (seed, blocks) in [(4u64, 1usize), (5, 2), (6, 5), (7, 8)] {
        let n = QK * blocks;
        let (rows, packed, acts, prepared) = group_case(n, seed, 4);
        check_group::<1>(&rows, &packed, &acts, &prepared, n, false);
        check_group::<3>(&rows, &packed, &acts, &prepared, n, false);
    }
}

#[test]
fn the_avx512_x8_kernel_follows_the_model_bit_for_bit_at_every_tile_width() {
    if !q8_0_x8::available() {
        eprintln!("no AVX-512 VNNI on this CPU: nothing to check");
        return;
    }
    for seed in 0..12u64 {
        for blocks in [1usize, 2, 3, 5, 16, 64] {
            let n = QK * blocks;
            let (rows, packed, acts, prepared) = group_case(n, 100 + seed, 9);
            check_group::<1>(&rows, &packed, &acts, &prepared, n, true);
            check_group::<2>(&rows, &packed, &acts, &prepared, n, true);
            check_group::<3>(&rows, &packed, &acts, &prepared, n, true);
            check_group::<4>(&rows, &packed, &acts, &prepared, n, true);
            check_group::<8>(&rows, &packed, &acts, &prepared, n, true);
        }
    }
}

#[test]
fn the_x8_model_differs_from_a_one_accumulator_order_somewhere() {
    // The model's two accumulators are observable: the test above would catch a kernel that
    // summed the blocks in one chain (a check that the bit-for-bit tests can fail).
    let mut differ = false;
    for seed in 0..20u64 {
        let n = QK * 16;
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        let (w, a) = (weight_row(n, 1, &mut r), act_row(n, 0, &mut r));
        let one: f32 = w.chunks_exact(Q8_0_BYTES).zip(a.chunks_exact(Q8_0_BYTES)).fold(0f32, |acc, (bw, ba)| {
            let isum: i32 = bw[2..].iter().zip(&ba[2..]).map(|(&x, &y)| x as i8 as i32 * y as i8 as i32).sum();
            (isum as f32).mul_add(super::float::f16_at(bw, 0) * super::float::f16_at(ba, 0), acc)
        });
        differ |= one.to_bits() != q8_0_x8::dot_model(&w, &a, n).to_bits();
    }
    assert!(differ);
}
