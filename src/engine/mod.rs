//! The engine: owns the model and runs sequences (queue, bounded active set, KV caches,
//! continuous batching, sampling).
//!
//! Public API used by the gRPC server, `civetta generate` and `civetta bench`:
//! [`Engine::load`], [`Engine::submit`] -> [`GenerationStream`] of [`GenerationEvent`]s.
//! Dropping a stream cancels its sequence within one step (or at once while it is queued).
//!
//! Files: `types` (request/response types), `validate` (what is refused before the model),
//! `scheduler` (the engine thread: admission, batch building), `sequence` (one sequence:
//! token emission, stop sequences), `kv` (the paged KV cache's blocks and prefix cache),
//! `sampler`.

pub mod kv;
mod log_sum_exp;
mod prompt_limit;
pub mod sampler;
mod scheduler;
mod sequence;
mod step_cost;
mod types;
mod validate;

pub use types::*;
pub use validate::{InvalidRequest, ValidRequest};

use crate::backend::{self, Backend};
use crate::gguf::GgufFile;
use crate::model::{moe::ExpertLoad, Model, Workspace, WorkspaceShape};
use crate::tokenizer::Tokenizer;
use anyhow::Context;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// Handle to the engine; cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    info: ModelInfo,
    tokenizer: Tokenizer,
    /// The model's backend, for stats and benchmark fingerprints (the model itself, generic
    /// over its backend, belongs to the engine thread).
    backend_name: &'static str,
    backend_fingerprint: serde_json::Value,
    /// Expert selection counts of an MoE model (shared with the model).
    expert_load: Option<Arc<ExpertLoad>>,
    cfg: EngineConfig,
    /// Effective context length (the model's, capped by the config).
    ctx_len: usize,
    /// Blocks of the paged KV pool (0: the backend has none; each sequence gets its own
    /// contiguous cache). A request needing more can never run and is refused at submit.
    kv_total_blocks: usize,
    /// Requests admitted but not yet active, oldest first. Shared with `submit` so that a
    /// request whose client went away frees its admission slot at once.
    queue: Mutex<VecDeque<Job>>,
    /// Wakes the idle engine thread (a new request, shutdown).
    wake: Condvar,
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
    /// Rows and sequences per step (the batch histograms of `EngineStats`).
    batches: Mutex<(StepHistogram, StepHistogram)>,
    /// Paged KV blocks by state, published by the engine thread after each change.
    kv_blocks_used: AtomicUsize,
    kv_blocks_cached: AtomicUsize,
    prefix_hit_tokens: AtomicU64,
    prefix_miss_tokens: AtomicU64,
    preemptions: AtomicU64,
}

impl Counters {
    fn observe_batch(&self, rows: usize, sequences: usize) {
        let mut b = self.batches.lock();
        b.0.observe(rows);
        b.1.observe(sequences);
    }
}

struct Job {
    req: ValidRequest,
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
    /// Loads the model on the backend `cfg.backend` names: the one place the backend is
    /// chosen at run time; from here on the model and the engine thread are monomorphised
    /// for it.
    pub fn load(cfg: EngineConfig) -> anyhow::Result<Engine> {
        let be = backend::create_with(&cfg.backend, cfg.threads, cfg.cpu_repack, &cfg.gpu)?;
        crate::with_backend!(be, be => Engine::load_on(cfg, be))
    }

