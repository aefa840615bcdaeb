//! The benchmark report and its renderings (md, json, jsonl, csv).

use serde::{Deserialize, Serialize};

/// Bumped when a field changes meaning or disappears (additions keep the version).
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BenchReport {
    pub schema_version: u32,
    pub civetta_version: String,
    pub git_sha: String,
    /// RFC 3339 UTC time the run started.
    pub started_at: String,
    /// The environment fingerprint (`civetta env --json`): `{ "fields": [{key, value, source}], ... }`.
    pub fingerprint: serde_json::Value,
    pub model: ModelIdentity,
    pub settings: BenchSettings,
    pub tests: Vec<TestResult>,
    pub profile: Profile,
    pub hashes: Option<HashSet>,
    /// Present for `--remote` / `--remote-http` runs: one row per concurrency level and protocol.
    pub remote: Vec<RemoteResult>,
    /// `--mixed` runs: one per protocol.
    #[serde(default)]
    pub mixed: Vec<MixedResult>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ModelIdentity {
    pub path: String,
    pub file_sha256: String,
    pub file_bytes: u64,
    pub name: String,
    pub architecture: String,
    pub parameter_count: u64,
    /// "q8_0:28, f32:9"-style tensor type mix.
    pub quant_mix: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BenchSettings {
    pub backend: String,
    pub threads: usize,
    pub repetitions: usize,
    pub warmup: usize,
    pub kernel_timing: bool,
    pub sample_rate: f64,
    pub prefill_batch: usize,
    /// CPU backend: whether Q4_K matrices ran repacked (`engine.cpu_repack` on a CPU with the
    /// kernel): the float order, so the hashes, differ from the row-by-row dots'. None for
    /// GPU backends and reports written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_q4_k_repacked: Option<bool>,
    /// CPU backend: whether Q8_0 matrices ran repacked (`quant::q8_0_x8`; same meaning as
    /// `cpu_q4_k_repacked`). None for GPU backends and reports written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_q8_0_repacked: Option<bool>,
    /// CPU backend: which thread pool ran the regions ("rayon" below 8 threads, "spin" from 8;
    /// `CIVETTA_CPU_POOL` overrides). Same bits either way; None for GPU backends and older reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_pool: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TestResult {
    /// "pp512", "tg128", "tg128@d512".
    pub name: String,
    /// "pp" or "tg".
    pub kind: String,
    pub n_prompt: usize,
    pub n_gen: usize,
    pub depth: usize,
    /// Tokens per second of each measured repetition.
    pub samples_tps: Vec<f64>,
    pub mean_tps: f64,
    pub stddev_tps: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Profile {
    pub stages: Vec<StageTime>,
    pub kernels: Vec<KernelTime>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StageTime {
    pub stage: String,
    pub seconds: f64,
    pub share: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KernelTime {
    pub kernel: String,
    pub shape_class: String,
    pub backend: String,
    pub variant: String,
    pub calls: u64,
    pub total_seconds: f64,
    pub per_call_seconds: f64,
    pub resources: Option<crate::kernel_registry::KernelResources>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HashSet {
    /// sha256 over the prompt texts and generation settings: equal sets are comparable.
    pub prompts_sha256: String,
    pub max_tokens: usize,
    pub completions: Vec<CompletionHash>,
    /// sha256 over all completion hashes in order.
    pub overall_sha256: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CompletionHash {
    pub prompt: String,
    pub tokens: usize,
    /// sha256 of the completion's token ids as little-endian u32.
    pub sha256: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RemoteResult {
    pub concurrency: usize,
    pub requests: usize,
    pub errors: usize,
    pub ttft_mean_s: f64,
    pub ttft_p50_s: f64,
    #[serde(default)]
    pub ttft_p95_s: f64,
    pub ttft_p99_s: f64,
    pub itl_mean_s: f64,
    pub itl_p50_s: f64,
    #[serde(default)]
    pub itl_p95_s: f64,
    pub itl_p99_s: f64,
    /// Generated tokens per wall-clock second over all streams.
    pub tokens_per_second: f64,
    /// "grpc" or "http" (reports from before the HTTP client are gRPC).
    #[serde(default = "grpc")]
    pub protocol: String,
    /// Generated tokens over the level, as the server's usage reported them.
    #[serde(default)]
    pub generated_tokens: usize,
    /// Prompt tokens over the level, as the server's usage reported them.
    #[serde(default)]
    pub prompt_tokens: usize,
    /// Messages (gRPC) or SSE chunks (HTTP) that carried tokens: equal to `generated_tokens`
    /// when every token travelled alone.
    #[serde(default)]
    pub deliveries: usize,
}

fn grpc() -> String {
    "grpc".into()
}

/// p50/p95/p99 of a set of latencies, and how many there were.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LatencySummary {
    pub samples: usize,
    pub p50_s: f64,
    pub p95_s: f64,
    pub p99_s: f64,
}

impl LatencySummary {
    pub fn of(mut xs: Vec<f64>) -> LatencySummary {
        xs.sort_by(f64::total_cmp);
        LatencySummary { samples: xs.len(), p50_s: percentile(&xs, 0.5), p95_s: percentile(&xs, 0.95), p99_s: percentile(&xs, 0.99) }
    }
}

/// The mixed scenario (`--mixed`): decoding streams' inter-token latency before and while one
/// long prompt prefills.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MixedResult {
    pub protocol: String,
    /// Streams decoding throughout.
    pub streams: usize,
    /// The long prompt's length as the server's usage reported it.
    pub long_prompt_tokens: usize,
    /// From sending the long prompt to its first token: its prefill, as the client saw it.
    pub long_ttft_s: f64,
    /// Inter-token latency of the streams while all of them decoded and before the long prompt.
    pub idle: LatencySummary,
    /// Inter-token latency of tokens delivered between the long prompt's send and its first token.
    pub during: LatencySummary,
    /// during p99 / idle p99 (#14's target: <= 3); absent without samples on either side.
    pub p99_ratio: Option<f64>,
    /// `--mixed-control`: the same streams run alone, their samples at the token positions that
    /// fell inside the prefill (what their gaps were without the long prompt).
    #[serde(default)]
    pub control: Option<LatencySummary>,
    /// during p99 / control p99: the slowdown the long prompt itself caused.
    #[serde(default)]
    pub p99_ratio_control: Option<f64>,
    /// False when a stream ended before the long prompt's first token (then `during` misses it).
    pub streams_outlasted_prefill: bool,
    pub errors: usize,
}

pub fn mean_stddev(xs: &[f64]) -> (f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

pub fn sha256_tokens(ids: &[u32]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for id in ids {
        h.update(id.to_le_bytes());
    }
    hex::encode(h.finalize())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Md,
    Json,
    Jsonl,
    Csv,
}

impl BenchReport {
    pub fn render(&self, f: Format) -> String {
        match f {
            Format::Json => serde_json::to_string_pretty(self).expect("report serialises") + "\n",
            Format::Jsonl => self.render_jsonl(),
            Format::Csv => self.render_csv(),
            Format::Md => self.render_md(),
        }
    }

    fn fp(&self, key: &str) -> String {
        fingerprint_value(&self.fingerprint, key).unwrap_or_else(|| "unknown".into())
    }

    fn render_md(&self) -> String {
        let mut s = String::new();
        s += &format!(
            "model: {} ({}, {}, sha256 {}…)\nbackend: {} ({}simd {}), kernel compiler: {}, iommu: {}, container: {}\n\n",
            self.model.name,
            self.model.architecture,
            self.model.quant_mix,
            &self.model.file_sha256.get(..12).unwrap_or(""),
            self.settings.backend,
            // 0 = not known (a remote server does not report its thread count).
            if self.settings.threads > 0 { format!("{} threads, ", self.settings.threads) } else { String::new() },
            self.fp("cpu.simd"),
            self.fp("toolchain.kernel_compiler"),
            self.fp("iommu.mode"),
            self.fp("container.type"),
        );
        if !self.tests.is_empty() {
            s += "| test | t/s | samples |\n|---|---:|---|\n";
            for t in &self.tests {
                let samples: Vec<String> = t.samples_tps.iter().map(|x| format!("{x:.2}")).collect();
                s += &format!("| {} | {:.2} ± {:.2} | {} |\n", t.name, t.mean_tps, t.stddev_tps, samples.join(", "));
            }
        }
        if !self.profile.stages.is_empty() {
            s += "\n| stage | seconds | share |\n|---|---:|---:|\n";
            for st in &self.profile.stages {
                s += &format!("| {} | {:.4} | {:.1}% |\n", st.stage, st.seconds, st.share * 100.0);
            }
            s += "\n| kernel | shape | calls | total s | per call µs |\n|---|---|---:|---:|---:|\n";
            for k in &self.profile.kernels {
                s += &format!(
                    "| {} | {} | {} | {:.4} | {:.1} |\n",
                    k.kernel,
                    k.shape_class,
                    k.calls,
                    k.total_seconds,
                    k.per_call_seconds * 1e6
                );
            }
        }
        if let Some(h) = &self.hashes {
            s += &format!("\ncompletion hashes ({} greedy tokens each), overall {}\n", h.max_tokens, h.overall_sha256);
            for c in &h.completions {
                s += &format!("- `{}` {:?}\n", &c.sha256[..16], c.prompt);
            }
        }
        if !self.remote.is_empty() {
            s += "\n| protocol | concurrency | requests | errors | generated | TTFT p50 ms | TTFT p95 ms | TTFT p99 ms | ITL p50 ms | ITL p95 ms | ITL p99 ms | tokens/s |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
            for r in &self.remote {
                s += &format!(
                    "| {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {:.2} | {:.1} |\n",
                    r.protocol,
                    r.concurrency,
                    r.requests,
                    r.errors,
                    r.generated_tokens,
                    r.ttft_p50_s * 1e3,
                    r.ttft_p95_s * 1e3,
                    r.ttft_p99_s * 1e3,
                    r.itl_p50_s * 1e3,
                    r.itl_p95_s * 1e3,
                    r.itl_p99_s * 1e3,
                    r.tokens_per_second
                );
            }
        }
        if !self.mixed.is_empty() {
            s += "\nmixed: streams' inter-token latency (ms) idle vs while one long prompt prefills\n\n| protocol | streams | long prompt tokens | long TTFT ms | idle n | idle p50 | idle p95 | idle p99 | during n | during p50 | during p95 | during p99 | p99 during/idle | errors |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
            for m in &self.mixed {
                let ms = |x: f64| format!("{:.2}", x * 1e3);
                s += &format!(
                    "| {} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                    m.protocol,
                    m.streams,
                    m.long_prompt_tokens,
                    m.long_ttft_s * 1e3,
                    m.idle.samples,
                    ms(m.idle.p50_s),
                    ms(m.idle.p95_s),
                    ms(m.idle.p99_s),
                    m.during.samples,
                    ms(m.during.p50_s),
                    ms(m.during.p95_s),
                    ms(m.during.p99_s),
                    m.p99_ratio.map(|r| format!("{r:.2}x")).unwrap_or_else(|| "n/a".into()),
                    m.errors,
                );
            }
            for m in self.mixed.iter().filter(|m| m.control.is_some()) {
                let c = m.control.as_ref().expect("filtered");
                s += &format!(
                    "\ncontrol ({}): the same streams alone, at the positions inside the prefill: n {}, p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms; p99 during/control {}\n",
                    m.protocol,
                    c.samples,
                    c.p50_s * 1e3,
                    c.p95_s * 1e3,
                    c.p99_s * 1e3,
                    m.p99_ratio_control.map(|r| format!("{r:.2}x")).unwrap_or_else(|| "n/a".into()),
                );
            }
            for m in self.mixed.iter().filter(|m| !m.streams_outlasted_prefill) {
                s += &format!(
                    "\nWARNING ({}): a stream ended before the long prompt's first token, so `during` misses part of the prefill: raise --mixed-stream-tokens, or the daemon's --max-active if the long prompt waited for a slot\n",
                    m.protocol
                );
            }
        }
        s
    }

    fn render_jsonl(&self) -> String {
        let mut s = String::new();
        for t in &self.tests {
            let line = serde_json::json!({
                "test": t.name, "kind": t.kind, "n_prompt": t.n_prompt, "n_gen": t.n_gen, "depth": t.depth,
                "mean_tps": t.mean_tps, "stddev_tps": t.stddev_tps, "samples_tps": t.samples_tps,
                "model_sha256": self.model.file_sha256, "backend": self.settings.backend,
                "threads": self.settings.threads, "git_sha": self.git_sha,
                "kernel_compiler": self.fp("toolchain.kernel_compiler"), "iommu": self.fp("iommu.mode"),
                "container": self.fp("container.type"),
            });
            s += &line.to_string();
            s.push('\n');
        }
        s
    }

    fn render_csv(&self) -> String {
        let mut s = String::from("test,kind,n_prompt,n_gen,depth,mean_tps,stddev_tps,samples,model_sha256,backend,threads,git_sha\n");
        for t in &self.tests {
            let samples: Vec<String> = t.samples_tps.iter().map(|x| format!("{x:.4}")).collect();
            s += &format!(
                "{},{},{},{},{},{:.4},{:.4},{},{},{},{},{}\n",
                t.name,
                t.kind,
                t.n_prompt,
                t.n_gen,
                t.depth,
                t.mean_tps,
                t.stddev_tps,
                samples.join(";"),
                self.model.file_sha256,
                self.settings.backend,
                self.settings.threads,
                self.git_sha
            );
        }
        s
    }
}

/// Reads `key` from a fingerprint JSON's `fields` array.
pub fn fingerprint_value(fp: &serde_json::Value, key: &str) -> Option<String> {
    fp.get("fields")?
        .as_array()?
        .iter()
        .find(|f| f.get("key").and_then(|k| k.as_str()) == Some(key))
        .and_then(|f| f.get("value"))
        .and_then(|v| v.as_str())
        .map(str::to_string)
}

/// Stage of a kernel name, for the profile's stage table.
pub fn stage_of(kernel: &str) -> &'static str {
    if kernel.starts_with("matmul") || kernel.starts_with("gemm") || kernel.starts_with("matvec") {
        "gemm"
    } else if kernel.starts_with("attention") || kernel == "kv_store" || kernel == "rope" || kernel.starts_with("softmax") {
        "attention"
    } else if kernel.contains("norm") {
        "norm"
    } else if kernel == "embed" {
        "embed"
    } else {
        "elementwise"
    }
}

pub fn profile_from_registry() -> Profile {
    let snap = crate::kernel_registry::registry().snapshot();
    let kernels: Vec<KernelTime> = snap
        .iter()
        .map(|k| KernelTime {
            kernel: k.key.kernel.clone(),
            shape_class: k.key.shape_class.clone(),
            backend: k.key.backend.clone(),
            variant: k.key.variant.clone(),
            calls: k.calls,
            total_seconds: k.total_seconds,
            per_call_seconds: k.mean_seconds,
            resources: k.resources.clone(),
        })
        .collect();
    let total: f64 = kernels.iter().map(|k| k.total_seconds).sum();
    let mut by_stage = std::collections::BTreeMap::<&str, f64>::new();
    for k in &kernels {
        *by_stage.entry(stage_of(&k.kernel)).or_default() += k.total_seconds;
    }
    let mut stages: Vec<StageTime> = by_stage
        .into_iter()
        .map(|(stage, seconds)| StageTime { stage: stage.into(), seconds, share: if total > 0.0 { seconds / total } else { 0.0 } })
        .collect();
    stages.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    Profile { stages, kernels }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_helpers() {
        let (m, s) = mean_stddev(&[1.0, 2.0, 3.0]);
        assert!((m - 2.0).abs() < 1e-12 && (s - 1.0).abs() < 1e-12);
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.5), 3.0);
        assert_eq!(stage_of("matmul_q8_0"), "gemm");
        assert_eq!(stage_of("rmsnorm"), "norm");
        assert_eq!(stage_of("silu_mul"), "elementwise");
        // Hash depends on every id and on order.
        assert_ne!(sha256_tokens(&[1, 2]), sha256_tokens(&[2, 1]));
        assert_eq!(sha256_tokens(&[]), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }
}
