//! The transformer forward pass (llama, qwen2, qwen3, qwen2moe, qwen3moe, gemma3), written against the Backend trait.
//!
//! Per layer: RMSNorm -> q/k/v projections (+bias on qwen2) -> per-head q/k RMSNorm (qwen3,
//! gemma3) -> RoPE -> KV cache store -> causal GQA attention -> output projection ->
//! [gemma3: post-attention RMSNorm] -> residual -> RMSNorm -> FFN -> [gemma3: post-FFN
//! RMSNorm] -> residual. The FFN is an enum so a mixture-of-experts block (qwen3moe) is one
//! more variant and one more match arm.
//!
//! Gemma 3 (checked against llama.cpp's src/models/gemma3.cpp): embeddings scaled by
//! sqrt(n_embd); the post norms above; GeGLU (tanh GELU) FFN; sliding-window local layers
//! with their own RoPE base (`HParams::layer_window`, `layer_rope_base`); queries scaled by
//! 1/sqrt(head_dim) as in every other arch; output tied to token_embd. Its GGUF norm weights
//! already hold 1 + w (llama.cpp's converter adds the 1), so the RMSNorms are the plain ones.

mod hparams;
pub mod moe;
pub mod moe_trace;
mod workspace;

pub use hparams::{Arch, ExpertAct, Gating, HParams, MoeParams, RopeScalingKind, RopeScalingParams, SlidingWindow, SUPPORTED_ARCHS};
pub use workspace::{MoeWorkspace, Workspace, WorkspaceShape};

use crate::backend::{AttentionShape, Backend, KvBlocks, SeqAttention, Weight, WeightOf};
use crate::gguf::GgufFile;
use anyhow::{bail, Context};
use std::sync::Arc;

pub struct Attention<B: Backend> {
    pub wq: WeightOf<B>,
    pub wk: WeightOf<B>,
    pub wv: WeightOf<B>,
    pub wo: WeightOf<B>,
    pub bq: Option<WeightOf<B>>,
    pub bk: Option<WeightOf<B>>,
    pub bv: Option<WeightOf<B>>,
    pub q_norm: Option<WeightOf<B>>,
    pub k_norm: Option<WeightOf<B>>,
    /// `attn_output.bias` (gpt-oss).
    pub bo: Option<WeightOf<B>>,
    /// `attn_sinks` (gpt-oss): one logit per query head, on the host.
    pub sinks: Option<Vec<f32>>,
}

pub enum Ffn<B: Backend> {
    /// SwiGLU: down(silu(gate x) * up x).
    Dense { gate: WeightOf<B>, up: WeightOf<B>, down: WeightOf<B> },
    /// Mixture of experts (qwen3moe, qwen2moe): see `moe`.
    Moe(Box<moe::MoeWeights<B>>),
    /// GeGLU (Gemma): down(gelu_tanh(gate x) * up x).
    GeGlu { gate: WeightOf<B>, up: WeightOf<B>, down: WeightOf<B> },
}

pub struct Layer<B: Backend> {
    pub attn_norm: WeightOf<B>,
    pub attn: Attention<B>,
    pub ffn_norm: WeightOf<B>,
    pub ffn: Ffn<B>,
    /// Gemma 3's RMSNorms of the attention output and of the FFN output, before each residual
    /// add (`post_attention_norm`, `post_ffw_norm`); None on the other archs.
    pub post_attn_norm: Option<WeightOf<B>>,
    pub post_ffn_norm: Option<WeightOf<B>>,
}

pub struct Model<B: Backend> {
    pub hp: HParams,
    pub file: Arc<GgufFile>,
    backend: Arc<B>,
    token_embd: WeightOf<B>,
    layers: Vec<Layer<B>>,
    output_norm: WeightOf<B>,
    /// The output projection; None when tied to token_embd.
    output: Option<WeightOf<B>>,
    /// Expert selection counts of a mixture-of-experts model (None for dense ones).
    expert_load: Option<Arc<moe::ExpertLoad>>,
    routing_tap: Option<Arc<moe_trace::RoutingTap>>,
}

/// One sequence's KV cache: `len` positions stored out of `capacity`. Either its own K and
/// V buffer per layer (`Model::new_cache`), or a table of blocks of a shared [`KvPool`]
/// (`KvCache::paged`; the engine's block manager, src/engine/kv.rs, owns the blocks).
pub struct KvCache<B: Backend> {
    storage: KvStorage<B>,
    pub len: usize,
    pub capacity: usize,
    /// Bytes this cache owns (0 for a paged one: the pool is accounted as a whole).
    pub bytes: usize,
}

/// One K or V buffer per layer.
type KvLayers<B> = Vec<<B as Backend>::KvBuffer>;

enum KvStorage<B: Backend> {
    Own {
        k: Vec<B::KvBuffer>,
        v: Vec<B::KvBuffer>,
    },
    /// `blocks` hold every position for the full-attention layers; with a windowed pool
    /// (`KvPool::ring_blocks` > 0) the sliding-window layers keep only the positions their
    /// window can still see, in ring `ring` of the pool's local buffers.
    Paged {
        blocks: Vec<u32>,
        block_size: usize,
        ring: Option<u32>,
    },
}

