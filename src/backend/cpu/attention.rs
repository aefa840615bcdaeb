//! The attention ops over the f16 KV cache: rows stored into the cache, and attention of
//! each token and GQA group as one work item on the pool. The kernels (f16 conversion, the
//! step-by-step row and the fused group kernels) are `quant::simd::attention`.

use super::{CpuBackend, CpuBuffer, CpuKvBuffer, SendPtr};
use crate::backend::{AttentionShape, KvBlocks, SeqAttention};
use crate::quant::simd::attention as kernels;
use std::cell::RefCell;

/// One thread's attention scratch: a head's q in f16, its accumulator, the group kernel's
/// buffers, the rows of a multi-row item. Nothing is carried from one work item to the next
/// (each overwrites what it reads).
type Scratch = (Vec<u16>, Vec<f32>, kernels::GroupScratch, Vec<f32>);

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Default::default());
}

/// Most query rows of one sequence in one work item (`kernels::attend_group_rows`): each block
/// of K/V rows is widened from f16 once for all of them.
const MAX_ROWS_PER_ITEM: usize = 16;

/// Query rows of one sequence that one work item attends for: `n` rows from the sequence's
/// row `t0`.
#[derive(Clone, Copy)]
struct RowSpan {
    seq: usize,
    t0: usize,
    n: usize,
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
        // The sequences' rows of q and out must not overlap: items write their rows' outputs
        // through one pointer (below).
        let mut ranges: Vec<_> = seqs.iter().map(|a| (a.shape.first_row, a.shape.first_row + a.shape.n_tokens)).collect();
        ranges.sort_unstable();
        assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "attention: two sequences share a row");
        let n_tokens: usize = seqs.iter().map(|a| a.shape.n_tokens).sum();
        // An item is one GQA group of one row, or one query head where the groups would leave
        // threads idle (a 16-thread decode of a model with 3 KV heads: 3 items, each the work
        // of 3 heads). A head alone is the same arithmetic (`attend_group` is `attend_row_sink`
        // per head bit for bit), so the numbers do not depend on the split.
        let heads_per_item = if n_tokens * s0.n_head_kv < self.threads { 1 } else { group };
        let items_per_group = group / heads_per_item;
        let item_len = heads_per_item * hd;
        // A prompt chunk's rows (no window: all of them read the cache from position 0) go up
        // to MAX_ROWS_PER_ITEM to an item, as long as there are about four items per thread:
        // its K/V rows are then read and widened once for those rows. Each row still gets the
        // one-row item's bits.
        let per_row_items = n_tokens * s0.n_head_kv * items_per_group;
        let rows_per_item = (per_row_items / (4 * self.threads)).clamp(1, MAX_ROWS_PER_ITEM);
        let mut spans = Vec::with_capacity(n_tokens);
        for (i, a) in seqs.iter().enumerate() {
            let span = if a.shape.window.is_none() { rows_per_item } else { 1 };
            for t0 in (0..a.shape.n_tokens).step_by(span) {
                spans.push(RowSpan { seq: i, t0, n: span.min(a.shape.n_tokens - t0) });
            }
        }
        let per_span = s0.n_head_kv * items_per_group;
        let out = SendPtr(o.as_mut_ptr());
        let o_len = o.len();
        self.timed("attention", n_tokens, || {
            self.pool.for_each(spans.len() * per_span, |idx| {
                // Scratch per thread, kept between calls (either pool's threads live as long
                // as the backend).
                SCRATCH.with_borrow_mut(|(q16, acc, scratch, rows_out)| {
                    q16.resize(hd, 0);
                    acc.resize(hd, 0.0);
                    let span = spans[idx / per_span];
                    let (g, part) = (idx % per_span / items_per_group, idx % items_per_group);
                    let a = &seqs[span.seq];
                    let (k, v) = (&kc[g * hd..], &vc[g * hd..]);
                    let head0 = g * group + part * heads_per_item;
                    let sinks = sinks.map(|s| &s[head0..head0 + heads_per_item]);
                    // Where row t of the sequence's query and output heads of this item start.
                    let at = |t: usize| (a.shape.first_row + t) * q_dim + g * q_group + part * item_len;
                    // SAFETY: rows of distinct spans, and the groups and parts of one row, are
                    // disjoint item_len ranges of `o` (spans cover each row once, a row's
                    // groups x parts tile its q_dim), so no two items write the same element.
                    let out_row = |t: usize| {
                        assert!(at(t) + item_len <= o_len);
                        unsafe { std::slice::from_raw_parts_mut(out.at(at(t)), item_len) }
                    };
                    let end = |t: usize| a.shape.start_pos + t + 1;
                    if span.n > 1 {
                        let rows = kernels::KvRows { blocks: a.blocks, first: 0, count: end(span.t0 + span.n - 1), stride: kv_dim };
                        rows_out.resize(span.n * item_len, 0.0);
                        let q_rows = &q[at(span.t0)..];
                        if kernels::attend_group_rows(q_rows, q_dim, span.n, hd, k, v, rows, end(span.t0), scale, sinks, rows_out, scratch)
                        {
                            for (r, row) in rows_out.chunks(item_len).enumerate() {
                                out_row(span.t0 + r).copy_from_slice(row);
                            }
                            return;
                        }
                    }
                    for t in span.t0..span.t0 + span.n {
                        let qg = &q[at(t)..at(t) + item_len];
                        let out_g = out_row(t);
                        // A sliding-window layer sees only the last `window` positions.
                        let first = a.shape.window.map_or(0, |w| end(t).saturating_sub(w));
                        let rows = kernels::KvRows { blocks: a.blocks, first, count: end(t) - first, stride: kv_dim };
                        if !kernels::attend_group(qg, hd, k, v, rows, scale, sinks, out_g, scratch) {
                            for (h, (qh, out_h)) in qg.chunks(hd).zip(out_g.chunks_mut(hd)).enumerate() {
                                let sink = sinks.map(|s| s[h]);
                                kernels::attend_row_sink(qh, k, v, rows, scale, sink, q16, acc, out_h);
                            }
                        }
                    }
                })
            });
        })
    }
}
