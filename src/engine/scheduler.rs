//! The scheduler: one engine thread, a FIFO queue in front of a bounded set of active
//! sequences, and continuous batching. Each step builds one batch under a token budget
//! (`engine.max_batch_tokens`): one decode row from every sequence past its prompt, then
//! prefill chunks of the waiting prompts (oldest first, at most `engine.prefill_batch` tokens
//! each) in what is left of the budget; the whole batch is one forward pass
//! (`Model::forward_batch`), then every sequence that produced logits samples its next token.
//! A long prompt is cut into chunks, so it never stalls the streams that are decoding.
//!
//! With the paged KV pool (CPU), admission takes only a prompt's blocks; sequences grow block
//! by block as they decode, and when the pool runs out the youngest running sequence is
//! preempted (blocks freed, resumed later by recomputing its history: `Worker::make_room`).

use super::kv::{Allocation, BlockManager};
use super::sequence::{Seq, StepOutcome};
use super::types::*;
use super::{Counters, Inner, Job};
use crate::model::{Logits, SeqRows};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// What one sequence contributes to a step: `rows` tokens, decoding or prefilling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Work {
    /// One row: the last token, whose logits give the next one.
    Decode,
    /// A chunk of the prompt; `last` when it completes the prompt (its logits are sampled).
    Prefill { rows: usize, last: bool },
}

impl Work {
    pub(super) fn rows(self) -> usize {
        match self {
            Work::Decode => 1,
            Work::Prefill { rows, .. } => rows,
        }
    }
}

/// Plans one step for sequences whose prompts have `prefill_left[i]` tokens to go (0 =
/// decoding): every decoding sequence gets its row, then prefills fill the rest of `budget`
/// in order, each at most `chunk` tokens. Decode rows are never cut by the budget (there are
/// at most max_active_sequences of them); when they use it all, prefills wait a step.
pub(super) fn plan_step(prefill_left: &[usize], budget: usize, chunk: usize) -> Vec<Option<Work>> {
    let mut plan: Vec<Option<Work>> = prefill_left.iter().map(|&left| (left == 0).then_some(Work::Decode)).collect();
    let mut room = budget.saturating_sub(plan.iter().flatten().count());
    for (slot, &left) in plan.iter_mut().zip(prefill_left) {
        if left == 0 || room == 0 {
            continue;
        }
        let rows = left.min(chunk.max(1)).min(room);
        room -= rows;
        *slot = Some(Work::Prefill { rows, last: rows == left });
    }
    plan
}

/// Publishes the paged pool's block counts (and the bytes in use) for `Engine::stats`.
fn publish_kv(c: &Counters, kv: &Option<BlockManager>) {
    if let Some(kv) = kv {
        let n = kv.counts();
        c.kv_blocks_used.store(n.used, Ordering::Relaxed);
        c.kv_blocks_cached.store(n.cached, Ordering::Relaxed);
        c.kv_bytes.store(kv.bytes_in_use(), Ordering::Relaxed);
    }
}

/// The engine thread's state between steps.
struct Worker<'a> {
    inner: &'a Inner,
    kv: Option<BlockManager>,
    /// Running sequences, oldest (smallest `arrival`) first.
    active: Vec<Seq>,
    /// Preempted sequences waiting to resume, oldest first; they go before every queued
    /// request (the front of the queue).
    preempted: VecDeque<Seq>,
    next_arrival: u64,
}

/// What admission took for this step: a queued request with its blocks, or a preempted
/// sequence with its new blocks.
enum Admitted {
    New(Job, Option<Allocation>),
    Resume(Box<Seq>, Allocation),
}

pub(super) fn run_worker(inner: &Inner, kv: Option<BlockManager>) {
    let mut w = Worker { inner, kv, active: Vec::new(), preempted: VecDeque::new(), next_arrival: 0 };
    let c = &inner.counters;
    loop {
        let admitted = {
            let mut queue = inner.queue.lock();
            if c.shutting_down.load(Ordering::SeqCst) {
                w.shut_down(&mut queue);
                return;
            }
            purge_cancelled(inner, &mut queue);
            w.purge_cancelled_preempted();
            if w.active.is_empty() && w.preempted.is_empty() && queue.is_empty() {
                inner.wake.wait(&mut queue);
                continue;
            }
            w.admit(&mut queue)
        };
        for a in admitted {
            w.activate(a);
        }
        // Clients that went away: their sequences end before the step (KV cache freed).
        let mut i = 0;
        while i < w.active.len() {
            if w.active[i].job.tx.is_closed() {
                c.cancelled.fetch_add(1, Ordering::Relaxed);
                w.active.remove(i).release(c, w.kv.as_mut());
            } else {
                i += 1;
            }
        }
        w.make_room();
        if !w.active.is_empty() {
            step(inner, &mut w.active, &mut w.kv);
        }
        publish_kv(c, &w.kv);
    }
}