impl<B: Backend> KvCache<B> {
    /// A cache made of pool blocks, whose first `len` positions are already stored (a
    /// prefix-cache hit); capacity is the blocks' positions.
    pub fn paged(blocks: Vec<u32>, block_size: usize, len: usize) -> KvCache<B> {
        let capacity = blocks.len() * block_size;
        assert!(len <= capacity, "a paged cache of {capacity} positions cannot hold {len}");
        KvCache { storage: KvStorage::Paged { blocks, block_size, ring: None }, len, capacity, bytes: 0 }
    }

    /// The same cache whose sliding-window layers use ring `ring` of a windowed pool.
    pub fn with_ring(mut self, ring: u32) -> KvCache<B> {
        if let KvStorage::Paged { ring: r, .. } = &mut self.storage {
            *r = Some(ring);
        }
        self
    }

    /// Appends one block to a paged cache's table (its ring, if any, is kept).
    pub fn push_block(&mut self, block: u32) {
        if let KvStorage::Paged { blocks, block_size, .. } = &mut self.storage {
            blocks.push(block);
            self.capacity += *block_size;
        }
    }

    /// Hands the local ring of a paged cache back (None: it has none).
    pub fn take_ring(&mut self) -> Option<u32> {
        match &mut self.storage {
            KvStorage::Paged { ring, .. } => ring.take(),
            KvStorage::Own { .. } => None,
        }
    }

    /// The block table of a paged cache (empty for an owned one).
    pub fn blocks(&self) -> &[u32] {
        match &self.storage {
            KvStorage::Paged { blocks, .. } => blocks,
            KvStorage::Own { .. } => &[],
        }
    }

    /// Hands the blocks of a paged cache back (to be released); the cache is empty after.
    pub fn take_blocks(&mut self) -> Vec<u32> {
        self.len = 0;
        self.capacity = 0;
        match &mut self.storage {
            KvStorage::Paged { blocks, .. } => std::mem::take(blocks),
            KvStorage::Own { .. } => Vec::new(),
        }
    }
}

/// The KV pool of a paged cache: per layer one K and one V buffer of `n_blocks` blocks of
/// `block_size` positions, shared by every sequence through its block table.
///
/// A windowed pool (`ring_blocks` > 0, models with sliding-window layers) gives those layers
/// smaller buffers: `rings` rings of `ring_blocks` blocks, one ring per running sequence.
/// Logical block b of a sequence's local layers is block `ring * ring_blocks + b %
/// ring_blocks`: a position overwrites the one `ring_blocks` blocks before it, which no query
/// can see any more (`ring_blocks` covers a window plus the largest chunk, checked per pass).
pub struct KvPool<B: Backend> {
    k: Vec<B::KvBuffer>,
    v: Vec<B::KvBuffer>,
    pub block_size: usize,
    pub n_blocks: usize,
    /// Blocks per local ring (0: not windowed, every layer keeps every position).
    pub ring_blocks: usize,
    pub rings: usize,
    /// Bytes of one block of `n_blocks` (the full-attention layers' part when windowed).
    pub block_bytes: usize,
    /// Bytes of one local ring (0 when not windowed).
    pub ring_bytes: usize,
    pub bytes: usize,
}

impl<B: Backend> KvPool<B> {
    /// A pool without storage, for tests of the block bookkeeping.
    #[cfg(test)]
    pub(crate) fn for_tests(n_blocks: usize, block_size: usize) -> KvPool<B> {
        KvPool { k: Vec::new(), v: Vec::new(), block_size, n_blocks, ring_blocks: 0, rings: 0, block_bytes: 0, ring_bytes: 0, bytes: 0 }
    }

    /// A windowed pool without storage, for tests of the block bookkeeping.
    #[cfg(test)]
    pub(crate) fn for_tests_windowed(n_blocks: usize, block_size: usize, rings: usize, ring_blocks: usize) -> KvPool<B> {
        KvPool { ring_blocks, rings, ..KvPool::for_tests(n_blocks, block_size) }
    }
}

/// One sequence's part of a batched forward pass: its cache, the tokens it appends at
/// positions cache.len.., and which of their logits it wants.
pub struct SeqRows<'a, B: Backend> {
    pub cache: &'a mut KvCache<B>,
    pub tokens: &'a [u32],
    pub logits: Logits,
}

/// Which logits a forward call returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token's (prefill, decode).
    Last,
    /// Every token's (reference tests).
    All,
    /// None (a prefill chunk that is not the last).
    None,
}

