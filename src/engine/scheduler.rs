//! The scheduler: one engine thread, a FIFO queue in front of a bounded set of active
//! sequences, and continuous batching. Each step builds one batch under a token budget
//! (`engine.max_batch_tokens`): one decode row from every sequence past its prompt, then
//! prefill chunks of the waiting prompts (oldest first, at most `engine.prefill_batch` tokens
//! each) in what is left of the budget; the whole batch is one forward pass
//! (`Model::forward_batch_with`, in the engine's one `model::Workspace` of activation
//! buffers), then every sequence that produced logits samples its next token.
//! A long prompt is cut into chunks, so it never stalls the streams that are decoding.
//!
//! With the paged KV pool (CPU), admission takes only a prompt's blocks; sequences grow block
//! by block as they decode, and when the pool runs out the youngest running sequence is
//! preempted (blocks freed, resumed later by recomputing its history: `Worker::make_room`).

use super::kv::{Allocation, BlockManager};
use super::sequence::{Draw, Seq, StepOutcome};
use super::step_cost::{StepCost, StepShape};
use super::types::*;
use super::{Counters, Inner, Job};
use crate::backend::Backend;
use crate::model::{Logits, Model, SeqRows, Workspace};
use rayon::prelude::*;
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

/// What the planner needs to know of one active sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SeqState {
    /// Tokens still to prefill (0: decoding).
    pub prefill_left: usize,
    /// Tokens this prefill computes in all (prompt, or history on resume, less the cached
    /// prefix): more than one chunk makes it a long prefill.
    pub prefill_rows: usize,
    /// Positions already in its KV cache (where its next row goes).
    pub kv_len: usize,
}

impl SeqState {
    fn is_long(&self, chunk: usize) -> bool {
        self.prefill_rows > chunk
    }
}

/// The limits one step is planned under (from the engine config).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct StepLimits {
    /// Rows of one step (`engine.max_batch_tokens`).
    pub budget: usize,
    /// The largest chunk of one sequence's prefill per step (`engine.prefill_batch`).
    pub chunk: usize,
    /// While sequences decode, a step with a long prefill's chunk may cost at most this many
    /// times their decode rows alone (predicted); 0 = no limit (`engine.max_decode_slowdown`).
    pub max_decode_slowdown: f64,
    /// Rows the oldest long prefill gets in every step even past that limit, so it always
    /// progresses (`engine.min_prefill_chunk`).
    pub min_prefill_chunk: usize,
}

impl StepLimits {
    pub(super) fn of(cfg: &EngineConfig) -> StepLimits {
        StepLimits {
            budget: cfg.max_batch_tokens.max(1),
            chunk: cfg.prefill_batch.max(1),
            // Resolved per backend when the engine loads; unset here only in a bare config.
            max_decode_slowdown: cfg.max_decode_slowdown.unwrap_or(0.0),
            min_prefill_chunk: cfg.min_prefill_chunk.max(1),
        }
    }
}

