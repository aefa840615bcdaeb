//! The Backend trait: memory and the ops the forward pass needs.
//!
//! The forward pass (`crate::model`) only talks to this trait, so CPU, HIP and CUDA backends
//! are interchangeable. Every op implementation reports through `crate::kernel_registry`.
//!
//! Typed handles: each backend names its own storage in associated types (as candle's
//! `BackendStorage`): `Buffer` (f32 activations), `KvBuffer` (one layer's K or V cache, in the
//! backend's element type) and `WeightData` (a prepared weight tensor, wrapped in a
//! [`Weight`] with the shape the model file gives, the same on every backend). Code that runs
//! a model is generic over `B: Backend` and monomorphised, so an op gets the backend's own
//! types: no `dyn Any`, no downcast, no "foreign buffer" to refuse. The one place that picks a
//! backend by name, [`create_with`], returns a [`LoadedBackend`] enum, which its caller
//! matches once ([`with_backend!`](crate::with_backend)).
//!
//! One error convention: every fallible method returns [`Result`], whose [`Error`] says what
//! went wrong (out of device memory with the size, an unsupported op, type or shape, a driver
//! call that failed with its name and code, arguments outside a tensor). GPU ops are queued:
//! a fault of a kernel surfaces at the next call that waits for the device (`read`,
//! `synchronize`), as `Error::Device` of that call. Callers propagate with `?`; the model turns
//! the error into `anyhow::Error` at its boundary. Ops do not panic on device errors.

pub mod cpu;
mod error;
pub mod gpu;
mod host_buffer;

pub use error::{Error, Result, ResultExt};
pub use host_buffer::{HostBuffer, Unpin};

use crate::gguf::{GgmlType, GgufFile};
use std::sync::Arc;

/// A weight tensor prepared by a backend: its name and shape, as the model file gives them
/// (the same on every backend, so kept here once rather than behind a trait method), and
/// the backend's `data` (`Backend::WeightData`). 2-D weights are `rows` x `cols` in ggml
/// order: each of the `rows` rows holds `cols` contiguous elements (a linear layer's output
/// row).
pub struct Weight<D> {
    pub name: String,
    pub ggml_type: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: D,
}

/// The weight type of backend `B`.
pub type WeightOf<B> = Weight<<B as Backend>::WeightData>;

/// Rotary embedding pairing: adjacent elements (llama) or halves (NeoX, Qwen).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    Norm,
    Neox,
}

/// ggml's `rope_ext` frequency scaling of one layer (linear or YaRN), precomputed on the host
/// from the file's `rope.scaling.*` metadata (`HParams::layer_rope_scaling`). With
/// freq_scale 1, ext_factor 0 and attn_factor 1 it is plain RoPE, bit for bit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeScaling {
    /// Multiplier of every rotation angle: 1 / the scaling factor.
    pub freq_scale: f32,
    /// YaRN's weight of the unscaled (extrapolated) angle on the high-frequency pairs; 0 for
    /// linear scaling. Where it is non-zero, ggml also multiplies the magnitude by
    /// 1 + 0.1 ln(1 / freq_scale).
    pub ext_factor: f32,
    /// Multiplier of cos and sin, so of q and k (the attention logits get its square).
    pub attn_factor: f32,
    /// YaRN's ramp over the pair index i: pairs below corr_dims[0] keep the unscaled angle,
    /// pairs above corr_dims[1] the scaled one (ggml_rope_yarn_corr_dims).
    pub corr_dims: [f32; 2],
}

impl RopeScaling {
    /// No scaling: plain RoPE's numbers, bit for bit.
    pub const IDENTITY: RopeScaling = RopeScaling { freq_scale: 1.0, ext_factor: 0.0, attn_factor: 1.0, corr_dims: [0.0, 0.0] };
}

/// Geometry of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    /// New query rows (tokens) in this call.
    pub n_tokens: usize,
    /// Position of the first new token; the cache holds positions 0..start_pos+n_tokens.
    pub start_pos: usize,
    /// Row of `q` and of the output holding the first new token: a batch stacks the rows of
    /// several sequences, and each sequence attends over its own cache with its own rows.
    pub first_row: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Sliding-window attention (Gemma 3's local layers): the query at position p attends only
    /// to positions p - window + 1 ..= p (llama.cpp's LLAMA_SWA_TYPE_STANDARD mask). None:
    /// every earlier position.
    pub window: Option<usize>,
}

/// Where a paged KV cache keeps a sequence's positions: position p is in block
/// `table[p / block_size]` of the pool, at row `table[p / block_size] * block_size + p %
/// block_size`. Block sizes are powers of two. A contiguous cache is one block that holds
/// every position ([`KvBlocks::CONTIGUOUS`]), so kernels need only this one addressing.
#[derive(Debug, Clone, Copy)]
pub struct KvBlocks<'a> {
    table: &'a [u32],
    shift: u32,
}

impl<'a> KvBlocks<'a> {
    /// A contiguous cache: position p is row p.
    pub const CONTIGUOUS: KvBlocks<'static> = KvBlocks { table: &[0], shift: usize::BITS - 1 };