impl<B: Backend> Model<B> {
    pub fn load(file: Arc<GgufFile>, backend: Arc<B>) -> anyhow::Result<Model<B>> {
        let hp = HParams::from_gguf(&file)?;
        backend.check_model(&hp)?;
        let w = |name: &str| backend.load_weight(&file, name);
        let opt = |name: &str| -> anyhow::Result<Option<WeightOf<B>>> {
            if file.tensor(name).is_some() {
                Ok(Some(backend.load_weight(&file, name)?))
            } else {
                Ok(None)
            }
        };
        // Untied (the file has its own output matrix), the embedding is read by `embed` only.
        let token_embd = if file.tensor(OUTPUT).is_some() { backend.load_embedding(&file, TOKEN_EMBD)? } else { w(TOKEN_EMBD)? };
        expect_shape(&token_embd, hp.n_embd, hp.n_vocab)?;
        let mut layers = Vec::with_capacity(hp.n_layer);
        let expert_load = hp.moe.as_ref().map(|m| Arc::new(moe::ExpertLoad::new(m.n_expert)));
        let routing_tap = hp.moe.as_ref().map(|_| Arc::new(moe_trace::RoutingTap::default()));
        for i in 0..hp.n_layer {
            let p = |s: &str| format!("blk.{i}.{s}");
            let attn = Attention {
                wq: w(&p("attn_q.weight"))?,
                wk: w(&p("attn_k.weight"))?,
                wv: w(&p("attn_v.weight"))?,
                wo: w(&p("attn_output.weight"))?,
                bq: opt(&p("attn_q.bias"))?,
                bk: opt(&p("attn_k.bias"))?,
                bv: opt(&p("attn_v.bias"))?,
                q_norm: opt(&p("attn_q_norm.weight"))?,
                k_norm: opt(&p("attn_k_norm.weight"))?,
                bo: opt(&p("attn_output.bias"))?,
                sinks: match file.tensor(&p("attn_sinks.weight")) {
                    Some(_) => Some(moe::host_f32(&file, &p("attn_sinks.weight"), hp.n_head)?),
                    None => None,
                },
            };
            if hp.arch == Arch::GptOss && attn.sinks.is_none() {
                bail!("{}: layer {i} lacks attn_sinks required by gpt-oss", file.path.display());
            }
            expect_shape(&attn.wq, hp.n_embd, hp.q_dim())?;
            expect_shape(&attn.wk, hp.n_embd, hp.kv_dim())?;
            expect_shape(&attn.wv, hp.n_embd, hp.kv_dim())?;
            expect_shape(&attn.wo, hp.q_dim(), hp.n_embd)?;
            if hp.arch.has_qk_norm() && (attn.q_norm.is_none() || attn.k_norm.is_none()) {
                bail!("{}: layer {i} lacks attn_q_norm/attn_k_norm required by {}", file.path.display(), hp.arch.name());
            }
            let gemma = hp.arch == Arch::Gemma3;
            let ffn = if hp.moe.is_some() {
                let load = expert_load.clone().context("MoE layer in a model without expert metadata")?;
                let tap = routing_tap.clone().context("MoE layer in a model without expert metadata")?;
                Ffn::Moe(Box::new(moe::load(&*backend, &file, i, &hp, load, tap)?))
            } else {
                let (gate, up, down) = (w(&p("ffn_gate.weight"))?, w(&p("ffn_up.weight"))?, w(&p("ffn_down.weight"))?);
                expect_shape(&gate, hp.n_embd, hp.n_ff)?;
                expect_shape(&up, hp.n_embd, hp.n_ff)?;
                expect_shape(&down, hp.n_ff, hp.n_embd)?;
                if gemma {
                    Ffn::GeGlu { gate, up, down }
                } else {
                    Ffn::Dense { gate, up, down }
                }
            };
            let (post_attn_norm, post_ffn_norm) =
                if gemma { (Some(w(&p("post_attention_norm.weight"))?), Some(w(&p("post_ffw_norm.weight"))?)) } else { (None, None) };
            layers.push(Layer {
                attn_norm: w(&p("attn_norm.weight"))?,
                attn,
                // gpt-oss names its pre-FFN norm post_attention_norm.
                ffn_norm: w(&p(if hp.arch == Arch::GptOss { "post_attention_norm.weight" } else { "ffn_norm.weight" }))?,
                ffn,
                post_attn_norm,
                post_ffn_norm,
            });
        }
        let output_norm = w("output_norm.weight")?;
        let output = opt(OUTPUT)?;
        if let Some(o) = &output {
            expect_shape(o, hp.n_embd, hp.n_vocab)?;
        }
        Ok(Model { hp, file, backend, token_embd, layers, output_norm, output, expert_load, routing_tap })
    }

    /// How often each expert was selected so far (MoE models).
    pub fn expert_load(&self) -> Option<&Arc<moe::ExpertLoad>> {
        self.expert_load.as_ref()
    }

    /// The MoE layers' routing record / replay switch (MoE models; diagnostics only).
    pub fn routing_tap(&self) -> Option<&Arc<moe_trace::RoutingTap>> {
        self.routing_tap.as_ref()
    }

    pub fn backend(&self) -> &Arc<B> {
        &self.backend
    }

    /// Allocates a KV cache for `capacity` positions (element type chosen by the backend).
    pub fn new_cache(&self, capacity: usize) -> anyhow::Result<KvCache<B>> {
        let (k, v) = self.alloc_kv_layers(capacity)?;
        Ok(KvCache { storage: KvStorage::Own { k, v }, len: 0, capacity, bytes: self.cache_bytes(capacity) })
    }

