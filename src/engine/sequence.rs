//! One sequence: its KV cache, prefill progress, sampler, and the token emission that
//! follows each forward pass (UTF-8 stream decoding, stop sequences with held-back prefixes,
//! the finish summary).
//!
//! A sequence may be preempted (its KV blocks given back) and resumed later: everything but
//! the KV cache stays in the `Seq` (history, sampler RNG, decoder, held-back text, what was
//! sent), and on resume the history (prompt + generated tokens) is prefilled again, so the
//! next token comes from the same logits and the client's stream just continues.

use super::kv::{Allocation, BlockManager};
use super::sampler::Sampler;
use super::types::*;
use super::{Counters, Inner, Job};
use crate::backend::Backend;
use crate::model::{KvCache, Model};
use crate::tokenizer::StreamDecoder;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// One sequence, running (in the active set) or preempted (waiting to resume).
pub(super) struct Seq<B: Backend> {
    pub(super) job: Job,
    pub(super) cache: KvCache<B>,
    /// Activation order: the largest is the youngest, the first to be preempted.
    pub(super) arrival: u64,
    /// Tokens of `history` already prefilled (its KV stored).
    pub(super) prefill_pos: usize,
    /// Tokens of `history` to prefill before sampling: the prompt, or after a preemption the
    /// prompt and the tokens generated so far.
    prefill_target: usize,
    /// Tokens this prefill computes in all (`prefill_target` less the cached prefix it started
    /// from): the planner treats more than one chunk as a long prefill.
    prefill_rows: usize,
    /// Positions this sequence may ever store (the context, or a contiguous cache's size).
    position_limit: usize,
    /// Prompt tokens whose KV came from the prefix cache.
    cached_tokens: usize,
    pub(super) history: Vec<u32>,
    generated: Vec<u32>,
    sampler: Sampler,
    decoder: StreamDecoder,
    /// Decoded text not yet sent (held back while it may start a stop sequence).
    pending: String,
    activated: Instant,
    pub(super) prefill_time: Duration,
    pub(super) decode_time: Duration,
    first_token_at: Option<Instant>,
    /// Whether this sequence still counts against admission (`Counters::admitted`).
    admitted: bool,
}

/// A token drawn from a sequence's logits, not yet emitted.
pub(super) struct Draw {
    token: u32,
    logprob: f32,
    top: Vec<TopLogprob>,
}

pub(super) enum StepOutcome {
    Continue,
    Finished,
}

impl<B: Backend> Seq<B> {
    /// Positions the whole request needs (prompt + max_tokens, capped by the context).
    pub(super) fn positions_needed(inner: &Inner, job: &Job) -> usize {
        (job.req.prompt().len() + job.req.params().max_tokens).min(inner.ctx_len)
    }

    /// Starts a sequence on the paged blocks it was given (prefilling from the end of its
    /// cached prefix), or, without a paged pool, on a contiguous KV cache allocated for the
    /// whole request. The job comes back on failure so its stream can receive the error.
    #[allow(clippy::result_large_err)]
    pub(super) fn activate(
        inner: &Inner,
        model: &Model<B>,
        job: Job,
        blocks: Option<Allocation<B>>,
        arrival: u64,
    ) -> Result<Seq<B>, (Job, anyhow::Error)> {
        let (cache, cached_tokens, position_limit) = match blocks {
            // Paged: the table grows block by block up to the context.
            Some(a) => (a.cache, a.cached_tokens, inner.ctx_len),
            None => match model.new_cache(Self::positions_needed(inner, &job)) {
                Ok(c) => {
                    let limit = c.capacity.min(inner.ctx_len);
                    (c, 0, limit)
                }
                Err(e) => return Err((job, e)),
            },
        };
        let sampler = Sampler::new(job.req.params().sampling.clone());
        Ok(Seq {
            history: job.req.prompt().to_vec(),
            prefill_target: job.req.prompt().len(),
            prefill_rows: job.req.prompt().len() - cached_tokens,
            position_limit,
            arrival,
            job,
            cache,
            prefill_pos: cached_tokens,
            cached_tokens,
            generated: Vec::new(),
            sampler,
            decoder: StreamDecoder::new(),
            pending: String::new(),
            activated: Instant::now(),
            prefill_time: Duration::ZERO,
            decode_time: Duration::ZERO,
            first_token_at: None,
            admitted: true,
        })
    }