    /// A block table over blocks of `block_size` positions (a power of two).
    pub fn new(table: &'a [u32], block_size: usize) -> KvBlocks<'a> {
        assert!(block_size.is_power_of_two(), "KV block size {block_size} is not a power of two");
        KvBlocks { table, shift: block_size.trailing_zeros() }
    }

    pub fn block_size(&self) -> usize {
        1 << self.shift
    }

    /// Whether this is `CONTIGUOUS` (one block spanning every position).
    pub fn is_contiguous(&self) -> bool {
        self.shift == usize::BITS - 1
    }

    /// block_size - 1: a position's offset within its block is `p & mask`.
    pub fn mask(&self) -> usize {
        self.block_size() - 1
    }

    /// The pool row holding position `pos`.
    #[inline(always)]
    pub fn slot(&self, pos: usize) -> usize {
        ((self.table[pos >> self.shift] as usize) << self.shift) | (pos & self.mask())
    }

    /// The largest pool row holding any of positions first..first + count (count > 0).
    pub fn max_slot(&self, first: usize, count: usize) -> usize {
        let last = first + count - 1;
        let (b0, b1) = (first >> self.shift, last >> self.shift);
        (b0..=b1).map(|b| self.slot(if b == b1 { last } else { (b << self.shift) | self.mask() })).max().unwrap_or(0)
    }
}

/// One sequence of `Backend::attention_paged_many`: its block table and its rows' geometry.
#[derive(Debug, Clone, Copy)]
pub struct SeqAttention<'a> {
    pub blocks: KvBlocks<'a>,
    pub shape: AttentionShape,
}

/// One MoE block's routed experts with the routing on the device (`Backend::routed_experts`):
/// from the router logits, per token the top-k experts and their weights as
/// `crate::model::moe::route` computes them (softmax gating, renormalisation, scale), then per
/// (token, slot) SwiGLU(gate, up) and down of the chosen expert, and `out` = the weighted sum
/// over the slots in slot order (as `weighted_sum_rows`). No expert id reaches the host
/// during the step: they are also written to `ids_log` (as i32 bits in f32 slots), which the
/// model reads after the step for the expert-load metric.
pub struct RoutedExperts<'a, B: Backend + ?Sized> {
    pub table: &'a B::ExpertTable,
    pub params: &'a crate::model::MoeParams,
    /// Router logits, n x n_expert.
    pub logits: &'a B::Buffer,
    /// Added to each row of the logits before the top-k (gpt-oss's `ffn_gate_inp.bias`).
    pub router_bias: Option<&'a [f32]>,
    /// The block's input, n x dim.
    pub x: &'a B::Buffer,
    pub n: usize,
    pub dim: usize,
    /// The chosen expert ids (i32 bits) then their weights: 2 x n x k.
    pub choice: &'a mut B::Buffer,
    /// Buffer and f32 offset where the n x k chosen ids are logged.
    pub ids_log: (&'a mut B::Buffer, usize),
    /// Gate and up outputs, n x k x n_ff_exp each.
    pub gate: &'a mut B::Buffer,
    pub up: &'a mut B::Buffer,
    /// Each (token, slot)'s expert output, n x k x dim.
    pub slots: &'a mut B::Buffer,
    /// The weighted sum, n x dim.
    pub out: &'a mut B::Buffer,
}