    /// [`Engine::load`] on a backend made by the caller (`cfg.backend`, `threads` and `gpu`
    /// are not used): tests wrap a backend to watch what the engine asks of it.
    pub fn load_on<B: Backend>(mut cfg: EngineConfig, be: Arc<B>) -> anyhow::Result<Engine> {
        let file = Arc::new(GgufFile::open_with(&cfg.model_path, cfg.weights_memory)?);
        let tokenizer = Tokenizer::from_gguf(&file).with_context(|| format!("{}: tokenizer", cfg.model_path.display()))?;
        crate::kernel_registry::configure(cfg.kernel_timing.enabled, cfg.kernel_timing.sample_rate_for(be.name()));
        let model = Arc::new(Model::load(file.clone(), be)?);
        // Per-backend defaults (types.rs says why they differ).
        let backend_name = model.backend().name();
        if cfg.max_batch_tokens == 0 {
            cfg.max_batch_tokens = default_max_batch_tokens(backend_name);
        }
        if cfg.prefill_batch == 0 {
            cfg.prefill_batch = default_prefill_batch(backend_name);
        }
        cfg.max_decode_slowdown.get_or_insert_with(|| default_max_decode_slowdown(backend_name));
        // Debug, not info: `serve` prints nothing but errors before its `listening` line.
        tracing::debug!(
            backend = backend_name,
            max_batch_tokens = cfg.max_batch_tokens,
            prefill_batch = cfg.prefill_batch,
            max_decode_slowdown = cfg.max_decode_slowdown,
            "engine step limits"
        );
        let hp = &model.hp;
        let ctx_len = if cfg.context_length > 0 { cfg.context_length.min(hp.n_ctx_train) } else { hp.n_ctx_train };
        let ws_shape = step_workspace_shape(&cfg);
        let ws_bytes = Workspace::<B>::bytes_for(hp, ws_shape);
        let kv_pool = if model.backend().paged_kv() {
            let (bs, max_active) = (kv::KV_BLOCK_TOKENS, cfg.max_active_sequences.max(1));
            // Sliding-window layers keep one ring of a window + a prefill chunk per active
            // sequence (a sequence's rows per step are at most prefill_batch); the rest of
            // the budget goes to the full-attention layers' blocks.
            let ring_blocks = model.local_ring_blocks(cfg.prefill_batch, bs).unwrap_or(0);
            let (block_bytes, ring_bytes) = model.windowed_kv_bytes(bs, ring_blocks);
            let rings_bytes = (ring_bytes * max_active) as u64;
            // 0 (or every layer windowed, so the blocks hold no storage): max_active contexts.
            let n_blocks = if cfg.kv_cache_bytes == 0 || block_bytes == 0 {
                ctx_len * max_active / bs
            } else {
                (cfg.kv_cache_bytes.saturating_sub(rings_bytes) / block_bytes as u64) as usize
            };
            if n_blocks == 0 {
                anyhow::bail!(
                    "engine.kv_cache_bytes = {} holds no KV block ({block_bytes} bytes each, after {rings_bytes} bytes of sliding-window rings)",
                    cfg.kv_cache_bytes
                );
            }
            check_memory(n_blocks as u128 * block_bytes as u128 + rings_bytes as u128 + ws_bytes as u128, || {
                format!("{n_blocks} blocks of {bs} tokens (engine.kv_cache_bytes) and {ws_bytes} bytes of activations")
            })?;
            if ring_blocks > 0 {
                tracing::info!(
                    rings = max_active,
                    ring_positions = ring_blocks * bs,
                    full_attention_blocks = n_blocks,
                    "KV pool: sliding-window layers keep one ring per active sequence (no prefix cache)"
                );
            }
            Some(model.new_windowed_kv_pool(n_blocks, bs, if ring_blocks > 0 { max_active } else { 0 }, ring_blocks)?)
        } else {
            check_kv_memory(&model, ctx_len, cfg.max_active_sequences, ws_bytes)?;
            None
        };
        // The activation buffers of the largest step, allocated once (model::Workspace).
        let workspace = model.new_workspace(ws_shape).context("allocating the forward pass's activation buffers")?;
        tracing::debug!(
            rows = ws_shape.rows,
            logit_rows = ws_shape.logit_rows,
            bytes = ws_bytes,
            "activation buffers allocated for the largest step"
        );
        let kv_total_blocks = kv_pool.as_ref().map_or(0, |p| p.n_blocks);
        let info = model_info(&file, &model, &tokenizer, ctx_len);
        let inner = Arc::new(Inner {
            info,
            tokenizer,
            backend_name: model.backend().name(),
            backend_fingerprint: model.backend().fingerprint(),
            expert_load: model.expert_load().cloned(),
            cfg,
            ctx_len,
            kv_total_blocks,
            queue: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            worker: Mutex::new(None),
            counters: Counters::default(),
        });
        let worker_inner = inner.clone();
        let handle = std::thread::Builder::new()
            .name("civetta-engine".into())
            .spawn(move || scheduler::run_worker(&worker_inner, &model, kv_pool.map(kv::BlockManager::new), workspace))
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

    /// "cpu", "hip", "cuda".
    pub fn backend_name(&self) -> &'static str {
        self.inner.backend_name
    }

    /// What a benchmark fingerprint records about the backend (`Backend::fingerprint`).
    pub fn backend_fingerprint(&self) -> &serde_json::Value {
        &self.inner.backend_fingerprint
    }

    /// How often each expert was selected so far (MoE models).
    pub fn expert_load(&self) -> Option<&Arc<ExpertLoad>> {
        self.inner.expert_load.as_ref()
    }

    pub fn context_length(&self) -> usize {
        self.inner.ctx_len
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.cfg
    }

