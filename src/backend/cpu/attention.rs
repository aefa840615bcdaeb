//! The attention ops over the f16 KV cache: rows stored into the cache, and attention of
//! each token and GQA group as one work item on the pool. The kernels (f16 conversion, the
//! step-by-step row and the fused group kernels) are `quant::simd::attention`.

use super::{CpuBackend, CpuBuffer, CpuKvBuffer};
use crate::backend::{AttentionShape, KvBlocks};
use crate::quant::simd::attention as kernels;
use rayon::prelude::*;

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
    /// With `sinks` (gpt-oss), the step-by-step row kernel with each head's sink folded in
    /// after the last key, as ggml's CPU flash attention does for its single KV chunk.
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
        let q = q.as_slice();
        let kc = k_pool.as_slice();
        let vc = v_pool.as_slice();
        let o = out.as_mut_slice();
        let hd = s.head_dim;
        let kv_dim = s.n_head_kv * hd;
        let group = s.n_head / s.n_head_kv;
        let scale = 1.0 / (hd as f32).sqrt();
        let q_dim = s.n_head * hd;
        // One work item per token and GQA group: the group's query heads are adjacent in q
        // and in the output, and read the same K/V rows.
        let q_group = group * hd;
        self.timed("attention", s.n_tokens, || {
            self.pool.install(|| {
                let rows = s.first_row * q_dim..(s.first_row + s.n_tokens) * q_dim;
                let (q, o) = (&q[rows.clone()], &mut o[rows]);
                o.par_chunks_mut(q_group).enumerate().for_each_init(
                    || (vec![0u16; hd], vec![0f32; hd], kernels::GroupScratch::default()),
                    |(q16, acc, scratch), (idx, out_g)| {
                        let t = idx / s.n_head_kv;
                        let g = idx % s.n_head_kv;
                        let qg = &q[t * q_dim + g * q_group..t * q_dim + (g + 1) * q_group];
                        let end = s.start_pos + t + 1;
                        // A sliding-window layer sees only the last `window` positions.
                        let first = s.window.map_or(0, |w| end.saturating_sub(w));
                        let rows = kernels::KvRows { blocks, first, count: end - first, stride: kv_dim };
                        let (k, v) = (&kc[g * hd..], &vc[g * hd..]);
                        if let Some(sinks) = sinks {
                            let heads = &sinks[g * group..(g + 1) * group];
                            for ((qh, out_h), &sink) in qg.chunks(hd).zip(out_g.chunks_mut(hd)).zip(heads) {
                                kernels::attend_row_sink(qh, k, v, rows, scale, Some(sink), q16, acc, out_h);
                            }
                        } else if !kernels::attend_group(qg, hd, k, v, rows, scale, out_g, scratch) {
                            for (qh, out_h) in qg.chunks(hd).zip(out_g.chunks_mut(hd)) {
                                kernels::attend_row_steps(qh, k, v, rows, scale, q16, acc, out_h);
                            }
                        }
                    },
                );
            })
        })
    }
}
