//! Preemption on the paged KV pool (CPU backend): sequences take blocks as they grow; when the
//! pool has none, the youngest running sequence gives its blocks back, waits at the front of
//! the queue and later prefills its prompt + generated tokens again. Checked here with a pool
//! far too small for four concurrent requests: every request completes (none fails, none
//! stalls), `preemptions` counts, each stream carries every token exactly once, and tokens,
//! log-probabilities and the 20 most likely alternatives of every step (greedy and seeded
//! sampling) are bit-identical to the same request run alone. A sequence alone in a full pool
//! finishes with `Context`; a prompt that can never fit is refused.

mod common;

use civetta::engine::{
    Engine, EngineConfig, FinishReason, GenerationEvent, GenerationRequest, GenerationSummary, InvalidRequest, PromptInput, SamplingParams,
    SubmitError, MAX_TOP_LOGPROBS,
};
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use common::prompt;

const VOCAB: usize = 640;

fn engine(path: &Path, kv_blocks: Option<u64>) -> Engine {
    let block_bytes = {
        let m = civetta::model::load_file(path, civetta::backend::create_cpu(1).unwrap()).unwrap();
        m.cache_bytes(16) as u64
    };
    common::small_engine(path, kv_blocks.map_or(0, |n| n * block_bytes))
}

fn request(tokens: Vec<u32>, max_tokens: usize, sampling: SamplingParams) -> GenerationRequest {
    GenerationRequest {
        prompt: PromptInput::Tokens(tokens),
        max_tokens,
        sampling,
        stop: vec![],
        ignore_eos: true,
        top_logprobs: MAX_TOP_LOGPROBS,
    }
}

/// One token event as bits: id, text, logprob bits, the alternatives' ids and logprob bits.
type TokenBits = (u32, String, u32, Vec<(u32, u32)>);

/// What a client saw: every token event and the summary.
#[derive(Debug, PartialEq)]
struct Seen {
    tokens: Vec<TokenBits>,
    summary: GenerationSummary,
}

fn collect(mut stream: civetta::engine::GenerationStream) -> Result<Seen, String> {
    let mut tokens = Vec::new();
    loop {
        match stream.blocking_next() {
            Some(GenerationEvent::Token { id, text, logprob, top_logprobs }) => {
                tokens.push((id, text, logprob.to_bits(), top_logprobs.iter().map(|t| (t.id, t.logprob.to_bits())).collect()))
            }
            Some(GenerationEvent::Done(summary)) => return Ok(Seen { tokens, summary }),
            Some(GenerationEvent::Error(e)) => return Err(e),
            None => return Err("stream ended without Done".into()),
        }
    }
}

/// Runs requests concurrently; fails the test if any has not finished within the limit (a
/// stalled scheduler), or failed.
fn run_concurrently(e: &Engine, reqs: &[GenerationRequest]) -> Vec<Seen> {
    let (tx, rx) = mpsc::channel();
    for (i, r) in reqs.iter().enumerate() {
        let stream = e.submit(r.clone()).unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || tx.send((i, collect(stream))).unwrap());
    }
    let mut out: Vec<Option<Seen>> = (0..reqs.len()).map(|_| None).collect();
    for _ in 0..reqs.len() {
        let (i, seen) = rx.recv_timeout(Duration::from_secs(300)).expect("a request stalled: no answer within 300 s");
        out[i] = Some(seen.unwrap_or_else(|err| panic!("request {i} failed: {err}")));
    }
    out.into_iter().map(Option::unwrap).collect()
}

fn check_stream_is_complete(seen: &Seen, what: &str) {
    let ids: Vec<u32> = seen.tokens.iter().map(|t| t.0).collect();
    assert_eq!(ids, seen.summary.token_ids, "{what}: every generated token sent exactly once, in order");
    assert_eq!(seen.tokens.len(), seen.summary.completion_tokens, "{what}");
}

