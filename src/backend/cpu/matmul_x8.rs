//! One work item of a matmul whose Q4_K or Q8_0 weights were repacked eight rows per group at
//! load (`quant::q4_k_x8`, `quant::q8_0_x8`): each group of the item's rows against its tokens,
//! eight tokens per kernel call while eight are left (Q4_K; Q8_0's kernel is faster at four:
//! 142-162 vs 134 GMAC/s, `prefill_tile_bench q8_0x8 4|8 20`), then four, then the last one to
//! three.
//! The kernels' outputs do not depend on how tokens are grouped, so batched decode and prefill
//! give each sequence the bits a single-row matmul gives it.

use super::weights::{X8Layout, X8Rows};
use crate::quant::q4_k_x8::GROUP_ROWS;
use crate::quant::{q4_k_x8, q8_0_x8};
use std::ops::Range;

/// Rows `rows` (whole groups, or the tensor's end) of the repacked tensor `x8` (`k` columns)
/// against the activation rows `tokens` (`act(tok)`: Q8_K rows for Q4_K, rows prepared by
/// `q8_0_x8::prepare_act_row` for Q8_0); `store(tok, row, value)`.
pub(super) fn item<'a>(
    x8: X8Rows<'_>,
    k: usize,
    rows: Range<usize>,
    tokens: Range<usize>,
    act: &impl Fn(usize) -> &'a [u8],
    store: &impl Fn(usize, usize, f32),
) {
    match x8.layout {
        X8Layout::Q4K => groups(x8.bytes, q4_k_x8::repacked_bytes(GROUP_ROWS, k), Q4K, 8, k, rows, tokens, act, store),
        X8Layout::Q8_0 => groups(x8.bytes, q8_0_x8::repacked_bytes(GROUP_ROWS, k), Q8_0, 4, k, rows, tokens, act, store),
    }
}

/// One layout's kernel, `dot_group` at tile widths 1, 2, 3, 4 and 8.
trait DotGroup {
    fn dot<const T: usize>(&self, group: &[u8], acts: [&[u8]; T], k: usize, out: &mut [[f32; T]; GROUP_ROWS]);
}

macro_rules! dot_group_fn {
    ($name:ident, $f:path) => {
        struct $name;
        impl DotGroup for $name {
            fn dot<const T: usize>(&self, group: &[u8], acts: [&[u8]; T], k: usize, out: &mut [[f32; T]; GROUP_ROWS]) {
                $f(group, acts, k, out)
            }
        }
    };
}
dot_group_fn!(Q4K, q4_k_x8::dot_group);
dot_group_fn!(Q8_0, q8_0_x8::dot_group);

#[allow(clippy::too_many_arguments)]
fn groups<'a>(
    x8: &[u8],
    group_bytes: usize,
    kernel: impl DotGroup,
    widest: usize,
    k: usize,
    rows: Range<usize>,
    tokens: Range<usize>,
    act: &impl Fn(usize) -> &'a [u8],
    store: &impl Fn(usize, usize, f32),
) {
    debug_assert!(rows.start.is_multiple_of(GROUP_ROWS));
    for g0 in rows.clone().step_by(GROUP_ROWS) {
        let group = &x8[g0 / GROUP_ROWS * group_bytes..][..group_bytes];
        let mut tok = tokens.start;
        while widest >= 8 && tok + 8 <= tokens.end {
            tile::<8>(&kernel, group, k, g0, tok, act, store);
            tok += 8;
        }
        while tok + 4 <= tokens.end {
            tile::<4>(&kernel, group, k, g0, tok, act, store);
            tok += 4;
        }
        match tokens.end - tok {
            3 => tile::<3>(&kernel, group, k, g0, tok, act, store),
            2 => tile::<2>(&kernel, group, k, g0, tok, act, store),
            1 => tile::<1>(&kernel, group, k, g0, tok, act, store),
            _ => {}
        }
    }
}

