//! Q4_1 weights against activation rows eight at a time (batched decode at 8+ sequences and
//! prefill), with the activations in the eights form. `Q8_1Eights` rearranges each aligned
//! group of eight Q8_1 activation rows so that, per block, the eight rows' 4-byte quant groups
//! lie side by side: the AVX-512 kernel (`simd::avx512::tiles_multi::dot_q4_1_rows_eights`)
//! then keeps one lane of ggml's eight per register for all eight rows and needs no scale
//! spreading. Results are bit for bit those of `vec_dot` (the kernel's comment says why).

use super::{act_row_bytes, float, legacy, simd, ActFormat, GgmlType, SimdLevel};

/// Bytes of one block of a group of eight rows in the eights form: 8 groups x 8 rows x 4.
const EIGHTS_BLOCK_BYTES: usize = 8 * legacy::QK;

/// Q8_1 activation rows in the eights form: rows 8g..8g + 8 make group g (a last group of
/// fewer than eight rows is left out; those rows take the other tiles).
pub struct Q8_1Eights {
    /// Per group, per block: for each 4-byte group l of the block's 32 quants, the eight rows'
    /// four bytes in row order (256 bytes a block).
    quants: Vec<u8>,
    /// Per group, per block: the eight rows' scales d (and s = d * sum of the quants) as f32.
    d: Vec<f32>,
    s: Vec<f32>,
    groups: usize,
    n: usize,
}

impl Q8_1Eights {
    /// From `rows` Q8_1 rows of n elements each, back to back in `acts`.
    pub fn new(acts: &[u8], rows: usize, n: usize) -> Q8_1Eights {
        let (nb, row_bytes) = (n / legacy::QK, act_row_bytes(ActFormat::Q8_1, n));
        assert!(n.is_multiple_of(legacy::QK) && acts.len() == rows * row_bytes, "Q8_1Eights: {rows} rows of {n} elements");
        let groups = rows / 8;
        let mut quants = vec![0u8; groups * nb * EIGHTS_BLOCK_BYTES];
        let (mut d, mut s) = (vec![0f32; groups * nb * 8], vec![0f32; groups * nb * 8]);
        for g in 0..groups {
            for t in 0..8 {
                let row = &acts[(8 * g + t) * row_bytes..(8 * g + t + 1) * row_bytes];
                for (b, blk) in row.chunks_exact(legacy::Q8_1_BYTES).enumerate() {
                    let at = g * nb + b;
                    d[8 * at + t] = float::f16_at(blk, 0);
                    s[8 * at + t] = float::f16_at(blk, 2);
                    let dst = &mut quants[at * EIGHTS_BLOCK_BYTES..(at + 1) * EIGHTS_BLOCK_BYTES];
                    for (l, four) in blk[4..].chunks_exact(4).enumerate() {
                        dst[32 * l + 4 * t..32 * l + 4 * t + 4].copy_from_slice(four);
                    }
                }
            }
        }
        Q8_1Eights { quants, d, s, groups, n }
    }

    /// Rows covered (whole groups of eight).
    pub fn rows(&self) -> usize {
        8 * self.groups
    }
}

/// Whether this CPU has the eights kernel (AVX-512 VNNI).
pub fn has_q4_1_eights_tile() -> bool {
    simd::level() == SimdLevel::Avx512Vnni
}

/// out[r][t] = `vec_dot(Q4_1, row r of w_rows, activation row first + t, n)` for the
/// `out.len()` consecutive weight rows in `w_rows` and the eight activation rows from `first`
/// (a multiple of 8 below `eights.rows()`), bit for bit. Call only where `has_q4_1_eights_tile()`.
pub fn vec_dot_rows_q4_1_eights(w_rows: &[u8], eights: &Q8_1Eights, first: usize, out: &mut [[f32; 8]]) {
    assert!(has_q4_1_eights_tile(), "no Q4_1 eights kernel on this CPU");
    let n = eights.n;
    let (nb, row_bytes) = (n / legacy::QK, GgmlType::Q4_1.row_bytes(n).unwrap_or(0));
    assert!(w_rows.len() >= out.len() * row_bytes, "vec_dot_rows_q4_1_eights(n={n}): {} bytes for {} rows", w_rows.len(), out.len());
    assert!(first.is_multiple_of(8) && first + 8 <= eights.rows(), "vec_dot_rows_q4_1_eights: rows {first}+8 of {}", eights.rows());
    if out.is_empty() {
        return;
    }
    let g = first / 8;
    let quants = &eights.quants[g * nb * EIGHTS_BLOCK_BYTES..(g + 1) * nb * EIGHTS_BLOCK_BYTES];
    let (d, s) = (&eights.d[g * nb * 8..(g + 1) * nb * 8], &eights.s[g * nb * 8..(g + 1) * nb * 8]);
    simd::dot_q4_1_eights(&w_rows[..out.len() * row_bytes], row_bytes, quants, d, s, nb, out);
}
