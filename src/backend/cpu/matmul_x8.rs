//! One work item of a matmul whose Q4_K weights were repacked eight rows per group at load
//! (`quant::q4_k_x8`): each group of the item's rows against its tokens, eight tokens per
//! kernel call while eight are left, then four, then the last one to three. The kernel's
//! outputs do not depend on how tokens are grouped, so batched decode and prefill give each
//! sequence the bits a single-row matmul gives it.

use crate::quant::q4_k_x8::{self, GROUP_ROWS};
use std::ops::Range;

/// Rows `rows` (whole groups, or the tensor's end) of the repacked tensor `x8` (`k` columns)
/// against the Q8_K activation rows `tokens` (`act(tok)`); `store(tok, row, value)`.
pub(super) fn item<'a>(
    x8: &[u8],
    k: usize,
    rows: Range<usize>,
    tokens: Range<usize>,
    act: &impl Fn(usize) -> &'a [u8],
    store: &impl Fn(usize, usize, f32),
) {
    let group_bytes = q4_k_x8::repacked_bytes(GROUP_ROWS, k);
    debug_assert!(rows.start.is_multiple_of(GROUP_ROWS));
    for g0 in rows.clone().step_by(GROUP_ROWS) {
        let group = &x8[g0 / GROUP_ROWS * group_bytes..][..group_bytes];
        let mut tok = tokens.start;
        while tok + 8 <= tokens.end {
            tile::<8>(group, k, g0, tok, act, store);
            tok += 8;
        }
        while tok + 4 <= tokens.end {
            tile::<4>(group, k, g0, tok, act, store);
            tok += 4;
        }
        match tokens.end - tok {
            3 => tile::<3>(group, k, g0, tok, act, store),
            2 => tile::<2>(group, k, g0, tok, act, store),
            1 => tile::<1>(group, k, g0, tok, act, store),
            _ => {}
        }
    }
}

