//! The repacked Q4_K kernels (`q4_k_x8`) against their float order, written out on the
//! row-major rows (`q4_k_x8::dot_model`): the scalar group code and the AVX-512 kernel, every
//! tile width the matmul uses, bit for bit, on the stress rows of the K-quant order tests (any
//! finite f16 d/dmin, all-0xFF blocks, 0x7F/0x80 patterns, activations at +-127).

use super::k_quant_order_tests::{bits_equal, stress_act_row, stress_weight_row};
use super::k_quants::QK_K;
use super::q4_k_x8::{self, GROUP_ROWS};
use super::{simd, GgmlType};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Eight stress rows of n elements (kinds cycling per row), their repacked group, and
/// activation rows.
fn group_case(n: usize, seed: u64, acts: usize) -> (Vec<Vec<u8>>, Vec<u8>, Vec<Vec<u8>>) {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    let rows: Vec<Vec<u8>> = (0..GROUP_ROWS).map(|i| stress_weight_row(GgmlType::Q4_K, n, (i + seed as usize) % 4, &mut r)).collect();
    let mut packed = vec![0u8; q4_k_x8::repacked_bytes(GROUP_ROWS, n)];
    q4_k_x8::repack_group(&rows.concat(), n, &mut packed);
    let a = (0..acts).map(|i| stress_act_row(n, i % 2, &mut r)).collect();
    (rows, packed, a)
}

#[test]
fn the_x8_order_model_is_close_to_the_scalar_reference() {
    for (seed, blocks) in [(1u64, 1usize), (2, 3), (3, 8)] {
        let n = QK_K * blocks;
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        // Kind 1: small d/dmin, so that the sums are not dominated by huge scales.
        let w = stress_weight_row(GgmlType::Q4_K, n, 1, &mut r);
        let a = stress_act_row(n, 0, &mut r);
        let (got, want) = (q4_k_x8::dot_model(&w, &a, n), simd::dot_scalar(GgmlType::Q4_K, &w, &a, n));
        assert!((got - want).abs() <= 1e-4 * want.abs().max(1e-3), "n={n}: x8 model {got} vs scalar {want}");
    }
}

fn check_group<const T: usize>(rows: &[Vec<u8>], packed: &[u8], acts: &[Vec<u8>], n: usize, avx512: bool) {
    for first in 0..=acts.len() - T {
        let a: [&[u8]; T] = std::array::from_fn(|t| acts[first + t].as_slice());
        let mut out = [[0f32; T]; GROUP_ROWS];
        if avx512 {
            q4_k_x8::dot_group(packed, a, n, &mut out);
        } else {
            q4_k_x8::dot_group_scalar(packed, a, n, &mut out);
        }
        for (r, row) in rows.iter().enumerate() {
            for t in 0..T {
                let want = q4_k_x8::dot_model(row, a[t], n);
                assert!(bits_equal(out[r][t], want), "n={n} T={T} row {r} act {}: {} vs model {want}", first + t, out[r][t]);
            }
        }
    }
}

#[test]
fn the_scalar_x8_group_code_follows_the_model_bit_for_bit() {
    for (seed, blocks) in [(4u64, 1usize), (5, 2), (6, 5)] {
        let n = QK_K * blocks;
        let (rows, packed, acts) = group_case(n, seed, 3);
        check_group::<1>(&rows, &packed, &acts, n, false);
        check_group::<3>(&rows, &packed, &acts, n, false);
    }
}

#[test]
fn the_avx512_x8_kernel_follows_the_model_bit_for_bit_at_every_tile_width() {
    if !q4_k_x8::available() {
        eprintln!("no AVX-512 VNNI + VBMI on this CPU: nothing to check");
        return;
    }
    for seed in 0..8u64 {
        for blocks in [1usize, 2, 5, 16] {
            let n = QK_K * blocks;
            let (rows, packed, acts) = group_case(n, 100 + seed, 9);
            check_group::<1>(&rows, &packed, &acts, n, true);
            check_group::<2>(&rows, &packed, &acts, n, true);
            check_group::<3>(&rows, &packed, &acts, n, true);
            check_group::<4>(&rows, &packed, &acts, n, true);
            check_group::<8>(&rows, &packed, &acts, n, true);
        }
    }
}