    /// Allocates a KV pool of `n_blocks` blocks of `block_size` positions (a power of two),
    /// for backends with `paged_kv()`.
    pub fn new_kv_pool(&self, n_blocks: usize, block_size: usize) -> anyhow::Result<KvPool<B>> {
        self.new_windowed_kv_pool(n_blocks, block_size, 0, 0)
    }

    /// A KV pool whose sliding-window layers keep `rings` rings of `ring_blocks` blocks (see
    /// [`KvPool`]; `ring_blocks` = 0: an ordinary pool) and whose other layers keep `n_blocks`.
    pub fn new_windowed_kv_pool(&self, n_blocks: usize, block_size: usize, rings: usize, ring_blocks: usize) -> anyhow::Result<KvPool<B>> {
        if !self.backend.paged_kv() {
            bail!("the {} backend has no paged KV cache", self.backend.name());
        }
        if !block_size.is_power_of_two() || n_blocks == 0 {
            bail!("KV pool: {n_blocks} blocks of {block_size} positions (need >= 1 block, a power-of-two size)");
        }
        if ring_blocks > 0 && (self.hp.sliding_window.is_none() || rings == 0) {
            bail!("KV pool: local rings need a model with sliding-window layers and at least one ring");
        }
        let (kvd, elem) = (self.hp.kv_dim(), self.backend.kv_cache_elem_bytes());
        let (mut k, mut v) = (Vec::with_capacity(self.hp.n_layer), Vec::with_capacity(self.hp.n_layer));
        let (mut global_layers, mut local_layers) = (0, 0);
        for li in 0..self.hp.n_layer {
            let positions = if ring_blocks > 0 && self.hp.layer_window(li).is_some() {
                local_layers += 1;
                rings * ring_blocks * block_size
            } else {
                global_layers += 1;
                n_blocks * block_size
            };
            k.push(self.backend.alloc_kv_cache(kvd * positions)?);
            v.push(self.backend.alloc_kv_cache(kvd * positions)?);
        }
        let block_bytes = 2 * global_layers * kvd * block_size * elem;
        let ring_bytes = 2 * local_layers * kvd * block_size * ring_blocks * elem;
        let bytes = n_blocks * block_bytes + rings * ring_bytes;
        Ok(KvPool { k, v, block_size, n_blocks, ring_blocks, rings, block_bytes, ring_bytes, bytes })
    }

    /// Blocks of `block_size` a local ring needs so that a pass of up to `chunk` rows per
    /// sequence finds every position its sliding-window layers can see: the window before
    /// the chunk's first query plus the chunk, `window + chunk - 1` positions. (Position p
    /// lives at ring row p mod ring positions, so no extra block for a straddle is needed.)
    /// None: the model has no sliding-window layer.
    pub fn local_ring_blocks(&self, chunk: usize, block_size: usize) -> Option<usize> {
        let window = (0..self.hp.n_layer).find_map(|li| self.hp.layer_window(li))?;
        Some((window + chunk.max(1) - 1).div_ceil(block_size))
    }

    /// Bytes of one pool block for the full-attention layers and of one local ring, as
    /// [`Model::new_windowed_kv_pool`] allocates them.
    pub fn windowed_kv_bytes(&self, block_size: usize, ring_blocks: usize) -> (usize, usize) {
        let local = (0..self.hp.n_layer).filter(|&li| self.hp.layer_window(li).is_some()).count();
        let per_layer_block = 2 * self.hp.kv_dim() * block_size * self.backend.kv_cache_elem_bytes();
        ((self.hp.n_layer - local) * per_layer_block, local * per_layer_block * ring_blocks)
    }

    fn alloc_kv_layers(&self, positions: usize) -> anyhow::Result<(KvLayers<B>, KvLayers<B>)> {
        let kv = self.hp.kv_dim() * positions;
        let mut k = Vec::with_capacity(self.hp.n_layer);
        let mut v = Vec::with_capacity(self.hp.n_layer);
        for _ in 0..self.hp.n_layer {
            k.push(self.backend.alloc_kv_cache(kv)?);
            v.push(self.backend.alloc_kv_cache(kv)?);
        }
        Ok((k, v))
    }

    /// Bytes a KV cache of `capacity` positions takes.
    pub fn cache_bytes(&self, capacity: usize) -> usize {
        2 * self.hp.n_layer * self.hp.kv_dim() * capacity * self.backend.kv_cache_elem_bytes()
    }

    /// Runs `tokens` at positions cache.len.. and appends them to the cache.
    /// Returns logits (vocab floats per returned row) as asked by `which`.
    /// A batch of one: the same arithmetic as any row of [`Model::forward_batch`].
    pub fn forward(&self, cache: &mut KvCache<B>, tokens: &[u32], which: Logits) -> anyhow::Result<Vec<f32>> {
        let mut batch = [SeqRows { cache, tokens, logits: which }];
        Ok(self.forward_batch(&mut batch)?.pop().expect("one sequence in, one logits vector out"))
    }