    pub fn submit(&self, req: GenerationRequest) -> Result<GenerationStream, SubmitError> {
        let c = &self.inner.counters;
        if c.shutting_down.load(Ordering::SeqCst) {
            return Err(SubmitError::ShuttingDown);
        }
        let req = self.validate(req).inspect_err(|_| {
            c.rejected.fetch_add(1, Ordering::Relaxed);
        })?;
        // Room for max_active_sequences running plus max_queue waiting; with max_queue = 0 a
        // request is admitted only while an active slot is free.
        let capacity = self.inner.cfg.max_active_sequences.max(1) + self.inner.cfg.max_queue;
        let admit = || c.admitted.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < capacity).then_some(n + 1)).is_ok();
        // When full, queued requests whose clients went away give their slots back first.
        let admitted = admit() || {
            scheduler::purge_cancelled(&self.inner, &mut self.inner.queue.lock());
            admit()
        };
        if !admitted {
            c.rejected.fetch_add(1, Ordering::Relaxed);
            let queued = c.queued.load(Ordering::SeqCst);
            // A rough hint: one slot frees per finished request.
            return Err(SubmitError::QueueFull { queued, retry_after_ms: 500 + 50 * queued as u64 });
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let prompt_tokens = req.prompt().len();
        let job = Job { req, tx, submitted: Instant::now() };
        {
            // Checked under the queue lock that `shutdown` takes to set the flag: a job queued
            // here is seen by the engine thread's final drain.
            let mut queue = self.inner.queue.lock();
            if c.shutting_down.load(Ordering::SeqCst) {
                c.admitted.fetch_sub(1, Ordering::SeqCst);
                return Err(SubmitError::ShuttingDown);
            }
            c.queued.fetch_add(1, Ordering::SeqCst);
            queue.push_back(job);
        }
        self.inner.wake.notify_one();
        Ok(GenerationStream { rx, prompt_tokens })
    }

    pub fn stats(&self) -> EngineStats {
        let c = &self.inner.counters;
        let (batch_rows, batch_sequences) = c.batches.lock().clone();
        EngineStats {
            queued: c.queued.load(Ordering::Relaxed),
            active: c.active.load(Ordering::Relaxed),
            completed: c.completed.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            cancelled: c.cancelled.load(Ordering::Relaxed),
            kv_bytes: c.kv_bytes.load(Ordering::Relaxed),
            batch_rows,
            batch_sequences,
            kv_blocks_total: self.inner.kv_total_blocks,
            kv_blocks_used: c.kv_blocks_used.load(Ordering::Relaxed),
            kv_blocks_cached: c.kv_blocks_cached.load(Ordering::Relaxed),
            prefix_cache_hit_tokens: c.prefix_hit_tokens.load(Ordering::Relaxed),
            prefix_cache_miss_tokens: c.prefix_miss_tokens.load(Ordering::Relaxed),
            preemptions: c.preemptions.load(Ordering::Relaxed),
        }
    }

    /// Stops accepting requests; queued and active sequences end with an error event.
    /// Waits for the engine thread to finish its current step.
    pub fn shutdown(&self) {
        {
            let _queue = self.inner.queue.lock();
            self.inner.counters.shutting_down.store(true, Ordering::SeqCst);
        }
        self.inner.wake.notify_all();
        if let Some(h) = self.inner.worker.lock().take() {
            let _ = h.join();
        }
    }
}

/// The largest step the scheduler plans: `max_batch_tokens` rows. `plan_step` never cuts
/// decode rows by the budget, but a sequence only starts decoding after a step in which its
/// last prefill rows fitted, so they never outnumber it; max_active_sequences is taken as
/// well so that the workspace bound does not rest on that. One row of logits per sequence
/// at most (each asks for its last row's or none).
fn step_workspace_shape(cfg: &EngineConfig) -> WorkspaceShape {
    let max_active = cfg.max_active_sequences.max(1);
    let rows = cfg.max_batch_tokens.max(max_active);
    WorkspaceShape { rows, logit_rows: max_active.min(rows) }
}

/// Refuses a KV pool (and the activation buffers) of `need` bytes that the machine's
/// available memory cannot hold.
fn check_memory(need: u128, what: impl Fn() -> String) -> anyhow::Result<()> {
    if let Some(avail) = mem_available_bytes() {
        if need > avail as u128 {
            anyhow::bail!(
                "not enough memory for the KV cache: {} need {:.1} GiB, {:.1} GiB available (lower engine.kv_cache_bytes)",
                what(),
                need as f64 / (1u64 << 30) as f64,
                avail as f64 / (1u64 << 30) as f64
            );
        }
    }
    Ok(())
}

fn check_kv_memory<B: Backend>(model: &Model<B>, ctx_len: usize, max_active: usize, workspace_bytes: usize) -> anyhow::Result<()> {
    let need = model.cache_bytes(ctx_len) as u128 * max_active.max(1) as u128 + workspace_bytes as u128;
    if let Some(avail) = mem_available_bytes() {
        if need > avail as u128 {
            anyhow::bail!(
                "not enough memory for the KV cache: {} active sequences x {} tokens (and the activation buffers) need {:.1} GiB, {:.1} GiB available (lower engine.context_length or engine.max_active_sequences)",
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

fn model_info<B: Backend>(file: &GgufFile, model: &Model<B>, tk: &Tokenizer, ctx_len: usize) -> ModelInfo {
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
