//! A long prompt arriving while streams decode (CPU backend, `engine.max_decode_slowdown`):
//! its prefill is cut into small chunks that share every step with the decoding streams, so
//! they keep getting a token per step while it prefills over many steps; and chunking does not
//! change anything a client sees (tokens and log-probabilities bit-identical to the requests run
//! alone, where the long prompt prefills in 64-token chunks).
//!
//! Behaviour, not timing: with `max_decode_slowdown` = 1 no prefill row fits the limit whatever
//! the learned cost model predicts, so the long prompt gets exactly `min_prefill_chunk` rows per
//! step while anything decodes, and the step counts below are exact.

mod common;

use civetta::engine::{Engine, EngineConfig, GenerationEvent, GenerationRequest, GenerationStream};
use std::path::Path;

const VOCAB: usize = 640;
const LONG: usize = 200;
const MIN_CHUNK: usize = 4;
const STREAM_TOKENS: usize = 150;

fn engine(path: &Path, max_decode_slowdown: f64) -> Engine {
    Engine::load(EngineConfig {
        model_path: path.to_path_buf(),
        threads: 2,
        max_active_sequences: 4,
        context_length: 512,
        prefill_batch: 64,
        max_batch_tokens: 64,
        max_decode_slowdown: Some(max_decode_slowdown),
        min_prefill_chunk: MIN_CHUNK,
        ..EngineConfig::default()
    })
    .unwrap()
}

/// A greedy request that also returns the top 5 alternatives (compared bit for bit).
fn request(tokens: Vec<u32>, max_tokens: usize) -> GenerationRequest {
    GenerationRequest { top_logprobs: 5, ..common::greedy_request(tokens, max_tokens) }
}

/// (id, logprob bits, alternatives' ids and logprob bits) of one token event.
type TokenBits = (u32, u32, Vec<(u32, u32)>);

fn next_token(s: &mut GenerationStream) -> Option<TokenBits> {
    match s.blocking_next() {
        Some(GenerationEvent::Token { id, logprob, top_logprobs, .. }) => {
            Some((id, logprob.to_bits(), top_logprobs.iter().map(|t| (t.id, t.logprob.to_bits())).collect()))
        }
        Some(GenerationEvent::Done(_)) => None,
        other => panic!("unexpected event {other:?}"),
    }
}

fn rest(s: &mut GenerationStream, mut seen: Vec<TokenBits>) -> Vec<TokenBits> {
    while let Some(t) = next_token(s) {
        seen.push(t);
    }
    seen
}

fn solo(e: &Engine, req: GenerationRequest) -> Vec<TokenBits> {
    rest(&mut e.submit(req).unwrap(), Vec::new())
}

