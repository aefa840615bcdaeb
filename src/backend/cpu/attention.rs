//! The attention ops over the f16 KV cache: rows stored into the cache, and attention of
//! each token and GQA group as one work item on the pool. The kernels (f16 conversion, the
//! step-by-step row and the fused group kernels) are `quant::simd::attention`.

use super::{CpuBackend, CpuBuffer, CpuKvBuffer};
use crate::backend::{AttentionShape, KvBlocks, SeqAttention};
use crate::quant::simd::attention as kernels;
use std::cell::RefCell;

thread_local! {
    /// One thread's attention scratch: a head's q in f16, its accumulator, the group kernel's
    /// buffers. Nothing is carried from one work item to the next (each overwrites what it reads).
    static SCRATCH: RefCell<(Vec<u16>, Vec<f32>, kernels::GroupScratch)> = RefCell::new(Default::default());
}

impl CpuBackend {
    /// `Backend::kv_store_paged`: K and V rows rounded to f16 into their pool rows.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn kv_store_cpu(
        &self,
        k: &CpuBuffer,
        v: &CpuBuffer,
        k_pool: &mut CpuKvBuffer,
        v_pool: &mut CpuKvBuffer,
        src_row: usize,
        blocks: KvBlocks<'_>,
        start_pos: usize,
        n_tokens: usize,
        kv_dim: usize,
    ) {
        self.timed("kv_store", n_tokens, || {
            let (kp, vp) = (k_pool.as_mut_slice(), v_pool.as_mut_slice());
            // Runs of positions that stay inside one block are contiguous in the pool.
            let mut t = 0;
            while t < n_tokens {
                let pos = start_pos + t;
                let run = (blocks.block_size() - (pos & blocks.mask())).min(n_tokens - t);
                let (src, at, n) = ((src_row + t) * kv_dim, blocks.slot(pos) * kv_dim, run * kv_dim);
                kernels::f32_to_f16_row(&k.as_slice()[src..src + n], &mut kp[at..at + n]);
                kernels::f32_to_f16_row(&v.as_slice()[src..src + n], &mut vp[at..at + n]);
                t += run;
            }
        })
    }

    /// `Backend::attention` / `attention_paged`: llama.cpp's CPU flash attention (its default:
    /// flash_attn "auto" is on for the CPU backend) over the f16 cache (position p at pool row
    /// `blocks.slot(p)`), reproduced for greedy parity: ggml's per-row path
    /// (ggml_compute_forward_flash_attn_ext_f16_one_chunk), which llama.cpp runs for decode and
    /// for batches of fewer than 64 query rows: q rounded to f16, f16 K·q dots (exact products,
    /// f32 sums in ggml's AVX-512 lane order), online softmax with libm expf, the V accumulator
    /// kept in f16 (rounded after every scale and FMA), divided by the sum at the end.
    /// Batches of 64+ rows use this path too (llama.cpp switches to an f32 tiled kernel there),
    /// so a row's result does not depend on how the sequence was batched.
    ///
    /// With `sinks` (gpt-oss), each head's sink is folded in after the last key, as ggml's CPU
    /// flash attention does for its single KV chunk.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention_cpu(
        &self,
        q: &CpuBuffer,
        k_pool: &CpuKvBuffer,
        v_pool: &CpuKvBuffer,
        blocks: KvBlocks<'_>,
        s: AttentionShape,
        sinks: Option<&[f32]>,
        out: &mut CpuBuffer,
    ) {
        self.attention_many_cpu(q, k_pool, v_pool, &[SeqAttention { blocks, shape: s }], sinks, out)
    }

    /// `attention_cpu` of several sequences (`Backend::attention_paged_many`) as one parallel
    /// region: a work item is one token of one sequence and one GQA group (the group's query
    /// heads are adjacent in q and in the output and read the same K/V rows), so a decode step
    /// of 8 sequences is 8 x n_head_kv items on the pool at once (with 3 KV heads on 2 threads,
    /// one sequence alone leaves a thread idle a third of the time). Each item computes what
    /// it computes alone: the numbers do not depend on the batch.
    pub(super) fn attention_many_cpu(
        &self,
        q: &CpuBuffer,
        k_pool: &CpuKvBuffer,
        v_pool: &CpuKvBuffer,
        seqs: &[SeqAttention<'_>],
        sinks: Option<&[f32]>,
        out: &mut CpuBuffer,
    ) {
        let Some(first) = seqs.first() else { return };
        let s0 = first.shape;
        assert!(
            seqs.iter().all(|a| (a.shape.n_head, a.shape.n_head_kv, a.shape.head_dim, a.shape.window)
                == (s0.n_head, s0.n_head_kv, s0.head_dim, s0.window)),
            "attention of one layer: every sequence has the same heads"
        );
        let q = q.as_slice();
        let kc = k_pool.as_slice();
        let vc = v_pool.as_slice();
        let o = out.as_mut_slice();
        let hd = s0.head_dim;
        let kv_dim = s0.n_head_kv * hd;
        let group = s0.n_head / s0.n_head_kv;
        let scale = 1.0 / (hd as f32).sqrt();
        let q_dim = s0.n_head * hd;
        let q_group = group * hd;
        // The rows the sequences cover (a batch's rows are its sequences' rows, in order) and,
        // per row of that range, the sequence it belongs to.
        let row0 = seqs.iter().map(|a| a.shape.first_row).min().unwrap_or(0);
        let row1 = seqs.iter().map(|a| a.shape.first_row + a.shape.n_tokens).max().unwrap_or(0);
        let mut row_seq = vec![u32::MAX; row1 - row0];
        for (i, a) in seqs.iter().enumerate() {
            let rows = a.shape.first_row - row0..a.shape.first_row + a.shape.n_tokens - row0;
            assert!(row_seq[rows.clone()].iter().all(|&r| r == u32::MAX), "attention: two sequences share a row");
            row_seq[rows].fill(i as u32);
        }
        let n_tokens: usize = seqs.iter().map(|a| a.shape.n_tokens).sum();
        // An item is one GQA group of one row, or one query head where the groups would leave
        // threads idle (a 16-thread decode of a model with 3 KV heads: 3 items, each the work
        // of 3 heads). A head alone is the same arithmetic (`attend_group` is `attend_row_sink`
        // per head bit for bit), so the numbers do not depend on the split.
        let heads_per_item = if n_tokens * s0.n_head_kv < self.threads { 1 } else { group };
        let items_per_group = group / heads_per_item;
        let item_len = heads_per_item * hd;
        self.timed("attention", n_tokens, || {
            let (q, o) = (&q[row0 * q_dim..row1 * q_dim], &mut o[row0 * q_dim..row1 * q_dim]);
            self.pool.for_each_chunk_mut(o, item_len, |idx, out_g| {
                // Scratch per thread, kept between calls (either pool's threads live as long
                // as the backend).
                SCRATCH.with_borrow_mut(|(q16, acc, scratch)| {
                    q16.resize(hd, 0);
                    acc.resize(hd, 0.0);
                    let (row, g, part) = {
                        let per_row = s0.n_head_kv * items_per_group;
                        (idx / per_row, idx % per_row / items_per_group, idx % items_per_group)
                    };
                    let Some(a) = seqs.get(row_seq[row] as usize) else { return };
                    let t = row + row0 - a.shape.first_row;
                    let q0 = row * q_dim + g * q_group + part * item_len;
                    let qg = &q[q0..q0 + item_len];
                    let end = a.shape.start_pos + t + 1;
                    // A sliding-window layer sees only the last `window` positions.
                    let first = a.shape.window.map_or(0, |w| end.saturating_sub(w));
                    let rows = kernels::KvRows { blocks: a.blocks, first, count: end - first, stride: kv_dim };
                    let (k, v) = (&kc[g * hd..], &vc[g * hd..]);
                    let head0 = g * group + part * heads_per_item;
                    let sinks = sinks.map(|s| &s[head0..head0 + heads_per_item]);
                    if !kernels::attend_group(qg, hd, k, v, rows, scale, sinks, out_g, scratch) {
                        for (h, (qh, out_h)) in qg.chunks(hd).zip(out_g.chunks_mut(hd)).enumerate() {
                            let sink = sinks.map(|s| s[h]);
                            kernels::attend_row_sink(qh, k, v, rows, scale, sink, q16, acc, out_h);
                        }
                    }
                })
            });
        })
    }
}
