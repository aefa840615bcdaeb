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
                for h in 0..n_heads {
                    let v = &mut row[h * head_dim..(h + 1) * head_dim];
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
        })
    }
}
