//! The forward pass's activation buffers are allocated once per engine (model::Workspace):
//! an engine serving several requests over many steps makes no `Backend::alloc` call after it
//! has loaded, and a reused workspace, holding what earlier passes of other shapes left in
//! it, gives the same logits bit for bit as a fresh one.

mod common;

use civetta::backend::cpu::CpuBackend;
use civetta::backend::{AttentionShape, Backend, KvBlocks, RopeScaling, RopeStyle, WeightOf};
use civetta::engine::{Engine, EngineConfig, GenerationEvent};
use civetta::gguf::{GgmlType, GgufFile};
use civetta::model::{self, HParams, Logits, SeqRows, WorkspaceShape};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{bits, greedy_request, prompt};

/// The CPU backend, counting the activation buffers asked of it (`alloc`).
struct Counting<B: Backend> {
    inner: Arc<B>,
    allocs: AtomicUsize,
}

impl<B: Backend> Counting<B> {
    fn allocs(&self) -> usize {
        self.allocs.load(Ordering::SeqCst)
    }
}

impl<B: Backend> Backend for Counting<B> {
    type Buffer = B::Buffer;
    type KvBuffer = B::KvBuffer;
    type WeightData = B::WeightData;
    type ExpertTable = B::ExpertTable;

    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn variant(&self) -> &'static str {
        self.inner.variant()
    }
    fn supports(&self, t: GgmlType) -> bool {
        self.inner.supports(t)
    }
    fn check_model(&self, hp: &HParams) -> civetta::backend::Result<()> {
        self.inner.check_model(hp)
    }
    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> civetta::backend::Result<WeightOf<Self>> {
        self.inner.load_weight(file, name)
    }
    fn alloc(&self, len: usize) -> civetta::backend::Result<Self::Buffer> {
        self.allocs.fetch_add(1, Ordering::SeqCst);
        self.inner.alloc(len)
    }
    fn alloc_kv_cache(&self, len: usize) -> civetta::backend::Result<Self::KvBuffer> {
        self.inner.alloc_kv_cache(len)
    }
    fn kv_cache_elem_bytes(&self) -> usize {
        self.inner.kv_cache_elem_bytes()
    }
    fn write(&self, dst: &mut Self::Buffer, offset: usize, src: &[f32]) -> civetta::backend::Result<()> {
        self.inner.write(dst, offset, src)
    }
    fn read(&self, src: &Self::Buffer, offset: usize, dst: &mut [f32]) -> civetta::backend::Result<()> {
        self.inner.read(src, offset, dst)
    }
    fn embed(&self, table: &WeightOf<Self>, tokens: &[u32], out: &mut Self::Buffer) -> civetta::backend::Result<()> {
        self.inner.embed(table, tokens, out)
    }
    fn rmsnorm(
        &self,
        x: &Self::Buffer,
        w: &WeightOf<Self>,
        rows: usize,
        dim: usize,
        eps: f32,
        out: &mut Self::Buffer,
    ) -> civetta::backend::Result<()> {
        self.inner.rmsnorm(x, w, rows, dim, eps, out)
    }
    fn rmsnorm_inplace(&self, x: &mut Self::Buffer, w: &WeightOf<Self>, rows: usize, dim: usize, eps: f32) -> civetta::backend::Result<()> {
        self.inner.rmsnorm_inplace(x, w, rows, dim, eps)
    }
    fn matmul(&self, w: &WeightOf<Self>, x: &Self::Buffer, rows: usize, out: &mut Self::Buffer) -> civetta::backend::Result<()> {
        self.inner.matmul(w, x, rows, out)
    }
    fn matmul_many(
        &self,
        ws: &[&WeightOf<Self>],
        x: &Self::Buffer,
        rows: usize,
        outs: &mut [&mut Self::Buffer],
    ) -> civetta::backend::Result<()> {
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
    ) -> civetta::backend::Result<()> {
        self.inner.matmul_add(w, x, up, rows, out, scratch)
    }
    fn add_bias(&self, x: &mut Self::Buffer, b: &WeightOf<Self>, rows: usize) -> civetta::backend::Result<()> {
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
    ) -> civetta::backend::Result<()> {
        self.inner.rope(x, positions, n_heads, head_dim, freq_base, style)
    }
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
    ) -> civetta::backend::Result<()> {
        self.inner.rope_scaled(x, positions, n_heads, head_dim, freq_base, style, scaling)
    }
    #[allow(clippy::too_many_arguments)]
    fn kv_store(
        &self,
        k: &Self::Buffer,
        v: &Self::Buffer,
        kc: &mut Self::KvBuffer,
        vc: &mut Self::KvBuffer,
        src_row: usize,
        start: usize,
        n: usize,
        kvd: usize,
    ) -> civetta::backend::Result<()> {
        self.inner.kv_store(k, v, kc, vc, src_row, start, n, kvd)
    }
    fn attention(
        &self,
        q: &Self::Buffer,
        k_cache: &Self::KvBuffer,
        v_cache: &Self::KvBuffer,
        s: AttentionShape,
        out: &mut Self::Buffer,
    ) -> civetta::backend::Result<()> {
        self.inner.attention(q, k_cache, v_cache, s, out)
    }
    fn paged_kv(&self) -> bool {
        self.inner.paged_kv()
    }
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
    ) -> civetta::backend::Result<()> {
        self.inner.kv_store_paged(k, v, k_pool, v_pool, src_row, blocks, start_pos, n_tokens, kv_dim)
    }
    fn attention_paged(
        &self,
        q: &Self::Buffer,
        k_pool: &Self::KvBuffer,
        v_pool: &Self::KvBuffer,
        blocks: KvBlocks<'_>,
        s: AttentionShape,
        out: &mut Self::Buffer,
    ) -> civetta::backend::Result<()> {
        self.inner.attention_paged(q, k_pool, v_pool, blocks, s, out)
    }
    #[allow(clippy::too_many_arguments)]
    fn attention_with_sinks(
        &self,
        q: &Self::Buffer,
        k_cache: &Self::KvBuffer,
        v_cache: &Self::KvBuffer,
        blocks: KvBlocks<'_>,
        s: AttentionShape,
        sinks: &[f32],
        out: &mut Self::Buffer,
    ) -> civetta::backend::Result<()> {
        self.inner.attention_with_sinks(q, k_cache, v_cache, blocks, s, sinks, out)
    }
    fn silu_mul(&self, gate: &mut Self::Buffer, up: &Self::Buffer, n: usize) -> civetta::backend::Result<()> {
        self.inner.silu_mul(gate, up, n)
    }
    fn gelu_tanh_mul(&self, gate: &mut Self::Buffer, up: &Self::Buffer, n: usize) -> civetta::backend::Result<()> {
        self.inner.gelu_tanh_mul(gate, up, n)
    }
    fn scale(&self, x: &mut Self::Buffer, n: usize, s: f32) -> civetta::backend::Result<()> {
        self.inner.scale(x, n, s)
    }
    fn add(&self, x: &mut Self::Buffer, y: &Self::Buffer, n: usize) -> civetta::backend::Result<()> {
        self.inner.add(x, y, n)
    }
    fn copy_row(&self, src: &Self::Buffer, src_row: usize, dim: usize, dst: &mut Self::Buffer) -> civetta::backend::Result<()> {
        self.inner.copy_row(src, src_row, dim, dst)
    }
    fn gather_rows(&self, src: &Self::Buffer, rows: &[usize], dim: usize, dst: &mut Self::Buffer) -> civetta::backend::Result<()> {
        self.inner.gather_rows(src, rows, dim, dst)
    }
    fn weight_rows(&self, w: &WeightOf<Self>, first_row: usize, n_rows: usize, name: &str) -> civetta::backend::Result<WeightOf<Self>> {
        self.inner.weight_rows(w, first_row, n_rows, name)
    }
    fn scatter_rows(&self, src: &Self::Buffer, rows: &[u32], dim: usize, dst: &mut Self::Buffer) -> civetta::backend::Result<()> {
        self.inner.scatter_rows(src, rows, dim, dst)
    }
    fn weighted_sum_rows(
        &self,
        src: &Self::Buffer,
        weights: &[f32],
        n: usize,
        k: usize,
        dim: usize,
        out: &mut Self::Buffer,
    ) -> civetta::backend::Result<()> {
        self.inner.weighted_sum_rows(src, weights, n, k, dim, out)
    }
    fn scale_rows(&self, x: &mut Self::Buffer, scales: &[f32], dim: usize) -> civetta::backend::Result<()> {
        self.inner.scale_rows(x, scales, dim)
    }
    fn synchronize(&self) -> civetta::backend::Result<()> {
        self.inner.synchronize()
    }
    fn run(&self, pass: &mut (dyn FnMut() + Send)) {
        self.inner.run(pass)
    }
}

