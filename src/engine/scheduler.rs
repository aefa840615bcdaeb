//! The scheduler: a bounded queue in front of a bounded set of active sequences, driven by
//! one engine thread that interleaves prefill chunks and decode steps across sequences
//! (round robin, one unit of work per sequence per turn).

use super::api::*;
use super::sampler::Sampler;
use crate::backend;
use crate::gguf::GgufFile;
use crate::model::{Logits, Model};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use anyhow::Context;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc as std_mpsc, Arc};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Limits on stop sequences (bad requests are rejected before reaching the model).
const MAX_STOP_SEQUENCES: usize = 16;
const MAX_STOP_BYTES: usize = 256;

/// Handle to the engine; cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    info: ModelInfo,
    tokenizer: Tokenizer,
    model: Arc<Model>,
    cfg: EngineConfig,
    /// Effective context length (the model's, capped by the config).
    ctx_len: usize,
    submit_tx: Mutex<Option<std_mpsc::Sender<Job>>>,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
    counters: Counters,
}

#[derive(Default)]
struct Counters {
    /// Requests in the engine (waiting or active): what admission control counts.
    admitted: AtomicUsize,
    queued: AtomicUsize,
    active: AtomicUsize,
    kv_bytes: AtomicUsize,
    completed: AtomicU64,
    rejected: AtomicU64,
    cancelled: AtomicU64,
    shutting_down: AtomicBool,
}

struct Job {
    prompt: Vec<u32>,
    req: GenerationRequest,
    tx: mpsc::UnboundedSender<GenerationEvent>,
    submitted: Instant,
}

/// Events of one generation. Dropping the stream cancels the sequence within one step.
pub struct GenerationStream {
    rx: mpsc::UnboundedReceiver<GenerationEvent>,
    /// Prompt length after tokenization / templating.
    pub prompt_tokens: usize,
}

impl GenerationStream {
    pub async fn next(&mut self) -> Option<GenerationEvent> {
        self.rx.recv().await
    }

    /// For synchronous callers (CLI); must not be called from inside a tokio runtime.
    pub fn blocking_next(&mut self) -> Option<GenerationEvent> {
        self.rx.blocking_recv()
    }
}

impl Engine {
    pub fn load(cfg: EngineConfig) -> anyhow::Result<Engine> {
        let file = Arc::new(GgufFile::open(&cfg.model_path)?);
        let tokenizer = Tokenizer::from_gguf(&file).with_context(|| format!("{}: tokenizer", cfg.model_path.display()))?;
        let be = backend::create_with(&cfg.backend, cfg.threads, &cfg.gpu)?;
        crate::kernel_registry::configure(cfg.kernel_timing.enabled, cfg.kernel_timing.sample_rate);
        let model = Arc::new(Model::load(file.clone(), be)?);
        let hp = &model.hp;
        let ctx_len = if cfg.context_length > 0 { cfg.context_length.min(hp.n_ctx_train) } else { hp.n_ctx_train };
        check_kv_memory(&model, ctx_len, cfg.max_active_sequences)?;
        let info = model_info(&file, &model, &tokenizer, ctx_len);
        let (tx, rx) = std_mpsc::channel();
        let inner = Arc::new(Inner {
            info,
            tokenizer,
            model,
            cfg,
            ctx_len,
            submit_tx: Mutex::new(Some(tx)),
            worker: Mutex::new(None),
            counters: Counters::default(),
        });
        let worker_inner = inner.clone();
        let handle = std::thread::Builder::new()
            .name("civetta-engine".into())
            .spawn(move || run_worker(&worker_inner, rx))
            .context("spawning the engine thread")?;
        *inner.worker.lock() = Some(handle);
        Ok(Engine { inner })
    }

    pub fn model_info(&self) -> &ModelInfo {
        &self.inner.info
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.inner.tokenizer
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.inner.model
    }

    pub fn context_length(&self) -> usize {
        self.inner.ctx_len
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.cfg
    }