/// Plans one step. Every decoding sequence gets its row (never cut by the budget: there are
/// at most max_active_sequences of them; when they use it all, prefills wait a step). Then:
/// 1. short prefills (at most one chunk in all: interactive prompts), oldest first, in the
///    rest of the budget, keeping `min_prefill_chunk` rows back for the oldest long prefill;
/// 2. long prefills, oldest first, each at most a chunk: while sequences decode and
///    `max_decode_slowdown` is set, a chunk is cut so that the prefill rows' predicted cost
///    stays within (slowdown - 1) x the measured decode-only step, i.e. the step within the
///    slowdown x a decode-only one (the oldest long prefill always gets at least
///    `min_prefill_chunk` rows); with nothing decoding they fill the budget.
///
/// Short prompts go first because they end in one step (their first token is the wait they
/// cause), while a long prompt's chunks would otherwise add to every decode gap for many steps.
pub(super) fn plan_step(seqs: &[SeqState], limits: &StepLimits, cost: &StepCost) -> Vec<Option<Work>> {
    let chunk = limits.chunk.max(1);
    let mut plan: Vec<Option<Work>> = seqs.iter().map(|s| (s.prefill_left == 0).then_some(Work::Decode)).collect();
    let decode = seqs.iter().filter(|s| s.prefill_left == 0).fold(StepShape::default(), |acc, s| acc.plus(StepShape::chunk(s.kv_len, 1)));
    let mut room = limits.budget.saturating_sub(decode.rows);
    let has_long = seqs.iter().any(|s| s.prefill_left > 0 && s.is_long(chunk));
    let reserve = if has_long { limits.min_prefill_chunk.max(1).min(room) } else { 0 };
    // The rows planned beyond the decode rows.
    let mut prefill = StepShape::default();

    for (slot, s) in plan.iter_mut().zip(seqs) {
        if s.prefill_left == 0 || s.is_long(chunk) {
            continue;
        }
        let rows = s.prefill_left.min(chunk).min(room - reserve);
        if rows == 0 {
            break;
        }
        room -= rows;
        prefill = prefill.plus(StepShape::chunk(s.kv_len, rows));
        *slot = Some(Work::Prefill { rows, last: rows == s.prefill_left });
    }

    // What the prefill rows may cost: (slowdown - 1) x the decode rows' step. The decode step
    // is measured (decode-only steps), the prefill rows' cost predicted by the fitted model;
    // short prompts already planned count against it.
    let allowance = (decode.rows > 0 && limits.max_decode_slowdown > 0.0)
        .then(|| (limits.max_decode_slowdown - 1.0).max(0.0) * cost.decode_step(decode));
    let mut first_long = true;
    for (slot, s) in plan.iter_mut().zip(seqs) {
        if s.prefill_left == 0 || !s.is_long(chunk) {
            continue;
        }
        let most = s.prefill_left.min(chunk).min(room);
        let least = if first_long { limits.min_prefill_chunk.max(1).min(most) } else { 0 };
        first_long = false;
        let rows = match allowance {
            None => most,
            // The largest chunk whose rows stay within the allowance (cost grows with rows).
            Some(allowance) => (least + 1..=most)
                .take_while(|&r| cost.predict(prefill.plus(StepShape::chunk(s.kv_len, r))) <= allowance)
                .last()
                .unwrap_or(least),
        };
        if rows == 0 {
            continue;
        }
        room -= rows;
        prefill = prefill.plus(StepShape::chunk(s.kv_len, rows));
        *slot = Some(Work::Prefill { rows, last: rows == s.prefill_left });
    }
    plan
}

/// Publishes the paged pool's block counts (and the bytes in use) for `Engine::stats`.
fn publish_kv<B: Backend>(c: &Counters, kv: &Option<BlockManager<B>>) {
    if let Some(kv) = kv {
        let n = kv.counts();
        c.kv_blocks_used.store(n.used, Ordering::Relaxed);
        c.kv_blocks_cached.store(n.cached, Ordering::Relaxed);
        c.kv_bytes.store(kv.bytes_in_use(), Ordering::Relaxed);
    }
}

/// The engine thread's state between steps.
struct Worker<'a, B: Backend> {
    inner: &'a Inner,
    model: &'a Model<B>,
    kv: Option<BlockManager<B>>,
    /// Running sequences, oldest (smallest `arrival`) first.
    active: Vec<Seq<B>>,
    /// Preempted sequences waiting to resume, oldest first; they go before every queued
    /// request (the front of the queue).
    preempted: VecDeque<Seq<B>>,
    next_arrival: u64,
    /// Learned step cost, for cutting long prefills while sequences decode.
    cost: StepCost,
    /// The forward pass's activation buffers, sized for the largest step (allocated once).
    workspace: Workspace<B>,
}

/// What admission took for this step: a queued request with its blocks, or a preempted
/// sequence with its new blocks.
enum Admitted<B: Backend> {
    New(Job, Option<Allocation<B>>),
    Resume(Box<Seq<B>>, Allocation<B>),
}