fn counting_cpu() -> Arc<Counting<CpuBackend>> {
    Arc::new(Counting { inner: civetta::backend::create_cpu(2).unwrap(), allocs: AtomicUsize::new(0) })
}

fn tokens_of(stream: &mut civetta::engine::GenerationStream) -> Vec<u32> {
    loop {
        match stream.blocking_next() {
            Some(GenerationEvent::Done(s)) => return s.token_ids,
            Some(GenerationEvent::Error(e)) => panic!("generation failed: {e}"),
            Some(_) => {}
            None => panic!("the stream ended without Done"),
        }
    }
}

/// Three requests (prompts of 40, 7 and 19 tokens, so steps of prefill chunks next to decode
/// rows, then decode-only steps of 3, 2 and 1 rows) run through an engine on the counting
/// backend: after `Engine::load` not one activation buffer is allocated, on a dense and on a
/// mixture-of-experts model. The same passes through `Model::forward_batch_in`, which makes
/// a workspace per call, do allocate (so the counter sees the forward pass's buffers).
#[test]
fn an_engine_allocates_no_activation_buffer_after_it_loads() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ["llama", "qwen2moe"] {
        let path = common::synth(dir.path(), arch, "q8_0");
        let be = counting_cpu();
        let e = Engine::load_on(
            EngineConfig {
                model_path: path.clone(),
                max_active_sequences: 4,
                context_length: 256,
                prefill_batch: 16,
                max_batch_tokens: 24,
                ..EngineConfig::default()
            },
            be.clone(),
        )
        .unwrap();
        let after_load = be.allocs();
        assert!(after_load > 0, "{arch}: the workspace is allocated when the engine loads");
        let vocab = e.model_info().vocab_size;
        let lens = [(40, 12), (7, 20), (19, 6)];
        let mut streams: Vec<_> =
            lens.iter().enumerate().map(|(i, &(n, out))| e.submit(greedy_request(prompt(n, i as u32, vocab), out)).unwrap()).collect();
        for (s, &(_, out)) in streams.iter_mut().zip(&lens) {
            assert_eq!(tokens_of(s).len(), out);
        }
        let stats = e.stats();
        let steps = stats.batch_rows.count;
        assert!(steps >= 20, "{arch}: only {steps} steps ran");
        assert_eq!(be.allocs(), after_load, "{arch}: {steps} engine steps allocated {} activation buffers", be.allocs() - after_load);
        e.shutdown();

        // The counter does see a forward pass's buffers: one pass without a workspace.
        let model = model::load_file(&path, be.clone()).unwrap();
        let mut cache = model.new_cache(8).unwrap();
        let before = be.allocs();
        model.forward(&mut cache, &[1, 2, 3], Logits::Last).unwrap();
        assert!(be.allocs() - before >= 10, "{arch}: a pass without a workspace allocated {} buffers", be.allocs() - before);
    }
}

