//! The paged KV cache on the CPU backend: logits through a block table (blocks scattered over
//! the pool) are bit-identical to a contiguous cache; a prefix-cache hit gives the same logits
//! as a miss and as the solo run; through the engine, a second request sharing a prefix reuses
//! its blocks (usage says how many tokens), greedy tokens are unchanged, a tiny pool makes
//! requests wait rather than fail, prefix blocks are evicted so memory stays bounded, and a
//! request that could never fit is refused.

mod common;

use civetta::backend;
use civetta::backend::cpu::CpuBackend;
use civetta::engine::kv::BlockManager;
use civetta::engine::{Engine, GenerationEvent, GenerationRequest, GenerationSummary, InvalidRequest, SubmitError};
use civetta::model::{self, KvCache, Logits, Model};
use std::path::Path;

use common::{argmax, bits, prompt};

/// Prefills `prompt[cache.len..]` in chunks of `chunk`, then decodes greedily; returns the
/// logits each new token was taken from (`new_tokens` of them).
fn run(
    model: &Model<CpuBackend>,
    pool: Option<&mut model::KvPool<CpuBackend>>,
    cache: &mut KvCache<CpuBackend>,
    prompt: &[u32],
    chunk: usize,
    new_tokens: usize,
) -> Vec<Vec<f32>> {
    let mut pool = pool;
    let mut last = Vec::new();
    while cache.len < prompt.len() {
        let end = (cache.len + chunk).min(prompt.len());
        let which = if end == prompt.len() { Logits::Last } else { Logits::None };
        let tokens = &prompt[cache.len..end];
        let mut batch = [model::SeqRows { cache: &mut *cache, tokens, logits: which }];
        last = model.forward_batch_in(pool.as_deref_mut(), &mut batch).unwrap().pop().unwrap();
    }
    let mut out = vec![last];
    while out.len() < new_tokens {
        let next = [argmax(out.last().unwrap())];
        let mut batch = [model::SeqRows { cache: &mut *cache, tokens: &next, logits: Logits::Last }];
        out.push(model.forward_batch_in(pool.as_deref_mut(), &mut batch).unwrap().pop().unwrap());
    }
    out
}

fn assert_bit_equal(a: &[Vec<f32>], b: &[Vec<f32>], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(bits(x) == bits(y), "{what}: logits of token {i} differ");
    }
}

fn check_model(path: &Path, vocab: usize) {
    let be = backend::create_cpu(2).unwrap();
    let model = model::load_file(path, be).unwrap();
    let (new_tokens, bs) = (5, 16);
    let p = prompt(70, 3, vocab);
    let mut solo_cache = model.new_cache(p.len() + new_tokens).unwrap();
    let solo = run(&model, None, &mut solo_cache, &p, 1000, new_tokens);

    // A block table whose blocks are scattered over the pool, in reverse order.
    let mut pool = model.new_kv_pool(16, bs).unwrap();
    let table: Vec<u32> = vec![13, 2, 9, 0, 7];
    let mut cache = KvCache::paged(table, bs, 0);
    let paged = run(&model, Some(&mut pool), &mut cache, &p, 23, new_tokens);
    assert_bit_equal(&solo, &paged, "paged vs contiguous");

    // The block manager: a first request fills and keys its blocks, a second one with the
    // same 48-token prefix and another tail reuses three of them.
    let mut kv = BlockManager::new(model.new_kv_pool(16, bs).unwrap());
    let first = kv.allocate(&p, p.len() + new_tokens, 0).unwrap();
    assert_eq!(first.cached_tokens, 0);
    let mut c1 = first.cache;
    run(&model, Some(kv.pool_mut()), &mut c1, &p, 64, new_tokens);
    kv.register(c1.blocks(), &p);
    kv.release(c1.take_blocks());

    let mut q = p[..50].to_vec();
    q.extend(prompt(9, 77, vocab));
    let mut q_cache = model.new_cache(q.len() + new_tokens).unwrap();
    let q_solo = run(&model, None, &mut q_cache, &q, 1000, new_tokens);
    let hit = kv.allocate(&q, q.len() + new_tokens, 0).unwrap();
    assert_eq!(hit.cached_tokens, 48, "three full blocks of the shared 50-token prefix");
    let mut c2 = hit.cache;
    let q_hit = run(&model, Some(kv.pool_mut()), &mut c2, &q, 7, new_tokens);
    assert_bit_equal(&q_solo, &q_hit, "prefix-cache hit vs solo");
    kv.release(c2.take_blocks());

    // The same request as a miss (a fresh manager): the same logits.
    let mut cold = BlockManager::new(model.new_kv_pool(16, bs).unwrap());
    let miss = cold.allocate(&q, q.len() + new_tokens, 0).unwrap();
    assert_eq!(miss.cached_tokens, 0);
    let mut c3 = miss.cache;
    let q_miss = run(&model, Some(cold.pool_mut()), &mut c3, &q, 7, new_tokens);
    assert_bit_equal(&q_miss, &q_hit, "prefix-cache hit vs miss");
}

