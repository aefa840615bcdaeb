//! Tensor block formats (bit-compatible with ggml's block layouts): dequantisation,
//! quantisation (to write test models) and the dot products of the CPU backend.
//!
//! Dot products follow ggml: activations are quantised once per row (Q8_0 for the 32-blocks,
//! Q8_K for the K-quants) and each block's integer products are exact; only the per-block
//! float scaling and the final sum depend on order. The same portable code is compiled three
//! times (AVX-512, AVX2+FMA, baseline) and chosen once at run time, so the compiler vectorises
//! for the best instruction set the CPU has without `-C target-cpu`. AMX is never used.

mod blocks;
mod dot;

pub use crate::gguf::GgmlType;
pub use blocks::{bf16_to_f32, dequantize_row, f16_to_f32, f32_to_bf16, f32_to_f16, quantize_row};
pub use dot::{simd_level, vec_dot};

/// Formats of quantised activation rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActFormat {
    F32,
    Q8_0,
    Q8_K,
}

/// Whether dequantize/quantize/vec_dot support this weight type.
pub fn supports(t: GgmlType) -> bool {
    use GgmlType::*;
    matches!(t, F32 | F16 | BF16 | Q8_0 | Q4_0 | Q4_1 | Q4_K | Q5_K | Q6_K)
}

/// The activation format a weight type's dot product consumes (ggml's vec_dot_type, except
/// that F16/BF16 weights keep f32 activations for accuracy).
pub fn act_format(weight: GgmlType) -> ActFormat {
    use GgmlType::*;
    match weight {
        Q8_0 | Q4_0 | Q4_1 => ActFormat::Q8_0,
        Q4_K | Q5_K | Q6_K => ActFormat::Q8_K,
        _ => ActFormat::F32,
    }
}

/// Bytes of one activation row of n elements.
pub fn act_row_bytes(fmt: ActFormat, n: usize) -> usize {
    match fmt {
        ActFormat::F32 => 4 * n,
        ActFormat::Q8_0 => n / 32 * 34,
        ActFormat::Q8_K => n / 256 * blocks::Q8K_BYTES,
    }
}

/// Quantises one activation row into dst (act_row_bytes long).
pub fn quantize_act_row(fmt: ActFormat, x: &[f32], dst: &mut [u8]) {
    match fmt {
        ActFormat::F32 => {
            for (d, v) in dst.chunks_exact_mut(4).zip(x) {
                d.copy_from_slice(&v.to_le_bytes());
            }
        }
        ActFormat::Q8_0 => blocks::quantize_q8_0(x, dst),
        ActFormat::Q8_K => blocks::quantize_q8_k(x, dst),
    }
}

#[cfg(test)]
mod tests;
