//! A backend for tests that forwards every `Backend` method to an inner backend, except where
//! the test's `Hooks` step in.
//!
//! Tests wrap the CPU backend to count, reroute or emulate a few calls. A hand-written wrapper
//! that forwards only some methods silently inherits the trait's defaults for the others,
//! which can differ from the inner backend's own implementations (the CPU backend's fused
//! `matmul_add`, `rope_qk`, `attention_paged_many`, ...), so the test would no longer run the
//! code it claims to check. Here every method forwards to the inner backend; the few a test
//! steps into go through a `Hooks` method whose default is the plain inner call.

use civetta::backend::{
    AttentionShape, Backend, HostBuffer, KvBlocks, Result, RopeScaling, RopeStyle, RoutedExperts, SeqAttention, WeightOf,
};
use civetta::gguf::{GgmlType, GgufFile};
use civetta::model::HParams;
use std::sync::Arc;

/// The expert table the wrapper hands out: the inner backend's (`InnerTable`), or the hooks'
/// own where they make the tables themselves (their `expert_table` hook then never calls the
/// conversions).
pub trait ExpertTableOf<B: Backend>: Send + Sync + Sized + 'static {
    fn from_inner(t: B::ExpertTable) -> Self;
    fn inner(&self) -> &B::ExpertTable;
    fn inner_mut(&mut self) -> &mut B::ExpertTable;
}

/// The inner backend's expert table, as is.
pub struct InnerTable<B: Backend>(pub B::ExpertTable);

impl<B: Backend> ExpertTableOf<B> for InnerTable<B> {
    fn from_inner(t: B::ExpertTable) -> Self {
        InnerTable(t)
    }
    fn inner(&self) -> &B::ExpertTable {
        &self.0
    }
    fn inner_mut(&mut self) -> &mut B::ExpertTable {
        &mut self.0
    }
}

/// `inner` and the hooks; `Delegate<B, H>` is the backend a test loads its model with.
pub struct Delegate<B: Backend, H: Hooks<B>> {
    pub inner: Arc<B>,
    pub hooks: H,
}

impl<B: Backend, H: Hooks<B>> Delegate<B, H> {
    pub fn new(inner: Arc<B>, hooks: H) -> Arc<Self> {
        Arc::new(Delegate { inner, hooks })
    }
}

/// The `Backend` methods a test can step into, each taking the inner backend first; the
/// defaults forward. A test that needs another one adds its hook here.
#[allow(clippy::too_many_arguments)]
pub trait Hooks<B: Backend>: Send + Sync + Sized + 'static {
    type Table: ExpertTableOf<B>;

    fn alloc(&self, inner: &B, len: usize) -> Result<B::Buffer> {
        inner.alloc(len)
    }
    fn decode_attention_batch(
        &self,
        inner: &B,
        q: &B::Buffer,
        k: &B::Buffer,
        v: &B::Buffer,
        caches: &mut [(&mut B::KvBuffer, &mut B::KvBuffer)],
        start_pos: &[usize],
        shape: AttentionShape,
        out: &mut B::Buffer,
    ) -> Result<bool> {
        inner.decode_attention_batch(q, k, v, caches, start_pos, shape, out)
    }
    fn attention_batch(
        &self,
        inner: &B,
        q: &B::Buffer,
        k: &B::Buffer,
        v: &B::Buffer,
        caches: &mut [(&mut B::KvBuffer, &mut B::KvBuffer)],
        shapes: &[AttentionShape],
        sinks: Option<&[f32]>,
        out: &mut B::Buffer,
    ) -> Result<bool> {
        inner.attention_batch(q, k, v, caches, shapes, sinks, out)
    }
    fn expert_table(&self, inner: &B, gate: &[&WeightOf<B>], up: &[&WeightOf<B>], down: &[&WeightOf<B>]) -> Result<Option<Self::Table>> {
        Ok(inner.expert_table(gate, up, down)?.map(Self::Table::from_inner))
    }
    fn expert_biases(
        &self,
        inner: &B,
        table: &mut Self::Table,
        gate: &[&WeightOf<B>],
        up: &[&WeightOf<B>],
        down: &[&WeightOf<B>],
    ) -> Result<bool> {
        inner.expert_biases(table.inner_mut(), gate, up, down)
    }
    fn routed_experts(&self, inner: &B, r: RoutedExperts<'_, Delegate<B, Self>>) -> Result<()> {
        inner.routed_experts(RoutedExperts {
            table: r.table.inner(),
            params: r.params,
            logits: r.logits,
            router_bias: r.router_bias,
            x: r.x,
            n: r.n,
            dim: r.dim,
            choice: r.choice,
            ids_log: r.ids_log,
            gate: r.gate,
            up: r.up,
            slots: r.slots,
            out: r.out,
        })
    }
    fn grouped_experts(
        &self,
        inner: &B,
        table: &Self::Table,
        experts: &[u32],
        weights: &[f32],
        k: usize,
        x: &B::Buffer,
        n: usize,
        dim: usize,
        out: &mut B::Buffer,
    ) -> Result<bool> {
        inner.grouped_experts(table.inner(), experts, weights, k, x, n, dim, out)
    }
}