    /// Tokenizes the prompt as the engine would (template, BOS, special tokens).
    pub fn prompt_tokens(&self, prompt: &PromptInput) -> Result<Vec<u32>, SubmitError> {
        let tk = &self.inner.tokenizer;
        Ok(match prompt {
            PromptInput::Text { text, add_bos } => {
                if text.is_empty() {
                    return Err(SubmitError::Invalid("prompt is empty".into()));
                }
                tk.encode(text, *add_bos, true)
            }
            PromptInput::Tokens(ids) => ids.clone(),
            PromptInput::Chat(messages) => {
                if messages.is_empty() {
                    return Err(SubmitError::Invalid("messages are empty".into()));
                }
                let text = tk.apply_chat_template(messages, true).map_err(|e| SubmitError::Invalid(format!("chat template: {e:#}")))?;
                tk.encode(&text, false, true)
            }
        })
    }

    /// Checks a request against the model and limits without running anything.
    pub fn validate(&self, req: &GenerationRequest) -> Result<Vec<u32>, SubmitError> {
        let invalid = |m: String| Err(SubmitError::Invalid(m));
        let prompt = self.prompt_tokens(&req.prompt)?;
        let ctx = self.inner.ctx_len;
        let vocab = self.inner.info.vocab_size;
        if prompt.is_empty() {
            return invalid("prompt is empty (no tokens)".into());
        }
        if let Some(bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            return invalid(format!("token id {bad} is outside the vocabulary of {vocab}"));
        }
        if prompt.len() >= ctx {
            return invalid(format!("prompt has {} tokens; the context holds {ctx}", prompt.len()));
        }
        if req.max_tokens == 0 {
            return invalid("max_tokens must be at least 1".into());
        }
        if prompt.len() + req.max_tokens > ctx {
            return invalid(format!(
                "max_tokens {} is beyond the context: prompt {} + max_tokens > context {ctx}",
                req.max_tokens,
                prompt.len()
            ));
        }
        let s = &req.sampling;
        if !s.temperature.is_finite() || s.temperature < 0.0 {
            return invalid(format!("temperature must be a finite number >= 0, got {}", s.temperature));
        }
        if !(s.top_p > 0.0 && s.top_p <= 1.0) {
            return invalid(format!("top_p must be in (0, 1], got {}", s.top_p));
        }
        if !(s.min_p >= 0.0 && s.min_p < 1.0) {
            return invalid(format!("min_p must be in [0, 1), got {}", s.min_p));
        }
        if !s.repetition_penalty.is_finite() || s.repetition_penalty < 0.0 {
            return invalid(format!("repetition_penalty must be >= 0, got {}", s.repetition_penalty));
        }
        if req.stop.len() > MAX_STOP_SEQUENCES {
            return invalid(format!("at most {MAX_STOP_SEQUENCES} stop sequences, got {}", req.stop.len()));
        }
        for st in &req.stop {
            if st.is_empty() {
                return invalid("stop sequences must not be empty".into());
            }
            if st.len() > MAX_STOP_BYTES {
                return invalid(format!("stop sequences are limited to {MAX_STOP_BYTES} bytes"));
            }
        }
        Ok(prompt)
    }

    pub fn submit(&self, req: GenerationRequest) -> Result<GenerationStream, SubmitError> {
        let c = &self.inner.counters;
        if c.shutting_down.load(Ordering::SeqCst) {
            return Err(SubmitError::ShuttingDown);
        }
        let prompt = self.validate(&req).inspect_err(|_| {
            c.rejected.fetch_add(1, Ordering::Relaxed);
        })?;
        // Room for max_active_sequences running plus max_queue waiting; with max_queue = 0 a
        // request is admitted only while an active slot is free.
        let capacity = self.inner.cfg.max_active_sequences.max(1) + self.inner.cfg.max_queue;
        if c.admitted.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < capacity).then_some(n + 1)).is_err() {
            c.rejected.fetch_add(1, Ordering::Relaxed);
            let queued = c.queued.load(Ordering::SeqCst);
            // A rough hint: one slot frees per finished request.
            return Err(SubmitError::QueueFull { queued, retry_after_ms: 500 + 50 * queued as u64 });
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let prompt_tokens = prompt.len();
        let job = Job { prompt, req, tx, submitted: Instant::now() };
        c.queued.fetch_add(1, Ordering::SeqCst);
        let sent = self.inner.submit_tx.lock().as_ref().map(|s| s.send(job).is_ok()).unwrap_or(false);
        if !sent {
            c.queued.fetch_sub(1, Ordering::SeqCst);
            c.admitted.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::ShuttingDown);
        }
        Ok(GenerationStream { rx, prompt_tokens })
    }

    pub fn stats(&self) -> EngineStats {
        let c = &self.inner.counters;
        EngineStats {
            queued: c.queued.load(Ordering::Relaxed),
            active: c.active.load(Ordering::Relaxed),
            completed: c.completed.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            cancelled: c.cancelled.load(Ordering::Relaxed),
            kv_bytes: c.kv_bytes.load(Ordering::Relaxed),
        }
    }

    /// Stops accepting requests; queued and active sequences end with an error event.
    /// Waits for the engine thread to finish its current step.
    pub fn shutdown(&self) {
        self.inner.counters.shutting_down.store(true, Ordering::SeqCst);
        self.inner.submit_tx.lock().take();
        if let Some(h) = self.inner.worker.lock().take() {
            let _ = h.join();
        }
    }
}

