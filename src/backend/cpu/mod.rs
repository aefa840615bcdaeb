//! The CPU backend: rayon threads over the quantised dot products of `crate::quant`.
//!
//! Weights stay in the memory-mapped GGUF file (no copy); activations are f32 `Vec`s.
//! Matmuls quantise the activation rows once (Q8_0 / Q8_K, like ggml) and then run
//! integer block dot products in parallel over weight rows.

use super::{AttentionShape, Backend, Buffer, KvBlocks, RopeScaling, RopeStyle, Weight};
use crate::gguf::{GgmlType, GgufFile};
use crate::kernel_registry::{self, shape_class};
use crate::quant;
use anyhow::{bail, Context};
use rayon::prelude::*;
use std::sync::Arc;

pub struct CpuBackend {
    pool: rayon::ThreadPool,
    threads: usize,
}

/// A weight borrowed from the mmap of its file: the whole tensor, or a byte range of it (a
/// row view such as one expert of a 3-D expert tensor, see `weight_rows`).
struct CpuWeight {
    file: Arc<GgufFile>,
    index: usize,
    range: Option<std::ops::Range<usize>>,
}

impl CpuWeight {
    fn bytes(&self) -> &[u8] {
        let all = self.file.tensor_data(&self.file.tensors[self.index]);
        match &self.range {
            Some(r) => &all[r.clone()],
            None => all,
        }
    }
}

/// Raw pointer for disjoint parallel writes into one output slice.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// A method (not field access) so closures capture the whole Send wrapper.
    fn at(self, i: usize) -> *mut f32 {
        // SAFETY: callers stay inside the slice the pointer came from.
        unsafe { self.0.add(i) }
    }
}

fn buf(b: &Buffer) -> &[f32] {
    b.inner.downcast_ref::<Vec<f32>>().expect("CPU backend got a foreign buffer")
}

fn buf_mut(b: &mut Buffer) -> &mut [f32] {
    b.inner.downcast_mut::<Vec<f32>>().expect("CPU backend got a foreign buffer")
}

/// The f16 bits of a K or V cache made by `alloc_kv_cache`.
fn kv(b: &Buffer) -> &[u16] {
    b.inner.downcast_ref::<Vec<u16>>().expect("CPU backend got a foreign KV cache")
}

fn kv_mut(b: &mut Buffer) -> &mut [u16] {
    b.inner.downcast_mut::<Vec<u16>>().expect("CPU backend got a foreign KV cache")
}

fn weight(w: &Weight) -> &CpuWeight {
    w.inner.downcast_ref::<CpuWeight>().expect("CPU backend got a foreign weight")
}

impl CpuBackend {
    pub fn new(threads: usize) -> anyhow::Result<Self> {
        // 0: one thread per physical core of the affinity mask (cpu_topology).
        let threads = super::cpu_topology::CpuPlacement::detect().threads(threads);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("civetta-cpu-{i}"))
            .build()
            .context("creating the CPU thread pool")?;
        Ok(CpuBackend { pool, threads })
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    fn timed<R>(&self, kernel: &str, rows: usize, f: impl FnOnce() -> R) -> R {
        kernel_registry::time(kernel, shape_class(rows), "cpu", quant::simd_level(), f)
    }
}

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

/// Element-wise ops (norms, SwiGLU, residual adds) run on one thread below this many
/// elements (decode: a wake-up of the pool costs more than the op) and in chunks of
/// `PARALLEL_CHUNK` over the pool above it (prefill: 64 rows x 2048 is 131k elements).
const PARALLEL_ELEMS: usize = 32 * 1024;
const PARALLEL_CHUNK: usize = 8 * 1024;

/// The most weight rows of one matmul work item (a 16-row block of a 2048-wide Q4_K matrix
/// is 18 KiB: it stays in L1 while four activation rows pass over it).
const MAX_BLOCK_ROWS: usize = 16;