    /// One forward pass over the rows of several sequences: each sequence's `tokens` run at
    /// positions cache.len.. of its own cache. The row-wise ops (embedding, norms, matmuls,
    /// SwiGLU, residuals) run once over all rows, so each weight is read once per step; RoPE
    /// takes each row's own position; the KV store and attention run per sequence over its
    /// own cache and rows. Every op computes a row independently of the others, so a
    /// sequence's logits do not depend on what else is in the batch (on the CPU backend,
    /// bit for bit: tests/batching.rs).
    ///
    /// Returns one logits vector per sequence, as asked by its `logits`. Capacity is checked
    /// for every sequence before anything runs; an error after that (a GPU fault) leaves the
    /// caches' lengths unchanged, their contents past `len` undefined.
    pub fn forward_batch(&self, seqs: &mut [SeqRows<'_, B>]) -> anyhow::Result<Vec<Vec<f32>>> {
        self.forward_batch_in(None, seqs)
    }

    /// [`Model::forward_batch`] where sequences may have paged caches in `pool` (the same
    /// arithmetic: only where K and V rows live differs). Allocates a workspace for this one
    /// pass; a caller that runs many passes keeps one and calls [`Model::forward_batch_with`].
    pub fn forward_batch_in(&self, pool: Option<&mut KvPool<B>>, seqs: &mut [SeqRows<'_, B>]) -> anyhow::Result<Vec<Vec<f32>>> {
        let mut ws = self.new_workspace(workspace_shape_of(seqs))?;
        self.forward_batch_with(pool, &mut ws, seqs)
    }

    /// [`Model::forward_batch_in`] in the activation buffers of `ws` (made by
    /// [`Model::new_workspace`] for at least this pass's rows): no allocation per pass.
    pub fn forward_batch_with(
        &self,
        pool: Option<&mut KvPool<B>>,
        ws: &mut Workspace<B>,
        seqs: &mut [SeqRows<'_, B>],
    ) -> anyhow::Result<Vec<Vec<f32>>> {
        Ok(self.forward_batch_into(pool, ws, seqs)?.into_iter().map(|l| l.to_vec()).collect())
    }

    /// [`Model::forward_batch_with`] without copying the logits out: each sequence gets its
    /// rows of the workspace's host logits (mutable, for the sampler's penalties), valid
    /// until the workspace's next pass. The engine's step samples from these.
    pub fn forward_batch_into<'w>(
        &self,
        mut pool: Option<&mut KvPool<B>>,
        ws: &'w mut Workspace<B>,
        seqs: &mut [SeqRows<'_, B>],
    ) -> anyhow::Result<Vec<&'w mut [f32]>> {
        let need = workspace_shape_of(seqs);
        ws.check_fits(need.rows, need.logit_rows)?;
        let mut result = None;
        self.backend.run(&mut || result = Some(self.forward_pass(pool.as_deref_mut(), ws, seqs)));
        let counts = match result.expect("the backend ran the forward pass") {
            Ok(counts) => counts,
            Err(e) => {
                // A failed pass stops at its first error: work a GPU backend recorded before
                // it runs now, while every buffer it names is alive (its own error, if any, is
                // not the first).
                let _ = self.backend.synchronize();
                return Err(e);
            }
        };
        let mut per_seq = Vec::with_capacity(counts.len());
        let mut rest: &'w mut [f32] = &mut ws.host_logits;
        for c in counts {
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(c * self.hp.n_vocab);
            per_seq.push(mine);
            rest = tail;
        }
        Ok(per_seq)
    }

    /// Activation buffers for passes of up to `shape` (see [`Workspace`]).
    pub fn new_workspace(&self, shape: WorkspaceShape) -> anyhow::Result<Workspace<B>> {
        Workspace::new(&*self.backend, &self.hp, shape)
    }

    /// Runs the pass; the logits land in the leading rows of `ws.host_logits`, sequence by
    /// sequence. Returns how many rows of logits each sequence got.
    fn forward_pass(
        &self,
        mut pool: Option<&mut KvPool<B>>,
        ws: &mut Workspace<B>,
        seqs: &mut [SeqRows<'_, B>],
    ) -> anyhow::Result<Vec<usize>> {
        if seqs.is_empty() {
            bail!("forward called with no sequences");
        }
        // Per sequence, the block table of its sliding-window layers (windowed pools only).
        let mut local_tables: Vec<Option<Vec<u32>>> = Vec::with_capacity(seqs.len());
        for s in seqs.iter() {
            if s.tokens.is_empty() {
                bail!("forward called with no tokens");
            }
            let mut local_table = None;
            if let KvStorage::Paged { blocks, block_size, ring } = &s.cache.storage {
                match pool.as_deref() {
                    None => bail!("a paged KV cache needs its pool"),
                    Some(p) if p.block_size != *block_size || blocks.iter().any(|&b| b as usize >= p.n_blocks) => {
                        bail!("a KV block table does not match the pool")
                    }
                    Some(p) if p.ring_blocks > 0 => {
                        let Some(r) = ring.filter(|&r| (r as usize) < p.rings) else {
                            bail!("a paged KV cache on a windowed pool needs one of its local rings")
                        };
                        local_table = Some(ring_table(p, r, s.cache.len, s.tokens.len(), self.hp.sliding_window.map_or(0, |w| w.window))?);
                    }
                    Some(_) => {}
                }
            }
            local_tables.push(local_table);
            if s.tokens.is_empty() {
                bail!("forward called with no tokens");
            }
            if s.cache.len + s.tokens.len() > s.cache.capacity {
                bail!("context full: {} + {} tokens exceed the cache of {}", s.cache.len, s.tokens.len(), s.cache.capacity);
            }
        }
        let hp = &self.hp;
        let be = &*self.backend;
        let (d, kvd, ff) = (hp.n_embd, hp.kv_dim(), hp.n_ff);
        // The batch's rows: each sequence's tokens in order, the sequences one after another.
        let n: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        let mut tokens = Vec::with_capacity(n);
        let mut positions: Vec<u32> = Vec::with_capacity(n);
        let mut first_rows = Vec::with_capacity(seqs.len());
        for s in seqs.iter() {
            first_rows.push(tokens.len());
            tokens.extend_from_slice(s.tokens);
            positions.extend((s.cache.len..s.cache.len + s.tokens.len()).map(|p| p as u32));
        }

        // The pass's activations: the leading n rows of the workspace's buffers.
        let Workspace { x, h, q, k, v, att, gate, up, picked, logits, host_logits, moe, .. } = ws;

        be.embed(&self.token_embd, &tokens, x)?;
        if let Some(s) = hp.embedding_scale() {
            be.scale(x, n * d, s)?;
        }
        let mut moe_layers = 0;
        if let Some(m) = moe.as_mut() {
            // A pass that failed part way may have left ids of its device-routed layers.
            m.routed_on_device = 0;
        }
        for (li, layer) in self.layers.iter().enumerate() {
            // Attention block.
            be.rmsnorm(x, &layer.attn_norm, n, d, hp.rms_eps, h)?;
            let a = &layer.attn;
            be.matmul_many(&[&a.wq, &a.wk, &a.wv], h, n, &mut [&mut *q, &mut *k, &mut *v])?;
            if let Some(b) = &a.bq {
                be.add_bias(q, b, n)?;
            }
            if let Some(b) = &a.bk {
                be.add_bias(k, b, n)?;
            }
            if let Some(b) = &a.bv {
                be.add_bias(v, b, n)?;
            }
            if let (Some(qn), Some(kn)) = (&a.q_norm, &a.k_norm) {
                be.rmsnorm_inplace(q, qn, n * hp.n_head, hp.head_dim, hp.rms_eps)?;
                be.rmsnorm_inplace(k, kn, n * hp.n_head_kv, hp.head_dim, hp.rms_eps)?;
            }
            let (style, rope_base, scaling) = (hp.arch.rope_style(), hp.layer_rope_base(li), hp.layer_rope_scaling(li));
            be.rope_qk(q, k, &positions, hp.n_head, hp.n_head_kv, hp.head_dim, rope_base, style, scaling)?;
            // Batched decode (one row per sequence): one store and one attention for all, where
            // the backend has them; else the ragged part below.
            let batched = a.sinks.is_none() && self.decode_attention_batch(seqs, li, q, k, v, att)?;
            // Other steps of several sequences (prompts, chunks, decode rows): all their stores
            // and attention in one go where the backend has batched kernels for them.
            let batched = batched || self.attention_batch(seqs, &first_rows, li, q, k, v, a.sinks.as_deref(), att)?;
            // Ragged part: each sequence stores its rows and attends over its own cache; the
            // sequences of the pool attend in one call (one parallel region on the CPU).
            let mut paged: Vec<SeqAttention<'_>> = Vec::new();
            for ((s, &row), local_table) in seqs.iter_mut().zip(&first_rows).zip(&local_tables).filter(|_| !batched) {
                let shape = self.seq_attention_shape(s, row, li);
                let (start, len) = (shape.start_pos, shape.n_tokens);
                let sinks = a.sinks.as_deref();
                match &mut s.cache.storage {
                    KvStorage::Own { k: kc, v: vc } => be.kv_store_attention(q, k, v, &mut kc[li], &mut vc[li], shape, sinks, att)?,
                    KvStorage::Paged { blocks, block_size, .. } => {
                        let p = pool.as_deref_mut().expect("checked above");
                        let table = match (local_table, shape.window) {
                            (Some(local), Some(_)) => KvBlocks::new(local, *block_size),
                            _ => KvBlocks::new(blocks, *block_size),
                        };
                        be.kv_store_paged(k, v, &mut p.k[li], &mut p.v[li], row, table, start, len, kvd)?;
                        paged.push(SeqAttention { blocks: table, shape });
                    }
                }
            }
            if !paged.is_empty() {
                let p = pool.as_deref().expect("paged sequences have their pool");
                be.attention_paged_many(q, &p.k[li], &p.v[li], &paged, a.sinks.as_deref(), att)?;
            }
            if layer.post_attn_norm.is_some() || a.bo.is_some() {
                be.matmul(&a.wo, att, n, h)?;
                if let Some(b) = &a.bo {
                    be.add_bias(h, b, n)?;
                }
                if let Some(w) = &layer.post_attn_norm {
                    be.rmsnorm_inplace(h, w, n, d, hp.rms_eps)?;
                }
                be.add(x, h, n * d)?;
            } else {
                // x += Wo att (one kernel where the backend fuses the residual add).
                be.matmul_add(&a.wo, att, None, n, x, h)?;
            }

            // Feed-forward block.
            be.rmsnorm(x, &layer.ffn_norm, n, d, hp.rms_eps, h)?;
            match &layer.ffn {
                Ffn::Dense { gate: wg, up: wu, down: wd } if layer.post_ffn_norm.is_none() => {
                    // x += Wd (silu(gate) * up): SwiGLU and the residual add fused where the
                    // backend can.
                    be.matmul_many(&[wg, wu], h, n, &mut [&mut *gate, &mut *up])?;
                    be.matmul_add(wd, gate, Some(&*up), n, x, h)?;
                    continue;
                }
                Ffn::Dense { gate: wg, up: wu, down: wd } => {
                    be.matmul_many(&[wg, wu], h, n, &mut [&mut *gate, &mut *up])?;
                    be.silu_mul(gate, up, n * ff)?;
                    be.matmul(wd, gate, n, h)?;
                }
                Ffn::Moe(m) => {
                    moe::ffn(be, m, moe.as_mut().context("an MoE layer needs the workspace's MoE buffers")?, h, n, d)?;
                    moe_layers += 1;
                }
                Ffn::GeGlu { gate: wg, up: wu, down: wd } => {
                    be.matmul_many(&[wg, wu], h, n, &mut [&mut *gate, &mut *up])?;
                    be.gelu_tanh_mul(gate, up, n * ff)?;
                    be.matmul(wd, gate, n, h)?;
                }
            }
            if let Some(w) = &layer.post_ffn_norm {
                be.rmsnorm_inplace(h, w, n, d, hp.rms_eps)?;
            }
            be.add(x, h, n * d)?;
        }
        // moe::ffn swaps h with its output buffer: after an odd number of swaps, swap back so
        // that each buffer keeps its role, and on a GPU its address, from pass to pass.
        if let (1, Some(m)) = (moe_layers % 2, moe.as_mut()) {
            std::mem::swap(h, &mut m.out);
        }

        // Rows whose logits are returned, and how many each sequence gets.
        let mut out_rows = Vec::new();
        let mut counts = Vec::with_capacity(seqs.len());
        for (s, &row) in seqs.iter().zip(&first_rows) {
            let len = s.tokens.len();
            let picked = match s.logits {
                Logits::None => 0..0,
                Logits::Last => len - 1..len,
                Logits::All => 0..len,
            };
            counts.push(picked.len());
            out_rows.extend(picked.map(|i| row + i));
        }
        let rows = out_rows.len();
        if rows == 0 {
            be.synchronize()?;
        } else {
            let last: &B::Buffer = if rows < n {
                be.gather_rows(x, &out_rows, d, picked)?;
                picked
            } else {
                x
            };
            be.rmsnorm(last, &self.output_norm, rows, d, hp.rms_eps, h)?;
            let out_w = self.output.as_ref().unwrap_or(&self.token_embd);
            be.matmul(out_w, h, rows, logits)?;
            be.read(logits, 0, &mut host_logits[..rows * hp.n_vocab])?;
        }
        if let (Some(m), Some(load), Some(p)) = (moe.as_mut(), &self.expert_load, &hp.moe) {
            moe::record_device_routing(be, load, p, m, n)?;
        }
        for s in seqs.iter_mut() {
            s.cache.len += s.tokens.len();
        }
        Ok(counts)
    }
}

impl<B: Backend> Model<B> {
    /// `Backend::decode_attention_batch` for layer `li` when every sequence brings one row and
    /// keeps its own contiguous cache (the GPU backends' decode batches) and the layer has no
    /// window; false (nothing done) otherwise or where the backend has no batched kernels.
    fn decode_attention_batch(
        &self,
        seqs: &mut [SeqRows<'_, B>],
        li: usize,
        q: &B::Buffer,
        k: &B::Buffer,
        v: &B::Buffer,
        out: &mut B::Buffer,
    ) -> anyhow::Result<bool> {
        let hp = &self.hp;
        if seqs.len() < 2 || hp.layer_window(li).is_some() || seqs.iter().any(|s| s.tokens.len() != 1) {
            return Ok(false);
        }
        let start_pos: Vec<usize> = seqs.iter().map(|s| s.cache.len).collect();
        let Some(mut caches) = own_caches(seqs, li) else { return Ok(false) };
        let shape = AttentionShape {
            n_tokens: 1,
            start_pos: 0,
            first_row: 0,
            n_head: hp.n_head,
            n_head_kv: hp.n_head_kv,
            head_dim: hp.head_dim,
            window: None,
        };
        Ok(self.backend.decode_attention_batch(q, k, v, &mut caches, &start_pos, shape, out)?)
    }

    /// `Backend::attention_batch` for layer `li` over every sequence of a step of two or more,
    /// when each keeps its own contiguous cache (the GPU backends); false (nothing done)
    /// otherwise or where the backend has no batched kernels for the step.
    #[allow(clippy::too_many_arguments)]
    fn attention_batch(
        &self,
        seqs: &mut [SeqRows<'_, B>],
        first_rows: &[usize],
        li: usize,
        q: &B::Buffer,
        k: &B::Buffer,
        v: &B::Buffer,
        sinks: Option<&[f32]>,
        out: &mut B::Buffer,
    ) -> anyhow::Result<bool> {
        if seqs.len() < 2 {
            return Ok(false);
        }
        let shapes: Vec<AttentionShape> = seqs.iter().zip(first_rows).map(|(s, &row)| self.seq_attention_shape(s, row, li)).collect();
        let Some(mut caches) = own_caches(seqs, li) else { return Ok(false) };
        Ok(self.backend.attention_batch(q, k, v, &mut caches, &shapes, sinks, out)?)
    }

    /// The attention of sequence `s`'s rows (from batch row `row`) in layer `li`.
    fn seq_attention_shape(&self, s: &SeqRows<'_, B>, row: usize, li: usize) -> AttentionShape {
        let hp = &self.hp;
        AttentionShape {
            n_tokens: s.tokens.len(),
            start_pos: s.cache.len,
            first_row: row,
            n_head: hp.n_head,
            n_head_kv: hp.n_head_kv,
            head_dim: hp.head_dim,
            window: hp.layer_window(li),
        }
    }
}

/// Layer `li`'s caches of every sequence of `seqs`, for the batched attention calls; None where a
/// sequence's cache is in the paged pool.
#[allow(clippy::type_complexity)]
fn own_caches<'a, B: Backend>(seqs: &'a mut [SeqRows<'_, B>], li: usize) -> Option<Vec<(&'a mut B::KvBuffer, &'a mut B::KvBuffer)>> {
    seqs.iter_mut()
        .map(|s| match &mut s.cache.storage {
            KvStorage::Own { k, v } => Some((&mut k[li], &mut v[li])),
            KvStorage::Paged { .. } => None,
        })
        .collect()
}

/// The local block table of a sequence on ring `ring` of a windowed pool, for a pass that
/// appends `rows` positions to `len`: logical block b is pool block `ring * ring_blocks + b %
/// ring_blocks`, so position p is ring row p mod (ring_blocks * block_size). Refused when the
/// positions the pass needs at once (the window before its first query, and its rows) are
/// more than the ring holds: a stored row would overwrite one a query still reads.
fn ring_table<B: Backend>(p: &KvPool<B>, ring: u32, len: usize, rows: usize, window: usize) -> anyhow::Result<Vec<u32>> {
    let bs = p.block_size;
    let (first, last) = ((len + 1).saturating_sub(window), len + rows - 1);
    if last - first + 1 > p.ring_blocks * bs {
        bail!("{rows} tokens at position {len} need more than the {} KV blocks of a sliding-window ring (lower the chunk)", p.ring_blocks);
    }
    let base = ring as usize * p.ring_blocks;
    Ok((0..=last / bs).map(|b| (base + b % p.ring_blocks) as u32).collect())
}

/// The rows and logit rows of one pass over `seqs`.
fn workspace_shape_of<B: Backend>(seqs: &[SeqRows<'_, B>]) -> WorkspaceShape {
    let rows = seqs.iter().map(|s| s.tokens.len()).sum::<usize>();
    let logit_rows = seqs
        .iter()
        .map(|s| match s.logits {
            Logits::None => 0,
            Logits::Last => 1.min(s.tokens.len()),
            Logits::All => s.tokens.len(),
        })
        .sum();
    WorkspaceShape { rows: rows.max(1), logit_rows }
}

/// The token embedding and the output projection, as GGUF files name them.
const TOKEN_EMBD: &str = "token_embd.weight";
const OUTPUT: &str = "output.weight";

fn expect_shape<D>(w: &Weight<D>, cols: usize, rows: usize) -> anyhow::Result<()> {
    if w.cols != cols || w.rows != rows {
        bail!("tensor \"{}\" has shape [{}, {}], expected [{cols}, {rows}]", w.name, w.cols, w.rows);
    }
    Ok(())
}

/// Loads a model file on a backend (used by the CLI's `logits` command and tests).
pub fn load_file<B: Backend>(path: &std::path::Path, backend: Arc<B>) -> anyhow::Result<Model<B>> {
    let file = Arc::new(GgufFile::open(path).with_context(|| format!("loading {}", path.display()))?);
    Model::load(file, backend)
}

/// Logits for every position of `tokens` (teacher forcing), row-major [tokens x vocab].
pub fn all_logits<B: Backend>(model: &Model<B>, tokens: &[u32]) -> anyhow::Result<Vec<f32>> {
    let mut cache = model.new_cache(tokens.len())?;
    model.forward(&mut cache, tokens, Logits::All)
}