fn check_kv_memory(model: &Model, ctx_len: usize, max_active: usize) -> anyhow::Result<()> {
    let need = model.cache_bytes(ctx_len) as u128 * max_active.max(1) as u128;
    if let Some(avail) = mem_available_bytes() {
        if need > avail as u128 {
            anyhow::bail!(
                "not enough memory for the KV cache: {} active sequences x {} tokens need {:.1} GiB, {:.1} GiB available (lower engine.context_length or engine.max_active_sequences)",
                max_active,
                ctx_len,
                need as f64 / (1u64 << 30) as f64,
                avail as f64 / (1u64 << 30) as f64
            );
        }
    }
    Ok(())
}

fn mem_available_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn model_info(file: &GgufFile, model: &Model, tk: &Tokenizer, ctx_len: usize) -> ModelInfo {
    let hp = &model.hp;
    let mut types = std::collections::BTreeMap::<String, usize>::new();
    for t in &file.tensors {
        *types.entry(t.ggml_type.name().to_string()).or_default() += 1;
    }
    ModelInfo {
        name: crate::gguf::served_model_name(file),
        architecture: hp.arch.name().into(),
        path: file.path.clone(),
        file_bytes: file.file_bytes(),
        file_sha256: file.sha256_hex(),
        context_length: ctx_len,
        embedding_length: hp.n_embd,
        block_count: hp.n_layer,
        head_count: hp.n_head,
        head_count_kv: hp.n_head_kv,
        vocab_size: hp.n_vocab,
        parameter_count: file.tensors.iter().map(|t| t.n_elements()).sum(),
        tensor_types: types.into_iter().collect(),
        tokenizer_model: file.get_str("tokenizer.ggml.model").unwrap_or("unknown").into(),
        has_chat_template: tk.chat_template().is_some(),
        backend: model.backend().name().into(),
        expert_count: hp.moe.as_ref().map_or(0, |m| m.n_expert),
        expert_used_count: hp.moe.as_ref().map_or(0, |m| m.n_expert_used),
    }
}

/// One active sequence.
struct Seq {
    job: Job,
    cache: crate::model::KvCache,
    /// Prompt tokens not yet prefilled.
    prefill_pos: usize,
    history: Vec<u32>,
    generated: Vec<u32>,
    sampler: Sampler,
    decoder: StreamDecoder,
    /// Decoded text not yet sent (held back while it may start a stop sequence).
    pending: String,
    activated: Instant,
    prefill_time: Duration,
    decode_time: Duration,
    first_token_at: Option<Instant>,
    /// Logits of the last forward, waiting to be sampled.
    next_logits: Option<Vec<f32>>,
    /// Whether this sequence still counts against admission (`Counters::admitted`).
    admitted: bool,
}

enum StepOutcome {
    Continue,
    Finished,
}

