//! In-process benchmarks on the engine: pp (prefill) and tg (decode) tests, profile, hashes.

use super::report::*;
use crate::engine::{
    Engine, EngineConfig, GenerationEvent, GenerationRequest, GenerationSummary, KernelTimingConfig, PromptInput, SamplingParams,
};
use anyhow::{bail, Context};

/// The fixed prompts whose greedy completions are hashed (changing them changes prompts_sha256).
pub const HASH_PROMPTS: [&str; 4] = [
    "The capital of France is",
    "Write a short poem about the sea.",
    "fn fibonacci(n: u64) -> u64 {",
    "Once upon a time, in a quiet village,",
];

pub struct LocalPlan {
    pub model: std::path::PathBuf,
    pub threads: usize,
    /// "cpu", "cuda", "hip" or "auto".
    pub backend: String,
    pub gpu: crate::backend::gpu::GpuOptions,
    pub pp: Vec<usize>,
    pub tg: Vec<usize>,
    pub depths: Vec<usize>,
    pub repetitions: usize,
    pub warmup: usize,
    pub hash_tokens: usize,
    pub kernel_timing: bool,
    pub sample_rate: f64,
    pub prefill_batch: usize,
    pub weights_memory: Option<crate::gguf::WeightsMemory>,
    pub cpu_repack: Option<bool>,
}

pub fn run(plan: &LocalPlan, progress: &indicatif::ProgressBar) -> anyhow::Result<BenchReport> {
    let started_at = now_rfc3339();
    let max_depth = plan.depths.iter().copied().max().unwrap_or(0);
    let need_ctx =
        plan.pp.iter().copied().max().unwrap_or(0).max(max_depth + plan.tg.iter().copied().max().unwrap_or(0) + 2) + plan.hash_tokens + 64;
    let cfg = EngineConfig {
        model_path: plan.model.clone(),
        backend: plan.backend.clone(),
        gpu: plan.gpu.clone(),
        threads: plan.threads,
        max_active_sequences: 1,
        max_queue: 4,
        context_length: need_ctx,
        prefill_batch: plan.prefill_batch,
        // One sequence at a time: a step is one prefill chunk of prefill_batch tokens.
        max_batch_tokens: plan.prefill_batch,
        kv_cache_bytes: 0,
        kernel_timing: KernelTimingConfig { enabled: plan.kernel_timing, sample_rate: Some(plan.sample_rate) },
        weights_memory: plan.weights_memory.unwrap_or_default(),
        cpu_repack: plan.cpu_repack.unwrap_or(true),
        // One sequence: nothing decodes while it prefills, the slowdown never applies.
        ..EngineConfig::default()
    };
    let engine = Engine::load(cfg)?;
    if engine.context_length() < need_ctx {
        bail!("the model's context ({}) is shorter than the benchmark needs ({need_ctx})", engine.context_length());
    }
    let ids = filler_tokens(&engine, need_ctx);
    let placement = crate::backend::cpu::topology::CpuPlacement::detect();
    let threads = placement.threads(plan.threads);
    let cpu_pool = (engine.backend_name() == "cpu").then(|| crate::backend::cpu::pool::PoolKind::for_threads(threads).name().to_string());
    if let Some(pool) = &cpu_pool {
        eprintln!("civetta bench: cpu backend, {}; {pool} thread pool", placement.describe(threads));
    }

    let mut tests = Vec::new();
    let total_runs = (plan.pp.len() + plan.tg.len() * plan.depths.len().max(1)) * (plan.repetitions + plan.warmup);
    progress.set_length(total_runs as u64 + plan.hash_tokens.min(1) as u64 * HASH_PROMPTS.len() as u64);
    crate::kernel_registry::registry().reset();
    // Every prefill run gets a prompt no earlier run started with (the filler rotated by a
    // counter), so the prefix cache cannot serve it and pp measures computed tokens only.
    let mut pp_runs = 0usize;
    for &n in &plan.pp {
        let mut samples = Vec::new();
        for rep in 0..plan.warmup + plan.repetitions {
            progress.set_message(format!("pp{n}"));
            let mut prompt = ids[..n].to_vec();
            prompt.rotate_left(pp_runs % n);
            pp_runs += 1;
            let s = generate(&engine, prompt, 1)?;
            if s.cached_prompt_tokens > 0 {
                bail!("pp{n}: {} prompt tokens came from the prefix cache; the measurement would be wrong", s.cached_prompt_tokens);
            }
            if rep >= plan.warmup {
                samples.push(n as f64 / s.timings.prefill.as_secs_f64());
            }
            progress.inc(1);
        }
        tests.push(test_result(format!("pp{n}"), "pp", n, 0, 0, samples));
    }
    let depths = if plan.depths.is_empty() { vec![0] } else { plan.depths.clone() };
    for &n in &plan.tg {
        for &d in &depths {
            let mut samples = Vec::new();
            for rep in 0..plan.warmup + plan.repetitions {
                progress.set_message(format!("tg{n}"));
                // d context tokens + 1; the first generated token comes from prefill, the next n from decode steps.
                let s = generate(&engine, ids[..d + 1].to_vec(), n + 1)?;
                if s.completion_tokens != n + 1 {
                    bail!("tg{n}: generated {} tokens, expected {}", s.completion_tokens, n + 1);
                }
                if rep >= plan.warmup {
                    samples.push(n as f64 / s.timings.decode.as_secs_f64());
                }
                progress.inc(1);
            }
            let name = if d > 0 { format!("tg{n}@d{d}") } else { format!("tg{n}") };
            tests.push(test_result(name, "tg", d + 1, n, d, samples));
        }
    }
    // Profile over the measured tests (warm-ups included: they run the same kernels).
    let profile = profile_from_registry();

    let hashes = if plan.hash_tokens > 0 {
        let mut completions = Vec::new();
        for p in HASH_PROMPTS {
            progress.set_message("hashes");
            let prompt = engine
                .prompt_tokens(&PromptInput::Text { text: p.into(), add_bos: engine.tokenizer().add_bos_default() })
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let s = generate(&engine, prompt, plan.hash_tokens)?;
            completions.push(CompletionHash { prompt: p.into(), tokens: s.token_ids.len(), sha256: sha256_tokens(&s.token_ids) });
            progress.inc(1);
        }
        Some(hash_set(completions, plan.hash_tokens))
    } else {
        None
    };

    let info = engine.model_info();
    let quant_mix = info.tensor_types.iter().map(|(t, c)| format!("{t}:{c}")).collect::<Vec<_>>().join(", ");
    let report = BenchReport {
        schema_version: SCHEMA_VERSION,
        civetta_version: crate::build_info::VERSION.into(),
        git_sha: crate::build_info::GIT_SHA.into(),
        started_at,
        fingerprint: with_backend(super::cli::local_fingerprint(&info.backend), engine.backend_fingerprint().clone()),
        model: ModelIdentity {
            path: info.path.display().to_string(),
            file_sha256: info.file_sha256.clone(),
            file_bytes: info.file_bytes,
            name: info.name.clone(),
            architecture: info.architecture.clone(),
            parameter_count: info.parameter_count,
            quant_mix,
        },
        settings: BenchSettings {
            backend: info.backend.clone(),
            threads,
            repetitions: plan.repetitions,
            warmup: plan.warmup,
            kernel_timing: plan.kernel_timing,
            sample_rate: plan.sample_rate,
            prefill_batch: plan.prefill_batch,
            cpu_q4_k_repacked: (info.backend == "cpu").then(|| plan.cpu_repack.unwrap_or(true) && crate::quant::q4_k_x8::available()),
            cpu_q8_0_repacked: (info.backend == "cpu").then(|| plan.cpu_repack.unwrap_or(true) && crate::quant::q8_0_x8::available()),
            cpu_pool,
        },
        tests,
        profile,
        hashes,
        remote: Vec::new(),
        mixed: Vec::new(),
    };
    engine.shutdown();
    Ok(report)
}

