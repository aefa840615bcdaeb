//! Request/response types of the engine.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

pub use crate::tokenizer::ChatMessage;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KernelTimingConfig {
    pub enabled: bool,
    /// Fraction of calls per kernel that are timed, in (0, 1]; unset: the backend's default
    /// (`sample_rate_for`). Every call is counted either way.
    #[serde(default)]
    pub sample_rate: Option<f64>,
}

impl Default for KernelTimingConfig {
    fn default() -> Self {
        KernelTimingConfig { enabled: true, sample_rate: None }
    }
}

/// Timed fraction of calls on GPU backends when none is configured: an event pair around
/// every launch cost 35% (H200, 2026-12-03) and 42% (H100 serving, 2026-12-06) of one
/// stream's decode speed, 5% of launches 0.5-2.5% (docs/GPU.md, "Per-kernel metrics overhead").
pub const GPU_DEFAULT_SAMPLE_RATE: f64 = 0.05;

impl KernelTimingConfig {
    /// The fraction of calls timed on `backend` (`Backend::name`): the configured rate, else
    /// every call on the CPU backend (a timed op is two clock reads) and
    /// `GPU_DEFAULT_SAMPLE_RATE` on the GPU backends.
    pub fn sample_rate_for(&self, backend: &str) -> f64 {
        self.sample_rate.unwrap_or(if backend == "cpu" { 1.0 } else { GPU_DEFAULT_SAMPLE_RATE })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EngineConfig {
    pub model_path: PathBuf,
    /// "cpu" (embedded default), "hip", "cuda" or "auto" (first GPU found, else CPU).
    pub backend: String,
    /// Options of the GPU backends (kernel folder, device, weight placement).
    #[serde(default)]
    pub gpu: crate::backend::gpu::GpuOptions,
    /// CPU threads; 0 = one per physical core (backend::cpu::topology).
    pub threads: usize,
    /// Sequences decoded concurrently.
    pub max_active_sequences: usize,
    /// Requests that may wait for an active slot; past max_active_sequences + max_queue
    /// requests in the engine, submit() returns QueueFull. 0 = no waiting: a request is
    /// admitted only while an active slot is free.
    pub max_queue: usize,
    /// Cap on the context length (0 = the model's own).
    pub context_length: usize,
    /// The largest prompt chunk one sequence prefills in one step; a prompt longer than this
    /// is a long one (its chunks are cut by `max_decode_slowdown`). 0 = the backend's default
    /// ([`default_prefill_batch`]), resolved when the engine loads.
    #[serde(default)]
    pub prefill_batch: usize,
    /// Token budget of one engine step (continuous batching): one decode row per decoding
    /// sequence, then prefill chunks up to this many rows in all. It bounds the decode gap
    /// while short prompts prefill (long ones are also cut by `max_decode_slowdown`); larger
    /// prefills bursts of prompts in fewer steps. 0 = the backend's
    /// default ([`default_max_batch_tokens`]), resolved when the engine loads.
    #[serde(default)]
    pub max_batch_tokens: usize,
    /// While sequences decode, how much slower a step may become because it also prefills a
    /// long prompt (one longer than `prefill_batch`): that prompt's chunk is cut so the
    /// step's predicted time stays within this factor of the decode rows' alone (a cost model
    /// learned online from measured step times, which takes a step's cost as proportional to
    /// its rows and attended positions). 3.0 = the decoding streams' inter-token gap at most
    /// triples while a long prompt prefills, which gets the other two thirds of the machine
    /// (2.0 measured 2.6x the long prompt's time to first token of 3.0 for a similar
    /// inter-token p99: docs/PERF.md). Short prompts are not cut (they end in one step; their
    /// time to first token matters). 0 = off: prefill chunks fill `max_batch_tokens`. Values in
    /// (0, 1) are refused. Unset = the backend's default ([`default_max_decode_slowdown`]):
    /// 3.0 on the CPU, off on GPUs.
    #[serde(default)]
    pub max_decode_slowdown: Option<f64>,
    /// Rows the oldest long prompt prefills in every step even when `max_decode_slowdown`
    /// leaves none, so it always progresses.
    #[serde(default = "default_min_prefill_chunk")]
    pub min_prefill_chunk: usize,
    /// Bytes of the paged KV cache pool (backends with paged KV: CPU); 0 = enough for
    /// max_active_sequences sequences of the full context. Requests wait for free blocks;
    /// unreferenced prefix-cache blocks are evicted when blocks run out. Models with
    /// sliding-window layers (gemma3, gpt-oss) first reserve one ring of window +
    /// prefill_batch - 1 positions of those layers per active sequence; the rest holds the
    /// full-attention layers' blocks.
    #[serde(default)]
    pub kv_cache_bytes: u64,
    /// Where the model file's bytes live: "mmap" (the default: page-cache pages, loaded lazily)
    /// or "huge_pages" (read into anonymous memory with transparent huge pages at load; the CPU
    /// backend's decode streams the weights through fewer TLB entries; docs/PERF.md).
    #[serde(default)]
    pub weights_memory: crate::gguf::WeightsMemory,
    /// CPU backend: repack Q4_K and Q8_0 matrices at load, eight rows per group, for the AVX-512
    /// VNNI (+ VBMI for Q4_K) kernels (`quant::q4_k_x8`, about 2x the row-by-row dot's speed;
    /// `quant::q8_0_x8`; a different float order; docs/PERF.md). Default true; no effect on
    /// other CPUs or backends.
    #[serde(default = "default_true")]
    pub cpu_repack: bool,
    pub kernel_timing: KernelTimingConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            model_path: PathBuf::from("models/default.gguf"),
            backend: "cpu".into(),
            gpu: Default::default(),
            threads: 0,
            max_active_sequences: 4,
            max_queue: 64,
            context_length: 4096,
            prefill_batch: 0,
            max_batch_tokens: 0,
            max_decode_slowdown: None,
            min_prefill_chunk: default_min_prefill_chunk(),
            kv_cache_bytes: 0,
            weights_memory: Default::default(),
            cpu_repack: true,
            kernel_timing: KernelTimingConfig::default(),
        }
    }
}