impl Worker<'_> {
    /// Every waiting and running request ends with an error event.
    fn shut_down(&mut self, queue: &mut VecDeque<Job>) {
        let c = &self.inner.counters;
        for j in queue.drain(..) {
            c.queued.fetch_sub(1, Ordering::SeqCst);
            c.admitted.fetch_sub(1, Ordering::SeqCst);
            let _ = j.tx.send(GenerationEvent::Error("engine is shutting down".into()));
        }
        for mut s in self.preempted.drain(..) {
            let _ = s.job.tx.send(GenerationEvent::Error("engine is shutting down".into()));
            s.drop_waiting(c);
        }
        for mut s in self.active.drain(..) {
            let _ = s.job.tx.send(GenerationEvent::Error("engine is shutting down".into()));
            s.release(c, self.kv.as_mut());
        }
        publish_kv(c, &self.kv);
    }

    /// Preempted sequences whose client went away end without resuming.
    fn purge_cancelled_preempted(&mut self) {
        let c = &self.inner.counters;
        self.preempted.retain_mut(|s| {
            if s.job.tx.is_closed() {
                c.cancelled.fetch_add(1, Ordering::Relaxed);
                s.drop_waiting(c);
                false
            } else {
                true
            }
        });
    }

    /// Takes what can start this step, oldest first: preempted sequences, then queued
    /// requests, while active slots are free. With a paged pool each needs the blocks of what
    /// it prefills (its prompt, or its whole history on resume) while leaving one block per
    /// running sequence for it to grow into; the first that cannot get them waits, and
    /// everything behind it too (no overtaking, so a long prompt is not starved).
    fn admit(&mut self, queue: &mut VecDeque<Job>) -> Vec<Admitted> {
        let (inner, c) = (self.inner, &self.inner.counters);
        let slots = inner.cfg.max_active_sequences.max(1);
        let mut admitted = Vec::new();
        while self.active.len() + admitted.len() < slots {
            let headroom = self.active.len() + admitted.len();
            if let Some(s) = self.preempted.front() {
                let kv = self.kv.as_mut().expect("only a paged pool preempts");
                let Some(a) = kv.allocate(&s.history, s.resume_positions(), headroom) else { break };
                let s = self.preempted.pop_front().expect("front checked above");
                admitted.push(Admitted::Resume(Box::new(s), a));
                continue;
            }
            let Some(job) = queue.front() else { break };
            let blocks = match self.kv.as_mut() {
                Some(kv) => match kv.allocate(job.req.prompt(), job.req.prompt().len(), headroom) {
                    Some(a) => {
                        c.prefix_hit_tokens.fetch_add(a.cached_tokens as u64, Ordering::Relaxed);
                        c.prefix_miss_tokens.fetch_add((job.req.prompt().len() - a.cached_tokens) as u64, Ordering::Relaxed);
                        Some(a)
                    }
                    None => break,
                },
                None => None,
            };
            let job = queue.pop_front().expect("front checked above");
            c.queued.fetch_sub(1, Ordering::SeqCst);
            admitted.push(Admitted::New(job, blocks));
        }
        admitted
    }

    /// Puts an admitted request or resumed sequence into the active set (kept oldest first).
    fn activate(&mut self, a: Admitted) {
        let c = &self.inner.counters;
        match a {
            Admitted::New(job, blocks) => match Seq::activate(self.inner, job, blocks, self.next_arrival) {
                Ok(seq) => {
                    self.next_arrival += 1;
                    c.active.fetch_add(1, Ordering::SeqCst);
                    c.kv_bytes.fetch_add(seq.cache.bytes, Ordering::SeqCst);
                    self.active.push(seq);
                }
                Err((job, e)) => {
                    c.admitted.fetch_sub(1, Ordering::SeqCst);
                    let _ = job.tx.send(GenerationEvent::Error(format!("{e:#}")));
                }
            },
            Admitted::Resume(mut seq, blocks) => {
                seq.resume(c, blocks);
                let at = self.active.partition_point(|s| s.arrival < seq.arrival);
                self.active.insert(at, *seq);
            }
        }
    }

    /// Gives every decoding sequence whose last block is full one more block, oldest first.
    /// When the pool has none (free or evictable), the youngest running sequence is preempted
    /// (its blocks freed, it waits at the front of the queue) until the block is found; the
    /// youngest may be the sequence itself. A sequence alone in the pool that still cannot
    /// grow holds every block: it finishes as at the end of its context.
    fn make_room(&mut self) {
        let Some(kv) = self.kv.as_mut() else { return };
        let c = &self.inner.counters;
        let mut i = 0;
        while i < self.active.len() {
            if !self.active[i].needs_block() || kv.grow(&mut self.active[i].cache) {
                i += 1;
                continue;
            }
            let youngest = self.active.len() - 1;
            if youngest == 0 {
                let mut s = self.active.remove(0);
                s.finish_kv_full(self.inner);
                s.release(c, Some(kv));
                continue;
            }
            let mut victim = self.active.remove(youngest);
            victim.preempt(c, kv);
            // Oldest first: a victim preempted later is older than those already waiting.
            let at = self.preempted.partition_point(|s| s.arrival < victim.arrival);
            self.preempted.insert(at, victim);
            // Retry sequence i (unless it was the victim: then the loop ends).
        }
    }
}

