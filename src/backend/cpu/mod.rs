//! The CPU backend: rayon threads over the quantised dot products of `crate::quant`.
//!
//! Weights stay in the memory-mapped GGUF file (no copy); activations are f32 `Vec`s.
//! Matmuls quantise the activation rows once (Q8_0 / Q8_K, like ggml) and then run
//! integer block dot products in parallel over weight rows.

use super::{AttentionShape, Backend, Buffer, KvBlocks, RopeScaling, RopeStyle, Weight};
use crate::gguf::{GgmlType, GgufFile};
use crate::kernel_registry::{self, shape_class};
use crate::quant;
use crate::quant::simd::attention as attention_kernels;
use anyhow::{bail, Context};
use rayon::prelude::*;
use std::sync::Arc;

pub mod topology;

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
        let threads = topology::CpuPlacement::detect().threads(threads);
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
                attention_kernels::f32_to_f16_row(&buf(k)[src..src + n], &mut kp[at..at + n]);
                attention_kernels::f32_to_f16_row(&buf(v)[src..src + n], &mut vp[at..at + n]);
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
                self.pool.install(|| {
                    g.par_chunks_mut(PARALLEL_CHUNK).zip(u.par_chunks(PARALLEL_CHUNK)).for_each(|(g, u)| quant::simd::silu::swiglu(g, u))
                });
            } else {
                quant::simd::silu::swiglu(g, u);
            }
        })
    }

    fn gelu_tanh_mul(&self, gate: &mut Buffer, up: &Buffer, n: usize) {
        let g = buf_mut(gate);
        let u = buf(up);
        self.timed("gelu_tanh_mul", 1, || quant::simd::geglu::geglu_ggml(&mut g[..n], &u[..n]))
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
                    || (vec![0u16; hd], vec![0f32; hd], attention_kernels::GroupScratch::default()),
                    |(q16, acc, scratch), (idx, out_g)| {
                        let t = idx / s.n_head_kv;
                        let g = idx % s.n_head_kv;
                        let qg = &q[t * q_dim + g * q_group..t * q_dim + (g + 1) * q_group];
                        let end = s.start_pos + t + 1;
                        // A sliding-window layer sees only the last `window` positions.
                        let first = s.window.map_or(0, |w| end.saturating_sub(w));
                        let rows = attention_kernels::KvRows { blocks, first, count: end - first, stride: kv_dim };
                        let (k, v) = (&kc[g * hd..], &vc[g * hd..]);
                        if let Some(sinks) = sinks {
                            let heads = &sinks[g * group..(g + 1) * group];
                            for ((qh, out_h), &sink) in qg.chunks(hd).zip(out_g.chunks_mut(hd)).zip(heads) {
                                attention_kernels::attend_row_sink(qh, k, v, rows, scale, Some(sink), q16, acc, out_h);
                            }
                        } else if !attention_kernels::attend_group(qg, hd, k, v, rows, scale, out_g, scratch) {
                            for (qh, out_h) in qg.chunks(hd).zip(out_g.chunks_mut(hd)) {
                                attention_kernels::attend_row_steps(qh, k, v, rows, scale, q16, acc, out_h);
                            }
                        }
                    },
                );
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