impl<B: Backend, H: Hooks<B>> Backend for Delegate<B, H> {
    type Buffer = B::Buffer;
    type KvBuffer = B::KvBuffer;
    type WeightData = B::WeightData;
    type ExpertTable = H::Table;

    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn variant(&self) -> &'static str {
        self.inner.variant()
    }
    fn supports(&self, t: GgmlType) -> bool {
        self.inner.supports(t)
    }
    fn check_model(&self, hp: &HParams) -> Result<()> {
        self.inner.check_model(hp)
    }
    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> Result<WeightOf<Self>> {
        self.inner.load_weight(file, name)
    }
    fn load_embedding(&self, file: &Arc<GgufFile>, name: &str) -> Result<WeightOf<Self>> {
        self.inner.load_embedding(file, name)
    }
    fn alloc(&self, len: usize) -> Result<Self::Buffer> {
        self.hooks.alloc(&self.inner, len)
    }
    fn alloc_host(&self, len: usize) -> Result<HostBuffer> {
        self.inner.alloc_host(len)
    }
    fn alloc_kv_cache(&self, len: usize) -> Result<Self::KvBuffer> {
        self.inner.alloc_kv_cache(len)
    }
    fn kv_cache_elem_bytes(&self) -> usize {
        self.inner.kv_cache_elem_bytes()
    }
    fn write(&self, dst: &mut Self::Buffer, offset: usize, src: &[f32]) -> Result<()> {
        self.inner.write(dst, offset, src)
    }
    fn read(&self, src: &Self::Buffer, offset: usize, dst: &mut [f32]) -> Result<()> {
        self.inner.read(src, offset, dst)
    }
    fn embed(&self, table: &WeightOf<Self>, tokens: &[u32], out: &mut Self::Buffer) -> Result<()> {
        self.inner.embed(table, tokens, out)
    }
    fn rmsnorm(&self, x: &Self::Buffer, w: &WeightOf<Self>, rows: usize, dim: usize, eps: f32, out: &mut Self::Buffer) -> Result<()> {
        self.inner.rmsnorm(x, w, rows, dim, eps, out)
    }
    fn rmsnorm_inplace(&self, x: &mut Self::Buffer, w: &WeightOf<Self>, rows: usize, dim: usize, eps: f32) -> Result<()> {
        self.inner.rmsnorm_inplace(x, w, rows, dim, eps)
    }
    fn matmul(&self, w: &WeightOf<Self>, x: &Self::Buffer, rows: usize, out: &mut Self::Buffer) -> Result<()> {
        self.inner.matmul(w, x, rows, out)
    }
    fn matmul_many(&self, ws: &[&WeightOf<Self>], x: &Self::Buffer, rows: usize, outs: &mut [&mut Self::Buffer]) -> Result<()> {
        self.inner.matmul_many(ws, x, rows, outs)
    }
    fn matmul_add(
        &self,
        w: &WeightOf<Self>,
        x: &mut Self::Buffer,
        up: Option<&Self::Buffer>,
        rows: usize,
        out: &mut Self::Buffer,
        scratch: &mut Self::Buffer,
    ) -> Result<()> {
        self.inner.matmul_add(w, x, up, rows, out, scratch)
    }
    fn add_bias(&self, x: &mut Self::Buffer, b: &WeightOf<Self>, rows: usize) -> Result<()> {
        self.inner.add_bias(x, b, rows)
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
        self.inner.rope(x, positions, n_heads, head_dim, freq_base, style)
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
        self.inner.rope_scaled(x, positions, n_heads, head_dim, freq_base, style, scaling)
    }
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
        self.inner.rope_qk(q, k, positions, n_head, n_head_kv, head_dim, freq_base, style, scaling)
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
        self.inner.kv_store(k, v, k_cache, v_cache, src_row, start_pos, n_tokens, kv_dim)
    }
    fn attention(
        &self,
        q: &Self::Buffer,
        k_cache: &Self::KvBuffer,
        v_cache: &Self::KvBuffer,
        shape: AttentionShape,
        out: &mut Self::Buffer,
    ) -> Result<()> {
        self.inner.attention(q, k_cache, v_cache, shape, out)
    }
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
        self.hooks.decode_attention_batch(&self.inner, q, k, v, caches, start_pos, shape, out)
    }
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
        self.hooks.attention_batch(&self.inner, q, k, v, caches, shapes, sinks, out)
    }
    fn paged_kv(&self) -> bool {
        self.inner.paged_kv()
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
        self.inner.kv_store_paged(k, v, k_pool, v_pool, src_row, blocks, start_pos, n_tokens, kv_dim)
    }
    fn attention_paged(
        &self,
        q: &Self::Buffer,
        k_pool: &Self::KvBuffer,
        v_pool: &Self::KvBuffer,
        blocks: KvBlocks<'_>,
        shape: AttentionShape,
        out: &mut Self::Buffer,
    ) -> Result<()> {
        self.inner.attention_paged(q, k_pool, v_pool, blocks, shape, out)
    }
    fn attention_paged_many(
        &self,
        q: &Self::Buffer,
        k_pool: &Self::KvBuffer,
        v_pool: &Self::KvBuffer,
        seqs: &[SeqAttention<'_>],
        sinks: Option<&[f32]>,
        out: &mut Self::Buffer,
    ) -> Result<()> {
        self.inner.attention_paged_many(q, k_pool, v_pool, seqs, sinks, out)
    }
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
        self.inner.attention_with_sinks(q, k_cache, v_cache, blocks, shape, sinks, out)
    }
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
        self.inner.kv_store_attention(q, k, v, k_cache, v_cache, shape, sinks, out)
    }
    fn silu_mul(&self, gate: &mut Self::Buffer, up: &Self::Buffer, n: usize) -> Result<()> {
        self.inner.silu_mul(gate, up, n)
    }
    fn swiglu_oai(&self, gate: &mut Self::Buffer, up: &Self::Buffer, n: usize) -> Result<()> {
        self.inner.swiglu_oai(gate, up, n)
    }
    fn gelu_tanh_mul(&self, gate: &mut Self::Buffer, up: &Self::Buffer, n: usize) -> Result<()> {
        self.inner.gelu_tanh_mul(gate, up, n)
    }
    fn scale(&self, x: &mut Self::Buffer, n: usize, s: f32) -> Result<()> {
        self.inner.scale(x, n, s)
    }
    fn add(&self, x: &mut Self::Buffer, y: &Self::Buffer, n: usize) -> Result<()> {
        self.inner.add(x, y, n)
    }
    fn copy_row(&self, src: &Self::Buffer, src_row: usize, dim: usize, dst: &mut Self::Buffer) -> Result<()> {
        self.inner.copy_row(src, src_row, dim, dst)
    }
    fn gather_rows(&self, src: &Self::Buffer, rows: &[usize], dim: usize, dst: &mut Self::Buffer) -> Result<()> {
        self.inner.gather_rows(src, rows, dim, dst)
    }
    fn weight_rows(&self, w: &WeightOf<Self>, first_row: usize, n_rows: usize, name: &str) -> Result<WeightOf<Self>> {
        self.inner.weight_rows(w, first_row, n_rows, name)
    }
    fn expert_table(
        &self,
        gate: &[&WeightOf<Self>],
        up: &[&WeightOf<Self>],
        down: &[&WeightOf<Self>],
    ) -> Result<Option<Self::ExpertTable>> {
        self.hooks.expert_table(&self.inner, gate, up, down)
    }
    fn expert_biases(
        &self,
        table: &mut Self::ExpertTable,
        gate: &[&WeightOf<Self>],
        up: &[&WeightOf<Self>],
        down: &[&WeightOf<Self>],
    ) -> Result<bool> {
        self.hooks.expert_biases(&self.inner, table, gate, up, down)
    }
    fn routed_experts(&self, r: RoutedExperts<'_, Self>) -> Result<()> {
        self.hooks.routed_experts(&self.inner, r)
    }
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
        self.hooks.grouped_experts(&self.inner, table, experts, weights, k, x, n, dim, out)
    }
    fn scatter_rows(&self, src: &Self::Buffer, rows: &[u32], dim: usize, dst: &mut Self::Buffer) -> Result<()> {
        self.inner.scatter_rows(src, rows, dim, dst)
    }
    fn weighted_sum_rows(&self, src: &Self::Buffer, weights: &[f32], n: usize, k: usize, dim: usize, out: &mut Self::Buffer) -> Result<()> {
        self.inner.weighted_sum_rows(src, weights, n, k, dim, out)
    }
    fn scale_rows(&self, x: &mut Self::Buffer, scales: &[f32], dim: usize) -> Result<()> {
        self.inner.scale_rows(x, scales, dim)
    }
    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }
    fn run(&self, pass: &mut (dyn FnMut() + Send)) {
        self.inner.run(pass)
    }
    fn fingerprint(&self) -> serde_json::Value {
        self.inner.fingerprint()
    }
}