pub trait Backend: Send + Sync + 'static {
    /// An f32 activation buffer.
    type Buffer: Send + Sync;
    /// One layer's K or V cache (or pool), in the element type the backend stores
    /// (`kv_cache_elem_bytes`); only `kv_store*` and `attention*` of the backend touch it.
    type KvBuffer: Send + Sync;
    /// A weight tensor's storage, as `load_weight` prepared it.
    type WeightData: Send + Sync;
    /// One MoE layer's expert matrices as device-side routing reaches them (`expert_table`,
    /// `routed_experts`): the GPU backends' tables of per-expert addresses. Backends that
    /// route on the host (the CPU) use `()` and never make one.
    type ExpertTable: Send + Sync;

    /// "cpu", "hip", "cuda".
    fn name(&self) -> &'static str;
    /// Implementation variant shown in metrics, e.g. "avx512vnni".
    fn variant(&self) -> &'static str;
    /// Whether this backend can compute with weights of this type.
    fn supports(&self, t: GgmlType) -> bool;
    /// Refuses model shapes this backend has no kernels for (checked before loading weights).
    fn check_model(&self, _hp: &crate::model::HParams) -> Result<()> {
        Ok(())
    }

    /// Makes a tensor of the model file usable by this backend (borrowed from the mmap on CPU).
    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> Result<WeightOf<Self>>;

    /// `load_weight` for a token embedding that only `embed` reads (an untied model: the
    /// logits come from a separate output matrix), so a backend may skip what only a matmul
    /// needs (the CPU backend's repacked copy: ~175 MB on Qwen3-30B Q4_K_M).
    fn load_embedding(&self, file: &Arc<GgufFile>, name: &str) -> Result<WeightOf<Self>> {
        self.load_weight(file, name)
    }
    fn alloc(&self, len: usize) -> Result<Self::Buffer>;
    /// Host memory of `len` f32s that `read` fills (the logits), allocated once per
    /// workspace: page-locked on GPU backends, where that makes the copy several times faster.
    fn alloc_host(&self, len: usize) -> Result<HostBuffer> {
        Ok(HostBuffer::heap(len))
    }
    /// Allocates one layer's K or V cache of `len` elements, in the backend's element type
    /// (f16 like llama.cpp on the CPU and GPU backends).
    fn alloc_kv_cache(&self, len: usize) -> Result<Self::KvBuffer>;
    /// Bytes per cached K or V element (matches `alloc_kv_cache`).
    fn kv_cache_elem_bytes(&self) -> usize;
    fn write(&self, dst: &mut Self::Buffer, offset: usize, src: &[f32]) -> Result<()>;
    fn read(&self, src: &Self::Buffer, offset: usize, dst: &mut [f32]) -> Result<()>;

    /// out[t] = dequantized row tokens[t] of `table`.
    fn embed(&self, table: &WeightOf<Self>, tokens: &[u32], out: &mut Self::Buffer) -> Result<()>;
    /// out = x / rms(x) * w over `rows` rows of `dim` (in place when x and out alias is not allowed: use rmsnorm_inplace).
    fn rmsnorm(&self, x: &Self::Buffer, w: &WeightOf<Self>, rows: usize, dim: usize, eps: f32, out: &mut Self::Buffer) -> Result<()>;
    fn rmsnorm_inplace(&self, x: &mut Self::Buffer, w: &WeightOf<Self>, rows: usize, dim: usize, eps: f32) -> Result<()>;
    /// out[rows x w.rows] = x[rows x w.cols] · wᵀ.
    fn matmul(&self, w: &WeightOf<Self>, x: &Self::Buffer, rows: usize, out: &mut Self::Buffer) -> Result<()>;
    /// `matmul` of several weights on the same input (q/k/v, gate/up), outs[i] for ws[i]. A
    /// backend may fuse them (the CPU backend quantises the input once and runs one parallel
    /// region); the default runs them one by one.
    fn matmul_many(&self, ws: &[&WeightOf<Self>], x: &Self::Buffer, rows: usize, outs: &mut [&mut Self::Buffer]) -> Result<()> {
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            self.matmul(w, x, rows, out)?;
        }
        Ok(())
    }
    /// out += W act (a residual add), where act = x, or silu(x) * up when `up` is given
    /// (SwiGLU into the down projection); x and `scratch` (rows * w.rows wide) are left
    /// undefined. A backend may run it as one kernel (the GPU decode mat-vecs); the default is
    /// silu_mul, matmul into `scratch` and add, the unfused ops bit for bit.
    fn matmul_add(
        &self,
        w: &WeightOf<Self>,
        x: &mut Self::Buffer,
        up: Option<&Self::Buffer>,
        rows: usize,
        out: &mut Self::Buffer,
        scratch: &mut Self::Buffer,
    ) -> Result<()> {
        if let Some(up) = up {
            self.silu_mul(x, up, rows * w.cols)?;
        }
        self.matmul(w, x, rows, scratch)?;
        self.add(out, scratch, rows * w.rows)
    }
    /// x[r] += b for each of `rows` rows.
    fn add_bias(&self, x: &mut Self::Buffer, b: &WeightOf<Self>, rows: usize) -> Result<()>;
    /// Rotates `n_heads` heads of `head_dim` in each of the rows; row t has position positions[t].
    fn rope(
        &self,
        x: &mut Self::Buffer,
        positions: &[u32],
        n_heads: usize,
        head_dim: usize,
        freq_base: f32,
        style: RopeStyle,
    ) -> Result<()>;
    /// `rope` with frequency scaling (linear or YaRN, as ggml's `rope_ext`). Backends without
    /// it refuse; their `check_model` refuses such models before loading.
    #[allow(clippy::too_many_arguments)]
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
        let _ = (x, positions, n_heads, head_dim, freq_base, style, scaling);
        Err(Error::unsupported(self.name(), "RoPE scaling (linear / YaRN)"))
    }
    /// `rope` (or `rope_scaled` with `scaling`) of q's `n_head` and k's `n_head_kv` heads, the
    /// same rows and positions: one call where the backend can (one launch on the GPU, where
    /// decode pays per launch). The same numbers as the two calls, which is the default.
    #[allow(clippy::too_many_arguments)]
    fn rope_qk(
        &self,
        q: &mut Self::Buffer,
        k: &mut Self::Buffer,
        positions: &[u32],
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        freq_base: f32,
        style: RopeStyle,
        scaling: Option<RopeScaling>,
    ) -> Result<()> {
        match scaling {
            None => {
                self.rope(q, positions, n_head, head_dim, freq_base, style)?;
                self.rope(k, positions, n_head_kv, head_dim, freq_base, style)
            }
            Some(s) => {
                self.rope_scaled(q, positions, n_head, head_dim, freq_base, style, s)?;
                self.rope_scaled(k, positions, n_head_kv, head_dim, freq_base, style, s)
            }
        }
    }
    /// Copies `n_tokens` rows of k and v (each `kv_dim` wide), starting at row `src_row` (a
    /// sequence's rows in a batch), into the caches at row `start_pos`.
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<()>;
    /// Causal multi-head attention of q against the caches (GQA when n_head_kv < n_head).
    fn attention(
        &self,
        q: &Self::Buffer,
        k_cache: &Self::KvBuffer,
        v_cache: &Self::KvBuffer,
        shape: AttentionShape,
        out: &mut Self::Buffer,
    ) -> Result<()>;
    /// Batched decode (issue #17): `kv_store` and `attention` for several sequences of one
    /// new row each, in one go. Row i of q, k, v and out is sequence i's (rows 0..caches.len(),
    /// in order); its caches are `caches[i]` (contiguous, one per sequence) and its row's
    /// position `start_pos[i]`; `shape` gives the heads (its n_tokens, start_pos, first_row
    /// and window are not used: no window). The same numbers as the per-sequence calls.
    /// Returns Ok(false), having done nothing, where the backend has no batched kernels; the
    /// caller then makes the per-sequence calls.
    #[allow(clippy::too_many_arguments)]
    fn decode_attention_batch(
        &self,
        q: &Self::Buffer,
        k: &Self::Buffer,
        v: &Self::Buffer,
        caches: &mut [(&mut Self::KvBuffer, &mut Self::KvBuffer)],
        start_pos: &[usize],
        shape: AttentionShape,
        out: &mut Self::Buffer,
    ) -> Result<bool> {
        let _ = (q, k, v, caches, start_pos, shape, out);
        Ok(false)
    }
    /// Batched attention of a step that is not all decode rows (issue #14): `kv_store_attention`
    /// for every sequence of the step (prompts, prompt chunks and one-row sequences alike), in
    /// one go. Sequence i's rows of q, k, v and out, its position, the heads and the layer's
    /// window are `shapes[i]`; its caches `caches[i]` (contiguous, one per sequence); `sinks` as
    /// in `attention_with_sinks`. The same numbers as the per-sequence calls. Returns Ok(false),
    /// having done nothing, where the backend has no batched kernels for the step; the caller
    /// then makes the per-sequence calls.
    #[allow(clippy::too_many_arguments)]
    fn attention_batch(
        &self,
        q: &Self::Buffer,
        k: &Self::Buffer,
        v: &Self::Buffer,
        caches: &mut [(&mut Self::KvBuffer, &mut Self::KvBuffer)],
        shapes: &[AttentionShape],
        sinks: Option<&[f32]>,
        out: &mut Self::Buffer,
    ) -> Result<bool> {
        let _ = (q, k, v, caches, shapes, sinks, out);
        Ok(false)
    }
    /// Whether this backend implements `kv_store_paged` and `attention_paged` (one KV pool of
    /// fixed-size blocks shared by all sequences). Backends without it get one contiguous
    /// cache per sequence from the engine.
    fn paged_kv(&self) -> bool {
        false
    }
    /// `kv_store` into a pool made by `alloc_kv_cache`, position p at row `blocks.slot(p)`.
    /// Called only where `paged_kv()` is true (the default returns `Error::Unsupported`).
    #[allow(clippy::too_many_arguments)]
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
        let _ = (k, v, k_pool, v_pool, src_row, blocks, start_pos, n_tokens, kv_dim);
        Err(Error::unsupported(self.name(), "a paged KV cache (paged_kv() is false)"))
    }
    /// `attention` over a pool, position p at row `blocks.slot(p)`, bit for bit the same
    /// numbers as over a contiguous cache. Called only where `paged_kv()` is true.
    fn attention_paged(
        &self,
        q: &Self::Buffer,
        k_pool: &Self::KvBuffer,
        v_pool: &Self::KvBuffer,
        blocks: KvBlocks<'_>,
        shape: AttentionShape,
        out: &mut Self::Buffer,
    ) -> Result<()> {
        let _ = (q, k_pool, v_pool, blocks, shape, out);
        Err(Error::unsupported(self.name(), "a paged KV cache (paged_kv() is false)"))
    }
    /// `attention_paged` (or `attention_with_sinks` when `sinks` is given) of several
    /// sequences of one batch over the same pool, one call per layer instead of one per
    /// sequence: each sequence's rows (`shape.first_row`..) attend over its own block table,
    /// bit for bit the per-sequence calls. A backend may run all sequences' heads as one
    /// parallel region (the CPU backend: a decode step of 8 sequences is 8 x n_head_kv work
    /// items at once instead of 8 regions of n_head_kv); the default makes the calls in order.
    fn attention_paged_many(
        &self,
        q: &Self::Buffer,
        k_pool: &Self::KvBuffer,
        v_pool: &Self::KvBuffer,
        seqs: &[SeqAttention<'_>],
        sinks: Option<&[f32]>,
        out: &mut Self::Buffer,
    ) -> Result<()> {
        for s in seqs {
            match sinks {
                Some(sinks) => self.attention_with_sinks(q, k_pool, v_pool, s.blocks, s.shape, sinks, out)?,
                None => self.attention_paged(q, k_pool, v_pool, s.blocks, s.shape, out)?,
            }
        }
        Ok(())
    }
    /// `attention` (or `attention_paged` with a block table; `KvBlocks::CONTIGUOUS` for one
    /// contiguous cache) with gpt-oss's attention sinks: query head h's softmax denominator
    /// gains exp(sinks[h] - max), as if one more key scored sinks[h] with a zero value
    /// (llama.cpp's `attn_sinks`). The default refuses; the GPU backends take contiguous caches.
    #[allow(clippy::too_many_arguments)]
    fn attention_with_sinks(
        &self,
        q: &Self::Buffer,
        k_cache: &Self::KvBuffer,
        v_cache: &Self::KvBuffer,
        blocks: KvBlocks<'_>,
        shape: AttentionShape,
        sinks: &[f32],
        out: &mut Self::Buffer,
    ) -> Result<()> {
        let _ = (q, k_cache, v_cache, blocks, shape, sinks, out);
        Err(Error::unsupported(self.name(), "attention sinks (gpt-oss)"))
    }
    /// One sequence's `kv_store` of its new rows (`shape.first_row`, `shape.n_tokens` rows of k and
    /// v, to cache row `shape.start_pos`) followed by its `attention` (`attention_with_sinks` when
    /// `sinks` is given) over its contiguous caches: one call where the backend can do both in
    /// one launch (GPU decode, where a step pays per launch). The same numbers as the two calls,
    /// which is the default.
    #[allow(clippy::too_many_arguments)]
    fn kv_store_attention(
        &self,
        q: &Self::Buffer,
        k: &Self::Buffer,
        v: &Self::Buffer,
        k_cache: &mut Self::KvBuffer,
        v_cache: &mut Self::KvBuffer,
        shape: AttentionShape,
        sinks: Option<&[f32]>,
        out: &mut Self::Buffer,
    ) -> Result<()> {
        let kv_dim = shape.n_head_kv * shape.head_dim;
        self.kv_store(k, v, k_cache, v_cache, shape.first_row, shape.start_pos, shape.n_tokens, kv_dim)?;
        match sinks {
            Some(s) => self.attention_with_sinks(q, k_cache, v_cache, KvBlocks::CONTIGUOUS, shape, s, out),
            None => self.attention(q, k_cache, v_cache, shape, out),
        }
    }
    /// gate = silu(gate) * up over n elements.
    fn silu_mul(&self, gate: &mut Self::Buffer, up: &Self::Buffer, n: usize) -> Result<()>;
    /// gate = gpt-oss's clamped SwiGLU of (gate, up) over n elements (`swiglu_oai_host`). The
    /// default computes it on the host through `read` and `write`.
    fn swiglu_oai(&self, gate: &mut Self::Buffer, up: &Self::Buffer, n: usize) -> Result<()> {
        let (mut g, mut u) = (vec![0f32; n], vec![0f32; n]);
        self.read(gate, 0, &mut g)?;
        self.read(up, 0, &mut u)?;
        swiglu_oai_host(&mut g, &u);
        self.write(gate, 0, &g)
    }
    /// gate = gelu_tanh(gate) * up over n elements, as ggml's CPU geglu computes it
    /// (`quant::simd::geglu::geglu_ggml`; Gemma's FFN). The default goes through host memory.
    fn gelu_tanh_mul(&self, gate: &mut Self::Buffer, up: &Self::Buffer, n: usize) -> Result<()> {
        let (mut g, mut u) = (vec![0f32; n], vec![0f32; n]);
        self.read(gate, 0, &mut g)?;
        self.read(up, 0, &mut u)?;
        crate::quant::simd::geglu::geglu_ggml(&mut g, &u);
        self.write(gate, 0, &g)
    }
    /// x *= s over n elements (Gemma's embedding scale). The default goes through host memory.
    fn scale(&self, x: &mut Self::Buffer, n: usize, s: f32) -> Result<()> {
        let mut v = vec![0f32; n];
        self.read(x, 0, &mut v)?;
        v.iter_mut().for_each(|e| *e *= s);
        self.write(x, 0, &v)
    }
    /// x += y over n elements.
    fn add(&self, x: &mut Self::Buffer, y: &Self::Buffer, n: usize) -> Result<()>;
    /// Copies row `src_row` of `src` (width `dim`) to row 0 of dst.
    fn copy_row(&self, src: &Self::Buffer, src_row: usize, dim: usize, dst: &mut Self::Buffer) -> Result<()>;
    /// Copies rows `rows[i]` of `src` (width `dim`) to row i of dst (the rows whose logits a
    /// batch returns).
    fn gather_rows(&self, src: &Self::Buffer, rows: &[usize], dim: usize, dst: &mut Self::Buffer) -> Result<()>;
    /// A view of rows `first_row..first_row + n_rows` of `w` (for example one expert's matrix
    /// of an expert-major 3-D tensor), named `name`, sharing `w`'s storage (no copy). Backends
    /// without views refuse.
    fn weight_rows(&self, w: &WeightOf<Self>, first_row: usize, n_rows: usize, name: &str) -> Result<WeightOf<Self>> {
        let _ = (first_row, n_rows, name);
        Err(Error::unsupported(self.name(), format!("row views (of \"{}\")", w.name)))
    }
    /// The table of one MoE layer's experts for `routed_experts`, from their `weight_rows`
    /// views (`gate[e]`, `up[e]`, `down[e]` are expert e's), or None: this backend routes on
    /// the host (the default), or has no routed kernels for these weights.
    fn expert_table(
        &self,
        gate: &[&WeightOf<Self>],
        up: &[&WeightOf<Self>],
        down: &[&WeightOf<Self>],
    ) -> Result<Option<Self::ExpertTable>> {
        let _ = (gate, up, down);
        Ok(None)
    }
    /// Adds per-expert bias rows (gpt-oss's `ffn_{gate,up,down}_exps.bias`: expert e's one-row
    /// f32 weight at index e) to a table `expert_table` made, for `routed_experts` to add after
    /// each matrix. False where the backend's routed kernels take no biases (the default; the
    /// model then routes that layer on the host).
    fn expert_biases(
        &self,
        table: &mut Self::ExpertTable,
        gate: &[&WeightOf<Self>],
        up: &[&WeightOf<Self>],
        down: &[&WeightOf<Self>],
    ) -> Result<bool> {
        let _ = (table, gate, up, down);
        Ok(false)
    }
    /// The routed experts of an MoE block with the routing on the device (see
    /// [`RoutedExperts`]); only called with a table `expert_table` made.
    fn routed_experts(&self, r: RoutedExperts<'_, Self>) -> Result<()> {
        let _ = r;
        Err(Error::unsupported(self.name(), "device-side expert routing"))
    }
    /// The prefill form of `routed_experts`, with the routing made on the host (`experts[t*k+s]`
    /// chosen for token t's slot s with weight `weights[t*k+s]`): every (token, slot)
    /// row through its expert's SwiGLU and down in one grouped launch per matrix, then `out` =
    /// the weighted sum over the slots (n x dim). Returns false where the backend has no grouped
    /// kernels for this table (the model then runs expert by expert); the default.
    #[allow(clippy::too_many_arguments)]
    fn grouped_experts(
        &self,
        table: &Self::ExpertTable,
        experts: &[u32],
        weights: &[f32],
        k: usize,
        x: &Self::Buffer,
        n: usize,
        dim: usize,
        out: &mut Self::Buffer,
    ) -> Result<bool> {
        let _ = (table, experts, weights, k, x, n, dim, out);
        Ok(false)
    }
    /// dst[rows[i]] = src[i] for each i, rows of width `dim`; `rows` holds no index twice.
    /// The default goes through host memory.
    fn scatter_rows(&self, src: &Self::Buffer, rows: &[u32], dim: usize, dst: &mut Self::Buffer) -> Result<()> {
        let mut host = vec![0f32; dim];
        for (i, &r) in rows.iter().enumerate() {
            self.read(src, i * dim, &mut host)?;
            self.write(dst, r as usize * dim, &host)?;
        }
        Ok(())
    }
    /// out[t] = sum over s < k of weights[t * k + s] * src[t * k + s] for t < n, rows of width
    /// `dim`: each product is rounded to f32, then the products are added in slot order
    /// starting from slot 0's (llama.cpp: ggml_mul by the weights, then one ggml_add per slot).
    fn weighted_sum_rows(&self, src: &Self::Buffer, weights: &[f32], n: usize, k: usize, dim: usize, out: &mut Self::Buffer) -> Result<()> {
        let mut s = vec![0f32; n * k * dim];
        self.read(src, 0, &mut s)?;
        let mut o = vec![0f32; n * dim];
        weighted_sum_rows_host(&s, weights, n, k, dim, &mut o);
        self.write(out, 0, &o)
    }
    /// x[r] *= scales[r] for each row r of width `dim`.
    fn scale_rows(&self, x: &mut Self::Buffer, scales: &[f32], dim: usize) -> Result<()> {
        let mut host = vec![0f32; scales.len() * dim];
        self.read(x, 0, &mut host)?;
        scale_rows_host(&mut host, scales, dim);
        self.write(x, 0, &host)
    }
    /// Waits for queued work (no-op on CPU).
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    /// Runs a whole forward pass. The CPU backend runs it on one of its own worker threads, so
    /// that each op's parallel split is a cheap join inside the pool instead of a hand-off
    /// from (and a wake-up of) the calling thread; other backends just call it.
    fn run(&self, pass: &mut (dyn FnMut() + Send)) {
        pass()
    }
    /// What a benchmark fingerprint records about this backend.
    fn fingerprint(&self) -> serde_json::Value {
        serde_json::json!({ "name": self.name(), "variant": self.variant() })
    }
}