    /// Tokens still to prefill (0: decoding).
    pub(super) fn prefill_left(&self) -> usize {
        self.prefill_target - self.prefill_pos
    }

    /// What the step planner needs to know of this sequence.
    pub(super) fn plan_state(&self) -> super::scheduler::SeqState {
        super::scheduler::SeqState { prefill_left: self.prefill_left(), prefill_rows: self.prefill_rows, kv_len: self.cache.len }
    }

    /// Whether the next step needs a position beyond the cache's blocks (a decoding sequence
    /// whose last block is full; prefills run inside the blocks taken on activation).
    pub(super) fn needs_block(&self) -> bool {
        self.prefill_left() == 0 && self.cache.len + 1 > self.cache.capacity
    }

    /// Gives the KV blocks back (full blocks keyed for the prefix cache first, so the resume
    /// may find them) and rewinds to prefill the whole history when it resumes. The sequence
    /// keeps its admission slot; it moves from the active set to the waiting ones.
    pub(super) fn preempt(&mut self, c: &Counters, kv: &mut BlockManager<B>) {
        kv.register(self.cache.blocks(), &self.history[..self.cache.len]);
        kv.release_cache(&mut self.cache);
        self.prefill_pos = 0;
        self.prefill_target = 0;
        self.prefill_rows = 0;
        c.preemptions.fetch_add(1, Ordering::Relaxed);
        c.active.fetch_sub(1, Ordering::SeqCst);
        c.queued.fetch_add(1, Ordering::SeqCst);
    }

    /// Blocks a preempted sequence needs to resume: its whole history (the last token's logits
    /// give the next token, as a decode row would have).
    pub(super) fn resume_positions(&self) -> usize {
        self.history.len()
    }

    /// Continues a preempted sequence on the blocks it was given (from its cached prefix on).
    pub(super) fn resume(&mut self, c: &Counters, a: Allocation<B>) {
        self.cache = a.cache;
        self.prefill_pos = a.cached_tokens;
        self.prefill_target = self.history.len();
        self.prefill_rows = self.history.len() - a.cached_tokens;
        c.queued.fetch_sub(1, Ordering::SeqCst);
        c.active.fetch_add(1, Ordering::SeqCst);
    }

    /// Ends a preempted sequence that will not resume (client gone, shutdown): it holds no
    /// blocks, only its admission slot and its place in the queue count.
    pub(super) fn drop_waiting(&mut self, c: &Counters) {
        c.queued.fetch_sub(1, Ordering::SeqCst);
        self.release_admission(c);
    }

    /// Ends a running sequence that cannot grow although it holds the whole pool (no other
    /// sequence to preempt): it finishes as a full context would.
    pub(super) fn finish_kv_full(&mut self, inner: &Inner) {
        self.finish(inner, FinishReason::Context);
    }

    /// Draws the next token from `logits` (of the last forward row). Touches only this
    /// sequence's sampler and history, so the sequences of a step draw in parallel.
    pub(super) fn draw(&mut self, logits: &mut [f32]) -> Draw {
        let sampled = self.sampler.sample(logits, &self.history);
        // After sample(): the logits carry the repetition penalty, as the logprob does.
        let n = self.job.req.params().top_logprobs.min(super::types::MAX_TOP_LOGPROBS);
        let top = super::sampler::top_logprobs(logits, n, sampled.log_norm);
        Draw { token: sampled.token, logprob: sampled.logprob, top }
    }

    /// Emits a drawn token (or finishes on EOS / stop / length / context).
    pub(super) fn emit(&mut self, inner: &Inner, d: Draw) -> StepOutcome {
        self.emit_token(inner, d.token, d.logprob, d.top)
    }