fn tile<'a, const T: usize>(
    group: &[u8],
    k: usize,
    g0: usize,
    tok: usize,
    act: &impl Fn(usize) -> &'a [u8],
    store: &impl Fn(usize, usize, f32),
) {
    let acts: [&[u8]; T] = std::array::from_fn(|j| act(tok + j));
    let mut out = [[0f32; T]; GROUP_ROWS];
    q4_k_x8::dot_group(group, acts, k, &mut out);
    for (i, v) in out.iter().enumerate() {
        for (j, v) in v.iter().enumerate() {
            store(tok + j, g0 + i, *v);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::cpu::CpuBackend;
    use crate::backend::Backend;
    use crate::gguf::{GgmlType, GgufFile, GgufWriter};
    use crate::quant::{self, q4_k_x8, ActFormat};
    use rand::{Rng, SeedableRng};
    use std::sync::Arc;

    const COLS: usize = 512;

    fn q4_k_rows(rows: usize, r: &mut impl Rng) -> Vec<u8> {
        let row_bytes = GgmlType::Q4_K.row_bytes(COLS).unwrap();
        let mut data = vec![0u8; rows * row_bytes];
        for row in data.chunks_mut(row_bytes) {
            let x: Vec<f32> = (0..COLS).map(|_| r.gen::<f32>() * 2.0 - 1.0).collect();
            quant::quantize_row(GgmlType::Q4_K, &x, row).unwrap();
        }
        data
    }

    /// A file with a 40-row Q4_K matrix (repacked: whole groups) and a 36-row one (not).
    fn file() -> Arc<GgufFile> {
        let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut w = GgufWriter::new();
        w.add_tensor("a", &[COLS as u64, 40], GgmlType::Q4_K, q4_k_rows(40, &mut r)).unwrap();
        w.add_tensor("b", &[COLS as u64, 36], GgmlType::Q4_K, q4_k_rows(36, &mut r)).unwrap();
        Arc::new(GgufFile::parse_bytes(w.to_bytes().unwrap(), "x8.gguf").unwrap())
    }

    /// out[tok * rows + row] as the backend's matmul leaves it, for `tokens` activation rows.
    fn matmul(be: &CpuBackend, w: &crate::backend::cpu::CpuWeight, x: &[f32], tokens: usize) -> Vec<f32> {
        let mut out = vec![0f32; tokens * w.rows];
        be.matmul(w, &x.to_vec(), tokens, &mut out).unwrap();
        out
    }

    #[test]
    fn repacked_matmuls_give_the_x8_order_for_every_token_count_and_row_view() {
        let f = file();
        let repacking = CpuBackend::with_options(2, true).unwrap();
        let rows_only = CpuBackend::with_options(2, false).unwrap();
        let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(8);
        let x: Vec<f32> = (0..13 * COLS).map(|_| r.gen::<f32>() * 2.0 - 1.0).collect();
        let acts: Vec<Vec<u8>> = x
            .chunks(COLS)
            .map(|row| {
                let mut q = vec![0u8; quant::act_row_bytes(ActFormat::Q8_K, COLS)];
                quant::quantize_act_row(ActFormat::Q8_K, row, &mut q);
                q
            })
            .collect();
        let row_bytes = GgmlType::Q4_K.row_bytes(COLS).unwrap();
        for name in ["a", "b"] {
            let w = repacking.load_weight(&f, name).unwrap();
            let plain = rows_only.load_weight(&f, name).unwrap();
            // Repacked exactly where the CPU runs the kernel and the rows are whole groups.
            assert_eq!(w.data.x8().is_some(), q4_k_x8::available() && name == "a", "{name}");
            assert!(plain.data.x8().is_none());
            let bytes = plain.data.bytes();
            for tokens in [1, 2, 3, 4, 5, 8, 9, 13] {
                let (got, rows) = (matmul(&repacking, &w, &x, tokens), matmul(&rows_only, &plain, &x, tokens));
                for tok in 0..tokens {
                    for row in 0..w.rows {
                        let w_row = &bytes[row * row_bytes..(row + 1) * row_bytes];
                        let want_rows = quant::vec_dot(GgmlType::Q4_K, w_row, &acts[tok], COLS);
                        assert_eq!(rows[tok * w.rows + row].to_bits(), want_rows.to_bits(), "{name} rows-only, {tokens} tokens");
                        let want = if w.data.x8().is_some() { q4_k_x8::dot_model(w_row, &acts[tok], COLS) } else { want_rows };
                        assert_eq!(got[tok * w.rows + row].to_bits(), want.to_bits(), "{name}: token {tok} of {tokens}, row {row}");
                    }
                }
            }
        }
        // A row view of whole groups keeps the repacked copy and its results; one that cuts a
        // group falls back to the file's rows.
        let w = repacking.load_weight(&f, "a").unwrap();
        let whole = matmul(&repacking, &w, &x, 5);
        let view = repacking.weight_rows(&w, 16, 16, "a[16..32]").unwrap();
        assert_eq!(view.data.x8().is_some(), w.data.x8().is_some());
        let part = matmul(&repacking, &view, &x, 5);
        for tok in 0..5 {
            for row in 0..16 {
                assert_eq!(part[tok * 16 + row].to_bits(), whole[tok * 40 + 16 + row].to_bits());
            }
        }
        assert!(repacking.weight_rows(&w, 4, 8, "a[4..12]").unwrap().data.x8().is_none());
        // Fused weights, one repacked and one not, each get their own results.
        let (a, b) = (repacking.load_weight(&f, "a").unwrap(), repacking.load_weight(&f, "b").unwrap());
        let (mut oa, mut ob) = (vec![0f32; 3 * 40], vec![0f32; 3 * 36]);
        repacking.matmul_many(&[&a, &b], &x.to_vec(), 3, &mut [&mut oa, &mut ob]).unwrap();
        assert_eq!(oa, matmul(&repacking, &a, &x, 3));
        assert_eq!(ob, matmul(&repacking, &b, &x, 3));
    }
}