pub fn hash_set(completions: Vec<CompletionHash>, max_tokens: usize) -> HashSet {
    use sha2::{Digest, Sha256};
    let mut hp = Sha256::new();
    for p in HASH_PROMPTS {
        hp.update(p.as_bytes());
        hp.update([0u8]);
    }
    hp.update((max_tokens as u64).to_le_bytes());
    let mut ho = Sha256::new();
    for c in &completions {
        ho.update(c.sha256.as_bytes());
    }
    HashSet { prompts_sha256: hex::encode(hp.finalize()), max_tokens, completions, overall_sha256: hex::encode(ho.finalize()) }
}

fn test_result(name: String, kind: &str, n_prompt: usize, n_gen: usize, depth: usize, samples: Vec<f64>) -> TestResult {
    let (mean, sd) = mean_stddev(&samples);
    TestResult { name, kind: kind.into(), n_prompt, n_gen, depth, samples_tps: samples, mean_tps: mean, stddev_tps: sd }
}

/// Deterministic pseudo-random token ids that are ordinary (not control/end-of-generation) tokens.
fn filler_tokens(engine: &Engine, n: usize) -> Vec<u32> {
    let tk = engine.tokenizer();
    let vocab = engine.model_info().vocab_size as u64;
    let mut out = Vec::with_capacity(n);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    while out.len() < n {
        // xorshift64*: fixed sequence, independent of the platform.
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let id = (x.wrapping_mul(0x2545_F491_4F6C_DD1D) % vocab) as u32;
        if !tk.is_control(id) && !tk.is_eog(id) {
            out.push(id);
        }
    }
    out
}

fn generate(engine: &Engine, prompt: Vec<u32>, max_tokens: usize) -> anyhow::Result<GenerationSummary> {
    let req = GenerationRequest {
        prompt: PromptInput::Tokens(prompt),
        max_tokens,
        sampling: SamplingParams::default(),
        stop: Vec::new(),
        ignore_eos: true,
        top_logprobs: 0,
    };
    let mut stream = engine.submit(req).map_err(|e| anyhow::anyhow!("{e}"))?;
    while let Some(ev) = stream.blocking_next() {
        match ev {
            GenerationEvent::Token { .. } => {}
            GenerationEvent::Done(s) => return Ok(s),
            GenerationEvent::Error(e) => bail!("generation failed: {e}"),
        }
    }
    Err(anyhow::anyhow!("the engine closed the stream without a result")).context("bench")
}

pub(crate) fn now_rfc3339() -> String {
    // Civil date from the Unix time (no chrono dependency): days -> y/m/d (Howard Hinnant's algorithm).
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// The environment fingerprint plus what the backend reports about itself (device, kernel
/// folder and compiler for GPU backends), under "backend".
fn with_backend(mut fingerprint: serde_json::Value, backend: serde_json::Value) -> serde_json::Value {
    if let Some(obj) = fingerprint.as_object_mut() {
        obj.insert("backend".into(), backend);
    }
    fingerprint
}
