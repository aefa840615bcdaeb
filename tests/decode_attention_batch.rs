//! The forward pass's side of batched decode attention (`Backend::decode_attention_batch`,
//! issue #17; the GPU backends implement it with one KV-store and one attention launch per
//! layer): a backend that takes the batched call must be handed, for every sequence of a
//! decode batch, its own row, caches and position. A wrapper around the CPU backend takes the
//! batched call and answers it with the per-sequence `kv_store` + `attention` calls; its logits
//! must equal, bit for bit, those of the same wrapper declining the call (the model's own
//! per-sequence loop), and the batched call must have been used.

mod common;

use civetta::backend::{AttentionShape, Backend};
use civetta::gguf::{GgmlType, GgufFile};
use civetta::model::{Logits, Model, SeqRows};
use civetta::synth::{synth_model, SynthSpec};
use common::delegate::{Delegate, Hooks, InnerTable};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Hooks that take the batched call (when `take_batches`) and answer it with the inner
/// backend's per-sequence `kv_store` + `attention` calls.
struct Batching {
    take_batches: bool,
    batched_calls: AtomicUsize,
}

impl<B: Backend> Hooks<B> for Batching {
    type Table = InnerTable<B>;
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
    ) -> civetta::backend::Result<bool> {
        if !self.take_batches {
            return Ok(false);
        }
        assert_eq!(caches.len(), start_pos.len());
        self.batched_calls.fetch_add(1, Ordering::Relaxed);
        let kv_dim = shape.n_head_kv * shape.head_dim;
        for (row, ((kc, vc), &start)) in caches.iter_mut().zip(start_pos).enumerate() {
            inner.kv_store(k, v, kc, vc, row, start, 1, kv_dim)?;
            let s = AttentionShape { n_tokens: 1, start_pos: start, first_row: row, ..shape };
            inner.attention(q, kc, vc, s, out)?;
        }
        Ok(true)
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
    let backend = |take_batches| Delegate::new(cpu.clone(), Batching { take_batches, batched_calls: AtomicUsize::new(0) });
    let (per_seq, batched) = (backend(false), backend(true));
    let a = run(&Model::load(file.clone(), per_seq.clone()).unwrap());
    let model = Model::load(file, batched.clone()).unwrap();
    let b = run(&model);
    assert_eq!(a, b, "batched decode attention changed the logits");
    assert_eq!(per_seq.hooks.batched_calls.load(Ordering::Relaxed), 0);
    // One call per layer and decode step; the prefill (several rows per sequence) never batches.
    assert_eq!(batched.hooks.batched_calls.load(Ordering::Relaxed), 5 * model.hp.n_layer);
}