/// How a matmul of `weight_rows` (all fused weights together) by `tokens` activation rows is
/// cut into work items of `block_rows` weight rows x `token_rows` activation rows. Aim: at
/// least `ITEMS_PER_THREAD` items per thread, so that rayon's stealing evens out the threads
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
        // Weight rows first: blocks of 16 down to 4 rows until there are `want` of them.
        // (Rounded down to a multiple of 4: rounding up would leave fewer items than wanted.)
        let block_rows = (weight_rows / want / 4 * 4).clamp(4, MAX_BLOCK_ROWS);
        let blocks = weight_rows.div_ceil(block_rows).max(1);
        // Then tokens, when the weight blocks alone are too few.
        let chunks = want.div_ceil(blocks).min(tokens.div_ceil(4)).max(1);
        let token_rows = if chunks == 1 { tokens.max(1) } else { (tokens / chunks / 4 * 4).max(4) };
        MatmulSplit { block_rows, token_rows }
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn variant(&self) -> &'static str {
        quant::simd_level()
    }

    fn supports(&self, t: GgmlType) -> bool {
        quant::supports(t)
    }

    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> anyhow::Result<Weight> {
        let index = file
            .tensors
            .iter()
            .position(|t| t.name == name)
            .with_context(|| format!("{}: tensor \"{name}\" is missing", file.path.display()))?;
        let info = &file.tensors[index];
        if !quant::supports(info.ggml_type) {
            bail!("{}: tensor \"{name}\" has type {} which the CPU backend does not support", file.path.display(), info.ggml_type);
        }
        let cols = *info.dims.first().unwrap_or(&1) as usize;
        let rows = info.dims.iter().skip(1).product::<u64>() as usize;
        Ok(Weight {
            name: name.to_string(),
            ggml_type: info.ggml_type,
            rows,
            cols,
            inner: Box::new(CpuWeight { file: file.clone(), index, range: None }),
        })
    }

    fn weight_rows(&self, w: &Weight, first_row: usize, n_rows: usize, name: &str) -> anyhow::Result<Weight> {
        let cw = weight(w);
        if first_row + n_rows > w.rows {
            bail!("rows {first_row}..{} are outside \"{}\" ({} rows)", first_row + n_rows, w.name, w.rows);
        }
        let row_bytes = w.ggml_type.row_bytes(w.cols).with_context(|| format!("row size of \"{}\"", w.name))?;
        let base = cw.range.as_ref().map_or(0, |r| r.start);
        let start = base + first_row * row_bytes;
        Ok(Weight {
            name: name.to_string(),
            ggml_type: w.ggml_type,
            rows: n_rows,
            cols: w.cols,
            inner: Box::new(CpuWeight { file: cw.file.clone(), index: cw.index, range: Some(start..start + n_rows * row_bytes) }),
        })
    }

    fn scatter_rows(&self, src: &Buffer, rows: &[u32], dim: usize, dst: &mut Buffer) {
        let (s, d) = (buf(src), buf_mut(dst));
        self.timed("scatter_rows", rows.len(), || {
            for (i, &r) in rows.iter().enumerate() {
                let r = r as usize;
                d[r * dim..(r + 1) * dim].copy_from_slice(&s[i * dim..(i + 1) * dim]);
            }
        })
    }

    fn weighted_sum_rows(&self, src: &Buffer, weights: &[f32], n: usize, k: usize, dim: usize, out: &mut Buffer) {
        let (s, o) = (buf(src), buf_mut(out));
        self.timed("weighted_sum_rows", n, || super::weighted_sum_rows_host(s, weights, n, k, dim, o))
    }

    fn scale_rows(&self, x: &mut Buffer, scales: &[f32], dim: usize) {
        let x = buf_mut(x);
        self.timed("scale_rows", scales.len(), || super::scale_rows_host(x, scales, dim))
    }

    fn run(&self, pass: &mut (dyn FnMut() + Send)) {
        self.pool.install(pass)
    }

    fn alloc(&self, len: usize) -> anyhow::Result<Buffer> {
        Ok(Buffer { len, inner: Box::new(vec![0f32; len]) })
    }

    /// K and V caches hold f16 bits (`Vec<u16>`), as llama.cpp's default cache type.
    fn alloc_kv_cache(&self, len: usize) -> anyhow::Result<Buffer> {
        Ok(Buffer { len, inner: Box::new(vec![0u16; len]) })
    }

    fn kv_cache_elem_bytes(&self) -> usize {
        2
    }

    fn write(&self, dst: &mut Buffer, offset: usize, src: &[f32]) {
        buf_mut(dst)[offset..offset + src.len()].copy_from_slice(src);
    }

    fn read(&self, src: &Buffer, offset: usize, dst: &mut [f32]) {
        dst.copy_from_slice(&buf(src)[offset..offset + dst.len()]);
    }

    fn embed(&self, table: &Weight, tokens: &[u32], out: &mut Buffer) -> anyhow::Result<()> {
        let w = weight(table);
        let dim = table.cols;
        let row_bytes = table.ggml_type.row_bytes(dim).context("embedding row size")?;
        let bytes = w.bytes();
        let o = buf_mut(out);
        self.timed("embed", tokens.len(), || {
            for (t, &id) in tokens.iter().enumerate() {
                let id = id as usize;
                if id >= table.rows {
                    bail!("token id {id} is outside the vocabulary ({} tokens)", table.rows);
                }
                quant::dequantize_row(table.ggml_type, &bytes[id * row_bytes..(id + 1) * row_bytes], &mut o[t * dim..(t + 1) * dim])?;
            }
            Ok(())
        })
    }

    fn rmsnorm(&self, x: &Buffer, w: &Weight, rows: usize, dim: usize, eps: f32, out: &mut Buffer) {
        let x = buf(x);
        let o = buf_mut(out);
        let wv = weight_f32(w);
        self.timed("rmsnorm", rows, || {
            let norm = |(xr, or): (&[f32], &mut [f32])| rmsnorm_row(xr, &wv, eps, or);
            let (x, o) = (&x[..rows * dim], &mut o[..rows * dim]);
            if rows * dim >= PARALLEL_ELEMS {
                self.pool.install(|| x.par_chunks(dim).zip(o.par_chunks_mut(dim)).for_each(norm));
            } else {
                x.chunks(dim).zip(o.chunks_mut(dim)).for_each(norm);
            }
        })
    }

    fn rmsnorm_inplace(&self, x: &mut Buffer, w: &Weight, rows: usize, dim: usize, eps: f32) {
        let x = buf_mut(x);
        let wv = weight_f32(w);
        self.timed("rmsnorm", rows, || {
            let norm = |row: &mut [f32]| {
                let scale = rms_scale(row, eps);
                for (v, g) in row.iter_mut().zip(wv.iter()) {
                    *v = *v * scale * g;
                }
            };
            let x = &mut x[..rows * dim];
            if rows * dim >= PARALLEL_ELEMS {
                self.pool.install(|| x.par_chunks_mut(dim).for_each(norm));
            } else {
                x.chunks_mut(dim).for_each(norm);
            }
        })
    }

    fn matmul(&self, w: &Weight, x: &Buffer, rows: usize, out: &mut Buffer) {
        self.matmul_many(&[w], x, rows, &mut [out]);
    }

    /// Weights of one type and width (q/k/v, gate/up) share one activation quantisation and
    /// one parallel region; their row blocks are the work items of that region.
    fn matmul_many(&self, ws: &[&Weight], x: &Buffer, rows: usize, outs: &mut [&mut Buffer]) {
        assert_eq!(ws.len(), outs.len(), "matmul_many: one output per weight");
        let Some(first) = ws.first() else { return };
        let (t, k) = (first.ggml_type, first.cols);
        if ws.iter().any(|w| w.ggml_type != t || w.cols != k) {
            for (w, out) in ws.iter().zip(outs.iter_mut()) {
                self.matmul_many(&[w], x, rows, &mut [&mut **out]);
            }
            return;
        }
        let fmt = quant::act_format(t);
        let act_bytes = quant::act_row_bytes(fmt, k);
        let w_bytes = t.row_bytes(k).expect("weight row size checked at load");
        let x = buf(x);
        assert!(x.len() >= rows * k, "matmul {}: input too small", first.name);
        // Work items: a block of rows of one weight x a range of activation rows (tokens),
        // sized so that every thread gets several items of equal work (matmul_split).
        let total_rows: usize = ws.iter().map(|w| w.rows).sum();
        let split = MatmulSplit::new(total_rows, rows, self.threads);
        let block = split.block_rows;
        let mut jobs = Vec::with_capacity(ws.len());
        let mut blocks = 0;
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            let o = buf_mut(out);
            assert!(o.len() >= rows * w.rows, "matmul {}: output too small", w.name);
            jobs.push((weight(w).bytes(), w.rows, SendPtr(o.as_mut_ptr()), blocks));
            blocks += w.rows.div_ceil(block);
        }
        let (tok_chunk, tok_chunks) = (split.token_rows, rows.div_ceil(split.token_rows));
        self.timed(matmul_kernel_name(t), rows, || {
            self.pool.install(|| {
                let mut acts = vec![0u8; act_bytes * rows];
                let quantize = |(r, dst): (usize, &mut [u8])| quant::quantize_act_row(fmt, &x[r * k..(r + 1) * k], dst);
                if rows >= 4 {
                    acts.par_chunks_mut(act_bytes).enumerate().for_each(quantize);
                } else {
                    acts.chunks_mut(act_bytes).enumerate().for_each(quantize);
                }
                let act = |tok: usize| &acts[tok * act_bytes..(tok + 1) * act_bytes];
                // Within an item, where the type has tile kernels: one weight row by four
                // activation rows while four are left (prefill: both sit in L1, each weight
                // block unpacked once per four dots; for Q4_1 the activation scales read as
                // f32, block-major), then one by the last two or three (batched decode); a
                // single activation row (all of plain decode) as one matrix-vector call over
                // the block's weight rows.
                let tiles = quant::has_dot_tile(t);
                let q8_1_scales = (t == quant::GgmlType::Q4_1 && tiles && rows >= 4).then(|| quant::Q8_1Scales::new(&acts, rows, k));
                (0..blocks * tok_chunks).into_par_iter().for_each(|item| {
                    let (b, chunk) = (item / tok_chunks, item % tok_chunks);
                    let &(bytes, n, optr, first_block) = jobs.iter().rev().find(|j| j.3 <= b).expect("block 0 belongs to the first weight");
                    let r0 = (b - first_block) * block;
                    let r1 = (r0 + block).min(n);
                    let (tok0, tok1) = (chunk * tok_chunk, ((chunk + 1) * tok_chunk).min(rows));
                    let w_block = &bytes[r0 * w_bytes..r1 * w_bytes];
                    let weight_row = |r: usize| &bytes[r * w_bytes..(r + 1) * w_bytes];
                    // SAFETY (every store below): (tok, r) pairs are disjoint across work items.
                    let store = |tok: usize, r: usize, v: f32| unsafe { *optr.at(tok * n + r) = v };
                    let mut tok = tok0;
                    if tiles {
                        let mut tile_out = [[0f32; 4]; MAX_BLOCK_ROWS];
                        while tok + 4 <= tok1 {
                            let act4 = [act(tok), act(tok + 1), act(tok + 2), act(tok + 3)];
                            if let Some(scales) = &q8_1_scales {
                                for r in r0..r1 {
                                    tile_out[r - r0] = quant::vec_dot_q4_1_x4(weight_row(r), act4, scales, tok, k);
                                }
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

    fn add_bias(&self, x: &mut Buffer, b: &Weight, rows: usize) {
        let bv = weight_f32(b);
        let dim = bv.len();
        let x = buf_mut(x);
        self.timed("add_bias", rows, || {
            for r in 0..rows {
                for (v, bb) in x[r * dim..(r + 1) * dim].iter_mut().zip(bv.iter()) {
                    *v += bb;
                }
            }
        })
    }

    fn rope(&self, x: &mut Buffer, positions: &[u32], n_heads: usize, head_dim: usize, freq_base: f32, style: RopeStyle) {
        self.rope_cpu(x, positions, n_heads, head_dim, freq_base, style, None)
    }

    fn rope_scaled(
        &self,
        x: &mut Buffer,
        positions: &[u32],
        n_heads: usize,
        head_dim: usize,
        freq_base: f32,
        style: RopeStyle,
        scaling: RopeScaling,
    ) -> anyhow::Result<()> {
        self.rope_cpu(x, positions, n_heads, head_dim, freq_base, style, Some(scaling));
        Ok(())
    }

    fn kv_store(
        &self,
        k: &Buffer,
        v: &Buffer,
        k_cache: &mut Buffer,
        v_cache: &mut Buffer,
        src_row: usize,
        start_pos: usize,
        n_tokens: usize,
        kv_dim: usize,
    ) {
        self.kv_store_paged(k, v, k_cache, v_cache, src_row, KvBlocks::CONTIGUOUS, start_pos, n_tokens, kv_dim)
    }

    fn paged_kv(&self) -> bool {
        true
    }

    fn kv_store_paged(
        &self,
        k: &Buffer,
        v: &Buffer,
        k_pool: &mut Buffer,
        v_pool: &mut Buffer,
        src_row: usize,
        blocks: KvBlocks<'_>,
        start_pos: usize,
        n_tokens: usize,
        kv_dim: usize,
    ) {
        self.timed("kv_store", n_tokens, || {
            let (kp, vp) = (kv_mut(k_pool), kv_mut(v_pool));
            // Runs of positions that stay inside one block are contiguous in the pool.
            let mut t = 0;
            while t < n_tokens {
                let pos = start_pos + t;
                let run = (blocks.block_size() - (pos & blocks.mask())).min(n_tokens - t);
                let (src, at, n) = ((src_row + t) * kv_dim, blocks.slot(pos) * kv_dim, run * kv_dim);
                f16::f32_to_f16_row(&buf(k)[src..src + n], &mut kp[at..at + n]);
                f16::f32_to_f16_row(&buf(v)[src..src + n], &mut vp[at..at + n]);
                t += run;
            }
        })
    }

    /// llama.cpp's CPU flash attention (its default: flash_attn "auto" is on for the CPU
    /// backend) over the f16 cache, reproduced for greedy parity: ggml's per-row path
    /// (ggml_compute_forward_flash_attn_ext_f16_one_chunk), which llama.cpp runs for decode and
    /// for batches of fewer than 64 query rows: q rounded to f16, f16 K·q dots (exact products,
    /// f32 sums in ggml's AVX-512 lane order), online softmax with libm expf, the V accumulator
    /// kept in f16 (rounded after every scale and FMA), divided by the sum at the end.
    /// Batches of 64+ rows use this path too (llama.cpp switches to an f32 tiled kernel there),
    /// so a row's result does not depend on how the sequence was batched.
    fn attention(&self, q: &Buffer, k_cache: &Buffer, v_cache: &Buffer, s: AttentionShape, out: &mut Buffer) {
        self.attention_cpu(q, k_cache, v_cache, KvBlocks::CONTIGUOUS, s, None, out)
    }

    /// The paged form of `attention`: cache position p is pool row `blocks.slot(p)`. A
    /// contiguous cache is the one-block case, so both forms run the same arithmetic.
    fn attention_paged(&self, q: &Buffer, k_pool: &Buffer, v_pool: &Buffer, blocks: KvBlocks<'_>, s: AttentionShape, out: &mut Buffer) {
        self.attention_cpu(q, k_pool, v_pool, blocks, s, None, out)
    }

    /// The step-by-step row kernel with the sink folded in after the last key, as ggml's CPU
    /// flash attention does for its single KV chunk.
    fn attention_with_sinks(
        &self,
        q: &Buffer,
        k_cache: &Buffer,
        v_cache: &Buffer,
        blocks: KvBlocks<'_>,
        s: AttentionShape,
        sinks: &[f32],
        out: &mut Buffer,
    ) -> anyhow::Result<()> {
        anyhow::ensure!(sinks.len() == s.n_head, "{} attention sinks for {} heads", sinks.len(), s.n_head);
        self.attention_cpu(q, k_cache, v_cache, blocks, s, Some(sinks), out);
        Ok(())
    }
    /// silu(gate) * up with ggml's AVX-512 vector expf (ggml_v_expf / ggml_v_silu), which
    /// differs from libm's expf by up to ~1.5 ulp; the same numbers with or without AVX-512.
    fn silu_mul(&self, gate: &mut Buffer, up: &Buffer, n: usize) {
        let g = buf_mut(gate);
        let u = buf(up);
        self.timed("silu_mul", 1, || {
            let (g, u) = (&mut g[..n], &u[..n]);
            if n >= PARALLEL_ELEMS {
                // Chunks of a multiple of 16 elements: the same vector lanes as one call.
                self.pool
                    .install(|| g.par_chunks_mut(PARALLEL_CHUNK).zip(u.par_chunks(PARALLEL_CHUNK)).for_each(|(g, u)| silu::swiglu(g, u)));
            } else {
                silu::swiglu(g, u);
            }
        })
    }

    fn gelu_tanh_mul(&self, gate: &mut Buffer, up: &Buffer, n: usize) {
        let g = buf_mut(gate);
        let u = buf(up);
        self.timed("gelu_tanh_mul", 1, || super::geglu::geglu_ggml(&mut g[..n], &u[..n]))
    }

    fn scale(&self, x: &mut Buffer, n: usize, s: f32) {
        let xs = buf_mut(x);
        self.timed("scale", 1, || xs[..n].iter_mut().for_each(|v| *v *= s))
    }

    fn add(&self, x: &mut Buffer, y: &Buffer, n: usize) {
        let xs = buf_mut(x);
        let ys = buf(y);
        self.timed("add", 1, || {
            let add = |(xs, ys): (&mut [f32], &[f32])| xs.iter_mut().zip(ys).for_each(|(a, b)| *a += b);
            if n >= PARALLEL_ELEMS {
                self.pool.install(|| xs[..n].par_chunks_mut(PARALLEL_CHUNK).zip(ys[..n].par_chunks(PARALLEL_CHUNK)).for_each(add));
            } else {
                add((&mut xs[..n], &ys[..n]));
            }
        })
    }

    fn copy_row(&self, src: &Buffer, src_row: usize, dim: usize, dst: &mut Buffer) {
        buf_mut(dst)[..dim].copy_from_slice(&buf(src)[src_row * dim..(src_row + 1) * dim]);
    }

    fn gather_rows(&self, src: &Buffer, rows: &[usize], dim: usize, dst: &mut Buffer) {
        let (s, d) = (buf(src), buf_mut(dst));
        for (i, &r) in rows.iter().enumerate() {
            d[i * dim..(i + 1) * dim].copy_from_slice(&s[r * dim..(r + 1) * dim]);
        }
    }
}

/// Norm and bias vectors are small F32 (sometimes F16) tensors: dequantise on use.
fn weight_f32(w: &Weight) -> std::borrow::Cow<'_, [f32]> {
    let cw = weight(w);
    let bytes = cw.bytes();
    let n = w.rows * w.cols;
    if w.ggml_type == GgmlType::F32 && (bytes.as_ptr() as usize).is_multiple_of(4) {
        // SAFETY: F32 tensor data is 4-byte aligned (checked) and exactly n*4 bytes long.
        return std::borrow::Cow::Borrowed(unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const f32, n) });
    }
    let mut v = vec![0f32; n];
    quant::dequantize_row(w.ggml_type, bytes, &mut v).expect("norm weight dequantisation");
    std::borrow::Cow::Owned(v)
}

/// 1/rms as ggml's rms_norm: squares in f32, summed in f64 in order, mean rounded to f32.
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let ss: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (ss / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

fn rmsnorm_row(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let scale = rms_scale(x, eps);
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// The AVX-512 form of `f16::attend_group` (src/backend/cpu_attention_avx512.rs).
#[cfg(target_arch = "x86_64")]
#[path = "../cpu_attention_avx512.rs"]
mod attention_avx512;

/// f16 helpers of the attention: the same numbers on every path (the x86 one uses F16C and
/// FMA, the portable one `half` and `mul_add`, both round to nearest even and fuse the same
/// multiply-adds).
mod f16 {
    use once_cell::sync::Lazy;

    #[cfg(target_arch = "x86_64")]
    static X86: Lazy<bool> =
        Lazy::new(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c"));
    #[cfg(not(target_arch = "x86_64"))]
    static X86: Lazy<bool> = Lazy::new(|| false);

    fn to_f32(h: u16) -> f32 {
        half::f16::from_bits(h).to_f32()
    }

    fn round(x: f32) -> f32 {
        half::f16::from_f32(x).to_f32()
    }

    pub fn f32_to_f16_row(src: &[f32], dst: &mut [u16]) {
        #[cfg(target_arch = "x86_64")]
        if *X86 {
            // SAFETY: avx2/fma/f16c detected above.
            return unsafe { x86::f32_to_f16_row(src, dst) };
        }
        for (d, s) in dst.iter_mut().zip(src) {
            *d = half::f16::from_f32(*s).to_bits();
        }
    }

    /// ggml_vec_dot_f16 as ggml's AVX-512 build computes it: per 64 elements four 16-lane FMA
    /// accumulators; then acc0+acc2, acc1+acc3, their sum, and a halving tree over the 16
    /// lanes; a tail past the last multiple of 64 is added in f64.
    pub fn dot_f16(x: &[u16], y: &[u16]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if *X86 {
            // SAFETY: avx2/fma/f16c detected above; x and y have the same length.
            return unsafe { x86::dot_f16(x, y) };
        }
        let n = x.len();
        let np = n & !63;
        let mut acc = [[0f32; 16]; 4];
        for c in (0..np).step_by(64) {
            for (j, a) in acc.iter_mut().enumerate() {
                for (l, v) in a.iter_mut().enumerate() {
                    let i = c + 16 * j + l;
                    *v = to_f32(x[i]).mul_add(to_f32(y[i]), *v);
                }
            }
        }
        let mut r = [0f32; 16];
        for l in 0..16 {
            r[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
        }
        let mut w = 16;
        while w > 1 {
            w /= 2;
            for l in 0..w {
                r[l] += r[l + w];
            }
        }
        let mut sum = r[0] as f64;
        for i in np..n {
            sum += (to_f32(x[i]) * to_f32(y[i])) as f64;
        }
        sum as f32
    }

    /// acc = f16(acc * s) (ggml_vec_scale_f16 on an f16 accumulator).
    pub fn scale_rounded(acc: &mut [f32], s: f32) {
        #[cfg(target_arch = "x86_64")]
        if *X86 && acc.len().is_multiple_of(8) {
            // SAFETY: avx2/fma/f16c detected above.
            return unsafe { x86::scale_rounded(acc, s) };
        }
        for a in acc.iter_mut() {
            *a = round(*a * s);
        }
    }

    /// acc = f16(fma(v, s, acc)) (ggml_vec_mad_f16 on an f16 accumulator).
    pub fn mad_rounded(acc: &mut [f32], v: &[u16], s: f32) {
        #[cfg(target_arch = "x86_64")]
        if *X86 && acc.len().is_multiple_of(8) {
            // SAFETY: avx2/fma/f16c detected above; v is as long as acc.
            return unsafe { x86::mad_rounded(acc, v, s) };
        }
        for (a, h) in acc.iter_mut().zip(v) {
            *a = round(to_f32(*h).mul_add(s, *a));
        }
    }

    /// The cache rows one query attends over: positions first..first + count, each at pool
    /// row `blocks.slot(p)`, rows `stride` elements apart (offsets relative to the K/V slice
    /// the kernel gets, which starts at the head's column).
    #[derive(Clone, Copy)]
    pub struct KvRows<'a> {
        pub blocks: super::KvBlocks<'a>,
        pub first: usize,
        pub count: usize,
        pub stride: usize,
    }

    impl KvRows<'_> {
        /// Element offset of the j-th attended row.
        #[inline(always)]
        pub fn offset(&self, j: usize) -> usize {
            self.blocks.slot(self.first + j) * self.stride
        }

        /// The largest `offset` of any attended row (count > 0).
        pub fn max_offset(&self) -> usize {
            self.blocks.max_slot(self.first, self.count) * self.stride
        }
    }

    /// One query row's attention over `rows` cache positions (K and V rows `stride` apart,
    /// starting at k[0] and v[0]), step by step: q rounded to f16, `dot_f16`, online softmax
    /// with libm expf, the f16-rounded accumulator. Any head size; q16 and acc are scratch of
    /// the head size. The reference of `attend_group`, and its fallback.
    #[allow(clippy::too_many_arguments)]
    pub fn attend_row_steps(
        q: &[f32],
        k: &[u16],
        v: &[u16],
        rows: KvRows<'_>,
        scale: f32,
        q16: &mut [u16],
        acc: &mut [f32],
        out: &mut [f32],
    ) {
        attend_row_sink(q, k, v, rows, scale, None, q16, acc, out)
    }

    /// `attend_row_steps` with an optional attention sink: after the last key, ggml's
    /// correction (if sink > max: rescale the accumulator by exp(max - sink), sum * that + 1;
    /// else sum + exp(sink - max)).
    #[allow(clippy::too_many_arguments)]
    pub fn attend_row_sink(
        q: &[f32],
        k: &[u16],
        v: &[u16],
        rows: KvRows<'_>,
        scale: f32,
        sink: Option<f32>,
        q16: &mut [u16],
        acc: &mut [f32],
        out: &mut [f32],
    ) {
        let hd = q.len();
        f32_to_f16_row(q, q16);
        let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
        acc.fill(0.0);
        for j in 0..rows.count {
            let at = rows.offset(j);
            let sc = dot_f16(&k[at..at + hd], q16) * scale;
            let (mut ms, mut vs) = (1f32, 1f32);
            if sc > m {
                let old = m;
                m = sc;
                ms = (old - m).exp();
                scale_rounded(acc, ms);
            } else {
                vs = (sc - m).exp();
            }
            mad_rounded(acc, &v[at..at + hd], vs);
            sum = sum.mul_add(ms, vs);
        }
        if let Some(s) = sink {
            let (mut ms, mut vs) = (1f32, 1f32);
            if s > m {
                ms = (m - s).exp();
                scale_rounded(acc, ms);
            } else {
                vs = (s - m).exp();
            }
            sum = sum * ms + vs;
        }
        let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
        for (d, a) in out.iter_mut().zip(acc.iter()) {
            *d = a * inv;
        }
    }

    /// K/V rows converted to f32 per block in `attend_group` (16 KiB of scratch at head size 64).
    pub(super) const GROUP_BLOCK: usize = 32;

    /// The online-softmax steps of `attend_row_steps` for a block of scores, continuing the
    /// running max m and sum: per row, whether it is a new maximum (the accumulator is then
    /// rescaled by ms first), and the factors on the old accumulator (ms) and on V (vs).
    pub(super) struct SoftmaxSteps {
        pub(super) rescale: [bool; GROUP_BLOCK],
        pub(super) ms: [f32; GROUP_BLOCK],
        pub(super) vs: [f32; GROUP_BLOCK],
    }

    #[inline(always)]
    pub(super) fn softmax_steps(scores: &[f32], m: &mut f32, sum: &mut f32) -> SoftmaxSteps {
        let mut st = SoftmaxSteps { rescale: [false; GROUP_BLOCK], ms: [1.0; GROUP_BLOCK], vs: [1.0; GROUP_BLOCK] };
        let (mut mx, mut s) = (*m, *sum);
        for (j, &sc) in scores.iter().enumerate() {
            if sc > mx {
                let old = mx;
                mx = sc;
                st.ms[j] = (old - mx).exp();
                st.rescale[j] = true;
            } else {
                st.vs[j] = (sc - mx).exp();
            }
            s = s.mul_add(st.ms[j], st.vs[j]);
        }
        (*m, *sum) = (mx, s);
        st
    }

    /// Rows per block of `attend_group`: the f32 K and V of a block stay within 32 KiB (L1)
    /// up to head size 128; 16 rows at 256.
    pub(super) fn group_block_rows(hd: usize) -> usize {
        (GROUP_BLOCK * 128 / hd).min(GROUP_BLOCK)
    }

    /// Per-thread scratch of `attend_group`.
    #[derive(Default)]
    pub struct GroupScratch {
        pub(super) q: Vec<f32>,
        pub(super) k: Vec<f32>,
        pub(super) v: Vec<f32>,
        pub(super) acc: Vec<f32>,
        pub(super) m: Vec<f32>,
        pub(super) sum: Vec<f32>,
    }

    /// `attend_row_steps` for all query heads of one GQA group at once (`q` and `out` hold
    /// the group's heads one after another), bit for bit, with q and the accumulator in
    /// registers within each block of rows: the heads of a group read the same K/V rows, so
    /// each block of rows is converted from f16 once for all of them. Returns false (and does
    /// nothing) where no fused kernel exists: head sizes other than 64, 128 and 256 (Gemma 3),
    /// or a kernel level below AVX2 (`quant::kernel_level`, the dot products' level).
    #[allow(clippy::too_many_arguments)]
    pub fn attend_group(
        q: &[f32],
        hd: usize,
        k: &[u16],
        v: &[u16],
        rows: KvRows<'_>,
        scale: f32,
        out: &mut [f32],
        scratch: &mut GroupScratch,
    ) -> bool {
        attend_group_at(crate::quant::kernel_level(), q, hd, k, v, rows, scale, out, scratch)
    }

    /// `attend_group` with the kernels of an explicit level (for the tests): AVX-512 (the
    /// 16-lane form, same bits) at `Avx512Vnni`, AVX2 at `Avx2`, none at `Scalar` or where
    /// the CPU lacks the level.
    #[allow(clippy::too_many_arguments)]
    pub fn attend_group_at(
        level: crate::quant::SimdLevel,
        q: &[f32],
        hd: usize,
        k: &[u16],
        v: &[u16],
        rows: KvRows<'_>,
        scale: f32,
        out: &mut [f32],
        scratch: &mut GroupScratch,
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        use crate::quant::SimdLevel;
        #[cfg(target_arch = "x86_64")]
        if level >= SimdLevel::Avx2
            && level.available()
            && (hd == 64 || hd == 128 || hd == 256)
            && rows.count > 0
            && q.len().is_multiple_of(hd)
            && out.len() == q.len()
            && k.len() >= rows.max_offset() + hd
            && v.len() >= rows.max_offset() + hd
        {
            // SAFETY: the level's features are available (Avx2: avx2/fma/f16c; Avx512Vnni:
            // those and avx512f/bw/vl); the slice lengths cover every row read.
            unsafe {
                match (level, hd) {
                    (SimdLevel::Avx512Vnni, 64) => x86_512::attend_group::<4>(q, k, v, rows, scale, out, scratch),
                    (SimdLevel::Avx512Vnni, 128) => x86_512::attend_group::<8>(q, k, v, rows, scale, out, scratch),
                    (SimdLevel::Avx512Vnni, _) => x86_512::attend_group::<16>(q, k, v, rows, scale, out, scratch),
                    (_, 64) => x86::attend_group::<8>(q, k, v, rows, scale, out, scratch),
                    (_, 128) => x86::attend_group::<16>(q, k, v, rows, scale, out, scratch),
                    _ => x86::attend_group::<32>(q, k, v, rows, scale, out, scratch),
                }
            }
            return true;
        }
        let _ = (level, q, hd, k, v, rows, scale, out, scratch);
        false
    }

    #[cfg(target_arch = "x86_64")]
    use super::attention_avx512 as x86_512;

    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use super::{GroupScratch, KvRows, GROUP_BLOCK};
        use std::arch::x86_64::*;

        /// `attend_group` for head size 8 * HD8.
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn attend_group<const HD8: usize>(
            q: &[f32],
            k: &[u16],
            v: &[u16],
            kv_rows: KvRows<'_>,
            scale: f32,
            out: &mut [f32],
            scratch: &mut GroupScratch,
        ) {
            let hd = 8 * HD8;
            let rows = kv_rows.count;
            let heads = q.len() / hd;
            let GroupScratch { q: qr, k: kf, v: vf, acc, m, sum } = scratch;
            for buf in [&mut *qr, &mut *acc] {
                buf.clear();
                buf.resize(q.len(), 0.0);
            }
            for buf in [&mut *kf, &mut *vf] {
                buf.resize(GROUP_BLOCK * hd, 0.0);
            }
            m.clear();
            m.resize(heads, f32::NEG_INFINITY);
            sum.clear();
            sum.resize(heads, 0.0);
            for i in (0..q.len()).step_by(8) {
                _mm256_storeu_ps(qr.as_mut_ptr().add(i), round(_mm256_loadu_ps(q.as_ptr().add(i))));
            }
            let block = super::group_block_rows(hd);
            for j0 in (0..rows).step_by(block) {
                let n = block.min(rows - j0);
                for j in 0..n {
                    let at = kv_rows.offset(j0 + j);
                    let (kp, vp) = (k.as_ptr().add(at), v.as_ptr().add(at));
                    for c in 0..HD8 {
                        _mm256_storeu_ps(kf.as_mut_ptr().add(j * hd + 8 * c), load_h(kp.add(8 * c)));
                        _mm256_storeu_ps(vf.as_mut_ptr().add(j * hd + 8 * c), load_h(vp.add(8 * c)));
                    }
                }
                for h in 0..heads {
                    let (qh, acc_h) = (qr.as_ptr().add(h * hd), acc.as_mut_ptr().add(h * hd));
                    attend_block::<HD8>(qh, kf.as_ptr(), vf.as_ptr(), n, scale, &mut m[h], &mut sum[h], acc_h);
                }
            }
            for (h, &total) in sum.iter().enumerate() {
                let inv = _mm256_set1_ps(if total == 0.0 { 0.0 } else { 1.0 / total });
                for c in 0..HD8 {
                    let i = h * hd + 8 * c;
                    _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_mul_ps(_mm256_loadu_ps(acc.as_ptr().add(i)), inv));
                }
            }
        }

        /// `attend_row_steps`' loop over n <= GROUP_BLOCK rows of f32 K and V (contiguous, 8 *
        /// HD8 apart) for one head whose rounded q is at `q`, continuing the online softmax in
        /// m, sum and acc. The same operations in three passes: all scores (independent dots),
        /// then the scalar softmax steps (the exps only wait on the running max), then the
        /// accumulator updates (a pure vector chain). Interleaved in one loop per row, the exp
        /// latency and the rounded accumulator chain serialise each row (measured on a noisy
        /// VM: the one-loop kernel took 1.1-1.6x as long per prefill attention call).
        #[allow(clippy::too_many_arguments)]
        #[inline(always)]
        unsafe fn attend_block<const HD8: usize>(
            q: *const f32,
            k: *const f32,
            v: *const f32,
            n: usize,
            scale: f32,
            m: &mut f32,
            sum: &mut f32,
            acc: *mut f32,
        ) {
            debug_assert!(n <= GROUP_BLOCK);
            let qv: [__m256; HD8] = std::array::from_fn(|c| _mm256_loadu_ps(q.add(8 * c)));
            let mut scores = [0f32; GROUP_BLOCK];
            for (j, sc) in scores.iter_mut().enumerate().take(n) {
                let kp = k.add(j * 8 * HD8);
                // dot_f16's order: per 64 elements, lo[i]/hi[i] hold lanes 0..7/8..15 of
                // the i-th 16-lane accumulator.
                let mut lo = [_mm256_setzero_ps(); 4];
                let mut hi = [_mm256_setzero_ps(); 4];
                for c in 0..HD8 / 8 {
                    for i in 0..4 {
                        let e = 64 * c + 16 * i;
                        lo[i] = _mm256_fmadd_ps(_mm256_loadu_ps(kp.add(e)), qv[e / 8], lo[i]);
                        hi[i] = _mm256_fmadd_ps(_mm256_loadu_ps(kp.add(e + 8)), qv[e / 8 + 1], hi[i]);
                    }
                }
                *sc = reduce_lanes(lo, hi) * scale;
            }
            let st = super::softmax_steps(&scores[..n], m, sum);
            // The accumulator stays in registers across the rows: all of it up to head size
            // 128, 128 columns at a time above (head size 256 would need 32 of the 16 ymm
            // registers); each column's operations and their row order are the same.
            let steps = (&st.rescale[..n], &st.ms[..n], &st.vs[..n]);
            if HD8 <= 16 {
                accumulate::<HD8>(acc, v, 8 * HD8, steps);
            } else {
                for g in 0..HD8 / 16 {
                    accumulate::<16>(acc.add(128 * g), v.add(128 * g), 8 * HD8, steps);
                }
            }
        }

        /// The accumulator updates of `attend_block` for 8 * W columns: per row j, rescale by
        /// ms[j] where the row set a new maximum, then acc = f16(fma(v_j, vs[j], acc)); V rows
        /// `stride` floats apart.
        #[inline(always)]
        unsafe fn accumulate<const W: usize>(acc: *mut f32, v: *const f32, stride: usize, (rescale, ms, vs): (&[bool], &[f32], &[f32])) {
            let mut av: [__m256; W] = std::array::from_fn(|c| _mm256_loadu_ps(acc.add(8 * c)));
            for j in 0..vs.len() {
                if rescale[j] {
                    let msv = _mm256_set1_ps(ms[j]);
                    for a in av.iter_mut() {
                        *a = round(_mm256_mul_ps(*a, msv));
                    }
                }
                let vp = v.add(j * stride);
                let vsv = _mm256_set1_ps(vs[j]);
                for (c, a) in av.iter_mut().enumerate() {
                    *a = round(_mm256_fmadd_ps(_mm256_loadu_ps(vp.add(8 * c)), vsv, *a));
                }
            }
            for (c, a) in av.iter().enumerate() {
                _mm256_storeu_ps(acc.add(8 * c), *a);
            }
        }

        #[inline(always)]
        unsafe fn load_h(p: *const u16) -> __m256 {
            _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
        }

        #[inline(always)]
        unsafe fn round(v: __m256) -> __m256 {
            _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
        }

        /// The sum of dot_f16's four 16-lane accumulators (lanes 0..7 in lo[i], 8..15 in
        /// hi[i]) in ggml's order: acc0 + acc2, acc1 + acc3, their sum, then the lanes.
        #[inline(always)]
        unsafe fn reduce_lanes(lo: [__m256; 4], hi: [__m256; 4]) -> f32 {
            let l = _mm256_add_ps(_mm256_add_ps(lo[0], lo[2]), _mm256_add_ps(lo[1], lo[3]));
            let h = _mm256_add_ps(_mm256_add_ps(hi[0], hi[2]), _mm256_add_ps(hi[1], hi[3]));
            hsum(_mm256_add_ps(l, h))
        }

        /// Lane l + lane l+4, then +2, then +1 (as _mm512_reduce_add_ps after its first fold).
        #[inline(always)]
        unsafe fn hsum(v: __m256) -> f32 {
            let s = _mm_add_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }

        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn f32_to_f16_row(src: &[f32], dst: &mut [u16]) {
            let n = src.len().min(dst.len());
            let n8 = n & !7;
            for i in (0..n8).step_by(8) {
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.as_ptr().add(i)));
                _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
            }
            for i in n8..n {
                dst[i] = half::f16::from_f32(src[i]).to_bits();
            }
        }

        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn dot_f16(x: &[u16], y: &[u16]) -> f32 {
            let n = x.len().min(y.len());
            let np = n & !63;
            let (xp, yp) = (x.as_ptr(), y.as_ptr());
            // acc[j] lanes 0..7 in lo[j], 8..15 in hi[j].
            let mut lo = [_mm256_setzero_ps(); 4];
            let mut hi = [_mm256_setzero_ps(); 4];
            for c in (0..np).step_by(64) {
                for j in 0..4 {
                    let i = c + 16 * j;
                    lo[j] = _mm256_fmadd_ps(load_h(xp.add(i)), load_h(yp.add(i)), lo[j]);
                    hi[j] = _mm256_fmadd_ps(load_h(xp.add(i + 8)), load_h(yp.add(i + 8)), hi[j]);
                }
            }
            let mut sum = reduce_lanes(lo, hi) as f64;
            for i in np..n {
                sum += (half::f16::from_bits(x[i]).to_f32() * half::f16::from_bits(y[i]).to_f32()) as f64;
            }
            sum as f32
        }

        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn scale_rounded(acc: &mut [f32], s: f32) {
            let sv = _mm256_set1_ps(s);
            for i in (0..acc.len()).step_by(8) {
                let p = acc.as_mut_ptr().add(i);
                _mm256_storeu_ps(p, round(_mm256_mul_ps(_mm256_loadu_ps(p), sv)));
            }
        }

        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn mad_rounded(acc: &mut [f32], v: &[u16], s: f32) {
            let sv = _mm256_set1_ps(s);
            for i in (0..acc.len().min(v.len())).step_by(8) {
                let p = acc.as_mut_ptr().add(i);
                _mm256_storeu_ps(p, round(_mm256_fmadd_ps(load_h(v.as_ptr().add(i)), sv, _mm256_loadu_ps(p))));
            }
        }
    }
}

/// ggml's vectorised SiLU: x / (1 + v_expf(-x)), v_expf being its AVX-512 port of the Arm
/// optimized-routines expf (range reduction by n = round(x / ln 2), degree-5 polynomial,
/// scalef). Written here from the algorithm, element by element with fused multiply-adds, so
/// the portable and AVX-512 paths give identical bits.
mod silu {
    const R: f32 = 12582912.0; // 0x1.8p23
    const LOG2E: f32 = f32::from_bits(0x3fb8_aa3b); // 0x1.715476p+0
    const LN2_HI: f32 = f32::from_bits(0x3f31_7200); // 0x1.62e4p-1
    const LN2_LO: f32 = f32::from_bits(0x35bf_be8e); // 0x1.7f7d1cp-20
    const C5: f32 = f32::from_bits(0x3c07_2010); // 0x1.0e4020p-7
    const C4: f32 = f32::from_bits(0x3d2b_9f17); // 0x1.573e2ep-5
    const C3: f32 = f32::from_bits(0x3e2a_af33); // 0x1.555e66p-3
    const C2: f32 = f32::from_bits(0x3eff_fedb); // 0x1.fffdb6p-2
    const C1: f32 = f32::from_bits(0x3f7f_fff6); // 0x1.ffffecp-1

    pub(super) fn v_expf(x: f32) -> f32 {
        let z = x.mul_add(LOG2E, R);
        let n = z - R;
        let b = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
        let u = b * b;
        let j = C5.mul_add(b, C4).mul_add(u, C3.mul_add(b, C2)).mul_add(u, C1.mul_add(b, 1.0));
        if n.abs() > 192.0 {
            return if n <= 0.0 { 0.0 } else { f32::INFINITY };
        }
        scalef(j, n)
    }

    /// j * 2^n for integral n in [-192, 192] (as vscalefps: one rounding).
    fn scalef(j: f32, n: f32) -> f32 {
        (j as f64 * (n as f64).exp2()) as f32
    }

    pub(super) fn swiglu(g: &mut [f32], u: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx512f") {
            // SAFETY: avx512f detected.
            return unsafe { swiglu_avx512(g, u) };
        }
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: avx2 and fma detected.
            return unsafe { swiglu_avx2(g, u) };
        }
        swiglu_scalar(g, u);
    }

    /// silu(g) * u element by element (the portable path, and the SIMD paths' tails).
    fn swiglu_scalar(g: &mut [f32], u: &[f32]) {
        for (a, b) in g.iter_mut().zip(u) {
            *a = *a / (1.0 + v_expf(-*a)) * b;
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn swiglu_avx512(g: &mut [f32], u: &[f32]) {
        use std::arch::x86_64::*;
        let n = g.len().min(u.len());
        let n16 = n & !15;
        let set = _mm512_set1_ps;
        for i in (0..n16).step_by(16) {
            let x = _mm512_loadu_ps(g.as_ptr().add(i));
            let nx = _mm512_sub_ps(_mm512_setzero_ps(), x);
            let z = _mm512_fmadd_ps(nx, set(LOG2E), set(R));
            let nn = _mm512_sub_ps(z, set(R));
            let b = _mm512_fnmadd_ps(nn, set(LN2_LO), _mm512_fnmadd_ps(nn, set(LN2_HI), nx));
            let d = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(nn), set(192.0));
            let uu = _mm512_mul_ps(b, b);
            let j = _mm512_fmadd_ps(
                _mm512_fmadd_ps(_mm512_fmadd_ps(set(C5), b, set(C4)), uu, _mm512_fmadd_ps(set(C3), b, set(C2))),
                uu,
                _mm512_fmadd_ps(set(C1), b, set(1.0)),
            );
            let mut e = _mm512_scalef_ps(j, nn);
            if d != 0 {
                let le = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(nn, _mm512_setzero_ps());
                let alt = _mm512_mask_blend_ps(le, set(f32::INFINITY), _mm512_setzero_ps());
                e = _mm512_mask_blend_ps(d, e, alt);
            }
            let silu = _mm512_div_ps(x, _mm512_add_ps(set(1.0), e));
            _mm512_storeu_ps(g.as_mut_ptr().add(i), _mm512_mul_ps(silu, _mm512_loadu_ps(u.as_ptr().add(i))));
        }
        swiglu_scalar(&mut g[n16..n], &u[n16..n]);
    }

    /// The AVX-512 arithmetic on 8 lanes: vscalefps(j, n) is j * 2^n with one rounding, which
    /// for |n| <= 126 is one multiply by the exact power of two built from n's bits. Chunks with
    /// a lane outside that range (|x| > ~87, rare) take the scalar path, which handles them.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn swiglu_avx2(g: &mut [f32], u: &[f32]) {
        use std::arch::x86_64::*;
        let n = g.len().min(u.len());
        let n8 = n & !7;
        let set = _mm256_set1_ps;
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let mut i = 0;
        while i < n8 {
            let x = _mm256_loadu_ps(g.as_ptr().add(i));
            let nx = _mm256_sub_ps(_mm256_setzero_ps(), x);
            let z = _mm256_fmadd_ps(nx, set(LOG2E), set(R));
            let nn = _mm256_sub_ps(z, set(R));
            let out_of_range = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(_mm256_and_ps(nn, abs_mask), set(126.0)));
            if out_of_range != 0 {
                swiglu_scalar(&mut g[i..i + 8], &u[i..i + 8]);
                i += 8;
                continue;
            }
            let b = _mm256_fnmadd_ps(nn, set(LN2_LO), _mm256_fnmadd_ps(nn, set(LN2_HI), nx));
            let uu = _mm256_mul_ps(b, b);
            let j = _mm256_fmadd_ps(
                _mm256_fmadd_ps(_mm256_fmadd_ps(set(C5), b, set(C4)), uu, _mm256_fmadd_ps(set(C3), b, set(C2))),
                uu,
                _mm256_fmadd_ps(set(C1), b, set(1.0)),
            );
            let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(nn), _mm256_set1_epi32(127))));
            let e = _mm256_mul_ps(j, pow2);
            let silu = _mm256_div_ps(x, _mm256_add_ps(set(1.0), e));
            _mm256_storeu_ps(g.as_mut_ptr().add(i), _mm256_mul_ps(silu, _mm256_loadu_ps(u.as_ptr().add(i))));
            i += 8;
        }
        swiglu_scalar(&mut g[n8..n], &u[n8..n]);
    }

    #[cfg(test)]
    mod tests {
        /// Inputs across the whole range: the polynomial's domain, subnormal exp(-x), the
        /// out-of-range chunks (|x| > 87) and the infinities.
        fn inputs() -> (Vec<f32>, Vec<f32>) {
            let mut x: Vec<f32> = (0..4096).map(|i| (i as f32 - 2048.0) * 0.013 + (i % 7) as f32 * 1e-3).collect();
            x.extend((0..400).map(|i| (i as f32 - 200.0) * 0.55));
            x.extend([87.3, -87.3, 88.7, -88.7, 103.0, -103.0, 150.0, -150.0, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1e-30, -1e-30]);
            let u = (0..x.len()).map(|i| 1.0 + (i % 5) as f32 * 0.25).collect();
            (x, u)
        }

        fn assert_matches_portable(x: &[f32], u: &[f32], got: &[f32]) {
            for i in 0..x.len() {
                let want = x[i] / (1.0 + super::v_expf(-x[i])) * u[i];
                assert_eq!(got[i].to_bits(), want.to_bits(), "x = {}: {} vs {want}", x[i], got[i]);
            }
        }

        #[cfg(target_arch = "x86_64")]
        #[test]
        fn avx2_and_portable_agree_bit_for_bit() {
            if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
                return;
            }
            let (x, u) = inputs();
            let mut a = x.clone();
            // SAFETY: avx2 and fma detected.
            unsafe { super::swiglu_avx2(&mut a, &u) };
            assert_matches_portable(&x, &u, &a);
        }

        #[test]
        fn constants_are_the_hex_floats() {
            assert_eq!(super::LN2_HI, f32::from_bits(0x3f31_7200));
            assert!((super::v_expf(1.0) - std::f32::consts::E).abs() < 1e-6);
            assert!((super::v_expf(-3.5) - (-3.5f32).exp()).abs() < 1e-7);
        }

        #[cfg(target_arch = "x86_64")]
        #[test]
        fn avx512_and_portable_agree_bit_for_bit() {
            if !is_x86_feature_detected!("avx512f") {
                return;
            }
            let (x, u) = inputs();
            let mut a = x.clone();
            // SAFETY: avx512f detected.
            unsafe { super::swiglu_avx512(&mut a, &u) };
            assert_matches_portable(&x, &u, &a);
        }
    }
}