#[test]
fn paged_and_prefix_cached_logits_equal_contiguous_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    for (arch, quant) in [("llama", "q8_0"), ("qwen3", "q4_k"), ("qwen2", "q4_1")] {
        let path = common::synth(dir.path(), arch, quant);
        check_model(&path, 640);
    }
}

fn engine(path: &Path, kv_cache_bytes: u64) -> Engine {
    common::small_engine(path, kv_cache_bytes)
}

fn request(tokens: Vec<u32>, max_tokens: usize) -> GenerationRequest {
    common::greedy_request(tokens, max_tokens)
}

fn finish(stream: &mut civetta::engine::GenerationStream) -> GenerationSummary {
    loop {
        match stream.blocking_next() {
            Some(GenerationEvent::Done(s)) => return s,
            Some(GenerationEvent::Error(e)) => panic!("generation failed: {e}"),
            Some(GenerationEvent::Token { .. }) => {}
            None => panic!("stream ended without Done"),
        }
    }
}

/// Greedy tokens of the solo run on a contiguous cache.
fn solo_tokens(model: &Model<CpuBackend>, p: &[u32], n: usize) -> Vec<u32> {
    let mut cache = model.new_cache(p.len() + n).unwrap();
    run(model, None, &mut cache, p, 1000, n).iter().map(|l| argmax(l)).collect()
}

#[test]
fn engine_reuses_prefix_blocks_waits_for_blocks_and_evicts() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::synth(dir.path(), "llama", "q4_1");
    let vocab = 640;
    let reference = model::load_file(&path, backend::create_cpu(2).unwrap()).unwrap();
    // A pool of 12 blocks of 16 tokens: one 100-token request + 12 new tokens takes 7.
    let block_bytes = reference.cache_bytes(16) as u64;
    let e = engine(&path, 12 * block_bytes);
    assert_eq!(e.stats().kv_blocks_total, 12);

    let system = prompt(64, 5, vocab);
    let with_tail = |salt: u32| {
        let mut p = system.clone();
        p.extend(prompt(36, salt, vocab));
        p
    };
    let first = finish(&mut e.submit(request(with_tail(1), 12)).unwrap());
    assert_eq!(first.cached_prompt_tokens, 0);
    let second_prompt = with_tail(2);
    let second = finish(&mut e.submit(request(second_prompt.clone(), 12)).unwrap());
    assert_eq!(second.cached_prompt_tokens, 64, "the 64-token shared prefix is four cached blocks");
    assert_eq!(second.token_ids, solo_tokens(&reference, &second_prompt, 12), "a prefix hit keeps greedy tokens");
    let s = common::settled_stats(&e, |s| s.kv_blocks_used == 0);
    assert_eq!((s.prefix_cache_hit_tokens, s.prefix_cache_miss_tokens), (64, 100 + 36));
    assert_eq!(s.kv_blocks_used, 0);

    // Four concurrent requests need 7 blocks each: at most one runs at a time in a pool of
    // 12, the others wait for blocks (none fails), and every answer equals its solo run.
    let prompts: Vec<Vec<u32>> = (0..4).map(|i| prompt(100, 40 + i, vocab)).collect();
    let mut streams: Vec<_> = prompts.iter().map(|p| e.submit(request(p.clone(), 12)).unwrap()).collect();
    for (p, st) in prompts.iter().zip(&mut streams) {
        assert_eq!(finish(st).token_ids, solo_tokens(&reference, p, 12));
    }
    // Distinct prompts evicted the older prefix blocks: the pool never grows.
    let s = common::settled_stats(&e, |s| s.kv_blocks_used == 0);
    assert_eq!(s.kv_blocks_used, 0);
    assert!(s.kv_blocks_cached <= 12, "{s:?}");
    let again = finish(&mut e.submit(request(with_tail(3), 4)).unwrap());
    assert!(again.cached_prompt_tokens < 64, "the system prompt's blocks were evicted by later requests: {again:?}");

    // 13 blocks can never fit in 12: refused at once with the reason.
    match e.submit(request(prompt(200, 9, vocab), 8)) {
        Err(SubmitError::Invalid(e)) => {
            assert!(matches!(e, InvalidRequest::BeyondKvCache { .. }) && e.to_string().contains("KV blocks"), "{e}")
        }
        Err(other) => panic!("expected an invalid-request error, got {other}"),
        Ok(_) => panic!("a request larger than the KV pool was accepted"),
    }
    e.shutdown();
}