/// Host implementation of [`Backend::weighted_sum_rows`].
/// gpt-oss's activation as ggml's CPU `swiglu_oai` computes it (alpha 1.702, limit 7):
/// x = min(gate, 7), y = clamp(up, -7, 7), gate <- x / (1 + exp(-1.702 x)) * (y + 1).
pub fn swiglu_oai_host(gate: &mut [f32], up: &[f32]) {
    const ALPHA: f32 = 1.702;
    const LIMIT: f32 = 7.0;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = g.min(LIMIT);
        let y = u.clamp(-LIMIT, LIMIT);
        *g = x / (1.0 + (ALPHA * -x).exp()) * (y + 1.0);
    }
}

pub fn weighted_sum_rows_host(src: &[f32], weights: &[f32], n: usize, k: usize, dim: usize, out: &mut [f32]) {
    for t in 0..n {
        let o = &mut out[t * dim..(t + 1) * dim];
        for s in 0..k {
            let w = weights[t * k + s];
            let row = &src[(t * k + s) * dim..(t * k + s + 1) * dim];
            if s == 0 {
                o.iter_mut().zip(row).for_each(|(o, x)| *o = x * w);
            } else {
                o.iter_mut().zip(row).for_each(|(o, x)| *o += x * w);
            }
        }
    }
}

