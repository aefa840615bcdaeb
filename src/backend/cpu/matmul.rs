//! Matmuls: the activation rows quantised once (Q8_0 / Q8_1 / Q8_K, like ggml), then the
//! quantised dot products (`crate::quant`, tiles of one weight row x up to four activation
//! rows where the type has them) over work items of weight rows x tokens on the pool.

use super::{CpuBackend, CpuBuffer, CpuWeight, SendPtr};
use crate::gguf::GgmlType;
use crate::quant;

fn matmul_kernel_name(t: GgmlType) -> &'static str {
    match t {
        GgmlType::F32 => "matmul_f32",
        GgmlType::F16 => "matmul_f16",
        GgmlType::BF16 => "matmul_bf16",
        GgmlType::Q8_0 => "matmul_q8_0",
        GgmlType::Q4_0 => "matmul_q4_0",
        GgmlType::Q4_1 => "matmul_q4_1",
        GgmlType::Q5_0 => "matmul_q5_0",
        GgmlType::Q5_1 => "matmul_q5_1",
        GgmlType::Q4_K => "matmul_q4_k",
        GgmlType::Q5_K => "matmul_q5_k",
        GgmlType::Q6_K => "matmul_q6_k",
        GgmlType::MXFP4 => "matmul_mxfp4",
        _ => "matmul_other",
    }
}

/// The most weight rows of one matmul work item (a 16-row block of a 2048-wide Q4_K matrix
/// is 18 KiB: it stays in L1 while four activation rows pass over it).
const MAX_BLOCK_ROWS: usize = 16;

/// How a matmul of `weight_rows` (all fused weights together) by `tokens` activation rows is
/// cut into work items of `block_rows` weight rows x `token_rows` activation rows. Aim: at
/// least `ITEMS_PER_THREAD` items per thread, so that the pool's dynamic claiming (rayon's
/// stealing, the spinning pool's lanes and their stealing) evens out the threads
/// (an item is then at most a quarter of a thread's share), with items as large as that
/// allows (weight blocks of up to 16 rows, token ranges in multiples of 4 for the 1 x 4 tiles).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MatmulSplit {
    block_rows: usize,
    token_rows: usize,
}

const ITEMS_PER_THREAD: usize = 4;

impl MatmulSplit {
    fn new(weight_rows: usize, tokens: usize, threads: usize) -> MatmulSplit {
        let want = (threads * ITEMS_PER_THREAD).max(1);
        // CpuWeight rows first: blocks of 16 down to 4 rows until there are `want` of them.
        // (Rounded down to a multiple of 4: rounding up would leave fewer items than wanted.)
        let block_rows = (weight_rows / want / 4 * 4).clamp(4, MAX_BLOCK_ROWS);
        let blocks = weight_rows.div_ceil(block_rows).max(1);
        // Then tokens, when the weight blocks alone are too few.
        let chunks = want.div_ceil(blocks).min(tokens.div_ceil(4)).max(1);
        let token_rows = if chunks == 1 { tokens.max(1) } else { (tokens / chunks / 4 * 4).max(4) };
        MatmulSplit { block_rows, token_rows }
    }
}

/// Stores a tile's results: out[i][j] is weight row r0 + i against activation row tok + j.
fn store_tile<const T: usize>(out: &[[f32; T]], tok: usize, r0: usize, store: &impl Fn(usize, usize, f32)) {
    for (i, v) in out.iter().enumerate() {
        for (j, v) in v.iter().enumerate() {
            store(tok + j, r0 + i, *v);
        }
    }
}