/// A workspace reused across passes of other shapes (bigger, smaller, prefill, decode,
/// several sequences) gives every pass the same logits, bit for bit, as a fresh workspace of
/// exactly that pass's size: no op reads what an earlier pass left behind. On a dense model,
/// Gemma 3 (post norms, scaled embeddings) and the MoE variants (routed experts, a shared
/// expert, gpt-oss's biases and sinks).
#[test]
fn a_reused_workspace_gives_the_logits_of_a_fresh_one_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ["llama", "gemma3", "qwen2moe", "qwen3moe", "gpt-oss"] {
        let path = common::synth(dir.path(), arch, "q8_0");
        let model = model::load_file(&path, civetta::backend::create_cpu(2).unwrap()).unwrap();
        let vocab = model.hp.n_vocab;
        let mut ws = model.new_workspace(WorkspaceShape { rows: 48, logit_rows: 48 }).unwrap();
        let prompts: Vec<Vec<u32>> = [30usize, 5, 12].iter().enumerate().map(|(i, &n)| prompt(n, i as u32 + 7, vocab)).collect();
        let (mut reused, mut fresh): (Vec<_>, Vec<_>) =
            prompts.iter().map(|p| (model.new_cache(p.len() + 8).unwrap(), model.new_cache(p.len() + 8).unwrap())).unzip();
        // Pass 1: the longest prompt alone, every row's logits (fills most of the workspace).
        // Pass 2: the two others together. Passes 3..: one decode row each, all together.
        let mut passes: Vec<Vec<(usize, Vec<u32>, Logits)>> = vec![
            vec![(0, prompts[0].clone(), Logits::All)],
            vec![(1, prompts[1].clone(), Logits::Last), (2, prompts[2].clone(), Logits::All)],
        ];
        for step in 0..4u32 {
            passes.push((0..3).map(|s| (s, vec![(step * 13 + s as u32 * 5) % (vocab as u32 - 2) + 1], Logits::Last)).collect());
        }
        for (pi, pass) in passes.iter().enumerate() {
            let run = |caches: &mut Vec<civetta::model::KvCache<CpuBackend>>, ws: Option<&mut civetta::model::Workspace<CpuBackend>>| {
                let mut picked: Vec<Option<&mut civetta::model::KvCache<CpuBackend>>> = caches.iter_mut().map(Some).collect();
                let mut rows: Vec<SeqRows<CpuBackend>> =
                    pass.iter().map(|(s, t, l)| SeqRows { cache: picked[*s].take().unwrap(), tokens: &t[..], logits: *l }).collect();
                match ws {
                    Some(ws) => model.forward_batch_with(None, ws, &mut rows).unwrap(),
                    None => model.forward_batch_in(None, &mut rows).unwrap(),
                }
            };
            let a = run(&mut reused, Some(&mut ws));
            let b = run(&mut fresh, None);
            assert_eq!(a.len(), b.len());
            for (s, (x, y)) in a.iter().zip(&b).enumerate() {
                assert!(bits(x) == bits(y), "{arch}: pass {pi}, sequence {s}: a reused workspace changed the logits");
            }
        }
        // A pass larger than the workspace is refused, not overrun.
        let mut cache = model.new_cache(64).unwrap();
        let long = prompt(49, 1, vocab);
        let err =
            model.forward_batch_with(None, &mut ws, &mut [SeqRows { cache: &mut cache, tokens: &long, logits: Logits::Last }]).unwrap_err();
        assert!(format!("{err:#}").contains("exceeds the workspace"), "{arch}: {err:#}");
    }
}