/// Host implementation of [`Backend::scale_rows`].
pub fn scale_rows_host(x: &mut [f32], scales: &[f32], dim: usize) {
    for (row, s) in x.chunks_mut(dim).zip(scales) {
        row.iter_mut().for_each(|v| *v *= s);
    }
}

/// Backend choice on the command line (`generate`, `bench`, `logits`).
#[derive(clap::Args, Debug, Clone)]
pub struct BackendArgs {
    /// Compute backend: cpu, cuda, hip or auto.
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// Kernel folder of a GPU backend (default: the newest build/kernels/<compiler>/<arch>).
    #[arg(long)]
    pub kernel_dir: Option<std::path::PathBuf>,
    /// GPU device index.
    #[arg(long, default_value_t = 0)]
    pub gpu_device: usize,
    /// Load the sched_barrier builds of the GEMM kernels.
    #[arg(long)]
    pub sched_barrier: bool,
    /// GPU: queue every launch on its own instead of replaying captured decode graphs.
    #[arg(long)]
    pub gpu_eager: bool,
    /// GPU prefill GEMM tile: auto (default), 64x64 or 128x128 (for measuring the tile choice).
    #[arg(long)]
    pub gpu_gemm_tile: Option<String>,
    /// GPU prefill attention: auto (default: the matrix-step kernel for head sizes 64 and 128) or scalar.
    #[arg(long)]
    pub gpu_prefill_attention: Option<String>,
    /// GPU decode mat-vec kernels: dp4a (default), dp4a-g32, dp4a-g64, dp4a-g128 or wave.
    #[arg(long)]
    pub gpu_matvec: Option<String>,
    /// Where the model file's bytes live: mmap or huge_pages (default: engine.weights_memory's).
    #[arg(long, value_enum)]
    pub weights_memory: Option<crate::gguf::WeightsMemory>,
    /// CPU: repack Q4_K and Q8_0 matrices at load for the eight-row AVX-512 kernels (default true:
    /// engine.cpu_repack's; `--cpu-repack false` keeps the row-by-row dots).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub cpu_repack: Option<bool>,
    /// GPU: run qwen3moe / qwen2moe models (default true; `--gpu-moe false` refuses them, docs/GPU.md).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub gpu_moe: Option<bool>,
    /// GPU: batched decode (4+ rows) runs the Q8_0 / Q5_0 / Q4_K mat-vecs on the matrix units
    /// (engine.gpu.matvec_mma, default true; `--gpu-matvec-mma false` keeps the dp4a builds).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub gpu_matvec_mma: Option<bool>,
    /// GPU: matrix-unit mat-vecs of matrices with fewer tiles than compute units run the 16-wave
    /// builds (engine.gpu.matvec_mma_wide, default true; `--gpu-matvec-mma-wide false`: 8 waves).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub gpu_matvec_mma_wide: Option<bool>,
    /// GPU: MoE decode routes on the device (engine.gpu.moe_device_routing, default true;
    /// `--gpu-moe-device-routing false` downloads the router logits and routes on the host).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub gpu_moe_device_routing: Option<bool>,
    /// GPU: keep an f16 copy of every Q4_K matrix for the prefill GEMM (engine.gpu.q4k_f16_copies,
    /// default false: the GEMM dequantises the raw blocks while it stages them, same result,
    /// 0.56 instead of 2.56 bytes per weight).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub gpu_q4k_f16_copies: Option<bool>,
    /// GPU: decode kernels start while the kernel before them finishes (engine.gpu.overlap_launches,
    /// default true; CUDA sm_90+; `--gpu-overlap-launches false` launches each after the previous).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub gpu_overlap_launches: Option<bool>,
    /// GPU: timed graph replays read a device clock from a stamp kernel between launches
    /// (engine.gpu.timing_stamps, default true; `--gpu-timing-stamps false` records events there).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub gpu_timing_stamps: Option<bool>,
}

