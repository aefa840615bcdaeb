//! The CPU backend: a thread pool (`pool`: rayon, or a spinning pool from 8 threads) over the CPU kernels of `crate::quant::simd` (quantised
//! dot products, f16 attention, activations).
//!
//! Weights stay in the memory-mapped GGUF file (no copy), except that Q4_K and Q8_0 matrices
//! are also repacked eight rows per group at load where the CPU runs those kernels
//! (`quant::q4_k_x8`, `quant::q8_0_x8`);
//! activations are f32 `Vec`s, the KV cache f16 bits. This file holds the backend, its buffers
//! and the `Backend` trait's table of ops; each op family lives in its own file: `weights`
//! (loading, repacking, row views, embedding), `matmul` (activation quantisation and the
//! parallel dot products; `matmul_x8` for the repacked Q4_K and Q8_0), `norm`,
//! `rope`, `attention` (KV store and attention), `elementwise` (adds, scaling, activations);
//! `topology` picks the default thread count, `pool` / `spin_pool` run the parallel regions.

use super::{AttentionShape, Backend, Error, KvBlocks, Result, RopeScaling, RopeStyle, SeqAttention, Weight, WeightOf};
use crate::gguf::{GgmlType, GgufFile};
use crate::kernel_registry::{self, shape_class};
use crate::quant;
use std::sync::Arc;

mod attention;
mod elementwise;
mod matmul;
mod matmul_x8;
mod norm;
pub mod pool;
mod rope;
pub mod spin_pool;
pub mod topology;
mod weights;

pub use weights::MappedWeight;

/// An f32 activation buffer of the CPU backend.
pub type CpuBuffer = Vec<f32>;
/// One layer's K or V cache of the CPU backend: f16 bits, as llama.cpp's default cache type.
pub type CpuKvBuffer = Vec<u16>;
/// A weight of the CPU backend (borrowed from the file's mmap).
pub type CpuWeight = Weight<MappedWeight>;

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

pub struct CpuBackend {
    pool: pool::CpuPool,
    threads: usize,
    /// Repack Q4_K and Q8_0 matrices at load for the eight-row kernels (`quant::q4_k_x8`,
    /// `quant::q8_0_x8`) where the CPU runs them (`engine.cpu_repack`, default on).
    repack: bool,
}

impl CpuBackend {
    /// The backend on `threads` threads (0: one per physical core), Q4_K and Q8_0 repacked at load.
    pub fn new(threads: usize) -> anyhow::Result<Self> {
        Self::with_options(threads, true)
    }

    /// `new`, saying whether Q4_K matrices are repacked at load (`engine.cpu_repack`).
    pub fn with_options(threads: usize, repack: bool) -> anyhow::Result<Self> {
        // 0: one thread per physical core of the affinity mask (topology.rs).
        let threads = topology::CpuPlacement::detect().threads(threads);
        Self::with_pool(threads, repack, pool::PoolKind::for_threads(threads))
    }

    /// `with_options` on `threads` threads (not 0) with the pool named (tests compare them).
    pub fn with_pool(threads: usize, repack: bool, kind: pool::PoolKind) -> anyhow::Result<Self> {
        Ok(CpuBackend { pool: pool::CpuPool::new(kind, threads.max(1))?, threads: threads.max(1), repack })
    }

    /// Which pool runs this backend's parallel regions.
    pub fn pool_kind(&self) -> pool::PoolKind {
        self.pool.kind()
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    fn timed<R>(&self, kernel: &str, rows: usize, f: impl FnOnce() -> R) -> R {
        kernel_registry::time(kernel, shape_class(rows), "cpu", quant::simd_level(), f)
    }
}

/// Element-wise ops (norms, SwiGLU, residual adds) run on one thread below this many
/// elements (decode: a wake-up of the pool costs more than the op) and in chunks of
/// `PARALLEL_CHUNK` over the pool above it (prefill: 64 rows x 2048 is 131k elements).
const PARALLEL_ELEMS: usize = 32 * 1024;
const PARALLEL_CHUNK: usize = 8 * 1024;

impl Backend for CpuBackend {
    type Buffer = CpuBuffer;
    type KvBuffer = CpuKvBuffer;
    type WeightData = MappedWeight;
    type ExpertTable = ();

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn variant(&self) -> &'static str {
        quant::simd_level()
    }

    fn supports(&self, t: GgmlType) -> bool {
        quant::supports(t)
    }

    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> Result<WeightOf<Self>> {
        self.load_weight_cpu(file, name, true)
    }

    fn load_embedding(&self, file: &Arc<GgufFile>, name: &str) -> Result<WeightOf<Self>> {
        self.load_weight_cpu(file, name, false)
    }

    fn weight_rows(&self, w: &WeightOf<Self>, first_row: usize, n_rows: usize, name: &str) -> Result<WeightOf<Self>> {
        self.weight_rows_cpu(w, first_row, n_rows, name)
    }