/// `engine.max_decode_slowdown` when unset, by backend.
///
/// - CPU: 3.0. A CPU step costs about its rows, so a cut chunk shortens the step in
///   proportion and the decoding streams' gap stays within the factor (docs/PERF.md).
/// - GPU: off. A GPU step's cost is mostly fixed (on an H200, a step that prefilled 1-3 rows
///   next to 4 decoding streams ran eagerly in 6-10 ms against their 2 ms graph-replayed
///   decode-only step), so the cost model, which takes cost as proportional to rows, let 1-3
///   rows through a step: a 3,000-token prompt took 7.9 s to its first token while the streams
///   ran ~4x slower throughout; off, 0.128 s (docs/GPU.md "Issue #14, session 23"). Filling
///   the budget with `prefill_batch` chunks, as vLLM and TGI do, costs the streams a few
///   longer steps.
pub fn default_max_decode_slowdown(backend_name: &str) -> f64 {
    match backend_name {
        "cpu" => 3.0,
        _ => 0.0,
    }
}

/// `engine.prefill_batch` when 0, by backend.
///
/// - CPU: 64 rows. A CPU step costs about its rows (see [`default_max_batch_tokens`]), so a
///   larger chunk prefills no faster and lengthens every decoding stream's gap.
/// - GPU: 512 rows (llama.cpp's default micro-batch). A GPU step that prefills costs several
///   ms however few its rows, so 64-row chunks would take a 3,000-token prompt 47 such steps;
///   512-row ones take 6 (~20 ms each on an H200, docs/GPU.md "Issue #14, session 23").
pub fn default_prefill_batch(backend_name: &str) -> usize {
    match backend_name {
        "cpu" => 64,
        _ => 512,
    }
}

fn default_true() -> bool {
    true
}

fn default_min_prefill_chunk() -> usize {
    1
}