fn run_worker(inner: &Inner, rx: std_mpsc::Receiver<Job>) {
    let c = &inner.counters;
    let mut queue: VecDeque<Job> = VecDeque::new();
    let mut active: Vec<Seq> = Vec::new();
    let mut disconnected = false;
    loop {
        if active.is_empty() && queue.is_empty() {
            if disconnected {
                break;
            }
            match rx.recv() {
                Ok(j) => queue.push_back(j),
                Err(_) => break,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(j) => queue.push_back(j),
                Err(std_mpsc::TryRecvError::Empty) => break,
                Err(std_mpsc::TryRecvError::Disconnected) => {
                    disconnected = true;
                    break;
                }
            }
        }
        if c.shutting_down.load(Ordering::SeqCst) {
            for j in queue.drain(..) {
                c.queued.fetch_sub(1, Ordering::SeqCst);
                c.admitted.fetch_sub(1, Ordering::SeqCst);
                let _ = j.tx.send(GenerationEvent::Error("engine is shutting down".into()));
            }
            for mut s in active.drain(..) {
                let _ = s.job.tx.send(GenerationEvent::Error("engine is shutting down".into()));
                release(c, &mut s);
            }
            if disconnected {
                break;
            }
            continue;
        }
        while active.len() < inner.cfg.max_active_sequences.max(1) {
            let Some(job) = queue.pop_front() else { break };
            c.queued.fetch_sub(1, Ordering::SeqCst);
            if job.tx.is_closed() {
                c.cancelled.fetch_add(1, Ordering::Relaxed);
                c.admitted.fetch_sub(1, Ordering::SeqCst);
                continue;
            }
            match activate(inner, job) {
                Ok(seq) => {
                    c.active.fetch_add(1, Ordering::SeqCst);
                    c.kv_bytes.fetch_add(seq.cache.bytes, Ordering::SeqCst);
                    active.push(seq);
                }
                Err((job, e)) => {
                    c.admitted.fetch_sub(1, Ordering::SeqCst);
                    let _ = job.tx.send(GenerationEvent::Error(format!("{e:#}")));
                }
            }
        }
        let mut i = 0;
        while i < active.len() {
            let outcome = if active[i].job.tx.is_closed() {
                c.cancelled.fetch_add(1, Ordering::Relaxed);
                StepOutcome::Finished
            } else {
                match step(inner, &mut active[i]) {
                    Ok(o) => o,
                    Err(e) => {
                        let _ = active[i].job.tx.send(GenerationEvent::Error(format!("{e:#}")));
                        StepOutcome::Finished
                    }
                }
            };
            match outcome {
                StepOutcome::Continue => i += 1,
                StepOutcome::Finished => {
                    let mut s = active.swap_remove(i);
                    release(c, &mut s);
                }
            }
        }
    }
}

fn release(c: &Counters, s: &mut Seq) {
    c.active.fetch_sub(1, Ordering::SeqCst);
    release_admission(c, s);
    c.kv_bytes.fetch_sub(s.cache.bytes, Ordering::SeqCst);
}

/// Gives the sequence's admission slot back (once).
fn release_admission(c: &Counters, s: &mut Seq) {
    if std::mem::take(&mut s.admitted) {
        c.admitted.fetch_sub(1, Ordering::SeqCst);
    }
}

// The job comes back on failure so its stream can receive the error.
#[allow(clippy::result_large_err)]
fn activate(inner: &Inner, job: Job) -> Result<Seq, (Job, anyhow::Error)> {
    let capacity = (job.prompt.len() + job.req.max_tokens).min(inner.ctx_len);
    let cache = match inner.model.new_cache(capacity) {
        Ok(c) => c,
        Err(e) => return Err((job, e)),
    };
    let sampler = Sampler::new(job.req.sampling.clone());
    Ok(Seq {
        history: job.prompt.clone(),
        job,
        cache,
        prefill_pos: 0,
        generated: Vec::new(),
        sampler,
        decoder: StreamDecoder::new(),
        pending: String::new(),
        activated: Instant::now(),
        prefill_time: Duration::ZERO,
        decode_time: Duration::ZERO,
        first_token_at: None,
        next_logits: None,
        admitted: true,
    })
}