impl BackendArgs {
    pub fn gpu_options(&self) -> gpu::GpuOptions {
        gpu::GpuOptions {
            device: self.gpu_device,
            kernel_dir: self.kernel_dir.clone().unwrap_or_default(),
            sched_barrier: self.sched_barrier,
            batched_attention: true,
            batched_prefill_attention: true,
            matvec_max_rows: 0,
            gemm_tile: self.gpu_gemm_tile.clone().unwrap_or_default(),
            prefill_attention: self.gpu_prefill_attention.clone().unwrap_or_default(),
            weights: String::new(),
            eager: self.gpu_eager,
            matvec: self.gpu_matvec.clone().unwrap_or_default(),
            moe: self.gpu_moe.unwrap_or(true),
            matvec_mma: self.gpu_matvec_mma.unwrap_or(true),
            matvec_mma_wide: self.gpu_matvec_mma_wide.unwrap_or(true),
            moe_device_routing: self.gpu_moe_device_routing.unwrap_or(true),
            q4k_f16_copies: self.gpu_q4k_f16_copies.unwrap_or(false),
            overlap_launches: self.gpu_overlap_launches.unwrap_or(true),
            timing_stamps: self.gpu_timing_stamps.unwrap_or(true),
            pool_free_bytes: gpu::DEFAULT_POOL_FREE_BYTES,
        }
    }
}