/// The step budget when `engine.max_batch_tokens` is 0, by backend.
///
/// - CPU: 64 rows, one default prefill chunk. A CPU step costs about its rows (the matmul tiles
///   are saturated after a few rows, so prefill gets no faster per row in larger steps), and
///   every decoding stream waits for the whole step: the budget is the bound on their
///   inter-token gap while prompts prefill (64 rows of SmolLM2 on 2 cores are ~0.25 s).
/// - GPU: 2048 rows. A GPU step costs little more for hundreds of rows than for one (weights
///   are read once, the GEMMs only fill up), so a large budget prefills many prompts at once
///   while the decode gap barely grows; it stays small next to the KV pool and the
///   activations of one step.
pub fn default_max_batch_tokens(backend_name: &str) -> usize {
    match backend_name {
        "cpu" => 64,
        _ => 2048,
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1.0 = off.
    pub top_p: f32,
    /// 0 = off.
    pub min_p: f32,
    /// 1.0 = off.
    pub repetition_penalty: f32,
    pub repetition_window: usize,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, repetition_penalty: 1.0, repetition_window: 64, seed: 0 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum PromptInput {
    /// Raw text, tokenized with special-token parsing on.
    Text { text: String, add_bos: bool },
    /// Pre-tokenized ids.
    Tokens(Vec<u32>),
    /// Chat messages, rendered with the model's chat template (generation prompt added).
    Chat(Vec<ChatMessage>),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerationRequest {
    pub prompt: PromptInput,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Stop sequences; matched text is not emitted.
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// How many most likely alternatives to report with each generated token (0 = none;
    /// at most [`MAX_TOP_LOGPROBS`]).
    #[serde(default)]
    pub top_logprobs: usize,
}

/// The most alternatives a token event carries (OpenAI's limit for `top_logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One alternative of a generated token: its id and log-probability under the same
/// distribution as the token's `logprob`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TopLogprob {
    pub id: u32,
    pub logprob: f32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FinishReason {
    Length,
    Stop,
    Eos,
    Context,
    Cancelled,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    pub queue: Duration,
    pub prefill: Duration,
    pub decode: Duration,
    pub time_to_first_token: Duration,
    pub total: Duration,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerationSummary {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub finish_reason: FinishReason,
    pub token_ids: Vec<u32>,
    /// Prompt tokens whose KV came from the prefix cache (not computed).
    #[serde(default)]
    pub cached_prompt_tokens: usize,
    pub timings: Timings,
    /// Text not yet delivered in Token events (held back as a possible stop-sequence
    /// prefix, or an incomplete UTF-8 tail); clients append it to the completion.
    pub text_tail: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum GenerationEvent {
    /// One generated token and the text it completes (may be empty while UTF-8 or a
    /// possible stop sequence is pending).
    /// `top_logprobs`: the request's `top_logprobs` most likely tokens of this step, most
    /// likely first (empty when not asked for).
    Token { id: u32, text: String, logprob: f32, top_logprobs: Vec<TopLogprob> },
    /// Always the last event of a successful stream.
    Done(GenerationSummary),
    /// The sequence failed inside the engine; the stream ends after it.
    Error(String),
}

impl From<super::validate::InvalidRequest> for SubmitError {
    fn from(e: super::validate::InvalidRequest) -> SubmitError {
        SubmitError::Invalid(e)
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubmitError {
    /// The request is malformed (the reason says why, and which field); nothing reached the
    /// model.
    #[error("invalid request: {0}")]
    Invalid(super::validate::InvalidRequest),
    /// The queue is full; retry after the hinted delay.
    #[error("server overloaded: {queued} requests queued, retry in {retry_after_ms} ms")]
    QueueFull { queued: usize, retry_after_ms: u64 },
    #[error("engine is shutting down")]
    ShuttingDown,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EngineStats {
    pub queued: usize,
    pub active: usize,
    pub completed: u64,
    pub rejected: u64,
    pub cancelled: u64,
    /// Bytes of KV cache currently allocated to active sequences.
    pub kv_bytes: usize,
    /// Rows (tokens) per engine step, every step since load.
    pub batch_rows: StepHistogram,
    /// Sequences per engine step.
    pub batch_sequences: StepHistogram,
    /// Paged KV cache blocks: all, referenced by sequences, cached (unreferenced prefix
    /// blocks, evictable). All zero on backends without a paged cache.
    #[serde(default)]
    pub kv_blocks_total: usize,
    #[serde(default)]
    pub kv_blocks_used: usize,
    #[serde(default)]
    pub kv_blocks_cached: usize,
    /// Prompt tokens found in the prefix cache / computed, since load.
    #[serde(default)]
    pub prefix_cache_hit_tokens: u64,
    #[serde(default)]
    pub prefix_cache_miss_tokens: u64,
    /// Sequences preempted (blocks freed, recomputed later) since load.
    #[serde(default)]
    pub preemptions: u64,
}

/// Upper bounds of the [`StepHistogram`] buckets (powers of two; a last +Inf bucket follows).
pub const STEP_BUCKETS: [f64; 12] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0];

/// A histogram of one value per engine step, as counts per bucket of [`STEP_BUCKETS`]
/// (not cumulative; the last count is the +Inf bucket).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepHistogram {
    pub counts: Vec<u64>,
    pub sum: u64,
    pub count: u64,
}

impl Default for StepHistogram {
    fn default() -> Self {
        StepHistogram { counts: vec![0; STEP_BUCKETS.len() + 1], sum: 0, count: 0 }
    }
}

impl StepHistogram {
    pub fn observe(&mut self, v: usize) {
        let i = STEP_BUCKETS.iter().position(|&b| v as f64 <= b).unwrap_or(STEP_BUCKETS.len());
        self.counts[i] += 1;
        self.sum += v as u64;
        self.count += 1;
    }
}

/// Static description of the loaded model.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelInfo {
    pub name: String,
    pub architecture: String,
    pub path: PathBuf,
    pub file_bytes: u64,
    pub file_sha256: String,
    pub context_length: usize,
    pub embedding_length: usize,
    pub block_count: usize,
    pub head_count: usize,
    pub head_count_kv: usize,
    pub vocab_size: usize,
    pub parameter_count: u64,
    /// (ggml type name, tensor count), sorted by name.
    pub tensor_types: Vec<(String, usize)>,
    pub tokenizer_model: String,
    pub has_chat_template: bool,
    pub backend: String,
    /// Experts per MoE layer and experts used per token (0 for dense models).
    #[serde(default)]
    pub expert_count: usize,
    #[serde(default)]
    pub expert_used_count: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unset_sample_rate_times_every_cpu_op_and_a_twentieth_of_gpu_launches() {
        let unset = KernelTimingConfig::default();
        assert_eq!(unset.sample_rate_for("cpu"), 1.0);
        assert_eq!(unset.sample_rate_for("cuda"), GPU_DEFAULT_SAMPLE_RATE);
        assert_eq!(unset.sample_rate_for("hip"), GPU_DEFAULT_SAMPLE_RATE);
        let set = KernelTimingConfig { enabled: true, sample_rate: Some(0.5) };
        assert_eq!(set.sample_rate_for("cpu"), 0.5);
        assert_eq!(set.sample_rate_for("cuda"), 0.5);
    }
}