    fn scatter_rows(&self, src: &Self::Buffer, rows: &[u32], dim: usize, dst: &mut Self::Buffer) -> Result<()> {
        let (s, d) = (src.as_slice(), dst.as_mut_slice());
        self.timed("scatter_rows", rows.len(), || {
            for (i, &r) in rows.iter().enumerate() {
                let r = r as usize;
                d[r * dim..(r + 1) * dim].copy_from_slice(&s[i * dim..(i + 1) * dim]);
            }
        });
        Ok(())
    }

    fn weighted_sum_rows(&self, src: &Self::Buffer, weights: &[f32], n: usize, k: usize, dim: usize, out: &mut Self::Buffer) -> Result<()> {
        let (s, o) = (src.as_slice(), out.as_mut_slice());
        self.timed("weighted_sum_rows", n, || super::weighted_sum_rows_host(s, weights, n, k, dim, o));
        Ok(())
    }

    fn scale_rows(&self, x: &mut Self::Buffer, scales: &[f32], dim: usize) -> Result<()> {
        self.timed("scale_rows", scales.len(), || super::scale_rows_host(x, scales, dim));
        Ok(())
    }

    fn run(&self, pass: &mut (dyn FnMut() + Send)) {
        self.pool.install(pass)
    }

    fn alloc(&self, len: usize) -> Result<Self::Buffer> {
        Ok(vec![0f32; len])
    }

    /// K and V caches hold f16 bits (`Vec<u16>`), as llama.cpp's default cache type.
    fn alloc_kv_cache(&self, len: usize) -> Result<Self::KvBuffer> {
        Ok(vec![0u16; len])
    }

    fn kv_cache_elem_bytes(&self) -> usize {
        2
    }

    fn write(&self, dst: &mut Self::Buffer, offset: usize, src: &[f32]) -> Result<()> {
        dst[offset..offset + src.len()].copy_from_slice(src);
        Ok(())
    }

    fn read(&self, src: &Self::Buffer, offset: usize, dst: &mut [f32]) -> Result<()> {
        dst.copy_from_slice(&src[offset..offset + dst.len()]);
        Ok(())
    }

    fn embed(&self, table: &WeightOf<Self>, tokens: &[u32], out: &mut Self::Buffer) -> Result<()> {
        self.embed_cpu(table, tokens, out)
    }

    fn rmsnorm(&self, x: &Self::Buffer, w: &WeightOf<Self>, rows: usize, dim: usize, eps: f32, out: &mut Self::Buffer) -> Result<()> {
        self.rmsnorm_cpu(x, w, rows, dim, eps, out);
        Ok(())
    }

    fn rmsnorm_inplace(&self, x: &mut Self::Buffer, w: &WeightOf<Self>, rows: usize, dim: usize, eps: f32) -> Result<()> {
        self.rmsnorm_inplace_cpu(x, w, rows, dim, eps);
        Ok(())
    }

    fn matmul(&self, w: &WeightOf<Self>, x: &Self::Buffer, rows: usize, out: &mut Self::Buffer) -> Result<()> {
        self.matmul_many(&[w], x, rows, &mut [out])
    }

    fn matmul_many(&self, ws: &[&WeightOf<Self>], x: &Self::Buffer, rows: usize, outs: &mut [&mut Self::Buffer]) -> Result<()> {
        self.matmul_many_cpu(ws, x, rows, outs);
        Ok(())
    }

    fn add_bias(&self, x: &mut Self::Buffer, b: &WeightOf<Self>, rows: usize) -> Result<()> {
        self.add_bias_cpu(x, b, rows);
        Ok(())
    }

    fn rope(
        &self,
        x: &mut Self::Buffer,
        positions: &[u32],
        n_heads: usize,
        head_dim: usize,
        freq_base: f32,
        style: RopeStyle,
    ) -> Result<()> {
        self.rope_cpu(x, positions, n_heads, head_dim, freq_base, style, None);
        Ok(())
    }

    fn rope_scaled(
        &self,
        x: &mut Self::Buffer,
        positions: &[u32],
        n_heads: usize,
        head_dim: usize,
        freq_base: f32,
        style: RopeStyle,
        scaling: RopeScaling,
    ) -> Result<()> {
        self.rope_cpu(x, positions, n_heads, head_dim, freq_base, style, Some(scaling));
        Ok(())
    }

    fn kv_store(
        &self,
        k: &Self::Buffer,
        v: &Self::Buffer,
        k_cache: &mut Self::KvBuffer,
        v_cache: &mut Self::KvBuffer,
        src_row: usize,
        start_pos: usize,
        n_tokens: usize,
        kv_dim: usize,
    ) -> Result<()> {
        self.kv_store_paged(k, v, k_cache, v_cache, src_row, KvBlocks::CONTIGUOUS, start_pos, n_tokens, kv_dim)
    }

    fn paged_kv(&self) -> bool {
        true
    }