/// cos and sin of pair `i`'s angle under ggml's rope_ext scaling, `theta` being the unscaled
/// angle p * base^(-2i/d): the scaled angle freq_scale * theta, blended towards `theta` on
/// the pairs below YaRN's ramp (ext_factor), both times the magnitude attn_factor (and YaRN's
/// 1 + 0.1 ln(1 / freq_scale)). Written from the YaRN paper's definition in ggml's order of
/// operations.
fn yarn_cos_sin(theta: f32, i: usize, s: &RopeScaling) -> (f32, f32) {
    let scaled = s.freq_scale * theta;
    let mut magnitude = s.attn_factor;
    let angle = if s.ext_factor != 0.0 {
        let [low, high] = s.corr_dims;
        let ramp = 1.0 - ((i as f32 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
        let mix = ramp * s.ext_factor;
        magnitude *= 1.0 + 0.1 * (1.0 / s.freq_scale).ln();
        scaled * (1.0 - mix) + theta * mix
    } else {
        scaled
    };
    (angle.cos() * magnitude, angle.sin() * magnitude)
}

impl CpuBackend {
    /// RoPE of every head of each row; `scaling` as ggml's rope_ext (None: plain RoPE, the
    /// same arithmetic as a scaling of 1 / no YaRN / magnitude 1).
    #[allow(clippy::too_many_arguments)]
    fn rope_cpu(
        &self,
        x: &mut Buffer,
        positions: &[u32],
        n_heads: usize,
        head_dim: usize,
        freq_base: f32,
        style: RopeStyle,
        scaling: Option<RopeScaling>,
    ) {
        let x = buf_mut(x);
        let half = head_dim / 2;
        self.timed("rope", positions.len(), || {
            let mut cos = vec![0f32; half];
            let mut sin = vec![0f32; half];
            // Same recurrence as ggml's rope: theta_i = p * base^(-2i/d), in f32.
            let theta_scale = freq_base.powf(-2.0 / head_dim as f32);
            for (t, &p) in positions.iter().enumerate() {
                let mut theta = p as f32;
                for i in 0..half {
                    (cos[i], sin[i]) = match &scaling {
                        None => (theta.cos(), theta.sin()),
                        Some(s) => yarn_cos_sin(theta, i, s),
                    };
                    theta *= theta_scale;
                }
                let row = &mut x[t * n_heads * head_dim..(t + 1) * n_heads * head_dim];
                for h in 0..n_heads {
                    let v = &mut row[h * head_dim..(h + 1) * head_dim];
                    for i in 0..half {
                        let (a, b) = match style {
                            RopeStyle::Norm => (2 * i, 2 * i + 1),
                            RopeStyle::Neox => (i, i + half),
                        };
                        let (x0, x1) = (v[a], v[b]);
                        v[a] = x0.mul_add(cos[i], -(x1 * sin[i]));
                        v[b] = x0.mul_add(sin[i], x1 * cos[i]);
                    }
                }
            }
        })
    }

    /// `Backend::attention_paged` (see there), with gpt-oss's per-head sinks when given.
    #[allow(clippy::too_many_arguments)]
    fn attention_cpu(
        &self,
        q: &Buffer,
        k_pool: &Buffer,
        v_pool: &Buffer,
        blocks: KvBlocks<'_>,
        s: AttentionShape,
        sinks: Option<&[f32]>,
        out: &mut Buffer,
    ) {
        let q = buf(q);
        let kc = kv(k_pool);
        let vc = kv(v_pool);
        let o = buf_mut(out);
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
                    || (vec![0u16; hd], vec![0f32; hd], f16::GroupScratch::default()),
                    |(q16, acc, scratch), (idx, out_g)| {
                        let t = idx / s.n_head_kv;
                        let g = idx % s.n_head_kv;
                        let qg = &q[t * q_dim + g * q_group..t * q_dim + (g + 1) * q_group];
                        let end = s.start_pos + t + 1;
                        // A sliding-window layer sees only the last `window` positions.
                        let first = s.window.map_or(0, |w| end.saturating_sub(w));
                        let rows = f16::KvRows { blocks, first, count: end - first, stride: kv_dim };
                        let (k, v) = (&kc[g * hd..], &vc[g * hd..]);
                        if let Some(sinks) = sinks {
                            let heads = &sinks[g * group..(g + 1) * group];
                            for ((qh, out_h), &sink) in qg.chunks(hd).zip(out_g.chunks_mut(hd)).zip(heads) {
                                f16::attend_row_sink(qh, k, v, rows, scale, Some(sink), q16, acc, out_h);
                            }
                        } else if !f16::attend_group(qg, hd, k, v, rows, scale, out_g, scratch) {
                            for (qh, out_h) in qg.chunks(hd).zip(out_g.chunks_mut(hd)) {
                                f16::attend_row_steps(qh, k, v, rows, scale, q16, acc, out_h);
                            }
                        }
                    },
                );
            })
        })
    }
}

