//! Weight layouts the GPU kernels read that differ from the GGUF blocks.

use anyhow::ensure;

const Q5_0_BLOCK: usize = 22; // f16 d, u8 qh[4], u8 qs[16]

/// Q5_0 blocks as the W8A8 GEMM's two planes, like a Q8_0 matrix: int8 q - 16 (-16..=15, so
/// the product with the scale is the dequantised weight exactly) and the f16 scale bytes.
pub fn q5_0_int8_planes(bytes: &[u8]) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    ensure!(bytes.len().is_multiple_of(Q5_0_BLOCK), "{} bytes is not a whole number of Q5_0 blocks", bytes.len());
    let nb = bytes.len() / Q5_0_BLOCK;
    let (mut qs, mut scales) = (vec![0u8; nb * 32], vec![0u8; nb * 2]);
    for (b, blk) in bytes.chunks_exact(Q5_0_BLOCK).enumerate() {
        scales[b * 2..b * 2 + 2].copy_from_slice(&blk[..2]);
        let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
        let out = &mut qs[b * 32..b * 32 + 32];
        for (j, &q) in blk[6..].iter().enumerate() {
            let lo = (q & 0xF) | ((((qh >> j) & 1) as u8) << 4);
            let hi = (q >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
            out[j] = (lo as i8 - 16) as u8;
            out[j + 16] = (hi as i8 - 16) as u8;
        }
    }
    Ok((qs, scales))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgmlType;
    use crate::quant;

    #[test]
    fn q5_0_planes_times_scale_are_the_dequantised_weights() {
        // Quantise a pseudo-random row with ggml's reference quantiser, then compare.
        let row: Vec<f32> = (0..256).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013).collect();
        let mut bytes = vec![0u8; 256 / 32 * Q5_0_BLOCK];
        quant::quantize_row(GgmlType::Q5_0, &row, &mut bytes).unwrap();
        let mut want = vec![0f32; 256];
        quant::dequantize_row(GgmlType::Q5_0, &bytes, &mut want).unwrap();
        let (qs, scales) = q5_0_int8_planes(&bytes).unwrap();
        for (i, w) in want.iter().enumerate() {
            let b = i / 32;
            let d = quant::f16_to_f32(u16::from_le_bytes([scales[2 * b], scales[2 * b + 1]]));
            assert_eq!(qs[i] as i8 as f32 * d, *w, "value {i}");
        }
        assert!(qs.iter().all(|&q| (-16..=15).contains(&(q as i8))));
        assert!(q5_0_int8_planes(&bytes[..21]).is_err());
    }
}
