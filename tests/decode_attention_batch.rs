//! The forward pass's side of batched decode attention (`Backend::decode_attention_batch`,
//! issue #17; the GPU backends implement it with one KV-store and one attention launch per
//! layer): a backend that takes the batched call must be handed, for every sequence of a
//! decode batch, its own row, caches and position. A wrapper around the CPU backend takes the
//! batched call and answers it with the per-sequence `kv_store` + `attention` calls; its logits
//! must equal, bit for bit, those of the same wrapper declining the call (the model's own
//! per-sequence loop), and the batched call must have been used.

use civetta::backend::{AttentionShape, Backend, RopeStyle, WeightOf};
use civetta::gguf::{GgmlType, GgufFile};
use civetta::model::{HParams, Logits, Model, SeqRows};
use civetta::synth::{synth_model, SynthSpec};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

struct Batching<B: Backend> {
    inner: Arc<B>,
    take_batches: bool,
    batched_calls: AtomicUsize,
}

impl<B: Backend> Backend for Batching<B> {
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
    fn decode_attention_batch(
        &self,
        q: &Self::Buffer,
        k: &Self::Buffer,
        v: &Self::Buffer,
        caches: &mut [(&mut Self::KvBuffer, &mut Self::KvBuffer)],
        start_pos: &[usize],
        shape: AttentionShape,
        out: &mut Self::Buffer,
    ) -> civetta::backend::Result<bool> {
        if !self.take_batches {
            return Ok(false);
        }
        assert_eq!(caches.len(), start_pos.len());
        self.batched_calls.fetch_add(1, Ordering::Relaxed);
        let kv_dim = shape.n_head_kv * shape.head_dim;
        for (row, ((kc, vc), &start)) in caches.iter_mut().zip(start_pos).enumerate() {
            self.inner.kv_store(k, v, kc, vc, row, start, 1, kv_dim)?;
            let s = AttentionShape { n_tokens: 1, start_pos: start, first_row: row, ..shape };
            self.inner.attention(q, kc, vc, s, out)?;
        }
        Ok(true)
    }
    fn silu_mul(&self, gate: &mut Self::Buffer, up: &Self::Buffer, n: usize) -> civetta::backend::Result<()> {
        self.inner.silu_mul(gate, up, n)
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
}

/// Three sequences (prompts of 9, 3 and 14 tokens) prefilled in one pass, then 5 decode steps
/// of one row each in one pass: every sequence's logits after each step.
fn run<B: Backend>(model: &Model<B>) -> Vec<Vec<f32>> {
    let prompts: Vec<Vec<u32>> = [9u32, 3, 14].iter().map(|&n| (0..n).map(|i| (i * 37 + n) % 200 + 1).collect()).collect();
    let mut caches: Vec<_> = prompts.iter().map(|p| model.new_cache(p.len() + 8).unwrap()).collect();
    let mut rows: Vec<SeqRows<B>> =
        caches.iter_mut().zip(&prompts).map(|(cache, p)| SeqRows { cache, tokens: &p[..], logits: Logits::Last }).collect();
    let mut last = model.forward_batch(&mut rows).unwrap();
    let mut all = last.clone();
    for step in 0..5u32 {
        let next: Vec<[u32; 1]> = (0..3u32).map(|s| [(step * 11 + s * 5) % 200 + 1]).collect();
        let mut rows: Vec<SeqRows<B>> =
            caches.iter_mut().zip(&next).map(|(cache, t)| SeqRows { cache, tokens: &t[..], logits: Logits::Last }).collect();
        last = model.forward_batch(&mut rows).unwrap();
        all.extend(last.iter().cloned());
    }
    all
}

#[test]
fn batched_decode_attention_gets_each_sequence_its_own_row_cache_and_position() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("llama-q8_0.gguf");
    synth_model(&SynthSpec::preset("llama", GgmlType::Q8_0, "small").unwrap(), &path).unwrap();
    let file = Arc::new(GgufFile::open(&path).unwrap());
    let cpu = civetta::backend::create_cpu(1).unwrap();
    let backend = |take_batches| Arc::new(Batching { inner: cpu.clone(), take_batches, batched_calls: AtomicUsize::new(0) });
    let (per_seq, batched) = (backend(false), backend(true));
    let a = run(&Model::load(file.clone(), per_seq.clone()).unwrap());
    let model = Model::load(file, batched.clone()).unwrap();
    let b = run(&model);
    assert_eq!(a, b, "batched decode attention changed the logits");
    assert_eq!(per_seq.batched_calls.load(Ordering::Relaxed), 0);
    // One call per layer and decode step; the prefill (several rows per sequence) never batches.
    assert_eq!(batched.batched_calls.load(Ordering::Relaxed), 5 * model.hp.n_layer);
}