    /// Sends a sampled token (or finishes on EOS / stop / length / context).
    fn emit_token(&mut self, inner: &Inner, token: u32, logprob: f32, top_logprobs: Vec<TopLogprob>) -> StepOutcome {
        let tk = &inner.tokenizer;
        if self.first_token_at.is_none() {
            self.first_token_at = Some(Instant::now());
        }
        if !self.job.req.params().ignore_eos && tk.is_eog(token) {
            return self.finish(inner, FinishReason::Eos);
        }
        self.history.push(token);
        self.generated.push(token);
        let piece = self.decoder.push(tk.token_bytes(token));
        self.pending.push_str(&piece);

        // A complete stop sequence ends the generation; its text is not sent.
        if let Some(cut) = self.job.req.params().stop.iter().filter_map(|st| self.pending.find(st.as_str())).min() {
            let text = self.pending[..cut].to_string();
            self.pending.clear();
            let _ = self.job.tx.send(GenerationEvent::Token { id: token, text, logprob, top_logprobs });
            return self.finish(inner, FinishReason::Stop);
        }
        let length_done = self.generated.len() >= self.job.req.params().max_tokens;
        let context_done = self.cache.len + 1 > self.position_limit;
        if length_done || context_done {
            self.pending.push_str(&self.decoder.finish());
            let text = std::mem::take(&mut self.pending);
            let _ = self.job.tx.send(GenerationEvent::Token { id: token, text, logprob, top_logprobs });
            let reason = if length_done { FinishReason::Length } else { FinishReason::Context };
            return self.finish(inner, reason);
        }
        let hold = stop_prefix_holdback(&self.pending, &self.job.req.params().stop);
        let text: String = self.pending[..self.pending.len() - hold].to_string();
        self.pending.drain(..self.pending.len() - hold);
        if self.job.tx.send(GenerationEvent::Token { id: token, text, logprob, top_logprobs }).is_err() {
            inner.counters.cancelled.fetch_add(1, Ordering::Relaxed);
            return StepOutcome::Finished;
        }
        StepOutcome::Continue
    }

    fn finish(&mut self, inner: &Inner, reason: FinishReason) -> StepOutcome {
        self.pending.push_str(&self.decoder.finish());
        let now = Instant::now();
        let timings = Timings {
            queue: self.activated.duration_since(self.job.submitted),
            prefill: self.prefill_time,
            decode: self.decode_time,
            time_to_first_token: self.first_token_at.unwrap_or(now).duration_since(self.job.submitted),
            total: now.duration_since(self.job.submitted),
        };
        let summary = GenerationSummary {
            prompt_tokens: self.job.req.prompt().len(),
            completion_tokens: self.generated.len(),
            finish_reason: reason,
            token_ids: self.generated.clone(),
            cached_prompt_tokens: self.cached_tokens,
            timings,
            text_tail: std::mem::take(&mut self.pending),
        };
        // A client that sends its next request as soon as it sees Done must find the slot free.
        self.release_admission(&inner.counters);
        let _ = self.job.tx.send(GenerationEvent::Done(summary));
        inner.counters.completed.fetch_add(1, Ordering::Relaxed);
        StepOutcome::Finished
    }

    /// Gives back everything the sequence holds (active slot, admission, KV). Paged blocks
    /// go back to the pool, their full blocks keyed for the prefix cache first.
    pub(super) fn release(&mut self, c: &Counters, kv: Option<&mut BlockManager<B>>) {
        c.active.fetch_sub(1, Ordering::SeqCst);
        self.release_admission(c);
        c.kv_bytes.fetch_sub(self.cache.bytes, Ordering::SeqCst);
        if let Some(kv) = kv {
            // history[..len] are the tokens whose K and V the cache holds.
            kv.register(self.cache.blocks(), &self.history[..self.cache.len]);
            kv.release_cache(&mut self.cache);
        }
    }

    /// Keys the prefilled full blocks for the prefix cache once the prefill is done, so that
    /// requests arriving while this one decodes can share them.
    pub(super) fn register_prefill(&self, kv: &mut BlockManager<B>) {
        kv.register(self.cache.blocks(), &self.history[..self.cache.len]);
    }

    /// Gives the sequence's admission slot back (once).
    fn release_admission(&mut self, c: &Counters) {
        if std::mem::take(&mut self.admitted) {
            c.admitted.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of some stop sequence.
fn stop_prefix_holdback(text: &str, stops: &[String]) -> usize {
    let mut best = 0;
    for st in stops {
        for (i, _) in text.char_indices() {
            let suffix = &text[i..];
            if suffix.len() < st.len() && st.starts_with(suffix) {
                best = best.max(suffix.len());
                break;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::stop_prefix_holdback;

    #[test]
    fn holdback_keeps_possible_stop_prefixes() {
        let stops = vec!["END".to_string(), "\n\n".to_string()];
        assert_eq!(stop_prefix_holdback("hello E", &stops), 1);
        assert_eq!(stop_prefix_holdback("hello EN", &stops), 2);
        assert_eq!(stop_prefix_holdback("hello\n", &stops), 1);
        assert_eq!(stop_prefix_holdback("hello", &stops), 0);
        assert_eq!(stop_prefix_holdback("héllo é", &["éx".to_string()]), "é".len());
    }
}