#[cfg(test)]
mod attention_tests {
    use super::f16;
    #[cfg(target_arch = "x86_64")]
    use crate::quant::SimdLevel;

    fn contiguous(stride: usize, rows: usize) -> f16::KvRows<'static> {
        f16::KvRows { blocks: crate::backend::KvBlocks::CONTIGUOUS, first: 0, count: rows, stride }
    }

    /// The fused GQA-group kernel must give the per-step path's bits exactly, head by head
    /// (greedy parity with llama.cpp and bench hashes depend on it), for prefix lengths inside
    /// one block of rows and across blocks, with K/V rows interleaved in the cache as in a GQA
    /// layer.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn fused_group_attention_equals_the_step_by_step_path() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 6.0
        };
        let mut scratch = f16::GroupScratch::default();
        for (level, hd) in [SimdLevel::Avx2, SimdLevel::Avx512Vnni].into_iter().flat_map(|l| [(l, 64usize), (l, 128), (l, 256)]) {
            let (kv_heads, rows_max) = (3usize, 70usize);
            let stride = kv_heads * hd;
            let kf: Vec<f32> = (0..rows_max * stride).map(|_| rnd()).collect();
            let vf: Vec<f32> = (0..rows_max * stride).map(|_| rnd()).collect();
            let (mut k, mut v) = (vec![0u16; kf.len()], vec![0u16; vf.len()]);
            f16::f32_to_f16_row(&kf, &mut k);
            f16::f32_to_f16_row(&vf, &mut v);
            let scale = 1.0 / (hd as f32).sqrt();
            for heads_per_group in [1usize, 3, 4] {
                let q: Vec<f32> = (0..heads_per_group * hd).map(|_| rnd()).collect();
                for g in 0..kv_heads {
                    for rows in [1usize, 2, 7, 16, 17, 32, 33, 64, rows_max] {
                        let mut fused = vec![0f32; q.len()];
                        let ran = f16::attend_group_at(
                            level,
                            &q,
                            hd,
                            &k[g * hd..],
                            &v[g * hd..],
                            contiguous(stride, rows),
                            scale,
                            &mut fused,
                            &mut scratch,
                        );
                        if !ran {
                            assert!(!level.available(), "a CPU with {level:?} must take the fused path");
                            continue;
                        }
                        let (mut q16, mut acc) = (vec![0u16; hd], vec![0f32; hd]);
                        for h in 0..heads_per_group {
                            let mut steps = vec![0f32; hd];
                            let qh = &q[h * hd..(h + 1) * hd];
                            f16::attend_row_steps(
                                qh,
                                &k[g * hd..],
                                &v[g * hd..],
                                contiguous(stride, rows),
                                scale,
                                &mut q16,
                                &mut acc,
                                &mut steps,
                            );
                            for (i, (a, b)) in fused[h * hd..(h + 1) * hd].iter().zip(&steps).enumerate() {
                                assert_eq!(a.to_bits(), b.to_bits(), "hd {hd} group {g} head {h} rows {rows} element {i}: {a} vs {b}");
                            }
                        }
                    }
                }
            }
        }
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
