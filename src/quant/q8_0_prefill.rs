//! The Q8_0 prefill GEMM's activation form and its entry point. On AVX-512 VNNI the prefill
//! tile for Q8_0 weights reads the activation rows once rearranged (`Q8_0Offset`): every quant
//! plus 128 as an unsigned byte, the 32 quants of each block back to back (two blocks are one
//! 64-byte load), and the block scales as f32. That lets one `vpdpbusd` per block pair form
//! each dot's exact integer sums (the single dot needs a sign mask, an absolute value and a
//! masked negation per dot) and drops the per-dot f16 conversion of the activation scales.
//! Results are bit for bit those of `vec_dot` (see `simd::avx512::tiles::dot_q8_0_offset_tile`).

use super::{act_row_bytes, check_dot_args, float, legacy, simd, ActFormat, GgmlType, SimdLevel};

/// A matrix of Q8_0 activation rows in the offset form.
pub struct Q8_0Offset {
    /// Row-major, n bytes per row: quant + 128.
    quants: Vec<u8>,
    /// Row-major, n / 32 per row: the block scales as f32.
    scales: Vec<f32>,
    rows: usize,
    n: usize,
}

impl Q8_0Offset {
    /// From `rows` Q8_0 activation rows of n elements each, back to back in `acts`.
    pub fn new(acts: &[u8], rows: usize, n: usize) -> Q8_0Offset {
        let (nb, row_bytes) = (n / legacy::QK, act_row_bytes(ActFormat::Q8_0, n));
        assert!(n.is_multiple_of(legacy::QK) && acts.len() == rows * row_bytes, "Q8_0Offset: {rows} rows of {n} elements");
        let (mut quants, mut scales) = (vec![0u8; rows * n], vec![0f32; rows * nb]);
        for (blk, (q, d)) in acts.chunks_exact(legacy::Q8_0_BYTES).zip(quants.chunks_exact_mut(legacy::QK).zip(scales.iter_mut())) {
            *d = float::f16_at(blk, 0);
            for (o, &v) in q.iter_mut().zip(&blk[2..]) {
                *o = (v as i8 as i16 + 128) as u8;
            }
        }
        Q8_0Offset { quants, scales, rows, n }
    }

    fn quants(&self, row: usize) -> &[u8] {
        &self.quants[row * self.n..(row + 1) * self.n]
    }

    fn scales(&self, row: usize) -> &[f32] {
        let nb = self.n / legacy::QK;
        &self.scales[row * nb..(row + 1) * nb]
    }
}

/// Whether this CPU runs the Q8_0 prefill tile on the offset form (AVX-512 VNNI).
pub fn has_q8_0_offset_tile() -> bool {
    simd::level() == SimdLevel::Avx512Vnni
}

/// out[r][j] = `vec_dot(Q8_0, row r of w_rows, activation row first + j, n)` for the
/// `out.len()` consecutive weight rows in `w_rows`, bit for bit, where `acts` holds the Q8_0
/// activation rows (for an odd last block) and `off` the same rows in the offset form. Call only
/// where `has_q8_0_offset_tile()`.
pub fn vec_dot_rows_q8_0_offset<const T: usize>(w_rows: &[u8], acts: &[u8], off: &Q8_0Offset, first: usize, out: &mut [[f32; T]]) {
    assert!(has_q8_0_offset_tile(), "no Q8_0 offset tile kernel on this CPU");
    let n = off.n;
    let (row_bytes, act_bytes) = (GgmlType::Q8_0.row_bytes(n).unwrap_or(0), act_row_bytes(ActFormat::Q8_0, n));
    assert!(w_rows.len() == out.len() * row_bytes, "vec_dot_rows_q8_0_offset(n={n}): {} bytes for {} rows", w_rows.len(), out.len());
    assert!(first + T <= off.rows && acts.len() == off.rows * act_bytes, "vec_dot_rows_q8_0_offset: rows {first}+{T} of {}", off.rows);
    if out.is_empty() {
        return;
    }
    check_dot_args(GgmlType::Q8_0, &w_rows[..row_bytes], &acts[..act_bytes], n);
    let a_rows: [&[u8]; T] = std::array::from_fn(|j| &acts[(first + j) * act_bytes..(first + j + 1) * act_bytes]);
    let a_u8: [&[u8]; T] = std::array::from_fn(|j| off.quants(first + j));
    let a_d: [&[f32]; T] = std::array::from_fn(|j| off.scales(first + j));
    let ahead = simd::PREFETCH_ROWS * row_bytes;
    for (o, w) in out.iter_mut().zip(w_rows.chunks_exact(row_bytes)) {
        simd::prefetch(w.as_ptr().wrapping_add(ahead), row_bytes);
        *o = simd::dot_q8_0_offset_tile(w, a_u8, a_d, a_rows, n / legacy::QK);
    }
}