#[test]
fn decoding_streams_get_a_token_every_step_while_a_long_prompt_prefills() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::synth(dir.path(), "llama", "q4_1");
    let streams = [common::prompt(5, 1, VOCAB), common::prompt(6, 2, VOCAB)];
    let long = common::prompt(LONG, 3, VOCAB);

    let e = engine(&path, 1.0);
    let mut s: Vec<GenerationStream> = streams.iter().map(|p| e.submit(request(p.clone(), STREAM_TOKENS)).unwrap()).collect();
    // Both streams decoding before the long prompt arrives.
    let mut seen: Vec<Vec<TokenBits>> = s.iter_mut().map(|s| (0..2).map(|_| next_token(s).unwrap()).collect()).collect();
    // max_tokens 1: the long request ends with its first token, so every step with three
    // sequences is one of its prefill steps.
    let long_seen = rest(&mut e.submit(request(long.clone(), 1)).unwrap(), Vec::new());
    let seen: Vec<Vec<TokenBits>> = s.iter_mut().zip(seen.drain(..)).map(|(s, v)| rest(s, v)).collect();
    let stats = common::settled_stats(&e, |st| st.active == 0);

    // The long prompt prefilled MIN_CHUNK rows per step, every one of those steps shared with
    // both streams (they need 148 more tokens: they cannot finish within its 50 steps).
    let steps_with_three = stats.batch_sequences.counts[2]; // bucket (2, 4]
    assert_eq!(steps_with_three, LONG.div_ceil(MIN_CHUNK) as u64, "sequences per step: {:?}", stats.batch_sequences);
    assert_eq!(stats.batch_sequences.counts[3..].iter().sum::<u64>(), 0);
    // No step over 16 rows: 2 decode rows + 4 prefill rows while the long prompt prefilled
    // (without the limit its steps would have been 2 + 62 rows), the streams' own prompts.
    assert_eq!(stats.batch_rows.counts[5..].iter().sum::<u64>(), 0, "rows per step: {:?}", stats.batch_rows);
    // Every row was computed exactly once.
    assert_eq!(stats.batch_rows.sum as usize, 5 + 6 + LONG + 2 * (STREAM_TOKENS - 1));

    // Bit-identical to the requests alone (the long prompt alone prefills in 64-row chunks).
    let alone = engine(&path, 0.0);
    assert_eq!(long_seen, solo(&alone, request(long, 1)), "the long prompt's first token");
    for (i, p) in streams.iter().enumerate() {
        assert_eq!(seen[i].len(), STREAM_TOKENS);
        assert_eq!(seen[i], solo(&alone, request(p.clone(), STREAM_TOKENS)), "stream {i}");
    }
}

#[test]
fn with_the_learned_limit_a_long_prompt_is_chunked_and_still_bit_identical() {
    // The default slowdown (3): the chunk sizes depend on measured step times, the results must
    // not, and a chunk is never larger than the budget's room.
    let dir = tempfile::tempdir().unwrap();
    let path = common::synth(dir.path(), "llama", "q4_1");
    let streams = [common::prompt(7, 4, VOCAB), common::prompt(5, 5, VOCAB), common::prompt(9, 6, VOCAB)];
    let long = common::prompt(LONG, 7, VOCAB);
    let e = engine(&path, 2.0);
    let mut s: Vec<GenerationStream> = streams.iter().map(|p| e.submit(request(p.clone(), 60)).unwrap()).collect();
    let mut seen: Vec<Vec<TokenBits>> = s.iter_mut().map(|s| vec![next_token(s).unwrap()]).collect();
    let long_seen = rest(&mut e.submit(request(long.clone(), 8)).unwrap(), Vec::new());
    let seen: Vec<Vec<TokenBits>> = s.iter_mut().zip(seen.drain(..)).map(|(s, v)| rest(s, v)).collect();
    let stats = common::settled_stats(&e, |st| st.active == 0);
    assert_eq!(stats.batch_rows.counts[7..].iter().sum::<u64>(), 0, "a step over the 64-row budget: {:?}", stats.batch_rows);

    let alone = engine(&path, 0.0);
    assert_eq!(long_seen, solo(&alone, request(long, 8)), "the long prompt");
    for (i, p) in streams.iter().enumerate() {
        assert_eq!(seen[i], solo(&alone, request(p.clone(), 60)), "stream {i}");
    }
}

/// Step limits left unset resolve to the CPU backend's defaults when the engine loads: a long
/// prompt is one past 64 tokens, and its chunks keep the decoding streams' step within 3x.
#[test]
fn unset_step_limits_take_the_cpu_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::synth(dir.path(), "llama", "q4_1");
    let e = Engine::load(EngineConfig { model_path: path.clone(), threads: 1, context_length: 256, ..EngineConfig::default() }).unwrap();
    let c = e.config();
    assert_eq!((c.prefill_batch, c.max_batch_tokens, c.max_decode_slowdown), (64, 64, Some(3.0)));
    e.shutdown();
    // Set values stand, 0 (off) included.
    let e = engine(&path, 0.0);
    assert_eq!(e.config().max_decode_slowdown, Some(0.0));
    e.shutdown();
}
