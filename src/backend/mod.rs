//! The Backend trait: memory and the ops the forward pass needs.
//!
//! The forward pass (`crate::model`) only talks to this trait, so CPU, HIP and CUDA backends
//! are interchangeable. Buffers and weights are opaque handles that each backend downcasts
//! to its own storage. Every op implementation reports through `crate::kernel_registry`.

pub mod cpu;

use crate::gguf::{GgmlType, GgufFile};
use std::any::Any;
use std::sync::Arc;

/// An f32 activation buffer owned by a backend.
pub struct Buffer {
    pub len: usize,
    pub(crate) inner: Box<dyn Any + Send + Sync>,
}

/// A weight tensor prepared by a backend. 2-D weights are `rows` x `cols` in ggml order:
/// each of the `rows` rows holds `cols` contiguous elements (a linear layer's output row).
pub struct Weight {
    pub name: String,
    pub ggml_type: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub(crate) inner: Box<dyn Any + Send + Sync>,
}

/// Rotary embedding pairing: adjacent elements (llama) or halves (NeoX, Qwen).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    Norm,
    Neox,
}

/// Geometry of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    /// New query rows (tokens) in this call.
    pub n_tokens: usize,
    /// Position of the first new token; the cache holds positions 0..start_pos+n_tokens.
    pub start_pos: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
}

pub trait Backend: Send + Sync {
    /// "cpu", "hip", "cuda".
    fn name(&self) -> &'static str;
    /// Implementation variant shown in metrics, e.g. "avx512vnni".
    fn variant(&self) -> &'static str;
    /// Whether this backend can compute with weights of this type.
    fn supports(&self, t: GgmlType) -> bool;

    /// Makes a tensor of the model file usable by this backend (borrowed from the mmap on CPU).
    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> anyhow::Result<Weight>;
    fn alloc(&self, len: usize) -> anyhow::Result<Buffer>;
    /// Allocates one layer's K or V cache of `len` elements. Backends pick the element type
    /// (f32 by default; f16 like llama.cpp where a backend stores it so); only `kv_store` and
    /// `attention` of the same backend read or write it.
    fn alloc_kv_cache(&self, len: usize) -> anyhow::Result<Buffer> {
        self.alloc(len)
    }
    /// Bytes per cached K or V element (matches `alloc_kv_cache`).
    fn kv_cache_elem_bytes(&self) -> usize {
        4
    }
    fn write(&self, dst: &mut Buffer, offset: usize, src: &[f32]);
    fn read(&self, src: &Buffer, offset: usize, dst: &mut [f32]);

    /// out[t] = dequantized row tokens[t] of `table`.
    fn embed(&self, table: &Weight, tokens: &[u32], out: &mut Buffer) -> anyhow::Result<()>;
    /// out = x / rms(x) * w over `rows` rows of `dim` (in place when x and out alias is not allowed: use rmsnorm_inplace).
    fn rmsnorm(&self, x: &Buffer, w: &Weight, rows: usize, dim: usize, eps: f32, out: &mut Buffer);
    fn rmsnorm_inplace(&self, x: &mut Buffer, w: &Weight, rows: usize, dim: usize, eps: f32);
    /// out[rows x w.rows] = x[rows x w.cols] · wᵀ.
    fn matmul(&self, w: &Weight, x: &Buffer, rows: usize, out: &mut Buffer);
    /// x[r] += b for each of `rows` rows.
    fn add_bias(&self, x: &mut Buffer, b: &Weight, rows: usize);
    /// Rotates `n_heads` heads of `head_dim` in each of the rows; row t has position positions[t].
    fn rope(&self, x: &mut Buffer, positions: &[u32], n_heads: usize, head_dim: usize, freq_base: f32, style: RopeStyle);
    /// Copies `n_tokens` rows of k and v (each `kv_dim` wide) into the caches at row `start_pos`.
    #[allow(clippy::too_many_arguments)]
    fn kv_store(
        &self,
        k: &Buffer,
        v: &Buffer,
        k_cache: &mut Buffer,
        v_cache: &mut Buffer,
        start_pos: usize,
        n_tokens: usize,
        kv_dim: usize,
    );
    /// Causal multi-head attention of q against the caches (GQA when n_head_kv < n_head).
    fn attention(&self, q: &Buffer, k_cache: &Buffer, v_cache: &Buffer, shape: AttentionShape, out: &mut Buffer);
    /// gate = silu(gate) * up over n elements.
    fn silu_mul(&self, gate: &mut Buffer, up: &Buffer, n: usize);
    /// x += y over n elements.
    fn add(&self, x: &mut Buffer, y: &Buffer, n: usize);
    /// Copies row `src_row` of `src` (width `dim`) to row 0 of dst.
    fn copy_row(&self, src: &Buffer, src_row: usize, dim: usize, dst: &mut Buffer);
    /// Waits for queued work (no-op on CPU).
    fn synchronize(&self) {}
}

/// Creates the backend named in the config. "auto" picks the best available.
pub fn create(name: &str, threads: usize) -> anyhow::Result<Arc<dyn Backend>> {
    match name {
        "cpu" | "auto" => Ok(Arc::new(cpu::CpuBackend::new(threads)?)),
        other => {
            anyhow::bail!("backend \"{other}\" is not available in this build (available: cpu; GPU backends need --features hip or cuda)")
        }
    }
}
