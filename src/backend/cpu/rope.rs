//! RoPE, plain and with ggml's rope_ext scaling (YaRN), in ggml's order of operations.

use super::{CpuBackend, CpuBuffer};
use crate::backend::{RopeScaling, RopeStyle};

/// cos and sin of pair `i`'s angle under ggml's rope_ext scaling, `theta` being the unscaled
/// angle p * base^(-2i/d): the scaled angle freq_scale * theta, blended towards `theta` on
/// the pairs below YaRN's ramp (ext_factor), both times the magnitude attn_factor (and YaRN's
/// 1 + 0.1 ln(1 / freq_scale)). Written from the YaRN paper's definition in ggml's order of
/// operations.
fn yarn_cos_sin(theta: f32, i: usize, s: &RopeScaling) -> (f32, f32) {
    let scaled = s.freq_scale * theta;
    let mut magnitude = s.attn_factor;
    let angle = if s.ext_factor != 0.0 {
        let [low, high] = s.corr_dims;
        let ramp = 1.0 - ((i as f32 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
        let mix = ramp * s.ext_factor;
        magnitude *= 1.0 + 0.1 * (1.0 / s.freq_scale).ln();
        scaled * (1.0 - mix) + theta * mix
    } else {
        scaled
    };
    (angle.cos() * magnitude, angle.sin() * magnitude)
}

impl CpuBackend {
    /// RoPE of every head of each row; `scaling` as ggml's rope_ext (None: plain RoPE, the
    /// same arithmetic as a scaling of 1 / no YaRN / magnitude 1).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rope_cpu(
        &self,
        x: &mut CpuBuffer,
        positions: &[u32],
        n_heads: usize,
        head_dim: usize,
        freq_base: f32,
        style: RopeStyle,
        scaling: Option<RopeScaling>,
    ) {
        let x = x.as_mut_slice();
        let half = head_dim / 2;
        self.timed("rope", positions.len(), || {
            let mut cos = vec![0f32; half];
            let mut sin = vec![0f32; half];
            // Same recurrence as ggml's rope: theta_i = p * base^(-2i/d), in f32.
            let theta_scale = freq_base.powf(-2.0 / head_dim as f32);
            for (t, &p) in positions.iter().enumerate() {
                let mut theta = p as f32;
                for i in 0..half {
                    (cos[i], sin[i]) = match &scaling {
                        None => (theta.cos(), theta.sin()),
                        Some(s) => yarn_cos_sin(theta, i, s),
                    };
                    theta *= theta_scale;
                }
                let row = &mut x[t * n_heads * head_dim..(t + 1) * n_heads * head_dim];
                rotate_row_dispatch(row, head_dim, style, &cos, &sin);
            }
        })
    }
}

/// Rotates every head of one row by the pairs' (cos, sin): x0' = x0 cos - x1 sin and
/// x1' = x0 sin + x1 cos, each with one fused multiply-add as ggml's rope.
#[inline(always)]
fn rotate_row(row: &mut [f32], head_dim: usize, style: RopeStyle, cos: &[f32], sin: &[f32]) {
    let half = head_dim / 2;
    for v in row.chunks_exact_mut(head_dim) {
        for i in 0..half {
            let (a, b) = match style {
                RopeStyle::Norm => (2 * i, 2 * i + 1),
                RopeStyle::Neox => (i, i + half),
            };
            let (x0, x1) = (v[a], v[b]);
            v[a] = x0.mul_add(cos[i], -(x1 * sin[i]));
            v[b] = x0.mul_add(sin[i], x1 * cos[i]);
        }
    }
}

/// `rotate_row` compiled with the FMA instruction: without the target feature `f32::mul_add`
/// is a call into the runtime's `fmaf` per element (both are the correctly rounded fused
/// operation, so the bits are the same; the call made RoPE ~10x slower than its arithmetic).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn rotate_row_fma(row: &mut [f32], head_dim: usize, style: RopeStyle, cos: &[f32], sin: &[f32]) {
    rotate_row(row, head_dim, style, cos, sin)
}

fn rotate_row_dispatch(row: &mut [f32], head_dim: usize, style: RopeStyle, cos: &[f32], sin: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::quant::simd::level() >= crate::quant::simd::SimdLevel::Avx2 {
        // SAFETY: the Avx2 level is only selected where the CPU has FMA (SimdLevel::available).
        return unsafe { rotate_row_fma(row, head_dim, style, cos, sin) };
    }
    rotate_row(row, head_dim, style, cos, sin)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The FMA build of the rotation against the portable one (which calls the runtime's
    /// fmaf), bit for bit, in both pair layouts.
    #[test]
    fn fma_rotation_equals_the_portable_one_bit_for_bit() {
        if !crate::quant::simd::SimdLevel::Avx2.available() {
            return;
        }
        let head_dim = 64;
        let cos: Vec<f32> = (0..head_dim / 2).map(|i| (i as f32 * 0.37).cos()).collect();
        let sin: Vec<f32> = (0..head_dim / 2).map(|i| (i as f32 * 0.37).sin()).collect();
        for style in [RopeStyle::Norm, RopeStyle::Neox] {
            let row: Vec<f32> = (0..3 * head_dim).map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 7.3).collect();
            let (mut a, mut b) = (row.clone(), row);
            rotate_row(&mut a, head_dim, style, &cos, &sin);
            #[cfg(target_arch = "x86_64")]
            unsafe {
                rotate_row_fma(&mut b, head_dim, style, &cos, &sin)
            };
            assert_eq!(a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), b.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        }
    }
}