/// Removes queued requests whose client went away (stream dropped), giving back their
/// admission slots at once rather than when they would have been activated.
pub(super) fn purge_cancelled(inner: &Inner, queue: &mut VecDeque<Job>) {
    let c = &inner.counters;
    queue.retain(|j| {
        if j.tx.is_closed() {
            c.queued.fetch_sub(1, Ordering::SeqCst);
            c.admitted.fetch_sub(1, Ordering::SeqCst);
            c.cancelled.fetch_add(1, Ordering::Relaxed);
            false
        } else {
            true
        }
    });
}

/// One engine step: plan the batch, one forward pass, sample for every sequence whose rows
/// end in a token to predict; finished sequences leave `active` (order kept: oldest first).
fn step(inner: &Inner, active: &mut Vec<Seq>, kv: &mut Option<BlockManager>) {
    let c = &inner.counters;
    let prefill_left: Vec<usize> = active.iter().map(Seq::prefill_left).collect();
    let plan = plan_step(&prefill_left, inner.cfg.max_batch_tokens.max(1), inner.cfg.prefill_batch);
    let rows: usize = plan.iter().flatten().map(|w| w.rows()).sum();
    let seqs = plan.iter().flatten().count();
    c.observe_batch(rows, seqs);

    let t0 = Instant::now();
    let result = {
        let mut batch = Vec::with_capacity(seqs);
        for (s, work) in active.iter_mut().zip(&plan) {
            let Some(work) = *work else { continue };
            let (tokens, logits) = match work {
                Work::Decode => (std::slice::from_ref(s.history.last().expect("history holds the prompt")), Logits::Last),
                Work::Prefill { rows, last } => {
                    (&s.history[s.prefill_pos..s.prefill_pos + rows], if last { Logits::Last } else { Logits::None })
                }
            };
            batch.push(SeqRows { cache: &mut s.cache, tokens, logits });
        }
        inner.model.forward_batch_in(kv.as_mut().map(BlockManager::pool_mut), &mut batch)
    };
    let elapsed = t0.elapsed();

    let mut finished = vec![false; active.len()];
    match result {
        Ok(logits) => {
            let mut logits = logits.into_iter();
            for ((s, work), done) in active.iter_mut().zip(&plan).zip(finished.iter_mut()) {
                let Some(work) = *work else { continue };
                let mut row_logits = logits.next().expect("one logits vector per sequence in the batch");
                match work {
                    Work::Decode => s.decode_time += elapsed,
                    Work::Prefill { rows, last } => {
                        s.prefill_pos += rows;
                        s.prefill_time += elapsed;
                        if !last {
                            continue;
                        }
                        if let Some(kv) = kv.as_mut() {
                            s.register_prefill(kv);
                        }
                    }
                }
                *done = matches!(s.sample_and_emit(inner, &mut row_logits), StepOutcome::Finished);
            }
        }
        Err(e) => {
            // A failed pass cannot be blamed on one sequence: every one in it ends.
            let msg = format!("{e:#}");
            for ((s, work), done) in active.iter_mut().zip(&plan).zip(finished.iter_mut()) {
                if work.is_some() {
                    let _ = s.job.tx.send(GenerationEvent::Error(msg.clone()));
                    *done = true;
                }
            }
        }
    }
    for i in (0..active.len()).rev() {
        if finished[i] {
            active.remove(i).release(c, kv.as_mut());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{plan_step, Work};

    #[test]
    fn every_decoding_sequence_gets_a_row_and_prefills_fill_the_budget() {
        // Two decoding, a 3000-token prompt, a 10-token prompt; budget 64, chunk 48.
        let plan = plan_step(&[0, 3000, 0, 10], 64, 48);
        assert_eq!(plan[0], Some(Work::Decode));
        assert_eq!(plan[2], Some(Work::Decode));
        assert_eq!(plan[1], Some(Work::Prefill { rows: 48, last: false }));
        assert_eq!(plan[3], Some(Work::Prefill { rows: 10, last: true }));
        let rows: usize = plan.iter().flatten().map(|w| w.rows()).sum();
        assert_eq!(rows, 60);
    }

    #[test]
    fn a_long_prompt_gets_what_is_left_and_later_prompts_wait() {
        let plan = plan_step(&[0, 0, 0, 500, 20], 16, 512);
        assert_eq!(plan[3], Some(Work::Prefill { rows: 13, last: false }));
        assert_eq!(plan[4], None);
        // Decode rows are never cut, even past the budget.
        let plan = plan_step(&[0, 0, 0, 7], 2, 512);
        assert_eq!(plan.iter().flatten().count(), 3);
        assert_eq!(plan[3], None);
    }
}