pub(super) fn run_worker<B: Backend>(inner: &Inner, model: &Model<B>, kv: Option<BlockManager<B>>, workspace: Workspace<B>) {
    let hp = &model.hp;
    let kv_per_row = StepCost::kv_per_row_of_shape(inner.info.parameter_count, hp.n_layer, hp.n_head, hp.head_dim);
    let mut w = Worker {
        inner,
        model,
        kv,
        active: Vec::new(),
        preempted: VecDeque::new(),
        next_arrival: 0,
        cost: StepCost::new(kv_per_row),
        workspace,
    };
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
            step(inner, model, &mut w.active, &mut w.kv, &mut w.cost, &mut w.workspace);
        }
        publish_kv(c, &w.kv);
    }
}

impl<B: Backend> Worker<'_, B> {
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
    fn admit(&mut self, queue: &mut VecDeque<Job>) -> Vec<Admitted<B>> {
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
    fn activate(&mut self, a: Admitted<B>) {
        let c = &self.inner.counters;
        match a {
            Admitted::New(job, blocks) => match Seq::activate(self.inner, self.model, job, blocks, self.next_arrival) {
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

/// Logits (rows x vocabulary) below which a step's sequences draw one after another: a
/// handful of small rows is quicker than waking the thread pool.
const PARALLEL_DRAW_MIN_LOGITS: usize = 1 << 16;

/// Draws the next token of each `(index in active, sequence, its logits)`; in parallel when
/// there is enough to do (a draw is ~0.15 ms per 150k-logit row, most of it the
/// log-softmax). Each draw reads only its own sequence and logits, so the tokens do not
/// depend on how the draws were spread over threads. Returns (index, draw) in the order given.
fn draw_all<B: Backend>(pairs: Vec<(usize, &mut Seq<B>, &mut [f32])>) -> Vec<(usize, Draw)> {
    let work: usize = pairs.iter().map(|(_, _, l)| l.len()).sum();
    if pairs.len() > 1 && work >= PARALLEL_DRAW_MIN_LOGITS {
        pairs.into_par_iter().map(|(i, s, l)| (i, s.draw(l))).collect()
    } else {
        pairs.into_iter().map(|(i, s, l)| (i, s.draw(l))).collect()
    }
}

/// One engine step: plan the batch, one forward pass, sample for every sequence whose rows
/// end in a token to predict; finished sequences leave `active` (order kept: oldest first).
fn step<B: Backend>(
    inner: &Inner,
    model: &Model<B>,
    active: &mut Vec<Seq<B>>,
    kv: &mut Option<BlockManager<B>>,
    cost: &mut StepCost,
    ws: &mut Workspace<B>,
) {
    let c = &inner.counters;
    let states: Vec<SeqState> = active.iter().map(Seq::plan_state).collect();
    let plan = plan_step(&states, &StepLimits::of(&inner.cfg), cost);
    let rows: usize = plan.iter().flatten().map(|w| w.rows()).sum();
    let seqs = plan.iter().flatten().count();
    c.observe_batch(rows, seqs);
    let shape = states
        .iter()
        .zip(&plan)
        .filter_map(|(s, w)| w.map(|w| StepShape::chunk(s.kv_len, w.rows())))
        .fold(StepShape::default(), StepShape::plus);

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
        model.forward_batch_into(kv.as_mut().map(BlockManager::pool_mut), ws, &mut batch)
    };
    let elapsed = t0.elapsed();
    if result.is_ok() {
        let predicted = cost.predict(shape);
        let decode_only = plan.iter().flatten().all(|w| matches!(w, Work::Decode));
        cost.observe(shape, decode_only, elapsed.as_secs_f64());
        tracing::trace!(
            rows = shape.rows,
            attended = shape.attended,
            predicted_ms = predicted * 1e3,
            measured_ms = elapsed.as_secs_f64() * 1e3,
            ?plan,
            ?states,
            "step"
        );
    }

    let mut finished = vec![false; active.len()];
    match result {
        Ok(logits) => {
            let mut logits = logits.into_iter();
            // (index in `active`, the sequence, its logits) of every sequence that samples.
            let mut to_sample = Vec::with_capacity(seqs);
            for (i, (s, work)) in active.iter_mut().zip(&plan).enumerate() {
                let Some(work) = *work else { continue };
                let row_logits = logits.next().expect("one logits vector per sequence in the batch");
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
                to_sample.push((i, s, row_logits));
            }
            for (i, draw) in draw_all(to_sample) {
                finished[i] = matches!(active[i].emit(inner, draw), StepOutcome::Finished);
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
    use super::{plan_step, SeqState, StepCost, StepLimits, Work};

    fn decoding(kv_len: usize) -> SeqState {
        SeqState { prefill_left: 0, prefill_rows: 0, kv_len }
    }

    fn prompt(len: usize, done: usize) -> SeqState {
        SeqState { prefill_left: len - done, prefill_rows: len, kv_len: done }
    }

    fn limits(budget: usize, chunk: usize, slowdown: f64, min: usize) -> StepLimits {
        StepLimits { budget, chunk, max_decode_slowdown: slowdown, min_prefill_chunk: min }
    }

    fn rows(plan: &[Option<Work>]) -> usize {
        plan.iter().flatten().map(|w| w.rows()).sum()
    }

    /// Cost per row only: a step of r rows costs r ms.
    fn per_row() -> StepCost {
        StepCost::fixed(1e-3, 0.0)
    }

    #[test]
    fn every_decoding_sequence_gets_a_row_and_prefills_fill_the_budget() {
        // Two decoding, a 3000-token prompt, a 10-token prompt; budget 64, chunk 48, no limit.
        let plan = plan_step(&[decoding(5), prompt(3000, 0), decoding(9), prompt(10, 0)], &limits(64, 48, 0.0, 1), &per_row());
        assert_eq!(plan[0], Some(Work::Decode));
        assert_eq!(plan[2], Some(Work::Decode));
        // The short prompt goes first, the long one gets what is left.
        assert_eq!(plan[3], Some(Work::Prefill { rows: 10, last: true }));
        assert_eq!(plan[1], Some(Work::Prefill { rows: 48, last: false }));
        assert_eq!(rows(&plan), 60);
    }

    #[test]
    fn a_long_prompt_gets_what_is_left_and_later_prompts_wait() {
        let plan =
            plan_step(&[decoding(1), decoding(1), decoding(1), prompt(600, 0), prompt(700, 0)], &limits(16, 512, 0.0, 1), &per_row());
        assert_eq!(plan[3], Some(Work::Prefill { rows: 13, last: false }));
        assert_eq!(plan[4], None);
        // Decode rows are never cut, even past the budget; the long prompt's minimum chunk
        // only comes out of the budget's room.
        let plan = plan_step(&[decoding(1), decoding(1), decoding(1), prompt(7, 0)], &limits(2, 512, 0.0, 1), &per_row());
        assert_eq!(plan.iter().flatten().count(), 3);
        assert_eq!(plan[3], None);
    }

    #[test]
    fn while_streams_decode_a_long_chunk_keeps_the_step_within_the_slowdown() {
        // 4 decoding rows cost 4 ms; slowdown 2 leaves 4 ms: 4 rows of the long prompt.
        let seqs = [decoding(40), decoding(41), decoding(42), decoding(43), prompt(3000, 0)];
        let plan = plan_step(&seqs, &limits(64, 64, 2.0, 1), &per_row());
        assert_eq!(plan[4], Some(Work::Prefill { rows: 4, last: false }));
        // Slowdown 3: 8 rows.
        let plan = plan_step(&seqs, &limits(64, 64, 3.0, 1), &per_row());
        assert_eq!(plan[4], Some(Work::Prefill { rows: 8, last: false }));
        // Off: the whole chunk.
        let plan = plan_step(&seqs, &limits(64, 64, 0.0, 1), &per_row());
        assert_eq!(plan[4], Some(Work::Prefill { rows: 60, last: false }));
    }

    #[test]
    fn the_chunk_shrinks_as_the_long_prompt_attends_to_more_positions() {
        // 1 ms per row, 1 µs per attended position.
        let cost = StepCost::fixed(1e-3, 1e-6);
        let seqs_at = |done| [decoding(10), decoding(10), decoding(10), decoding(10), prompt(3000, done)];
        let l = limits(64, 64, 2.0, 1);
        // Decode alone: 4 + 0.044 ms; the limit leaves ~4 ms.
        let early = plan_step(&seqs_at(0), &l, &cost)[4].unwrap().rows();
        // At position 2000 each row also attends to 2000 positions (2 ms).
        let late = plan_step(&seqs_at(2000), &l, &cost)[4].unwrap().rows();
        assert_eq!(early, 4);
        assert_eq!(late, 1);
        // Every chosen plan is within the limit, and one more row would not be.
        for done in [0, 500, 1000, 2000, 2900] {
            let seqs = seqs_at(done);
            let r = plan_step(&seqs, &l, &cost)[4].unwrap().rows();
            let decode = (0..4).fold(super::StepShape::default(), |s, _| s.plus(super::StepShape::chunk(10, 1)));
            let with = |r| cost.predict(decode.plus(super::StepShape::chunk(done, r)));
            assert!(with(r) <= 2.0 * cost.predict(decode) || r == 1, "done {done}: {r} rows");
            assert!(with(r + 1) > 2.0 * cost.predict(decode), "done {done}: {r} rows is not the most");
        }
    }

    #[test]
    fn the_minimum_chunk_keeps_a_long_prompt_moving() {
        // One decoding row costs 1 ms; a row of the long prompt at position 2500 costs 3.5 ms:
        // nothing fits under slowdown 2, the minimum chunk goes anyway.
        let cost = StepCost::fixed(1e-3, 1e-6);
        let seqs = [decoding(10), prompt(3000, 2500)];
        assert_eq!(plan_step(&seqs, &limits(64, 64, 2.0, 1), &cost)[1], Some(Work::Prefill { rows: 1, last: false }));
        assert_eq!(plan_step(&seqs, &limits(64, 64, 2.0, 8), &cost)[1], Some(Work::Prefill { rows: 8, last: false }));
        // Only the oldest long prompt gets the minimum; a second one waits.
        let seqs = [decoding(10), prompt(3000, 2500), prompt(2000, 1500)];
        let plan = plan_step(&seqs, &limits(64, 64, 2.0, 1), &cost);
        assert_eq!(plan[1], Some(Work::Prefill { rows: 1, last: false }));
        assert_eq!(plan[2], None);
    }

    #[test]
    fn short_prompts_are_not_cut_and_go_before_an_older_long_one() {
        // 4 decoding; an older 3000-token prompt, then 16-token prompts arriving behind it.
        let seqs = [decoding(1), decoding(1), decoding(1), decoding(1), prompt(3000, 640), prompt(16, 0), prompt(16, 0)];
        let plan = plan_step(&seqs, &limits(64, 64, 2.0, 1), &per_row());
        assert_eq!(plan[5], Some(Work::Prefill { rows: 16, last: true }));
        assert_eq!(plan[6], Some(Work::Prefill { rows: 16, last: true }));
        // The short ones already cost past the limit: the long prompt gets its minimum.
        assert_eq!(plan[4], Some(Work::Prefill { rows: 1, last: false }));
        // With no room left for short prompts, the long prompt's minimum is kept back for it.
        let seqs = [decoding(1), decoding(1), decoding(1), prompt(3000, 0), prompt(16, 0), prompt(16, 0)];
        let plan = plan_step(&seqs, &limits(20, 64, 2.0, 1), &per_row());
        assert_eq!(plan[4], Some(Work::Prefill { rows: 16, last: true }));
        assert_eq!(plan[5], None, "the second short prompt waits: no overtaking within the short ones' room");
        assert_eq!(plan[3], Some(Work::Prefill { rows: 1, last: false }));
        assert_eq!(rows(&plan), 20);
    }

    #[test]
    fn with_nothing_decoding_a_long_prompt_takes_the_full_budget() {
        let plan = plan_step(&[prompt(3000, 0)], &limits(64, 64, 2.0, 1), &per_row());
        assert_eq!(plan[0], Some(Work::Prefill { rows: 64, last: false }));
        // Its last chunk is still long work (the prompt was long): cut while others decode.
        let plan = plan_step(&[decoding(3), prompt(3000, 2990)], &limits(64, 64, 2.0, 1), &per_row());
        assert_eq!(plan[1], Some(Work::Prefill { rows: 1, last: false }));
    }
}
