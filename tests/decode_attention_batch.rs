//! The forward pass's side of batched attention (`Backend::decode_attention_batch`, issue #17,
//! and `Backend::attention_batch` for steps that prefill, issue #14; the GPU backends implement
//! them with one to three launches per layer): a backend that takes a batched call must be
//! handed, for every sequence of the batch, its own rows, caches and position. A wrapper around
//! the CPU backend takes the batched calls and answers them with the per-sequence
//! `kv_store_attention` calls; its logits must equal, bit for bit, those of the same wrapper
//! declining the calls (the model's own per-sequence loop), and the batched calls must have
//! been used.

mod common;

use civetta::backend::cpu::CpuBackend;
use civetta::backend::{AttentionShape, Backend};
use civetta::gguf::{GgmlType, GgufFile};
use civetta::model::{Logits, Model, SeqRows};
use civetta::synth::{synth_model, SynthSpec};
use common::delegate::{Delegate, Hooks, InnerTable};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Hooks that take the batched calls (when `take_batches`) and answer them with the inner
/// backend's per-sequence calls.
struct Batching {
    take_batches: bool,
    decode_calls: AtomicUsize,
    step_calls: AtomicUsize,
}

impl Batching {
    fn new(take_batches: bool) -> Self {
        Batching { take_batches, decode_calls: AtomicUsize::new(0), step_calls: AtomicUsize::new(0) }
    }
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
        self.decode_calls.fetch_add(1, Ordering::Relaxed);
        let kv_dim = shape.n_head_kv * shape.head_dim;
        for (row, ((kc, vc), &start)) in caches.iter_mut().zip(start_pos).enumerate() {
            inner.kv_store(k, v, kc, vc, row, start, 1, kv_dim)?;
            let s = AttentionShape { n_tokens: 1, start_pos: start, first_row: row, ..shape };
            inner.attention(q, kc, vc, s, out)?;
        }
        Ok(true)
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
    ) -> civetta::backend::Result<bool> {
        if !self.take_batches {
            return Ok(false);
        }
        assert_eq!(caches.len(), shapes.len());
        assert!(shapes.len() >= 2, "{shapes:?}");
        self.step_calls.fetch_add(1, Ordering::Relaxed);
        for ((kc, vc), &s) in caches.iter_mut().zip(shapes) {
            inner.kv_store_attention(q, k, v, kc, vc, s, sinks, out)?;
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

/// The CPU backend in the test's wrapper.
type Wrapped = Delegate<CpuBackend, Batching>;

/// `run` on an `arch` Q8_0 model through the wrapper declining the batched calls and through
/// one taking them: asserts equal logits and that the first never was called; returns the
/// second's (decode calls, step calls) and the model's layers.
fn per_sequence_vs_batched(arch: &str, run: fn(&Model<Wrapped>) -> Vec<Vec<f32>>) -> (usize, usize, usize) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{arch}-q8_0.gguf"));
    synth_model(&SynthSpec::preset(arch, GgmlType::Q8_0, "small").unwrap(), &path).unwrap();
    let file = Arc::new(GgufFile::open(&path).unwrap());
    let cpu = civetta::backend::create_cpu(1).unwrap();
    let (per_seq, batched) = (Delegate::new(cpu.clone(), Batching::new(false)), Delegate::new(cpu, Batching::new(true)));
    let a = run(&Model::load(file.clone(), per_seq.clone()).unwrap());
    let model = Model::load(file, batched.clone()).unwrap();
    assert_eq!(a, run(&model), "batched attention changed the logits");
    let calls = |h: &Batching| (h.decode_calls.load(Ordering::Relaxed), h.step_calls.load(Ordering::Relaxed));
    assert_eq!(calls(&per_seq.hooks), (0, 0));
    let (decode, step) = calls(&batched.hooks);
    (decode, step, model.hp.n_layer)
}

#[test]
fn batched_decode_attention_gets_each_sequence_its_own_row_cache_and_position() {
    let (decode, step, layers) = per_sequence_vs_batched("llama", run);
    // One decode call per layer and decode step, one step call per layer for the prompts.
    assert_eq!((decode, step), (5 * layers, layers));
}

/// Steps that mix prompt chunks with decode rows, as a serving step does: the first pass
/// prefills two prompts (6 and 11 rows) and starts a third (4 of its 9 rows); the second gives
/// the two their first decode row and the third its last 5 rows (from position 4), with a
/// fourth sequence's 7-row prompt; the third pass decodes all four (the batched decode call).
fn run_mixed<B: Backend>(model: &Model<B>) -> Vec<Vec<f32>> {
    let prompt = |n: u32| -> Vec<u32> { (0..n).map(|i| (i * 29 + n * 3) % 200 + 1).collect() };
    let (p0, p1, p2, p3) = (prompt(6), prompt(11), prompt(9), prompt(7));
    let mut caches: Vec<_> = (0..4).map(|_| model.new_cache(16).unwrap()).collect();
    let [c0, c1, c2, c3] = &mut caches[..] else { unreachable!() };
    let mut all = model
        .forward_batch(&mut [
            SeqRows { cache: &mut *c0, tokens: &p0[..], logits: Logits::Last },
            SeqRows { cache: &mut *c1, tokens: &p1[..], logits: Logits::Last },
            SeqRows { cache: &mut *c2, tokens: &p2[..4], logits: Logits::None },
        ])
        .unwrap();
    all.extend(
        model
            .forward_batch(&mut [
                SeqRows { cache: &mut *c0, tokens: &[5][..], logits: Logits::Last },
                SeqRows { cache: &mut *c2, tokens: &p2[4..], logits: Logits::All },
                SeqRows { cache: &mut *c1, tokens: &[9][..], logits: Logits::Last },
                SeqRows { cache: &mut *c3, tokens: &p3[..], logits: Logits::Last },
            ])
            .unwrap(),
    );
    let next = [[3u32], [4], [6], [8]];
    let mut rows: Vec<SeqRows<B>> =
        [c0, c1, c2, c3].into_iter().zip(&next).map(|(c, t)| SeqRows { cache: c, tokens: &t[..], logits: Logits::Last }).collect();
    all.extend(model.forward_batch(&mut rows).unwrap());
    all
}

#[test]
fn batched_prefill_attention_gets_each_sequence_its_own_rows_caches_and_position() {
    let (decode, step, layers) = per_sequence_vs_batched("qwen3", |m| {
        let logits = run_mixed(m);
        assert_eq!(logits.len(), 3 + 4 + 4, "one logits vector per sequence and pass");
        logits
    });
    // The first two passes are batched steps in every layer; the third is a decode batch.
    assert_eq!((decode, step), (layers, 2 * layers));
}
