//! Q4_1 weights against activation rows eight at a time (batched decode at 8+ sequences and
//! prefill), with the activations in the eights form. `Q8_1Eights` rearranges each aligned
//! group of eight Q8_1 activation rows so that, per block, the eight rows' 4-byte quant groups
//! lie side by side: the AVX-512 kernel (`simd::avx512::tiles_multi::dot_q4_1_rows_eights`)
//! then keeps one lane of ggml's eight per register for all eight rows and needs no scale
//! spreading. Results are bit for bit those of `vec_dot` (the kernel's comment says why).

use super::{act_row_bytes, float, legacy, simd, ActFormat, GgmlType, SimdLevel};

/// Bytes of one block of a group of eight rows in the eights form: the quants (8 groups x 8
/// rows x 4 bytes), then the eight rows' d and s as f32.
const QUANT_BYTES: usize = 8 * legacy::QK;
const BLOCK_BYTES: usize = simd::Q8_1_EIGHTS_BLOCK_BYTES;
const _: () = assert!(BLOCK_BYTES == QUANT_BYTES + 2 * 8 * 4);

/// Q8_1 activation rows in the eights form: rows 8g..8g + 8 make group g (a last group of
/// fewer than eight rows is left out; those rows take the other tiles). Per group, per block
/// (`BLOCK_BYTES`): for each 4-byte group l of the block's 32 quants the eight rows' four bytes
/// in row order (256 bytes), then the eight rows' scales d, then s (= d * sum of the quants),
/// as f32.
pub struct Q8_1Eights {
    bytes: Vec<u8>,
    groups: usize,
    n: usize,
}

impl Q8_1Eights {
    /// From `rows` Q8_1 rows of n elements each, back to back in `acts`; the groups one after
    /// another (`new_with` lets a thread pool fill them).
    pub fn new(acts: &[u8], rows: usize, n: usize) -> Q8_1Eights {
        Q8_1Eights::new_with(acts, rows, n, |bytes, group_bytes, fill| {
            bytes.chunks_mut(group_bytes).enumerate().for_each(|(g, dst)| fill(g, dst))
        })
    }

    /// As `new`, with `for_each_group(bytes, group_bytes, fill)` calling `fill(g, chunk)` for
    /// every `group_bytes` chunk of `bytes` (g = its index), in any order or in parallel.
    pub fn new_with(
        acts: &[u8],
        rows: usize,
        n: usize,
        for_each_group: impl FnOnce(&mut [u8], usize, &(dyn Fn(usize, &mut [u8]) + Sync)),
    ) -> Q8_1Eights {
        let (nb, row_bytes) = (n / legacy::QK, act_row_bytes(ActFormat::Q8_1, n));
        assert!(n.is_multiple_of(legacy::QK) && acts.len() == rows * row_bytes, "Q8_1Eights: {rows} rows of {n} elements");
        let groups = rows / 8;
        let group_bytes = nb * BLOCK_BYTES;
        let mut bytes = vec![0u8; groups * group_bytes];
        let fill = |g: usize, dst: &mut [u8]| {
            for t in 0..8 {
                let row = &acts[(8 * g + t) * row_bytes..(8 * g + t + 1) * row_bytes];
                for (blk, dst) in row.chunks_exact(legacy::Q8_1_BYTES).zip(dst.chunks_exact_mut(BLOCK_BYTES)) {
                    for (l, four) in blk[4..].chunks_exact(4).enumerate() {
                        dst[32 * l + 4 * t..32 * l + 4 * t + 4].copy_from_slice(four);
                    }
                    let (d, s) = (float::f16_at(blk, 0), float::f16_at(blk, 2));
                    dst[QUANT_BYTES + 4 * t..][..4].copy_from_slice(&d.to_le_bytes());
                    dst[QUANT_BYTES + 32 + 4 * t..][..4].copy_from_slice(&s.to_le_bytes());
                }
            }
        };
        if group_bytes > 0 {
            for_each_group(&mut bytes, group_bytes, &fill);
        }
        Q8_1Eights { bytes, groups, n }
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
    let group_bytes = nb * BLOCK_BYTES;
    let group = &eights.bytes[first / 8 * group_bytes..][..group_bytes];
    simd::dot_q4_1_eights(&w_rows[..out.len() * row_bytes], row_bytes, group, nb, out);
}