impl CpuBackend {
    /// Weights of one type and width (q/k/v, gate/up) share one activation quantisation and
    /// one parallel region; their row blocks are the work items of that region.
    pub(super) fn matmul_many_cpu(&self, ws: &[&CpuWeight], x: &CpuBuffer, rows: usize, outs: &mut [&mut CpuBuffer]) {
        assert_eq!(ws.len(), outs.len(), "matmul_many: one output per weight");
        let Some(first) = ws.first() else { return };
        let (t, k) = (first.ggml_type, first.cols);
        // Q4_K or Q8_0 repacked eight rows per group (matmul_x8.rs) where every weight here has
        // the copy. Weights of mixed types or widths, or a mix of repacked and row-by-row ones,
        // run one weight at a time.
        let x8 = ws.iter().all(|w| w.data.x8().is_some());
        let mixed = ws.iter().any(|w| w.ggml_type != t || w.cols != k || w.data.x8().is_some() != x8);
        if mixed {
            for (w, out) in ws.iter().zip(outs.iter_mut()) {
                self.matmul_many_cpu(&[w], x, rows, &mut [&mut **out]);
            }
            return;
        }
        let fmt = quant::act_format(t);
        let act_bytes = quant::act_row_bytes(fmt, k);
        let w_bytes = t.row_bytes(k).expect("weight row size checked at load");
        let x = x.as_slice();
        assert!(x.len() >= rows * k, "matmul {}: input too small", first.name);
        // Work items: a block of rows of one weight x a range of activation rows (tokens),
        // sized so that every thread gets several items of equal work (matmul_split).
        let total_rows: usize = ws.iter().map(|w| w.rows).sum();
        let split = MatmulSplit::new(total_rows, rows, self.threads);
        // The repacked kernel takes whole groups of eight rows.
        let block = if x8 { split.block_rows.next_multiple_of(quant::q4_k_x8::GROUP_ROWS) } else { split.block_rows };
        let mut jobs = Vec::with_capacity(ws.len());
        let mut blocks = 0;
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            let o = out.as_mut_slice();
            assert!(o.len() >= rows * w.rows, "matmul {}: output too small", w.name);
            jobs.push((w.data.bytes(), w.data.x8(), w.rows, SendPtr(o.as_mut_ptr()), blocks));
            blocks += w.rows.div_ceil(block);
        }
        let (tok_chunk, tok_chunks) = (split.token_rows, rows.div_ceil(split.token_rows));
        // The repacked kernel has its own name in profiles and metrics: runs with and without
        // `engine.cpu_repack` differ in it, not only in speed.
        let x8_layout = first.data.x8().map(|x| x.layout).filter(|_| x8);
        let kernel = x8_layout.map_or(matmul_kernel_name(t), |l| l.kernel_name());
        self.timed(kernel, rows, || {
            self.pool.install(|| {
                let mut acts = vec![0u8; act_bytes * rows];
                let quantize = |(r, dst): (usize, &mut [u8])| quant::quantize_act_row(fmt, &x[r * k..(r + 1) * k], dst);
                if rows >= 4 {
                    self.pool.for_each_chunk_mut(&mut acts, act_bytes, |r, dst| quantize((r, dst)));
                } else {
                    acts.chunks_mut(act_bytes).enumerate().for_each(quantize);
                }
                let act = |tok: usize| &acts[tok * act_bytes..(tok + 1) * act_bytes];
                // The repacked Q8_0 kernel reads its activation rows rearranged
                // (`quant::q8_0_x8::prepare_act_row`: two blocks' quants interleaved, f32 scales,
                // the -128 * sum(a) corrections of its unsigned weights).
                let x8_act_bytes = quant::q8_0_x8::act_bytes(k);
                let q8_0_x8_acts = (x8_layout == Some(super::weights::X8Layout::Q8_0)).then(|| {
                    let mut p = vec![0u8; x8_act_bytes * rows];
                    let prepare = |r: usize, dst: &mut [u8]| quant::q8_0_x8::prepare_act_row(act(r), k, dst);
                    if rows >= 4 {
                        self.pool.for_each_chunk_mut(&mut p, x8_act_bytes, prepare);
                    } else {
                        p.chunks_mut(x8_act_bytes).enumerate().for_each(|(r, d)| prepare(r, d));
                    }
                    p
                });
                let x8_act = |tok: usize| match &q8_0_x8_acts {
                    Some(p) => &p[tok * x8_act_bytes..(tok + 1) * x8_act_bytes],
                    None => act(tok),
                };
                // Within an item, where the type has tile kernels: one weight row by eight
                // activation rows while eight are left where `prefill_tile_rows` says 8 (the
                // AVX-512 Q4_K/Q5_K tiles; Q8_0 on AVX-512 reads its activations in the offset
                // form, `quant::Q8_0Offset`; Q4_1 takes the block's weight rows by eight
                // activation rows, in the eights form on AVX-512, `quant::Q8_1Eights`), then by
                // four while four are left (prefill: both sit in L1, each weight
                // block unpacked once per four dots; for Q4_1 the activation scales read as
                // f32, block-major), then one by the last two or three (batched decode); a
                // single activation row (all of plain decode) as one matrix-vector call over
                // the block's weight rows.
                let tiles = quant::has_dot_tile(t);
                let q8_0_offset = (t == GgmlType::Q8_0 && !x8 && rows >= 4 && quant::has_q8_0_offset_tile())
                    .then(|| quant::Q8_0Offset::new(&acts, rows, k));
                let q8_1_scales = (t == quant::GgmlType::Q4_1 && tiles && rows >= 4).then(|| quant::Q8_1Scales::new(&acts, rows, k));
                // Q4_1 on AVX-512: groups of eight activation rows in the eights form
                // (`quant::Q8_1Eights`), the batched decode's and prefill's main tile.
                // Its groups are filled on the pool from two groups on (serial, a 512-token
                // SmolLM2 prompt spent ~10 ms in this pass on one EPYC thread: 120 matmuls).
                let q8_1_eights = (t == quant::GgmlType::Q4_1 && rows >= 8 && quant::has_q4_1_eights_tile()).then(|| {
                    if rows >= 16 {
                        quant::Q8_1Eights::new_with(&acts, rows, k, |bytes, group_bytes, fill| {
                            self.pool.for_each_chunk_mut(bytes, group_bytes, fill)
                        })
                    } else {
                        quant::Q8_1Eights::new(&acts, rows, k)
                    }
                });
                self.pool.for_each(blocks * tok_chunks, |item| {
                    let (b, chunk) = (item / tok_chunks, item % tok_chunks);
                    let &(bytes, x8_rows, n, optr, first_block) =
                        jobs.iter().rev().find(|j| j.4 <= b).expect("block 0 belongs to the first weight");
                    let r0 = (b - first_block) * block;
                    let r1 = (r0 + block).min(n);
                    let (tok0, tok1) = (chunk * tok_chunk, ((chunk + 1) * tok_chunk).min(rows));
                    // SAFETY (every store below): (tok, r) pairs are disjoint across work items.
                    let store = |tok: usize, r: usize, v: f32| unsafe { *optr.at(tok * n + r) = v };
                    if let Some(x8_rows) = x8_rows {
                        return super::matmul_x8::item(x8_rows, k, r0..r1, tok0..tok1, &x8_act, &store);
                    }
                    let w_block = &bytes[r0 * w_bytes..r1 * w_bytes];
                    let mut tok = tok0;
                    if let Some(off) = &q8_0_offset {
                        let mut out8 = [[0f32; 8]; MAX_BLOCK_ROWS];
                        while tok + 8 <= tok1 {
                            quant::vec_dot_rows_q8_0_offset(w_block, &acts, off, tok, &mut out8[..r1 - r0]);
                            store_tile(&out8[..r1 - r0], tok, r0, &store);
                            tok += 8;
                        }
                        let mut out4 = [[0f32; 4]; MAX_BLOCK_ROWS];
                        while tok + 4 <= tok1 {
                            quant::vec_dot_rows_q8_0_offset(w_block, &acts, off, tok, &mut out4[..r1 - r0]);
                            store_tile(&out4[..r1 - r0], tok, r0, &store);
                            tok += 4;
                        }
                    } else if tiles && quant::prefill_tile_rows(t) == 8 {
                        let mut out8 = [[0f32; 8]; MAX_BLOCK_ROWS];
                        while tok + 8 <= tok1 {
                            let act8: [&[u8]; 8] = std::array::from_fn(|j| act(tok + j));
                            quant::vec_dot_rows_tile(t, w_block, act8, k, &mut out8[..r1 - r0]);
                            store_tile(&out8[..r1 - r0], tok, r0, &store);
                            tok += 8;
                        }
                    }
                    if tiles {
                        // Q4_1: eight activation rows at a time while eight are left (batched
                        // decode at 8+ sequences: each weight block unpacked once per eight),
                        // in the eights form on AVX-512 (its groups start at multiples of 8:
                        // an item's rows start at a multiple of 4, so at most one 4-row tile first).
                        if let (Some(eights), Some(scales)) = (&q8_1_eights, &q8_1_scales) {
                            if !tok.is_multiple_of(8) && tok + 4 <= tok1 {
                                let mut out4 = [[0f32; 4]; MAX_BLOCK_ROWS];
                                let act4 = [act(tok), act(tok + 1), act(tok + 2), act(tok + 3)];
                                quant::vec_dot_q4_1_rows::<1, 4>(w_block, act4, scales, tok, k, &mut out4[..r1 - r0]);
                                store_tile(&out4[..r1 - r0], tok, r0, &store);
                                tok += 4;
                            }
                            let mut out8 = [[0f32; 8]; MAX_BLOCK_ROWS];
                            while tok + 8 <= tok1.min(eights.rows()) {
                                quant::vec_dot_rows_q4_1_eights(w_block, eights, tok, &mut out8[..r1 - r0]);
                                store_tile(&out8[..r1 - r0], tok, r0, &store);
                                tok += 8;
                            }
                        } else if let Some(scales) = &q8_1_scales {
                            let mut out8 = [[0f32; 8]; MAX_BLOCK_ROWS];
                            while tok + 8 <= tok1 {
                                let act8 = std::array::from_fn(|j| act(tok + j));
                                quant::vec_dot_q4_1_rows::<2, 8>(w_block, act8, scales, tok, k, &mut out8[..r1 - r0]);
                                for (i, v) in out8[..r1 - r0].iter().enumerate() {
                                    for (j, v) in v.iter().enumerate() {
                                        store(tok + j, r0 + i, *v);
                                    }
                                }
                                tok += 8;
                            }
                        }
                        let mut tile_out = [[0f32; 4]; MAX_BLOCK_ROWS];
                        while tok + 4 <= tok1 {
                            let act4 = [act(tok), act(tok + 1), act(tok + 2), act(tok + 3)];
                            if let Some(scales) = &q8_1_scales {
                                quant::vec_dot_q4_1_rows::<1, 4>(w_block, act4, scales, tok, k, &mut tile_out[..r1 - r0]);
                            } else {
                                quant::vec_dot_rows_tile(t, w_block, act4, k, &mut tile_out[..r1 - r0]);
                            }
                            for (i, v) in tile_out[..r1 - r0].iter().enumerate() {
                                for (j, v) in v.iter().enumerate() {
                                    store(tok + j, r0 + i, *v);
                                }
                            }
                            tok += 4;
                        }
                        let rest = tok1 - tok;
                        if rest == 3 {
                            let mut out = [[0f32; 3]; MAX_BLOCK_ROWS];
                            quant::vec_dot_rows_tile(t, w_block, [act(tok), act(tok + 1), act(tok + 2)], k, &mut out[..r1 - r0]);
                            for (i, v) in out[..r1 - r0].iter().enumerate() {
                                for (j, v) in v.iter().enumerate() {
                                    store(tok + j, r0 + i, *v);
                                }
                            }
                            tok += 3;
                        } else if rest == 2 {
                            let mut out = [[0f32; 2]; MAX_BLOCK_ROWS];
                            quant::vec_dot_rows_tile(t, w_block, [act(tok), act(tok + 1)], k, &mut out[..r1 - r0]);
                            for (i, v) in out[..r1 - r0].iter().enumerate() {
                                for (j, v) in v.iter().enumerate() {
                                    store(tok + j, r0 + i, *v);
                                }
                            }
                            tok += 2;
                        }
                    }
                    let mut row_out = [0f32; MAX_BLOCK_ROWS];
                    for tok in tok..tok1 {
                        let out = &mut row_out[..r1 - r0];
                        quant::vec_dot_rows(t, w_block, act(tok), k, out);
                        for (i, v) in out.iter().enumerate() {
                            store(tok, r0 + i, *v);
                        }
                    }
                });
            })
        })
    }
}

