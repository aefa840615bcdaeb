//! GeGLU with the tanh GELU exactly as ggml's CPU backend computes it (Gemma's FFN), shared by
//! the CPU backend and the trait's host-memory default. A table lookup, so one portable form
//! (no instruction-set variants); it lives with the other CPU kernels.
//!
//! ggml builds with GGML_GELU_FP16: `ggml_vec_geglu_f32` looks the GELU up in a table indexed
//! by the f16 bits of x (`ggml_table_gelu_f16[i] = f16(gelu(f16_to_f32(i)))`), so x is rounded
//! to f16 and GELU's result is rounded to f16 before the product with the up projection; x <=
//! -10 gives 0 and x >= 10 gives x * up unrounded. Using the exact GELU instead moves logits by
//! far more than the other rounding differences, so parity with llama.cpp needs the table.

use crate::quant::{f16_to_f32, f32_to_f16};
use once_cell::sync::Lazy;

const GELU_COEF_A: f32 = 0.044715;
#[allow(clippy::excessive_precision)] // ggml's literal, rounded to f32 by the compiler as in C
const SQRT_2_OVER_PI: f32 = 0.797_884_560_802_865_355_879_892_119_868_76;

/// ggml_gelu_f32: 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))), in f32 with libm's tanhf,
/// with `1 + (0.044715 x) x` as one fused multiply-add: gcc contracts it so in llama.cpp's x86
/// build (-mfma, -ffp-contract=fast). Unfused, 1 of the 65,536 table entries differs from
/// ggml's (x = f16 0xbfff = -1.999: GELU lies on an f16 rounding midpoint), which moved
/// Gemma 3's logits by ~2e-2 (docs/REFERENCE.md); fused, all finite entries equal ggml's table.
pub fn gelu_tanh(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (GELU_COEF_A * x).mul_add(x, 1.0)).tanh())
}

/// f16(gelu(x)) for every f16 bit pattern x, as f32 (256 KiB, built on first use).
static TABLE: Lazy<Vec<f32>> = Lazy::new(|| (0..=u16::MAX).map(|h| f16_to_f32(f32_to_f16(gelu_tanh(f16_to_f32(h))))).collect());

/// gate[i] = gelu(gate[i]) * up[i], ggml's table GELU (see the module comment).
pub fn geglu_ggml(gate: &mut [f32], up: &[f32]) {
    let table = &*TABLE;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * u
        } else {
            table[f32_to_f16(x) as usize] * u
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_matches_the_formula_and_rounds_through_f16() {
        assert_eq!(gelu_tanh(0.0), 0.0);
        assert!((gelu_tanh(1.0) - 0.841_192).abs() < 1e-5);
        assert!((gelu_tanh(-1.0) + 0.158_808).abs() < 1e-5);
        let mut g = vec![-11.0, -1.0, 0.0, 0.3, 1.0, 12.0];
        geglu_ggml(&mut g, &[2.0; 6]);
        assert_eq!(g[0], 0.0);
        assert_eq!(g[5], 24.0);
        // The in-range values are f16(gelu(f16(x))) * up.
        for (x, y) in [-1.0f32, 0.0, 0.3, 1.0].into_iter().zip(&g[1..5]) {
            let want = f16_to_f32(f32_to_f16(gelu_tanh(f16_to_f32(f32_to_f16(x))))) * 2.0;
            assert_eq!(*y, want, "x = {x}");
        }
    }

    #[test]
    fn table_entry_on_a_rounding_midpoint_is_ggmls() {
        // ggml's ggml_table_gelu_f16[0xbfff] (x = -1.999) is 0xa9d3, read from llama.cpp's
        // libggml-cpu built with the project's flags; without the FMA it would be 0xa9d2.
        assert_eq!(f32_to_f16(TABLE[0xbfff]), 0xa9d3);
    }
}