#[test]
fn preempted_sequences_resume_bit_identical_and_none_fails() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::synth(dir.path(), "llama", "q4_1");
    let greedy = SamplingParams::default();
    let seeded = |seed| SamplingParams { temperature: 0.9, top_k: 40, seed, ..Default::default() };
    // One-block prompts that all start at once and grow by 60 tokens each to 5 blocks: 20
    // blocks in all, in a pool of 8, so sequences are preempted in the middle of generating.
    let reqs = vec![
        request(prompt(10, 11, VOCAB), 60, greedy.clone()),
        request(prompt(12, 12, VOCAB), 60, seeded(7)),
        request(prompt(14, 13, VOCAB), 60, greedy),
        request(prompt(9, 14, VOCAB), 60, seeded(8)),
    ];

    // Each request alone, on a pool that never runs out.
    let roomy = engine(&path, None);
    let alone: Vec<Seen> = reqs.iter().map(|r| run_concurrently(&roomy, std::slice::from_ref(r)).pop().unwrap()).collect();
    assert_eq!(roomy.stats().preemptions, 0);
    roomy.shutdown();

    let tiny = engine(&path, Some(8));
    assert_eq!(tiny.stats().kv_blocks_total, 8);
    let together = run_concurrently(&tiny, &reqs);
    let s = tiny.stats();
    assert!(s.preemptions > 0, "the pool of 8 blocks must force preemptions: {s:?}");
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        let what = format!("request {i}");
        check_stream_is_complete(b, &what);
        assert_eq!(b.summary.finish_reason, FinishReason::Length, "{what}");
        assert_eq!(b.summary.completion_tokens, 60, "{what}");
        // Tokens, texts, logprob bits and the 20 alternatives' bits of every step.
        assert_eq!(a.tokens, b.tokens, "{what}: preempted run differs from the request alone");
        assert_eq!(a.summary.text_tail, b.summary.text_tail, "{what}");
    }
    // Everything given back: no block in use, nothing waiting or running.
    let s = common::settled_stats(&tiny, |s| (s.kv_blocks_used, s.active, s.queued) == (0, 0, 0));
    assert_eq!((s.kv_blocks_used, s.active, s.queued), (0, 0, 0), "{s:?}");
    eprintln!("preemptions: {}", s.preemptions);

    // A sequence alone in the full pool cannot grow and nobody can give way: it finishes as
    // at the end of its context, having used all 128 positions (the last sampled token is
    // never stored); its tokens are the request-alone ones.
    let long = request(prompt(20, 21, VOCAB), 300, SamplingParams::default());
    let seen = run_concurrently(&tiny, std::slice::from_ref(&long)).pop().unwrap();
    check_stream_is_complete(&seen, "alone in a full pool");
    assert_eq!(seen.summary.finish_reason, FinishReason::Context);
    assert_eq!(20 + seen.summary.completion_tokens - 1, 128);
    let roomy = engine(&path, None);
    let reference = run_concurrently(&roomy, &[long]).pop().unwrap();
    assert_eq!(reference.tokens[..seen.tokens.len()], seen.tokens[..]);
    roomy.shutdown();

    // A prompt of 9 blocks can never fit in 8: refused at once, on the prompt field.
    match tiny.submit(request(prompt(130, 9, VOCAB), 4, SamplingParams::default())) {
        Err(SubmitError::Invalid(e)) => {
            assert!(matches!(e, InvalidRequest::BeyondKvCache { .. }), "{e}");
            assert_eq!(e.field(), "prompt");
            assert!(e.to_string().contains("KV blocks"), "{e}");
        }
        Err(other) => panic!("expected an invalid-request error, got {other}"),
        Ok(_) => panic!("a prompt larger than the KV pool was accepted"),
    }
    tiny.shutdown();
}

#[test]
fn max_batch_tokens_zero_is_the_backends_default() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::synth(dir.path(), "llama", "q8_0");
    let e = Engine::load(EngineConfig { model_path: path, threads: 1, context_length: 256, ..EngineConfig::default() }).unwrap();
    assert_eq!(EngineConfig::default().max_batch_tokens, 0);
    assert_eq!(e.config().max_batch_tokens, civetta::engine::default_max_batch_tokens("cpu"));
    assert_eq!(e.config().max_batch_tokens, 64);
    assert_eq!(civetta::engine::default_max_batch_tokens("cuda"), 2048);
    e.shutdown();
}

/// With a vocabulary large enough (4 rows x 20,000 logits), the sequences of a step draw their
/// tokens on several threads (scheduler.rs `draw_all`): what each client sees must still be
/// the request alone, bit for bit, with greedy and seeded sampling and the alternatives.
#[test]
fn sequences_that_draw_in_parallel_see_what_they_see_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("llama-q8_0-vocab20000.gguf");
    let out = common::civetta()
        .args(["model", "synth", "--arch", "llama", "--quant", "q8_0", "--vocab", "20000", "--seed", "3", "-o"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "synth failed: {}", String::from_utf8_lossy(&out.stderr));
    let seeded = |seed| SamplingParams { temperature: 0.8, top_k: 0, top_p: 0.95, seed, ..Default::default() };
    let reqs = vec![
        request(prompt(9, 21, VOCAB), 24, SamplingParams::default()),
        request(prompt(11, 22, VOCAB), 24, seeded(5)),
        request(prompt(13, 23, VOCAB), 24, SamplingParams { repetition_penalty: 1.3, ..SamplingParams::default() }),
        request(prompt(10, 24, VOCAB), 24, seeded(6)),
    ];
    let e = engine(&path, None);
    let alone: Vec<Seen> = reqs.iter().map(|r| run_concurrently(&e, std::slice::from_ref(r)).pop().unwrap()).collect();
    let together = run_concurrently(&e, &reqs);
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        check_stream_is_complete(b, &format!("request {i}"));
        assert_eq!(a.tokens, b.tokens, "request {i}: drawn in a batch differs from the request alone");
    }
    e.shutdown();
}