    fn kv_store_paged(
        &self,
        k: &Self::Buffer,
        v: &Self::Buffer,
        k_pool: &mut Self::KvBuffer,
        v_pool: &mut Self::KvBuffer,
        src_row: usize,
        blocks: KvBlocks<'_>,
        start_pos: usize,
        n_tokens: usize,
        kv_dim: usize,
    ) -> Result<()> {
        self.kv_store_cpu(k, v, k_pool, v_pool, src_row, blocks, start_pos, n_tokens, kv_dim);
        Ok(())
    }

    /// llama.cpp's CPU flash attention over the f16 cache, for greedy parity (attention.rs).
    fn attention(
        &self,
        q: &Self::Buffer,
        k_cache: &Self::KvBuffer,
        v_cache: &Self::KvBuffer,
        s: AttentionShape,
        out: &mut Self::Buffer,
    ) -> Result<()> {
        self.attention_cpu(q, k_cache, v_cache, KvBlocks::CONTIGUOUS, s, None, out);
        Ok(())
    }

    /// The paged form of `attention`: cache position p is pool row `blocks.slot(p)`. A
    /// contiguous cache is the one-block case, so both forms run the same arithmetic.
    fn attention_paged(
        &self,
        q: &Self::Buffer,
        k_pool: &Self::KvBuffer,
        v_pool: &Self::KvBuffer,
        blocks: KvBlocks<'_>,
        s: AttentionShape,
        out: &mut Self::Buffer,
    ) -> Result<()> {
        self.attention_cpu(q, k_pool, v_pool, blocks, s, None, out);
        Ok(())
    }

    /// All sequences' heads as one parallel region (attention.rs), the same numbers as the
    /// per-sequence calls.
    fn attention_paged_many(
        &self,
        q: &Self::Buffer,
        k_pool: &Self::KvBuffer,
        v_pool: &Self::KvBuffer,
        seqs: &[SeqAttention<'_>],
        sinks: Option<&[f32]>,
        out: &mut Self::Buffer,
    ) -> Result<()> {
        if let (Some(sinks), Some(a)) = (sinks, seqs.first()) {
            if sinks.len() != a.shape.n_head {
                return Err(Error::invalid("cpu", format!("{} attention sinks for {} heads", sinks.len(), a.shape.n_head)));
            }
        }
        self.attention_many_cpu(q, k_pool, v_pool, seqs, sinks, out);
        Ok(())
    }

    /// Attention with each head's sink folded in after the last key (`fold_sink`, in the fused
    /// GQA-group kernel or the row kernel), as ggml's CPU flash attention does for its single KV
    /// chunk.
    fn attention_with_sinks(
        &self,
        q: &Self::Buffer,
        k_cache: &Self::KvBuffer,
        v_cache: &Self::KvBuffer,
        blocks: KvBlocks<'_>,
        s: AttentionShape,
        sinks: &[f32],
        out: &mut Self::Buffer,
    ) -> Result<()> {
        if sinks.len() != s.n_head {
            return Err(Error::invalid("cpu", format!("{} attention sinks for {} heads", sinks.len(), s.n_head)));
        }
        self.attention_cpu(q, k_cache, v_cache, blocks, s, Some(sinks), out);
        Ok(())
    }

    fn silu_mul(&self, gate: &mut Self::Buffer, up: &Self::Buffer, n: usize) -> Result<()> {
        self.silu_mul_cpu(gate, up, n);
        Ok(())
    }

    fn swiglu_oai(&self, gate: &mut Self::Buffer, up: &Self::Buffer, n: usize) -> Result<()> {
        self.timed("swiglu_oai", 1, || super::swiglu_oai_host(&mut gate.as_mut_slice()[..n], &up.as_slice()[..n]));
        Ok(())
    }

    fn gelu_tanh_mul(&self, gate: &mut Self::Buffer, up: &Self::Buffer, n: usize) -> Result<()> {
        self.gelu_tanh_mul_cpu(gate, up, n);
        Ok(())
    }

    fn scale(&self, x: &mut Self::Buffer, n: usize, s: f32) -> Result<()> {
        self.scale_cpu(x, n, s);
        Ok(())
    }

    fn add(&self, x: &mut Self::Buffer, y: &Self::Buffer, n: usize) -> Result<()> {
        self.add_cpu(x, y, n);
        Ok(())
    }

    fn copy_row(&self, src: &Self::Buffer, src_row: usize, dim: usize, dst: &mut Self::Buffer) -> Result<()> {
        dst[..dim].copy_from_slice(&src[src_row * dim..(src_row + 1) * dim]);
        Ok(())
    }

    fn gather_rows(&self, src: &Self::Buffer, rows: &[usize], dim: usize, dst: &mut Self::Buffer) -> Result<()> {
        let (s, d) = (src.as_slice(), dst.as_mut_slice());
        for (i, &r) in rows.iter().enumerate() {
            d[i * dim..(i + 1) * dim].copy_from_slice(&s[r * dim..(r + 1) * dim]);
        }
        Ok(())
    }
}