/// Backends compiled into this binary, in the order "auto" tries them.
pub fn compiled_backends() -> Vec<&'static str> {
    let mut v = Vec::new();
    if cfg!(feature = "hip") {
        v.push("hip");
    }
    if cfg!(feature = "cuda") {
        v.push("cuda");
    }
    v.push("cpu");
    v
}

/// A backend chosen at run time (by name, in the config or on the command line). Code that
/// runs a model is generic over [`Backend`]: the caller matches this once, with
/// [`with_backend!`](crate::with_backend), and each arm runs the monomorphised code of its
/// backend.
#[derive(Clone)]
pub enum LoadedBackend {
    Cpu(Arc<cpu::CpuBackend>),
    #[cfg(feature = "cuda")]
    Cuda(Arc<gpu::GpuBackend<gpu::cuda::CudaApi>>),
    #[cfg(feature = "hip")]
    Hip(Arc<gpu::GpuBackend<gpu::hip::HipApi>>),
}

/// Runs `$body` with `$be` bound to the `Arc` of the backend a [`LoadedBackend`] holds, for
/// whichever backend it is (one match arm per backend compiled in, each monomorphised).
#[macro_export]
macro_rules! with_backend {
    ($loaded:expr, $be:ident => $body:expr) => {
        match $loaded {
            $crate::backend::LoadedBackend::Cpu($be) => $body,
            #[cfg(feature = "cuda")]
            $crate::backend::LoadedBackend::Cuda($be) => $body,
            #[cfg(feature = "hip")]
            $crate::backend::LoadedBackend::Hip($be) => $body,
        }
    };
}

