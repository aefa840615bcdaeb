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

// An MXFP4 block: u8 e (E8M0), u8 qs[16] (E2M1 nibbles); the levels doubled, so the scale is
// 2^(e - 128) (src/quant/mxfp4.rs).
use crate::quant::{MXFP4_BYTES as MXFP4_BLOCK, MXFP4_KVALUES as MXFP4_LEVELS};

/// MXFP4 blocks as the same two planes: int8 doubled E2M1 levels (-12..=12) and the f16 scale
/// 2^(e - 128), exact for e in 104..=143 (f16's powers of two, subnormals included); a block
/// of zeros gets scale 0 whatever its e. Each plane value times its scale is the dequantised
/// weight exactly; the planes take 8.5 bits per weight against MXFP4's 4.25.
pub fn mxfp4_int8_planes(bytes: &[u8]) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    ensure!(bytes.len().is_multiple_of(MXFP4_BLOCK), "{} bytes is not a whole number of MXFP4 blocks", bytes.len());
    let nb = bytes.len() / MXFP4_BLOCK;
    let (mut qs, mut scales) = (vec![0u8; nb * 32], vec![0u8; nb * 2]);
    for (b, blk) in bytes.chunks_exact(MXFP4_BLOCK).enumerate() {
        let out = &mut qs[b * 32..b * 32 + 32];
        for (j, &q) in blk[1..].iter().enumerate() {
            out[j] = MXFP4_LEVELS[(q & 0xF) as usize] as u8;
            out[j + 16] = MXFP4_LEVELS[(q >> 4) as usize] as u8;
        }
        let exp = blk[0] as i32 - 128;
        let scale = if out.iter().all(|&q| q == 0) {
            0u16
        } else if (-24..=-15).contains(&exp) {
            1u16 << (exp + 24) // f16 subnormal 2^exp
        } else if (-14..=15).contains(&exp) {
            ((exp + 15) as u16) << 10
        } else {
            anyhow::bail!("MXFP4 block {b} has scale 2^{exp}, outside f16's range (2^-24..2^15) that the GPU's int8 planes keep");
        };
        scales[b * 2..b * 2 + 2].copy_from_slice(&scale.to_le_bytes());
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

    #[test]
    fn mxfp4_planes_times_scale_are_the_dequantised_weights() {
        // Rows across scales: 2^-9 .. 2^3 magnitudes, a zero block, then exponents at f16's edges.
        let mut row: Vec<f32> = (0..512).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013 * (2f32).powi(i / 32 - 9)).collect();
        row[64..96].iter_mut().for_each(|v| *v = 0.0);
        let mut bytes = vec![0u8; 512 / 32 * MXFP4_BLOCK];
        quant::quantize_row(GgmlType::MXFP4, &row, &mut bytes).unwrap();
        for (b, e) in [(5usize, 104u8), (6, 143), (7, 110)] {
            bytes[b * MXFP4_BLOCK] = e;
        }
        let mut want = vec![0f32; 512];
        quant::dequantize_row(GgmlType::MXFP4, &bytes, &mut want).unwrap();
        let (qs, scales) = mxfp4_int8_planes(&bytes).unwrap();
        for (i, w) in want.iter().enumerate() {
            let b = i / 32;
            let d = quant::f16_to_f32(u16::from_le_bytes([scales[2 * b], scales[2 * b + 1]]));
            assert_eq!(qs[i] as i8 as f32 * d, *w, "value {i}");
        }
        assert_eq!(&scales[4..6], &[0, 0], "the zero block's scale");
        // One step outside f16's powers of two either way is refused with the block named.
        for e in [103u8, 144] {
            bytes[5 * MXFP4_BLOCK] = e;
            let err = mxfp4_int8_planes(&bytes).unwrap_err().to_string();
            assert!(err.contains("block 5") && err.contains("outside f16's range"), "{err}");
        }
        assert!(mxfp4_int8_planes(&bytes[..16]).is_err());
    }
}
