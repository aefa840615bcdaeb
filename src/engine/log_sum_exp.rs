//! The log-sum-exp of a row of logits: the log-softmax's normaliser, for the logprob that every
//! token event carries and for the top alternatives.
//!
//! Why not libm: one `expf` call per element made this the largest host cost of a decode step on
//! large vocabularies (0.61 ms per row of Qwen3's 151,936 logits on one core of the dev VM, more
//! than the 0.82 ms device step of an 8-layer MoE model). Here the exponential is Cephes' `expf`
//! (range reduction by ln 2, a degree-6 polynomial, the power of two put in by its exponent bits)
//! written branch-free in a plain loop, which the compiler vectorises (SSE2, or AVX2 where the
//! CPU has it: the same IEEE operations per element, no fused multiply-add, so the same bits on
//! every x86-64 host). The sum is kept in f64 as before, in 16 lanes by index.

/// Lanes of the running maximum and sum (independent chains the compiler maps to vectors).
const LANES: usize = 16;
/// Logits whose exponentials are computed before they are summed (a buffer on the stack).
const BLOCK: usize = 256;

/// e^x for x <= 0 (a logit minus its row's maximum), within a few ulp of the exact value (the
/// tests bound it); exactly 1 at 0. Arguments below -87 (and NaN) are taken as -87, whose e^x
/// (1.6e-38) is nothing next to the row's largest term, 1.
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    // 1.5 * 2^23: adding it rounds x log2(e) to the nearest integer n, which its low mantissa
    // bits then hold (|x log2 e| < 2^22), so no float-to-int conversion is needed.
    const ROUND: f32 = 12_582_912.0;
    let x = if x > -87.0 { x } else { -87.0 };
    let t = x * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    // x - n ln 2 in two steps (Cephes' split of ln 2: the first product is exact).
    let r = x - n * 0.693_359_4 + n * 2.121_944_4e-4;
    // Cephes: the last coefficient, 5.0000001e-1, is 0.5 in f32.
    let p = (((((1.987_569_2e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 1.666_666_5e-1) * r + 0.5) * (r * r)
        + r
        + 1.0;
    // 2^n for n in -126..=0: the biased exponent in place.
    let n_bits = t.to_bits() as i32 - ROUND.to_bits() as i32;
    p * f32::from_bits(((n_bits + 127) as u32) << 23)
}

/// `out[i] = exp_nonpositive(v[i] - max)`: a plain loop the compiler vectorises.
#[inline(always)]
fn exp_block(out: &mut [f32], v: &[f32], max: f32) {
    for (o, &x) in out.iter_mut().zip(v) {
        *o = exp_nonpositive(x - max);
    }
}

/// [`exp_block`] compiled for AVX2 (8 lanes instead of SSE2's 4). Rust never fuses a multiply
/// and an add, so every lane does the same IEEE operations in the same order as the baseline
/// build: the bits do not depend on which one ran.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn exp_block_avx2(out: &mut [f32], v: &[f32], max: f32) {
    exp_block(out, v, max)
}

fn exp_block_dispatch(out: &mut [f32], v: &[f32], max: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected.
        return unsafe { exp_block_avx2(out, v, max) };
    }
    exp_block(out, v, max)
}

/// The largest logit, NaN skipped (-inf for an empty row or one of only NaN / -inf): the
/// maximum in 16 independent lanes, which compiles to vector max instructions (~10x the
/// one-at-a-time loop on a 150k vocabulary). Shared with `sampler::argmax`.
pub(super) fn max_logit(logits: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = if v > *m { v } else { *m };
        }
    }
    lanes.iter().chain(tail).fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
}

/// ln(sum_i e^(logits_i)), computed as max + ln(sum_i e^(logits_i - max)). NaN logits are
/// skipped by the maximum. A row of -inf gives -inf.
pub fn log_sum_exp(logits: &[f32]) -> f32 {
    let max = max_logit(logits);
    if max == f32::NEG_INFINITY {
        return max;
    }
    // The exponentials of a block into a buffer (a plain loop over elements, which the
    // compiler vectorises), then their sum in f64 lanes.
    let mut sums = [0f64; LANES];
    let mut buf = [0f32; BLOCK];
    for block in logits.chunks(BLOCK) {
        let e = &mut buf[..block.len()];
        exp_block_dispatch(e, block, max);
        let lanes = e.chunks_exact(LANES);
        let tail = lanes.remainder();
        for c in lanes {
            for (s, &x) in sums.iter_mut().zip(c) {
                *s += x as f64;
            }
        }
        for (s, &x) in sums.iter_mut().zip(tail) {
            *s += x as f64;
        }
    }
    (sums.iter().sum::<f64>().ln() as f32) + max
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn exp_is_within_a_few_ulp_of_the_exact_value() {
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(-0.0), 1.0);
        let mut worst = 0f64;
        let mut x = 0f32;
        while x > -87.0 {
            let exact = (x as f64).exp();
            let got = exp_nonpositive(x) as f64;
            // In units of the last place of the exact value's f32 neighbourhood.
            let ulp = (exact as f32).next_up() as f64 - exact as f32 as f64;
            worst = worst.max((got - exact).abs() / ulp);
            x -= 0.000_731;
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        assert!(exp_nonpositive(-200.0) < 2e-38 && exp_nonpositive(f32::NEG_INFINITY) < 2e-38);
    }

    #[test]
    fn log_sum_exp_matches_f64_arithmetic() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for len in [1usize, 2, 15, 16, 17, 100, 32_000, 151_936] {
            for scale in [0.1f32, 3.0, 30.0] {
                let v: Vec<f32> = (0..len).map(|_| rng.gen_range(-1.0f32..1.0) * scale).collect();
                let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
                let exact = v.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln() + max;
                let got = log_sum_exp(&v) as f64;
                assert!((got - exact).abs() <= 2e-6 * exact.abs().max(1.0), "len {len} scale {scale}: {got} vs {exact}");
                // Every log-probability is <= 0.
                assert!(got >= max, "len {len} scale {scale}");
            }
        }
    }

    #[test]
    fn the_avx2_build_gives_the_baseline_bits() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let v: Vec<f32> = (0..4099).map(|_| rng.gen_range(-100.0f32..0.0)).collect();
        let (mut a, mut b) = (vec![0f32; v.len()], vec![0f32; v.len()]);
        exp_block(&mut a, &v, 0.0);
        exp_block_dispatch(&mut b, &v, 0.0);
        assert_eq!(a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), b.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    }

    #[test]
    fn edge_rows() {
        assert_eq!(log_sum_exp(&[0.0, 0.0]), 2f32.ln());
        assert_eq!(log_sum_exp(&[f32::NEG_INFINITY; 3]), f32::NEG_INFINITY);
        assert_eq!(log_sum_exp(&[]), f32::NEG_INFINITY);
        let mut v = vec![f32::NEG_INFINITY; 40];
        v[33] = 5.0;
        assert_eq!(log_sum_exp(&v), 5.0);
        v[3] = f32::NAN;
        assert_eq!(log_sum_exp(&v), 5.0);
    }
}