/// One unit of work: a prefill chunk, or one decode step (forward of the last token + sample).
fn step(inner: &Inner, s: &mut Seq) -> anyhow::Result<StepOutcome> {
    let model = &inner.model;
    if s.prefill_pos < s.job.prompt.len() {
        let t0 = Instant::now();
        let end = (s.prefill_pos + inner.cfg.prefill_batch.max(1)).min(s.job.prompt.len());
        let last = end == s.job.prompt.len();
        let which = if last { Logits::Last } else { Logits::None };
        let logits = model.forward(&mut s.cache, &s.job.prompt[s.prefill_pos..end], which)?;
        s.prefill_pos = end;
        s.prefill_time += t0.elapsed();
        if !last {
            return Ok(StepOutcome::Continue);
        }
        s.next_logits = Some(logits);
    } else {
        let t0 = Instant::now();
        let last = *s.history.last().expect("history holds the prompt");
        s.next_logits = Some(model.forward(&mut s.cache, &[last], Logits::Last)?);
        s.decode_time += t0.elapsed();
    }
    let mut logits = s.next_logits.take().expect("logits were just computed");
    let sampled = s.sampler.sample(&mut logits, &s.history);
    emit_token(inner, s, sampled.token, sampled.logprob)
}

/// Sends a sampled token (or finishes on EOS / stop / length / context).
fn emit_token(inner: &Inner, s: &mut Seq, token: u32, logprob: f32) -> anyhow::Result<StepOutcome> {
    let tk = &inner.tokenizer;
    if s.first_token_at.is_none() {
        s.first_token_at = Some(Instant::now());
    }
    if !s.job.req.ignore_eos && tk.is_eog(token) {
        return Ok(finish(inner, s, FinishReason::Eos));
    }
    s.history.push(token);
    s.generated.push(token);
    let piece = s.decoder.push(tk.token_bytes(token));
    s.pending.push_str(&piece);

    // A complete stop sequence ends the generation; its text is not sent.
    if let Some(cut) = s.job.req.stop.iter().filter_map(|st| s.pending.find(st.as_str())).min() {
        let text = s.pending[..cut].to_string();
        s.pending.clear();
        let _ = s.job.tx.send(GenerationEvent::Token { id: token, text, logprob });
        return Ok(finish(inner, s, FinishReason::Stop));
    }
    let length_done = s.generated.len() >= s.job.req.max_tokens;
    let context_done = s.cache.len + 1 > s.cache.capacity;
    if length_done || context_done {
        s.pending.push_str(&s.decoder.finish());
        let text = std::mem::take(&mut s.pending);
        let _ = s.job.tx.send(GenerationEvent::Token { id: token, text, logprob });
        let reason = if length_done { FinishReason::Length } else { FinishReason::Context };
        return Ok(finish(inner, s, reason));
    }
    let hold = stop_prefix_holdback(&s.pending, &s.job.req.stop);
    let text: String = s.pending[..s.pending.len() - hold].to_string();
    s.pending.drain(..s.pending.len() - hold);
    if s.job.tx.send(GenerationEvent::Token { id: token, text, logprob }).is_err() {
        inner.counters.cancelled.fetch_add(1, Ordering::Relaxed);
        return Ok(StepOutcome::Finished);
    }
    Ok(StepOutcome::Continue)
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

fn finish(inner: &Inner, s: &mut Seq, reason: FinishReason) -> StepOutcome {
    s.pending.push_str(&s.decoder.finish());
    let now = Instant::now();
    let timings = Timings {
        queue: s.activated.duration_since(s.job.submitted),
        prefill: s.prefill_time,
        decode: s.decode_time,
        time_to_first_token: s.first_token_at.unwrap_or(now).duration_since(s.job.submitted),
        total: now.duration_since(s.job.submitted),
    };
    let summary = GenerationSummary {
        prompt_tokens: s.job.prompt.len(),
        completion_tokens: s.generated.len(),
        finish_reason: reason,
        token_ids: s.generated.clone(),
        timings,
        text_tail: std::mem::take(&mut s.pending),
    };
    // A client that sends its next request as soon as it sees Done must find the slot free.
    release_admission(&inner.counters, s);
    let _ = s.job.tx.send(GenerationEvent::Done(summary));
    inner.counters.completed.fetch_add(1, Ordering::Relaxed);
    StepOutcome::Finished
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