fn tile<'a, const T: usize>(
    kernel: &impl DotGroup,
    group: &[u8],
    k: usize,
    g0: usize,
    tok: usize,
    act: &impl Fn(usize) -> &'a [u8],
    store: &impl Fn(usize, usize, f32),
) {
    let acts: [&[u8]; T] = std::array::from_fn(|j| act(tok + j));
    let mut out = [[0f32; T]; GROUP_ROWS];
    kernel.dot(group, acts, k, &mut out);
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
    use crate::quant::{self, q4_k_x8, q8_0_x8};
    use rand::{Rng, SeedableRng};
    use std::sync::Arc;

    const COLS: usize = 512;

    fn quantized_rows(t: GgmlType, rows: usize, r: &mut impl Rng) -> Vec<u8> {
        let row_bytes = t.row_bytes(COLS).unwrap();
        let mut data = vec![0u8; rows * row_bytes];
        for row in data.chunks_mut(row_bytes) {
            let x: Vec<f32> = (0..COLS).map(|_| r.gen::<f32>() * 2.0 - 1.0).collect();
            quant::quantize_row(t, &x, row).unwrap();
        }
        data
    }

    /// A file with a 40-row matrix of type t (repacked: whole groups) and a 36-row one (not).
    fn file(t: GgmlType) -> Arc<GgufFile> {
        let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut w = GgufWriter::new();
        w.add_tensor("a", &[COLS as u64, 40], t, quantized_rows(t, 40, &mut r)).unwrap();
        w.add_tensor("b", &[COLS as u64, 36], t, quantized_rows(t, 36, &mut r)).unwrap();
        Arc::new(GgufFile::parse_bytes(w.to_bytes().unwrap(), "x8.gguf").unwrap())
    }

    /// out[tok * rows + row] as the backend's matmul leaves it, for `tokens` activation rows.
    fn matmul(be: &CpuBackend, w: &crate::backend::cpu::CpuWeight, x: &[f32], tokens: usize) -> Vec<f32> {
        let mut out = vec![0f32; tokens * w.rows];
        be.matmul(w, &x.to_vec(), tokens, &mut out).unwrap();
        out
    }

    #[test]
    fn repacked_q4_k_matmuls_give_the_x8_order_for_every_token_count_and_row_view() {
        repacked_matmuls_give_the_x8_order(GgmlType::Q4_K, "matmul_q4_k_x8");
    }

    #[test]
    fn repacked_q8_0_matmuls_give_the_x8_order_for_every_token_count_and_row_view() {
        repacked_matmuls_give_the_x8_order(GgmlType::Q8_0, "matmul_q8_0_x8");
    }

    fn repacked_matmuls_give_the_x8_order(t: GgmlType, kernel: &str) {
        type DotModel = fn(&[u8], &[u8], usize) -> f32;
        let (available, dot_model): (bool, DotModel) = match t {
            GgmlType::Q4_K => (q4_k_x8::available(), q4_k_x8::dot_model),
            _ => (q8_0_x8::available(), q8_0_x8::dot_model),
        };
        let fmt = quant::act_format(t);
        let f = file(t);
        let repacking = CpuBackend::with_options(2, true).unwrap();
        let rows_only = CpuBackend::with_options(2, false).unwrap();
        let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(8);
        let x: Vec<f32> = (0..13 * COLS).map(|_| r.gen::<f32>() * 2.0 - 1.0).collect();
        let acts: Vec<Vec<u8>> = x
            .chunks(COLS)
            .map(|row| {
                let mut q = vec![0u8; quant::act_row_bytes(fmt, COLS)];
                quant::quantize_act_row(fmt, row, &mut q);
                q
            })
            .collect();
        let row_bytes = t.row_bytes(COLS).unwrap();
        for name in ["a", "b"] {
            let w = repacking.load_weight(&f, name).unwrap();
            let plain = rows_only.load_weight(&f, name).unwrap();
            // Repacked exactly where the CPU runs the kernel and the rows are whole groups.
            assert_eq!(w.data.x8().is_some(), available && name == "a", "{name}");
            if let Some(x) = w.data.x8() {
                assert_eq!(x.layout.kernel_name(), kernel);
            }
            assert!(plain.data.x8().is_none());
            let bytes = plain.data.bytes();
            for tokens in 1..=13 {
                let (got, rows) = (matmul(&repacking, &w, &x, tokens), matmul(&rows_only, &plain, &x, tokens));
                for tok in 0..tokens {
                    for row in 0..w.rows {
                        let w_row = &bytes[row * row_bytes..(row + 1) * row_bytes];
                        let want_rows = quant::vec_dot(t, w_row, &acts[tok], COLS);
                        assert_eq!(rows[tok * w.rows + row].to_bits(), want_rows.to_bits(), "{name} rows-only, {tokens} tokens");
                        let want = if w.data.x8().is_some() { dot_model(w_row, &acts[tok], COLS) } else { want_rows };
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
