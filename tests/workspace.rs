//! The forward pass's activation buffers are allocated once per engine (model::Workspace):
//! an engine serving several requests over many steps makes no `Backend::alloc` call after it
//! has loaded, and a reused workspace, holding what earlier passes of other shapes left in
//! it, gives the same logits bit for bit as a fresh one.

mod common;

use civetta::backend::cpu::CpuBackend;
use civetta::backend::Backend;
use civetta::engine::{Engine, EngineConfig, GenerationEvent};
use civetta::model::{self, Logits, SeqRows, WorkspaceShape};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::delegate::{Delegate, Hooks, InnerTable};
use common::{bits, greedy_request, prompt};

/// Hooks that count the activation buffers asked of the inner backend (`alloc`).
#[derive(Default)]
struct CountAllocs(AtomicUsize);

impl<B: Backend> Hooks<B> for CountAllocs {
    type Table = InnerTable<B>;
    fn alloc(&self, inner: &B, len: usize) -> civetta::backend::Result<B::Buffer> {
        self.0.fetch_add(1, Ordering::SeqCst);
        inner.alloc(len)
    }
}

type Counting = Delegate<CpuBackend, CountAllocs>;

impl Counting {
    fn allocs(&self) -> usize {
        self.hooks.0.load(Ordering::SeqCst)
    }
}

fn counting_cpu() -> Arc<Counting> {
    Delegate::new(civetta::backend::create_cpu(2).unwrap(), CountAllocs::default())
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

/// The tests' delegating backend (tests/common/delegate.rs) forwards every method of the
/// `Backend` trait: one it missed would fall back to the trait's default in every wrapped test,
/// not to the inner backend's own implementation.
#[test]
fn the_test_delegate_forwards_every_backend_method() {
    let methods = |text: &str, start: &str| -> std::collections::BTreeSet<String> {
        let body = &text[text.find(start).unwrap_or_else(|| panic!("{start:?} not found"))..];
        let body = &body[..body.find("\n}\n").unwrap()];
        body.lines().filter_map(|l| l.strip_prefix("    fn ")).map(|l| l[..l.find(['(', '<']).unwrap()].to_string()).collect()
    };
    let root = env!("CARGO_MANIFEST_DIR");
    let read = |p: &str| std::fs::read_to_string(format!("{root}/{p}")).unwrap();
    let trait_methods = methods(&read("src/backend/mod.rs"), "pub trait Backend:");
    let forwarded = methods(&read("tests/common/delegate.rs"), "Backend for Delegate<B, H> {");
    assert!(trait_methods.len() > 40, "parsed only {} trait methods", trait_methods.len());
    let missing: Vec<_> = trait_methods.difference(&forwarded).collect();
    assert!(missing.is_empty(), "tests/common/delegate.rs does not forward {missing:?}");
}