#[cfg(test)]
mod split_tests {
    use super::{MatmulSplit, MAX_BLOCK_ROWS};

    #[test]
    fn matmul_split_gives_every_thread_several_items_and_covers_everything() {
        for threads in [1, 2, 4, 8, 16] {
            for weight_rows in [1, 5, 64, 192, 576, 960, 3072, 32000] {
                for tokens in [1, 2, 3, 4, 7, 64, 512] {
                    let s = MatmulSplit::new(weight_rows, tokens, threads);
                    assert!(s.block_rows >= 4 && s.block_rows <= MAX_BLOCK_ROWS && s.block_rows.is_multiple_of(4), "{s:?}");
                    assert!(s.token_rows >= 1 && (s.token_rows.is_multiple_of(4) || s.token_rows >= tokens), "{s:?}");
                    let items = weight_rows.div_ceil(s.block_rows) * tokens.div_ceil(s.token_rows);
                    // Enough items for 4 per thread whenever the matrix can be cut that fine.
                    let finest = weight_rows.div_ceil(4) * tokens.div_ceil(4);
                    assert!(items >= (4 * threads).min(finest), "{threads} threads, {weight_rows} x {tokens}: {s:?} gives {items} items");
                }
            }
        }
        // Decode on 2 threads keeps 16-row blocks on large matrices; prefill on 16 threads of a
        // SmolLM2-sized q/k/v cuts tokens too.
        assert_eq!(MatmulSplit::new(3072, 1, 2), MatmulSplit { block_rows: 16, token_rows: 1 });
        let s = MatmulSplit::new(960, 64, 16);
        assert!(960usize.div_ceil(s.block_rows) * 64usize.div_ceil(s.token_rows) >= 64, "{s:?}");
    }
}