impl LoadedBackend {
    /// "cpu", "hip", "cuda".
    pub fn name(&self) -> &'static str {
        with_backend!(self, b => b.name())
    }
}

/// The CPU backend on `threads` threads (0: one per physical core), Q4_K repacked at load.
pub fn create_cpu(threads: usize) -> anyhow::Result<Arc<cpu::CpuBackend>> {
    Ok(Arc::new(cpu::CpuBackend::new(threads)?))
}

/// Creates the CPU backend, or a GPU backend with default options (see [`create_with`]).
pub fn create(name: &str, threads: usize) -> anyhow::Result<LoadedBackend> {
    create_with(name, threads, true, &gpu::GpuOptions::default())
}

/// Creates the backend named in the config: "cpu", "hip", "cuda", or "auto" (the first GPU
/// backend that finds a device, else the CPU one, saying so in the log). A GPU backend asked
/// for by name never falls back: without its device it is an error.
/// `cpu_repack`: whether the CPU backend repacks Q4_K matrices at load (`engine.cpu_repack`).
pub fn create_with(name: &str, threads: usize, cpu_repack: bool, gpu_opts: &gpu::GpuOptions) -> anyhow::Result<LoadedBackend> {
    // Not `create_cpu`: that would shadow the public fn above (which always repacks), and a
    // reader could not tell which of the two a call site runs.
    let cpu_backend = |threads| anyhow::Ok(Arc::new(cpu::CpuBackend::with_options(threads, cpu_repack)?));
    match name {
        "cpu" => Ok(LoadedBackend::Cpu(cpu_backend(threads)?)),
        "auto" => {
            for gpu_name in compiled_backends().into_iter().filter(|b| *b != "cpu") {
                match create_gpu(gpu_name, gpu_opts) {
                    Ok(b) => return Ok(b),
                    Err(e) => tracing::warn!(backend = gpu_name, error = %format!("{e:#}"), "backend auto: GPU backend unavailable"),
                }
            }
            tracing::info!("backend auto: using the CPU backend");
            Ok(LoadedBackend::Cpu(cpu_backend(threads)?))
        }
        "hip" | "cuda" => create_gpu(name, gpu_opts),
        other => anyhow::bail!("unknown backend \"{other}\" (expected cpu, hip, cuda or auto)"),
    }
}

#[allow(unused_variables)]
fn create_gpu(name: &str, opts: &gpu::GpuOptions) -> anyhow::Result<LoadedBackend> {
    match name {
        #[cfg(feature = "cuda")]
        "cuda" => {
            if !opts.weights.is_empty() && opts.weights != "device" {
                anyhow::bail!("cuda backend: engine.gpu.weights = \"{}\" is not supported (only \"device\")", opts.weights);
            }
            Ok(LoadedBackend::Cuda(Arc::new(gpu::GpuBackend::new(gpu::cuda::CudaApi::new(opts.device)?, opts)?)))
        }
        #[cfg(feature = "hip")]
        "hip" => Ok(LoadedBackend::Hip(Arc::new(gpu::GpuBackend::new(gpu::hip::HipApi::new(opts.device, &opts.weights)?, opts)?))),
        _ => anyhow::bail!(
            "backend \"{name}\" is not available in this build (compiled: {}); rebuild with `cargo build --release --features {name}`",
            compiled_backends().join(", ")
        ),
    }
}
